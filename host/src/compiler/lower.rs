//! From the optimized graph to kernel steps: weight matmuls, embedding
//! lookups and mixtures of experts lowered to kernels that read weights in
//! their stored encoding,
//! chains of element-wise ops fused into one pass, and each value's last use.

use kiln_plugin_api::graph::{GraphIr, Op, ValueId};

use super::program::{CompileReport, ElementOp, Instr, Kernel, Operand, Step};

fn element_op(op: &Op) -> Option<ElementOp> {
    Some(match op {
        Op::Unary { op } => ElementOp::Unary { f: *op },
        Op::Binary { op } => ElementOp::Binary { f: *op },
        Op::Where => ElementOp::Where,
        Op::Cast { .. } => ElementOp::Cast,
        _ => return None,
    })
}

/// The weight index behind `id`, if it is a weight node.
fn weight_of(ir: &GraphIr, id: ValueId) -> Option<usize> {
    match ir.nodes[id as usize].op {
        Op::Weight { index } => Some(index),
        _ => None,
    }
}

/// Lowers the graph to steps and fills the step-related parts of `report`.
pub fn lower(ir: &GraphIr, report: &mut CompileReport) -> (Vec<Step>, Vec<Option<usize>>) {
    let n = ir.nodes.len();
    // Distinct consumers of each value (an op reading a value twice is one).
    let mut users = vec![0usize; n];
    for node in &ir.nodes {
        let mut seen = node.inputs.clone();
        seen.sort_unstable();
        seen.dedup();
        for i in seen {
            users[i as usize] += 1;
        }
    }
    let is_output = |id: usize| ir.outputs.contains(&(id as ValueId));

    // 1. Pick a kernel per node.
    let mut kernels: Vec<Option<(Kernel, Vec<ValueId>)>> = vec![None; n];
    for (id, node) in ir.nodes.iter().enumerate() {
        let lowered = match &node.op {
            Op::Input { .. } | Op::Weight { .. } | Op::Constant(_) => continue,
            Op::MatMul => {
                let rhs = &ir.nodes[node.inputs[1] as usize];
                match (&rhs.op, rhs.inputs.first().and_then(|&w| weight_of(ir, w))) {
                    (Op::Permute { perm }, Some(weight)) if perm == &[1, 0] => {
                        Some((Kernel::Linear { weight }, vec![node.inputs[0]]))
                    }
                    _ => None,
                }
            }
            Op::Gather { axis: 0 } => weight_of(ir, node.inputs[0])
                .map(|weight| (Kernel::Embedding { weight }, vec![node.inputs[1]])),
            Op::MixtureOfExperts(spec) => {
                let (lead, experts) = node.inputs.split_at(spec.leading_inputs());
                // The verifier requires weights here.
                let weights: Vec<usize> =
                    experts.iter().filter_map(|&w| weight_of(ir, w)).collect();
                let e = spec.num_experts as usize;
                let kernel = Kernel::MixtureOfExperts {
                    gate: weights[..e].to_vec(),
                    up: weights[e..2 * e].to_vec(),
                    down: weights[2 * e..].to_vec(),
                };
                Some((kernel, lead.to_vec()))
            }
            _ => None,
        };
        if lowered.is_some() {
            report.lowered += 1;
        }
        kernels[id] = Some(lowered.unwrap_or((Kernel::Node, node.inputs.clone())));
    }

    // 2. Fuse element-wise chains: an element-wise operand with no other user
    // and the same shape joins its consumer's group.
    let mut root = (0..n).collect::<Vec<usize>>();
    let mut absorbed = vec![false; n];
    for (id, node) in ir.nodes.iter().enumerate() {
        if element_op(&node.op).is_none() {
            continue;
        }
        for &input in &node.inputs {
            let p = input as usize;
            let operand = &ir.nodes[p];
            if element_op(&operand.op).is_some()
                && users[p] == 1
                && !is_output(p)
                && operand.ty.shape == node.ty.shape
            {
                absorbed[p] = true;
                root[p] = id;
            }
        }
    }
    let group_root = |mut id: usize| {
        while root[id] != id {
            id = root[id];
        }
        id
    };
    for id in 0..n {
        if element_op(&ir.nodes[id].op).is_none() || absorbed[id] {
            continue;
        }
        let members: Vec<usize> = (0..=id)
            .filter(|&m| element_op(&ir.nodes[m].op).is_some() && group_root(m) == id)
            .collect();
        if members.len() < 2 {
            continue;
        }
        let mut externals: Vec<ValueId> = Vec::new();
        let mut program = Vec::new();
        for &m in &members {
            let node = &ir.nodes[m];
            let args = node
                .inputs
                .iter()
                .map(|&i| match members.iter().position(|&x| x == i as usize) {
                    Some(reg) => Operand::Reg(reg),
                    None => {
                        let slot = externals.iter().position(|&e| e == i).unwrap_or_else(|| {
                            externals.push(i);
                            externals.len() - 1
                        });
                        Operand::Input(slot)
                    }
                })
                .collect();
            program.push(Instr {
                op: element_op(&node.op).expect("members are element-wise"),
                args,
                dtype: node.ty.dtype,
            });
        }
        report.fused_kernels += 1;
        report.fused_ops += members.len();
        for &m in &members[..members.len() - 1] {
            kernels[m] = None;
        }
        kernels[id] = Some((Kernel::Fused { program }, externals));
    }

    // 3. Keep the steps that outputs and side effects need.
    let mut needed = vec![false; n];
    for &o in &ir.outputs {
        needed[o as usize] = true;
    }
    for id in (0..n).rev() {
        if ir.nodes[id].op.has_side_effect() {
            needed[id] = true;
        }
        if needed[id] {
            if let Some((_, inputs)) = &kernels[id] {
                for &i in inputs {
                    needed[i as usize] = true;
                }
            }
        }
    }
    let steps: Vec<Step> = (0..n)
        .filter(|&id| needed[id])
        .filter_map(|id| {
            kernels[id].clone().map(|(kernel, inputs)| Step {
                output: id as ValueId,
                kernel,
                inputs,
            })
        })
        .collect();

    // 4. Liveness: the last step reading each value.
    let last_use = last_uses(ir, &steps);
    report.steps = steps.len();
    (steps, last_use)
}

/// For each value of `ir`, the index of the last of `steps` that reads it
/// (`None` for graph outputs, which live to the end, and unread values).
pub fn last_uses(ir: &GraphIr, steps: &[Step]) -> Vec<Option<usize>> {
    let mut last_use = vec![None; ir.nodes.len()];
    for (index, step) in steps.iter().enumerate() {
        for &i in &step.inputs {
            last_use[i as usize] = Some(index);
        }
    }
    for &o in &ir.outputs {
        last_use[o as usize] = None;
    }
    last_use
}
