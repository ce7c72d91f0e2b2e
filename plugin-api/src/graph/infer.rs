//! Type inference for every op: the rules the graph builder applies as
//! plugins build graphs, and the host's verifier re-applies to what it receives.

use std::collections::BTreeMap;

use super::ir::{BinaryOp, MoeRouting, MoeSpec, Op, TopKOutput, UnaryOp};
use super::types::{DType, Dim, TensorType};

/// Infers the output type of `op` applied to `inputs`. Nodes without inputs
/// (inputs, weights, constants, ranges) carry their own type: `declared`.
pub fn infer(
    op: &Op,
    inputs: &[&TensorType],
    declared: Option<&TensorType>,
) -> Result<TensorType, String> {
    let arity = |n: usize| {
        if inputs.len() == n {
            Ok(())
        } else {
            Err(format!("expects {n} operand(s), got {}", inputs.len()))
        }
    };
    match op {
        Op::Input { .. } | Op::Weight { .. } | Op::Constant(_) | Op::Range { .. } => {
            arity(0)?;
            declared
                .cloned()
                .ok_or_else(|| "needs a declared type".to_owned())
        }
        Op::Unary { op } => {
            arity(1)?;
            let x = inputs[0];
            match op {
                UnaryOp::Not => require_dtype(x, DType::Bool, "operand")?,
                UnaryOp::Neg | UnaryOp::Abs => {
                    if x.dtype == DType::Bool {
                        return Err("needs a numeric operand, got bool".to_owned());
                    }
                }
                _ => require_float(x, "operand")?,
            }
            Ok(x.clone())
        }
        Op::Binary { op } => {
            arity(2)?;
            let (a, b) = (inputs[0], inputs[1]);
            if a.dtype != b.dtype {
                return Err(format!(
                    "operand types differ: {} and {} (cast one explicitly)",
                    a.dtype, b.dtype
                ));
            }
            match op {
                BinaryOp::And | BinaryOp::Or => require_dtype(a, DType::Bool, "operands")?,
                BinaryOp::Pow => require_float(a, "operands")?,
                _ if !op.is_predicate() && a.dtype == DType::Bool => {
                    return Err("arithmetic on bool operands".to_owned())
                }
                _ => {}
            }
            let shape = broadcast(&a.shape, &b.shape)?;
            let dtype = if op.is_predicate() {
                DType::Bool
            } else {
                a.dtype
            };
            Ok(TensorType {
                dtype,
                shape,
                device: a.device,
            })
        }
        Op::Where => {
            arity(3)?;
            let (cond, a, b) = (inputs[0], inputs[1], inputs[2]);
            require_dtype(cond, DType::Bool, "condition")?;
            if a.dtype != b.dtype {
                return Err(format!("branch types differ: {} and {}", a.dtype, b.dtype));
            }
            let shape = broadcast(&broadcast(&cond.shape, &a.shape)?, &b.shape)?;
            Ok(TensorType {
                dtype: a.dtype,
                shape,
                device: a.device,
            })
        }
        Op::Cast { dtype } => {
            arity(1)?;
            Ok(TensorType {
                dtype: *dtype,
                ..inputs[0].clone()
            })
        }
        Op::Reduce {
            op: _,
            axis,
            keep_dims,
        } => {
            arity(1)?;
            let x = inputs[0];
            check_axis(*axis, x.rank())?;
            if x.dtype == DType::Bool {
                return Err("cannot reduce bool values".to_owned());
            }
            Ok(TensorType {
                shape: reduced(&x.shape, *axis, *keep_dims),
                ..x.clone()
            })
        }
        Op::ArgMax { axis, keep_dims } => {
            arity(1)?;
            let x = inputs[0];
            check_axis(*axis, x.rank())?;
            Ok(TensorType {
                dtype: DType::I64,
                shape: reduced(&x.shape, *axis, *keep_dims),
                device: x.device,
            })
        }
        Op::TopK { k, output } => {
            arity(1)?;
            let x = inputs[0];
            let last = x.shape.last().ok_or("needs at least one axis")?;
            match last.as_static() {
                Some(n) if *k >= 1 && *k <= n => {}
                Some(n) => return Err(format!("k = {k} is outside 1..={n}")),
                None => return Err("the last axis must be static".to_owned()),
            }
            let mut shape = x.shape.clone();
            *shape.last_mut().expect("checked") = Dim::Static(*k);
            let dtype = match output {
                TopKOutput::Values => x.dtype,
                TopKOutput::Indices => DType::I64,
            };
            Ok(TensorType {
                dtype,
                shape,
                device: x.device,
            })
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            arity(1)?;
            check_axis(*axis, inputs[0].rank())?;
            require_float(inputs[0], "operand")?;
            Ok(inputs[0].clone())
        }
        Op::MatMul => {
            arity(2)?;
            let (a, b) = (inputs[0], inputs[1]);
            if a.rank() < 2 || b.rank() < 2 {
                return Err(format!("needs operands of rank ≥ 2, got {a} and {b}"));
            }
            if a.dtype != b.dtype {
                return Err(format!("operand types differ: {} and {}", a.dtype, b.dtype));
            }
            require_float(a, "operands")?;
            let (ra, rb) = (a.rank(), b.rank());
            if a.shape[ra - 1] != b.shape[rb - 2] {
                return Err(format!("inner dimensions differ: {a} × {b}"));
            }
            let mut shape = broadcast(&a.shape[..ra - 2], &b.shape[..rb - 2])?;
            shape.push(a.shape[ra - 2].clone());
            shape.push(b.shape[rb - 1].clone());
            Ok(TensorType {
                dtype: a.dtype,
                shape,
                device: a.device,
            })
        }
        Op::Reshape { shape } => {
            arity(1)?;
            let x = inputs[0];
            if numel(&x.shape) != numel(shape) {
                return Err(format!("cannot reshape {x} to {}", show(shape)));
            }
            Ok(TensorType {
                shape: shape.clone(),
                ..x.clone()
            })
        }
        Op::Permute { perm } => {
            arity(1)?;
            let x = inputs[0];
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank()
                || perm
                    .iter()
                    .any(|&p| p >= x.rank() || std::mem::replace(&mut seen[p], true))
            {
                return Err(format!(
                    "{perm:?} is not a permutation of {} axes",
                    x.rank()
                ));
            }
            Ok(TensorType {
                shape: perm.iter().map(|&p| x.shape[p].clone()).collect(),
                ..x.clone()
            })
        }
        Op::Concat { axis } => {
            let first = inputs.first().ok_or("needs at least one operand")?;
            check_axis(*axis, first.rank())?;
            let mut total = 0u64;
            for part in inputs {
                if part.dtype != first.dtype || part.rank() != first.rank() {
                    return Err(format!("parts differ in type or rank: {first} and {part}"));
                }
                for (i, (d, e)) in part.shape.iter().zip(&first.shape).enumerate() {
                    if i != *axis && d != e {
                        return Err(format!(
                            "parts differ outside axis {axis}: {first} and {part}"
                        ));
                    }
                }
                total += part.shape[*axis]
                    .as_static()
                    .ok_or("the concatenated axis must be static")?;
            }
            let mut shape = first.shape.clone();
            shape[*axis] = Dim::Static(total);
            Ok(TensorType {
                shape,
                ..(*first).clone()
            })
        }
        Op::Slice {
            axis,
            start,
            end,
            step,
        } => {
            arity(1)?;
            let x = inputs[0];
            check_axis(*axis, x.rank())?;
            if *step == 0 {
                return Err("step must be ≥ 1".to_owned());
            }
            let mut shape = x.shape.clone();
            shape[*axis] = match &x.shape[*axis] {
                Dim::Static(n) => {
                    let end = (*end).min(*n);
                    Dim::Static(if end > *start {
                        (end - start).div_ceil(*step)
                    } else {
                        0
                    })
                }
                sym if *start == 0 && *end == u64::MAX && *step == 1 => sym.clone(),
                _ => return Err("a symbolic axis can only be sliced whole".to_owned()),
            };
            Ok(TensorType { shape, ..x.clone() })
        }
        Op::BroadcastTo { shape } => {
            arity(1)?;
            let x = inputs[0];
            if broadcast(&x.shape, shape)? != *shape {
                return Err(format!("cannot broadcast {x} to {}", show(shape)));
            }
            Ok(TensorType {
                shape: shape.clone(),
                ..x.clone()
            })
        }
        Op::Gather { axis } => {
            arity(2)?;
            let (data, indices) = (inputs[0], inputs[1]);
            check_axis(*axis, data.rank())?;
            require_integer(indices, "indices")?;
            let mut shape = data.shape[..*axis].to_vec();
            shape.extend(indices.shape.iter().cloned());
            shape.extend(data.shape[axis + 1..].iter().cloned());
            Ok(TensorType {
                shape,
                ..data.clone()
            })
        }
        Op::Scatter { axis } => {
            arity(3)?;
            let (data, indices, updates) = (inputs[0], inputs[1], inputs[2]);
            check_axis(*axis, data.rank())?;
            require_integer(indices, "indices")?;
            if indices.shape != updates.shape || indices.rank() != data.rank() {
                return Err(format!("indices {indices} and updates {updates} must have one shape and the rank of {data}"));
            }
            if updates.dtype != data.dtype {
                return Err(format!(
                    "updates are {}, data is {}",
                    updates.dtype, data.dtype
                ));
            }
            Ok(data.clone())
        }
        Op::BandPart { .. } => {
            arity(1)?;
            if inputs[0].rank() < 2 {
                return Err("needs rank ≥ 2".to_owned());
            }
            Ok(inputs[0].clone())
        }
        Op::LayerNorm { .. } => {
            arity(3)?;
            let x = inputs[0];
            require_float(x, "input")?;
            let last = x.shape.last().ok_or("needs at least one axis")?;
            for (what, p) in [("gamma", inputs[1]), ("beta", inputs[2])] {
                if p.shape != [last.clone()] || p.dtype != x.dtype {
                    return Err(format!("{what} must be {}[{last}], got {p}", x.dtype));
                }
            }
            Ok(x.clone())
        }
        Op::RmsNorm { .. } => {
            arity(2)?;
            let (x, w) = (inputs[0], inputs[1]);
            require_float(x, "input")?;
            let last = x.shape.last().ok_or("needs at least one axis")?;
            if w.shape != [last.clone()] || w.dtype != x.dtype {
                return Err(format!("the weight must be {}[{last}], got {w}", x.dtype));
            }
            Ok(x.clone())
        }
        Op::Rope { .. } => {
            arity(3)?;
            let (x, positions, inv_freq) = (inputs[0], inputs[1], inputs[2]);
            require_float(x, "input")?;
            require_integer(positions, "positions")?;
            if x.rank() != 3 || positions.rank() != 1 || x.shape[0] != positions.shape[0] {
                return Err(format!(
                    "needs x [T, heads, head_dim] and positions [T], got {x} and {positions}"
                ));
            }
            let head_dim = x.shape[2].as_static().ok_or("head_dim must be static")?;
            if head_dim % 2 != 0
                || inv_freq.shape != [Dim::Static(head_dim / 2)]
                || inv_freq.dtype != DType::F32
            {
                return Err(format!(
                    "needs an even head_dim and inv_freq f32[{}], got {inv_freq}",
                    head_dim / 2
                ));
            }
            Ok(x.clone())
        }
        Op::PagedAttention(_) => {
            arity(6)?;
            infer_attention_operands(inputs)?;
            for (what, t, rank) in [
                ("row_offsets", inputs[3], 1),
                ("context_lens", inputs[4], 1),
                ("block_tables", inputs[5], 2),
            ] {
                require_integer(t, what)?;
                if t.rank() != rank {
                    return Err(format!("{what} must have rank {rank}, got {t}"));
                }
            }
            Ok(inputs[0].clone())
        }
        Op::SequenceAttention(_) => {
            arity(4)?;
            infer_attention_operands(inputs)?;
            require_integer(inputs[3], "row_offsets")?;
            if inputs[3].rank() != 1 {
                return Err(format!("row_offsets must have rank 1, got {}", inputs[3]));
            }
            Ok(inputs[0].clone())
        }
        Op::MixtureOfExperts(spec) => infer_moe(spec, inputs),
        Op::Print { .. } => {
            arity(1)?;
            Ok(inputs[0].clone())
        }
    }
}

/// Checks attention's `q, k, v [T, heads, head_dim]`: one float type, one
/// head size, query heads a static multiple of key/value heads.
fn infer_attention_operands(inputs: &[&TensorType]) -> Result<(), String> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    for (what, t) in [("q", q), ("k", k), ("v", v)] {
        require_float(t, what)?;
        if t.rank() != 3
            || t.shape[0] != q.shape[0]
            || t.shape[2] != q.shape[2]
            || t.dtype != q.dtype
        {
            return Err(format!(
                "q, k, v must be [T, heads, head_dim] of one type, got {q}, {k}, {v}"
            ));
        }
    }
    if k.shape[1] != v.shape[1] {
        return Err(format!("k and v head counts differ: {k} and {v}"));
    }
    match (q.shape[1].as_static(), k.shape[1].as_static()) {
        (Some(hq), Some(hkv)) if hkv > 0 && hq % hkv == 0 => {}
        _ => {
            return Err(format!(
                "query heads must be a static multiple of key/value heads, got {q} and {k}"
            ))
        }
    }
    Ok(())
}

fn require_float(t: &TensorType, what: &str) -> Result<(), String> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("needs a float {what}, got {t}"))
    }
}

fn require_integer(t: &TensorType, what: &str) -> Result<(), String> {
    if t.dtype.is_integer() {
        Ok(())
    } else {
        Err(format!("needs integer {what}, got {t}"))
    }
}

fn require_dtype(t: &TensorType, dtype: DType, what: &str) -> Result<(), String> {
    if t.dtype == dtype {
        Ok(())
    } else {
        Err(format!("needs a {dtype} {what}, got {t}"))
    }
}

fn check_axis(axis: usize, rank: usize) -> Result<(), String> {
    if axis < rank {
        Ok(())
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}

fn reduced(shape: &[Dim], axis: usize, keep_dims: bool) -> Vec<Dim> {
    let mut shape = shape.to_vec();
    if keep_dims {
        shape[axis] = Dim::Static(1);
    } else {
        shape.remove(axis);
    }
    shape
}

/// Numpy broadcasting of two shapes. A symbolic dimension matches itself or 1.
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, String> {
    let rank = a.len().max(b.len());
    let one = Dim::Static(1);
    (0..rank)
        .map(|i| {
            let da = if i + a.len() >= rank {
                &a[i + a.len() - rank]
            } else {
                &one
            };
            let db = if i + b.len() >= rank {
                &b[i + b.len() - rank]
            } else {
                &one
            };
            match (da, db) {
                (x, y) if x == y => Ok(x.clone()),
                (Dim::Static(1), y) => Ok(y.clone()),
                (x, Dim::Static(1)) => Ok(x.clone()),
                _ => Err(format!(
                    "shapes {} and {} do not broadcast",
                    show(a),
                    show(b)
                )),
            }
        })
        .collect()
}

/// The element count of a shape as (static product, symbol multiplicities).
pub fn numel(shape: &[Dim]) -> (u64, BTreeMap<String, u32>) {
    let mut product = 1u64;
    let mut symbols = BTreeMap::new();
    for dim in shape {
        match dim {
            Dim::Static(n) => product = product.saturating_mul(*n),
            Dim::Symbolic(name) => *symbols.entry(name.clone()).or_insert(0) += 1,
        }
    }
    (product, symbols)
}

/// A shape as `[a, b, c]`.
pub fn show(shape: &[Dim]) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// [`Op::MixtureOfExperts`]: x `[T, H]`, logits `[T, E]`, the bias `[E]` if
/// any, then E gates and E ups `[I, H]` and E downs `[H, I]`; out like x.
fn infer_moe(spec: &MoeSpec, inputs: &[&TensorType]) -> Result<TensorType, String> {
    let experts = spec.num_experts as usize;
    let lead = spec.leading_inputs();
    if inputs.len() != lead + 3 * experts {
        return Err(format!(
            "expects {} operands ({lead} then 3 × {experts} expert weights), got {}",
            lead + 3 * experts,
            inputs.len()
        ));
    }
    if spec.top_k == 0 || spec.top_k > spec.num_experts {
        return Err(format!(
            "top_k {} must lie in 1..={} experts",
            spec.top_k, spec.num_experts
        ));
    }
    if let MoeRouting::Sigmoid {
        groups, top_groups, ..
    } = spec.routing
    {
        let fits = groups > 0
            && spec.num_experts.is_multiple_of(groups)
            && (1..=groups).contains(&top_groups)
            && spec.top_k <= top_groups * (spec.num_experts / groups);
        if !fits {
            return Err(format!(
                "{} experts in {groups} groups, {top_groups} of them picked, cannot give top_k {}",
                spec.num_experts, spec.top_k
            ));
        }
    }
    if !matches!(
        spec.activation,
        UnaryOp::Silu | UnaryOp::Gelu | UnaryOp::GeluTanh | UnaryOp::Relu
    ) {
        return Err(format!(
            "expert activation {:?} is not one of silu, gelu, gelu_tanh, relu",
            spec.activation
        ));
    }
    let (x, logits) = (inputs[0], inputs[1]);
    require_float(x, "x")?;
    require_float(logits, "router_logits")?;
    let static_dim = |t: &TensorType, axis: usize| t.shape.get(axis).and_then(Dim::as_static);
    let hidden = match (x.rank(), static_dim(x, 1)) {
        (2, Some(h)) => h,
        _ => {
            return Err(format!(
                "x must be [T, hidden] with a static hidden, got {x}"
            ))
        }
    };
    if logits.rank() != 2
        || logits.shape[0] != x.shape[0]
        || static_dim(logits, 1) != Some(experts as u64)
    {
        return Err(format!(
            "router_logits must be [T, {experts}] for x {x}, got {logits}"
        ));
    }
    if lead == 3 && inputs[2].shape != [Dim::Static(experts as u64)] {
        return Err(format!(
            "the correction bias must be [{experts}], got {}",
            inputs[2]
        ));
    }
    let weights = &inputs[lead..];
    let intermediate = static_dim(weights[0], 0).unwrap_or(0);
    for (i, w) in weights.iter().enumerate() {
        let (what, expected) = match i / experts {
            0 => ("gate", [intermediate, hidden]),
            1 => ("up", [intermediate, hidden]),
            _ => ("down", [hidden, intermediate]),
        };
        let dims: Vec<Option<u64>> = (0..w.rank()).map(|a| static_dim(w, a)).collect();
        if dims != [Some(expected[0]), Some(expected[1])] || !w.dtype.is_float() {
            return Err(format!(
                "expert {} {what} must be a float [{}, {}], got {w}",
                i % experts,
                expected[0],
                expected[1]
            ));
        }
    }
    Ok(x.clone())
}
