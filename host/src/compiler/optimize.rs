//! Graph-to-graph passes: dead-code elimination, common-subexpression
//! elimination and constant folding. Each returns a renumbered graph.

use std::collections::HashMap;

use kiln_plugin_api::graph::{Constant, GraphIr, Node, Op, ValueId};

use crate::runtime::{cpu_ops, BufferPool, Tensor};

/// Constants larger than this many elements are not folded (they would bloat
/// the program and the compile cache).
const FOLD_LIMIT: u64 = 1 << 16;

/// Rebuilds `ir` with only the nodes `keep` marks, mapping operands through
/// `forward` (old id → old id that replaces it) and renumbering.
fn rebuild(ir: &GraphIr, keep: &[bool], forward: &[ValueId]) -> GraphIr {
    let mut new_id = vec![ValueId::MAX; ir.nodes.len()];
    let mut nodes = Vec::new();
    for (id, node) in ir.nodes.iter().enumerate() {
        if !keep[id] {
            continue;
        }
        let inputs = node
            .inputs
            .iter()
            .map(|&i| new_id[forward[i as usize] as usize])
            .collect();
        new_id[id] = nodes.len() as ValueId;
        nodes.push(Node {
            inputs,
            ..node.clone()
        });
    }
    let outputs = ir
        .outputs
        .iter()
        .map(|&o| new_id[forward[o as usize] as usize])
        .collect();
    GraphIr {
        nodes,
        outputs,
        ..ir.clone()
    }
}

/// Removes nodes that neither feed an output nor have a side effect. Graph
/// inputs always stay (callers bind them by position).
pub fn eliminate_dead_code(ir: &GraphIr) -> (GraphIr, usize) {
    let mut live = vec![false; ir.nodes.len()];
    for &o in &ir.outputs {
        live[o as usize] = true;
    }
    for (id, node) in ir.nodes.iter().enumerate().rev() {
        if node.op.has_side_effect() || matches!(node.op, Op::Input { .. }) {
            live[id] = true;
        }
        if live[id] {
            for &i in &node.inputs {
                live[i as usize] = true;
            }
        }
    }
    let identity: Vec<ValueId> = (0..ir.nodes.len() as ValueId).collect();
    let removed = live.iter().filter(|l| !**l).count();
    (rebuild(ir, &live, &identity), removed)
}

/// Merges nodes computing the same op on the same operands.
pub fn eliminate_common_subexpressions(ir: &GraphIr) -> (GraphIr, usize) {
    let mut forward: Vec<ValueId> = (0..ir.nodes.len() as ValueId).collect();
    let mut keep = vec![true; ir.nodes.len()];
    let mut seen: HashMap<String, ValueId> = HashMap::new();
    let mut merged = 0;
    for (id, node) in ir.nodes.iter().enumerate() {
        if node.op.has_side_effect() || matches!(node.op, Op::Input { .. }) {
            continue;
        }
        let inputs: Vec<ValueId> = node.inputs.iter().map(|&i| forward[i as usize]).collect();
        let key = serde_json::to_string(&(&node.op, &inputs, &node.ty)).expect("nodes serialize");
        match seen.get(&key) {
            Some(&first) => {
                forward[id] = first;
                keep[id] = false;
                merged += 1;
            }
            None => {
                seen.insert(key, id as ValueId);
            }
        }
    }
    (rebuild(ir, &keep, &forward), merged)
}

/// Replaces nodes whose operands are all constants (and ranges of static
/// length) by their values, evaluated with the CPU kernels.
pub fn fold_constants(ir: &GraphIr) -> Result<(GraphIr, usize), String> {
    let mut ir = ir.clone();
    let mut values: HashMap<usize, Tensor> = HashMap::new();
    let mut folded = 0;
    for id in 0..ir.nodes.len() {
        let node = &ir.nodes[id];
        let Some(shape) = node.ty.static_shape() else {
            continue;
        };
        let size: u64 = shape.iter().product();
        let foldable = match &node.op {
            Op::Constant(_) => true,
            Op::Input { .. }
            | Op::Weight { .. }
            | Op::Print { .. }
            | Op::PagedAttention(_)
            | Op::MixtureOfExperts(_) => false,
            Op::Range { .. } => size <= FOLD_LIMIT,
            _ => {
                size <= FOLD_LIMIT
                    && node
                        .inputs
                        .iter()
                        .all(|i| values.contains_key(&(*i as usize)))
            }
        };
        if !foldable {
            continue;
        }
        let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let tensor = match &node.op {
            Op::Constant(c) => Tensor::from_f64(node.ty.dtype, shape, &c.values),
            op => {
                let inputs: Vec<&Tensor> = node
                    .inputs
                    .iter()
                    .map(|i| &values[&(*i as usize)])
                    .collect();
                let tensor =
                    cpu_ops::eval(op, &inputs, node.ty.dtype, shape, &BufferPool::default())?;
                let node = &mut ir.nodes[id];
                node.op = Op::Constant(Constant {
                    values: tensor.to_f64(),
                });
                node.inputs.clear();
                folded += 1;
                tensor
            }
        };
        values.insert(id, tensor);
    }
    Ok((ir, folded))
}
