//! Work on weights alone, done once at load. A step whose inputs are all
//! weights, constants or results of such steps (DeepSeek's per-head
//! up-projections, reshaped and transposed out of `kv_b_proj`) computes the
//! same value at every step. When a program is bound to its weights these
//! steps run once on the CPU and their results become weights of the
//! program: every backend reads them as it reads any other weight, and no
//! decode step recomputes them.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_plugin_api::graph::{GraphIr, Op, ValueId, WeightSpec};
use kiln_plugin_api::Encoding;

use super::executor::RuntimeError;
use super::pool::BufferPool;
use super::tensor::{Data, Tensor};
use super::weights::WeightData;
use super::{cpu_ops, fused};
use crate::compiler::{last_uses, Kernel, Program, Step};

/// `program` with its weight-only steps computed from `weights`: their
/// results needed later are appended to the graph's weights (and to the
/// returned weight data), the steps are gone. Unchanged when it has none.
pub(crate) fn hoist_weight_steps(
    program: Arc<Program>,
    mut weights: Vec<WeightData>,
) -> Result<(Arc<Program>, Vec<WeightData>), RuntimeError> {
    let graph = &program.graph;
    let hoisted = weight_only_steps(graph, &program.steps);
    if !hoisted.iter().any(|&h| h) {
        return Ok((program, weights));
    }
    let mut once: Vec<&Step> = Vec::new();
    let mut kept: Vec<Step> = Vec::new();
    for (step, &hoist) in program.steps.iter().zip(&hoisted) {
        if hoist {
            once.push(step);
        } else {
            kept.push(step.clone());
        }
    }

    // Results a remaining step or an output reads.
    let mut needed: Vec<ValueId> = once
        .iter()
        .map(|s| s.output)
        .filter(|&v| kept.iter().any(|s| s.inputs.contains(&v)) || graph.outputs.contains(&v))
        .collect();
    needed.sort_unstable();
    let results = evaluate(graph, &once, &weights, &needed)?;

    let mut graph = graph.clone();
    for (id, tensor) in needed.iter().zip(results) {
        let node = &mut graph.nodes[*id as usize];
        let spec = WeightSpec {
            name: format!("{}.%{id} (computed at load)", node.module),
            dtype: node.ty.dtype,
            shape: tensor.shape.iter().map(|&d| d as u64).collect(),
            encoding: Encoding::Float32,
            device: Default::default(),
        };
        let Data::F32(values) = &tensor.data else {
            unreachable!("only float steps are hoisted")
        };
        weights.push(WeightData::from_f32(spec.clone(), values));
        node.op = Op::Weight {
            index: graph.weights.len(),
        };
        node.inputs.clear();
        graph.weights.push(spec);
    }
    tracing::debug!(
        "computed {} weight-only steps at load ({} results kept as weights)",
        once.len(),
        needed.len()
    );
    let last_use = last_uses(&graph, &kept);
    let mut report = program.report.clone();
    report.steps = kept.len();
    let program = Program {
        graph,
        steps: kept,
        last_use,
        report,
    };
    Ok((Arc::new(program), weights))
}

/// Which of `steps` read only weights, constants and earlier such steps:
/// generic or fused kernels with a static float result and no side effect.
fn weight_only_steps(graph: &GraphIr, steps: &[Step]) -> Vec<bool> {
    let mut fixed: Vec<bool> = graph
        .nodes
        .iter()
        .map(|n| matches!(n.op, Op::Weight { .. } | Op::Constant(_)))
        .collect();
    steps
        .iter()
        .map(|step| {
            let node = &graph.nodes[step.output as usize];
            let hoist = matches!(step.kernel, Kernel::Node | Kernel::Fused { .. })
                && !node.op.has_side_effect()
                && node.ty.dtype.is_float()
                && node.ty.static_shape().is_some()
                && step.inputs.iter().all(|&i| fixed[i as usize]);
            fixed[step.output as usize] |= hoist;
            hoist
        })
        .collect()
}

/// Runs `steps` on the CPU and returns the values of `needed`, in order;
/// intermediate values are dropped after their last use.
fn evaluate(
    graph: &GraphIr,
    steps: &[&Step],
    weights: &[WeightData],
    needed: &[ValueId],
) -> Result<Vec<Tensor>, RuntimeError> {
    let mut last_read: HashMap<ValueId, usize> = HashMap::new();
    for (index, step) in steps.iter().enumerate() {
        for &i in &step.inputs {
            last_read.insert(i, index);
        }
    }
    let pool = BufferPool::default();
    let mut values: HashMap<ValueId, Tensor> = HashMap::new();
    for (index, step) in steps.iter().enumerate() {
        let node = &graph.nodes[step.output as usize];
        let fail = |message: String| RuntimeError::op(graph, step.output, message);
        for &i in &step.inputs {
            if let std::collections::hash_map::Entry::Vacant(slot) = values.entry(i) {
                slot.insert(leaf(graph, i, weights).map_err(fail)?);
            }
        }
        let inputs: Vec<&Tensor> = step.inputs.iter().map(|i| &values[i]).collect();
        let shape: Vec<usize> = node
            .ty
            .static_shape()
            .expect("hoisted steps have static shapes")
            .iter()
            .map(|&d| d as usize)
            .collect();
        let dtype = node.ty.dtype;
        let result = match &step.kernel {
            Kernel::Fused { program } => fused::run(program, &inputs, dtype, shape, &pool),
            _ => cpu_ops::eval(&node.op, &inputs, dtype, shape, &pool),
        }
        .map_err(fail)?;
        values.insert(step.output, result);
        for &i in &step.inputs {
            if last_read.get(&i) == Some(&index) && !needed.contains(&i) {
                values.remove(&i);
            }
        }
    }
    Ok(needed
        .iter()
        .map(|id| values.remove(id).expect("every needed value was computed"))
        .collect())
}

/// A weight (decoded to its logical type) or a constant.
fn leaf(graph: &GraphIr, id: ValueId, weights: &[WeightData]) -> Result<Tensor, String> {
    let node = &graph.nodes[id as usize];
    match &node.op {
        Op::Weight { index } => weights[*index].to_tensor(graph.weights[*index].dtype),
        Op::Constant(c) => {
            let shape = node.ty.static_shape().unwrap_or_default();
            let shape = shape.iter().map(|&d| d as usize).collect();
            Ok(Tensor::from_f64(node.ty.dtype, shape, &c.values))
        }
        _ => Err(format!("value %{id} is neither a weight nor a constant")),
    }
}
