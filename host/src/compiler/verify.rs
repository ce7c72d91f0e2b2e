//! Verification: a graph from a plugin is checked in full before anything
//! runs, with errors naming the op and the module that created it.

use kiln_plugin_api::graph::{infer::infer, GraphIr, Op};

use super::CompileError;

/// Checks structure (operands defined before use, valid input/weight indices,
/// outputs) and re-infers every node's type.
pub fn verify(ir: &GraphIr) -> Result<(), CompileError> {
    for (id, node) in ir.nodes.iter().enumerate() {
        let fail = |message: String| CompileError::at(ir, id, message);
        for &input in &node.inputs {
            if input as usize >= id {
                return Err(fail(format!(
                    "operand %{input} is not defined before %{id}"
                )));
            }
        }
        match &node.op {
            Op::Input { index } => {
                let spec = ir
                    .inputs
                    .get(*index)
                    .ok_or_else(|| fail(format!("no graph input #{index}")))?;
                if spec.ty != node.ty {
                    return Err(fail(format!(
                        "input `{}` is declared {} but used as {}",
                        spec.name, spec.ty, node.ty
                    )));
                }
            }
            Op::Weight { index } => {
                let spec = ir
                    .weights
                    .get(*index)
                    .ok_or_else(|| fail(format!("no weight #{index}")))?;
                if spec.tensor_type() != node.ty {
                    return Err(fail(format!(
                        "weight `{}` is {} but used as {}",
                        spec.name,
                        spec.tensor_type(),
                        node.ty
                    )));
                }
            }
            Op::Constant(c) => match node.ty.static_shape() {
                Some(shape) if shape.iter().product::<u64>() == c.values.len() as u64 => {}
                _ => {
                    return Err(fail(format!(
                        "{} values do not fill {}",
                        c.values.len(),
                        node.ty
                    )))
                }
            },
            Op::MixtureOfExperts(spec) => {
                let lead = spec.leading_inputs();
                if let Some(&expert) = node
                    .inputs
                    .iter()
                    .skip(lead)
                    .find(|&&i| !matches!(ir.nodes[i as usize].op, Op::Weight { .. }))
                {
                    return Err(fail(format!(
                        "expert operand %{expert} is not a weight (experts are read in their \
                         stored encoding)"
                    )));
                }
            }
            _ => {}
        }
        let types: Vec<_> = node
            .inputs
            .iter()
            .map(|&i| &ir.nodes[i as usize].ty)
            .collect();
        let inferred = infer(&node.op, &types, Some(&node.ty)).map_err(&fail)?;
        if inferred != node.ty {
            return Err(fail(format!(
                "declared type {} but the operands give {inferred}",
                node.ty
            )));
        }
    }
    if ir.outputs.is_empty() {
        return Err(CompileError {
            op: "return".into(),
            module: String::new(),
            message: "the graph has no outputs".into(),
        });
    }
    if let Some(bad) = ir.outputs.iter().find(|&&o| o as usize >= ir.nodes.len()) {
        return Err(CompileError {
            op: "return".into(),
            module: String::new(),
            message: format!("output %{bad} does not exist"),
        });
    }
    Ok(())
}
