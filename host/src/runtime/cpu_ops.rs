//! CPU implementations of the graph ops on concrete [`Tensor`]s (everything
//! but paged attention, which needs the KV cache, and the weight products:
//! see `executor.rs`).

use kiln_kernels::dense::{activation, attention, matmul, norm, rope};
use kiln_plugin_api::graph::{
    BinaryOp, DType, Op, ReduceOp, SequenceAttentionSpec, TopKOutput, UnaryOp,
};

use rayon::prelude::*;

use super::broadcast::{self, broadcast_offsets, strided_offsets, Broadcast};
use super::pool::BufferPool;
use super::tensor::{storage_of, strides, wrap_integers, Data, Storage, Tensor};

/// A failed op, with its reason (the executor adds the op and module).
pub type OpResult = Result<Tensor, String>;

/// Evaluates an op whose inputs are all available; `shape` is the output's
/// concrete shape and `dtype` its type (from the compiled graph).
pub fn eval(
    op: &Op,
    inputs: &[&Tensor],
    dtype: DType,
    shape: Vec<usize>,
    pool: &BufferPool,
) -> OpResult {
    match op {
        Op::Unary { op } => Ok(unary(*op, inputs[0])),
        Op::Binary { op } => binary(*op, inputs[0], inputs[1], shape, pool),
        Op::Where => Ok(where_(inputs[0], inputs[1], inputs[2], shape)),
        Op::Cast { dtype } => Ok(cast(inputs[0], *dtype)),
        Op::Reduce { op, axis, .. } => Ok(reduce(inputs[0], *op, *axis, shape)),
        Op::ArgMax { axis, .. } => Ok(argmax(inputs[0], *axis, shape)),
        Op::TopK { k, output } => Ok(top_k(inputs[0], *k as usize, *output, shape)),
        Op::Softmax { axis } => Ok(softmax(inputs[0], *axis, false, pool)),
        Op::LogSoftmax { axis } => Ok(softmax(inputs[0], *axis, true, pool)),
        Op::MatMul => Ok(batched_matmul(inputs[0], inputs[1], shape, pool)),
        Op::Reshape { .. } | Op::Print { .. } => Ok(Tensor {
            shape,
            ..inputs[0].clone()
        }),
        Op::Permute { perm } => Ok(permute(inputs[0], perm)),
        Op::Concat { axis } => Ok(concat(inputs, *axis, shape)),
        Op::Slice {
            axis, start, step, ..
        } => Ok(slice(
            inputs[0],
            *axis,
            *start as usize,
            *step as usize,
            shape,
        )),
        Op::BroadcastTo { .. } => Ok(broadcast_to(inputs[0], shape)),
        Op::Gather { axis } => gather(inputs[0], inputs[1], *axis),
        Op::Scatter { axis } => scatter(inputs[0], inputs[1], inputs[2], *axis),
        Op::BandPart {
            num_lower,
            num_upper,
            exclude,
        } => Ok(band_part(inputs[0], *num_lower, *num_upper, *exclude)),
        Op::Range { start, step } => {
            let values: Vec<f64> = (0..shape[0]).map(|i| start + step * i as f64).collect();
            Ok(Tensor::from_f64(dtype, shape, &values))
        }
        Op::LayerNorm { eps } => {
            let x = inputs[0];
            let (gamma, beta) = (inputs[1].as_f32(), inputs[2].as_f32());
            let mut out = pool.take_for_overwrite(x.len());
            by_rows(x.as_f32(), &mut out, gamma.len(), |_, x, out| {
                norm::layer_norm_rows(x, gamma, beta, *eps, out)
            });
            Ok(Tensor::from_f32(x.dtype, shape, out))
        }
        Op::RmsNorm { eps, weight_offset } => {
            let x = inputs[0];
            let weight = inputs[1].as_f32();
            let mut out = pool.take_for_overwrite(x.len());
            by_rows(x.as_f32(), &mut out, weight.len(), |_, x, out| {
                norm::rms_norm_rows(x, weight, *weight_offset, *eps, out)
            });
            Ok(Tensor::from_f32(x.dtype, shape, out))
        }
        Op::Rope { interleaved, scale } => {
            let x = inputs[0];
            let positions = inputs[1].as_i64();
            let mut out = pool.take_for_overwrite(x.len());
            let (heads, cols) = (x.shape[1], x.len() / positions.len().max(1));
            by_rows(x.as_f32(), &mut out, cols, |row0, x, out| {
                out.copy_from_slice(x);
                let rows = out.len() / cols;
                rope::rope(
                    out,
                    &positions[row0..row0 + rows],
                    inputs[2].as_f32(),
                    heads,
                    *interleaved,
                    *scale,
                );
            });
            Ok(Tensor::from_f32(x.dtype, shape, out))
        }
        Op::SequenceAttention(spec) => sequence_attention(spec, inputs, shape, pool),
        Op::Input { .. }
        | Op::Weight { .. }
        | Op::Constant(_)
        | Op::PagedAttention(_)
        | Op::MixtureOfExperts(_) => Err(format!("`{}` is not evaluated by cpu_ops", op.name())),
    }
}

/// Rows a task takes in the row-wise ops (norms, rotary embedding).
const ROWS_PER_TASK: usize = 8;

/// Runs `f` over the rows (of `cols` values) of `x` and `out` in parallel
/// groups of rows; `f` gets the index of its group's first row. Each row's
/// result is the same whichever group computes it.
fn by_rows(x: &[f32], out: &mut [f32], cols: usize, f: impl Fn(usize, &[f32], &mut [f32]) + Sync) {
    let step = ROWS_PER_TASK * cols.max(1);
    x.par_chunks(step)
        .zip(out.par_chunks_mut(step))
        .enumerate()
        .for_each(|(i, (x, out))| f(i * ROWS_PER_TASK, x, out));
}

/// Attention within each sequence of `row_offsets` (`[q, k, v,
/// row_offsets]`), with no cache.
fn sequence_attention(
    spec: &SequenceAttentionSpec,
    inputs: &[&Tensor],
    shape: Vec<usize>,
    pool: &BufferPool,
) -> OpResult {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let tokens = q.shape[0];
    let offsets = inputs[3].as_i64();
    check_row_offsets(tokens, offsets)?;
    let offsets: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
    let mut out = pool.take(q.len());
    attention::sequence_attention(
        q.as_f32(),
        k.as_f32(),
        v.as_f32(),
        &mut out,
        q.shape[1],
        k.shape[1],
        &offsets,
        spec.scale,
        spec.causal,
    );
    Ok(Tensor::from_f32(q.dtype, shape, out))
}

/// Checks sequence attention's `row_offsets` against `tokens` rows: from 0
/// to `tokens`, never falling (both backends check before attending).
pub(crate) fn check_row_offsets(tokens: usize, offsets: &[i64]) -> Result<(), String> {
    let in_order = offsets.first() == Some(&0)
        && offsets.last() == Some(&(tokens as i64))
        && offsets.windows(2).all(|pair| pair[0] <= pair[1]);
    if in_order {
        Ok(())
    } else {
        Err(format!(
            "row_offsets must rise from 0 to the {tokens} rows, got {offsets:?}"
        ))
    }
}

/// Applies a unary op element-wise.
pub fn unary(op: UnaryOp, x: &Tensor) -> Tensor {
    match &x.data {
        Data::F32(v) => {
            let mut values = v.clone();
            unary_f32_in_place(op, &mut values);
            Tensor::from_f32(x.dtype, x.shape.clone(), values)
        }
        Data::I64(v) => {
            let values = v
                .iter()
                .map(|&a| match op {
                    UnaryOp::Neg => a.wrapping_neg(),
                    _ => a.wrapping_abs(),
                })
                .collect();
            Tensor {
                data: Data::I64(values),
                ..x.clone()
            }
        }
        Data::Bool(v) => Tensor::bool(x.shape.clone(), v.iter().map(|&a| !a).collect()),
    }
}

/// Applies a unary op to f32 values in place (vectorized where a kernel exists).
pub fn unary_f32_in_place(op: UnaryOp, x: &mut [f32]) {
    match op {
        UnaryOp::Silu => activation::silu(x),
        UnaryOp::GeluTanh => activation::gelu_tanh(x),
        UnaryOp::Gelu => activation::gelu(x),
        _ => {
            let f = unary_f32(op);
            x.iter_mut().for_each(|v| *v = f(*v));
        }
    }
}

/// The f32 function of a unary op.
pub fn unary_f32(op: UnaryOp) -> fn(f32) -> f32 {
    match op {
        UnaryOp::Neg => |a| -a,
        UnaryOp::Abs => f32::abs,
        UnaryOp::Exp => f32::exp,
        UnaryOp::Log => f32::ln,
        UnaryOp::Sqrt => f32::sqrt,
        UnaryOp::Rsqrt => |a| 1.0 / a.sqrt(),
        UnaryOp::Recip => |a| 1.0 / a,
        UnaryOp::Square => |a| a * a,
        UnaryOp::Sin => f32::sin,
        UnaryOp::Cos => f32::cos,
        UnaryOp::Tanh => f32::tanh,
        UnaryOp::Sigmoid => |a| 1.0 / (1.0 + (-a).exp()),
        UnaryOp::Relu => |a| a.max(0.0),
        UnaryOp::Silu => activation::silu_scalar,
        UnaryOp::Gelu => activation::gelu_scalar,
        UnaryOp::GeluTanh => activation::gelu_tanh_scalar,
        UnaryOp::Floor => f32::floor,
        UnaryOp::Ceil => f32::ceil,
        UnaryOp::Not => |a| f32::from(u8::from(a == 0.0)),
    }
}

fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, shape: Vec<usize>, pool: &BufferPool) -> OpResult {
    // Float arithmetic (a residual add, a bias over rows): in parallel
    // chunks, the output buffer from the pool.
    if let (Data::F32(x), Data::F32(y)) = (&a.data, &b.data) {
        if !op.is_predicate() {
            let (pa, pb) = (
                Broadcast::of(&a.shape, &shape),
                Broadcast::of(&b.shape, &shape),
            );
            let mut out = pool.take_for_overwrite(shape.iter().product());
            broadcast::arithmetic(op, (x, &pa), (y, &pb), &mut out);
            return Ok(Tensor::from_f32(a.dtype, shape, out));
        }
    }
    let oa = broadcast_offsets(&a.shape, &shape);
    let ob = broadcast_offsets(&b.shape, &shape);
    let pairs = oa.iter().zip(&ob);
    Ok(match (&a.data, &b.data) {
        // Comparisons: float arithmetic returned above.
        (Data::F32(x), Data::F32(y)) => {
            let f = compare_f32(op);
            Tensor::bool(shape, pairs.map(|(&i, &j)| f(x[i], y[j])).collect())
        }
        (Data::I64(x), Data::I64(y)) => {
            if op.is_predicate() {
                let f = compare_i64(op);
                Tensor::bool(shape, pairs.map(|(&i, &j)| f(x[i], y[j])).collect())
            } else {
                let values = pairs
                    .map(|(&i, &j)| arithmetic_i64(op, x[i], y[j]))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut t = Tensor::i64(shape, values);
                t.dtype = a.dtype;
                t
            }
        }
        (Data::Bool(x), Data::Bool(y)) => {
            let f = |p: bool, q: bool| match op {
                BinaryOp::And => p && q,
                BinaryOp::Or => p || q,
                BinaryOp::Equal => p == q,
                BinaryOp::NotEqual => p != q,
                BinaryOp::Greater => p & !q,
                BinaryOp::GreaterEqual => p >= q,
                BinaryOp::Less => !p & q,
                _ => p <= q,
            };
            Tensor::bool(shape, pairs.map(|(&i, &j)| f(x[i], y[j])).collect())
        }
        _ => return Err("operands of different storage types".to_owned()),
    })
}

/// The f32 function of an arithmetic binary op.
pub fn arithmetic_f32(op: BinaryOp) -> fn(f32, f32) -> f32 {
    match op {
        BinaryOp::Add => |a, b| a + b,
        BinaryOp::Sub => |a, b| a - b,
        BinaryOp::Mul => |a, b| a * b,
        BinaryOp::Div => |a, b| a / b,
        BinaryOp::Pow => f32::powf,
        BinaryOp::Maximum => |a, b| {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else {
                a.max(b)
            }
        },
        BinaryOp::Minimum => |a, b| {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else {
                a.min(b)
            }
        },
        _ => |_, _| f32::NAN,
    }
}

/// The f32 predicate of a comparison op.
pub fn compare_f32(op: BinaryOp) -> fn(f32, f32) -> bool {
    match op {
        BinaryOp::Equal => |a, b| a == b,
        BinaryOp::NotEqual => |a, b| a != b,
        BinaryOp::Greater => |a, b| a > b,
        BinaryOp::GreaterEqual => |a, b| a >= b,
        BinaryOp::Less => |a, b| a < b,
        _ => |a, b| a <= b,
    }
}

fn compare_i64(op: BinaryOp) -> fn(i64, i64) -> bool {
    match op {
        BinaryOp::Equal => |a, b| a == b,
        BinaryOp::NotEqual => |a, b| a != b,
        BinaryOp::Greater => |a, b| a > b,
        BinaryOp::GreaterEqual => |a, b| a >= b,
        BinaryOp::Less => |a, b| a < b,
        _ => |a, b| a <= b,
    }
}

fn arithmetic_i64(op: BinaryOp, a: i64, b: i64) -> Result<i64, String> {
    Ok(match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div if b == 0 => return Err("integer division by zero".to_owned()),
        // Floor division, like PyTorch's `//` on integers.
        BinaryOp::Div => a.div_euclid(b) - i64::from(b < 0 && a.rem_euclid(b) != 0),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        _ => return Err(format!("{op:?} is not defined on integers")),
    })
}

fn where_(cond: &Tensor, a: &Tensor, b: &Tensor, shape: Vec<usize>) -> Tensor {
    let Data::Bool(c) = &cond.data else {
        unreachable!("verified: bool condition")
    };
    let oc = broadcast_offsets(&cond.shape, &shape);
    let oa = broadcast_offsets(&a.shape, &shape);
    let ob = broadcast_offsets(&b.shape, &shape);
    let pick = |i: usize| c[oc[i]];
    let data = match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => Data::F32(
            (0..oc.len())
                .map(|i| if pick(i) { x[oa[i]] } else { y[ob[i]] })
                .collect(),
        ),
        (Data::I64(x), Data::I64(y)) => Data::I64(
            (0..oc.len())
                .map(|i| if pick(i) { x[oa[i]] } else { y[ob[i]] })
                .collect(),
        ),
        (Data::Bool(x), Data::Bool(y)) => Data::Bool(
            (0..oc.len())
                .map(|i| if pick(i) { x[oa[i]] } else { y[ob[i]] })
                .collect(),
        ),
        _ => unreachable!("verified: branches of one type"),
    };
    Tensor {
        dtype: a.dtype,
        shape,
        data,
    }
}

/// Converts to `dtype` (float → integer truncates toward zero).
pub fn cast(x: &Tensor, dtype: DType) -> Tensor {
    let shape = x.shape.clone();
    match (storage_of(dtype), &x.data) {
        (Storage::F32, Data::F32(v)) => Tensor::from_f32(dtype, shape, v.clone()),
        (Storage::F32, Data::I64(v)) => {
            Tensor::from_f32(dtype, shape, v.iter().map(|&a| a as f32).collect())
        }
        (Storage::F32, Data::Bool(v)) => Tensor::from_f32(
            dtype,
            shape,
            v.iter().map(|&a| f32::from(u8::from(a))).collect(),
        ),
        (Storage::I64, data) => {
            let mut values: Vec<i64> = match data {
                Data::F32(v) => v.iter().map(|&a| a as i64).collect(),
                Data::I64(v) => v.clone(),
                Data::Bool(v) => v.iter().map(|&a| i64::from(a)).collect(),
            };
            wrap_integers(dtype, &mut values);
            Tensor {
                dtype,
                shape,
                data: Data::I64(values),
            }
        }
        (Storage::Bool, data) => Tensor::bool(
            shape,
            match data {
                Data::F32(v) => v.iter().map(|&a| a != 0.0).collect(),
                Data::I64(v) => v.iter().map(|&a| a != 0).collect(),
                Data::Bool(v) => v.clone(),
            },
        ),
    }
}

/// (outer, size, inner) of an axis.
fn split_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

fn reduce(x: &Tensor, op: ReduceOp, axis: usize, shape: Vec<usize>) -> Tensor {
    let (outer, n, inner) = split_axis(&x.shape, axis);
    let values = x.to_f64();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let items = (0..n).map(|j| values[(o * n + j) * inner + i]);
            let r = match op {
                ReduceOp::Sum => items.sum::<f64>(),
                ReduceOp::Mean => items.sum::<f64>() / n as f64,
                ReduceOp::Max => items.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => items.fold(f64::INFINITY, f64::min),
            };
            out.push(r);
        }
    }
    Tensor::from_f64(x.dtype, shape, &out)
}

fn argmax(x: &Tensor, axis: usize, shape: Vec<usize>) -> Tensor {
    let (outer, n, inner) = split_axis(&x.shape, axis);
    let values = x.to_f64();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best = 0;
            for j in 1..n {
                if values[(o * n + j) * inner + i] > values[(o * n + best) * inner + i] {
                    best = j;
                }
            }
            out.push(best as i64);
        }
    }
    Tensor::i64(shape, out)
}

fn top_k(x: &Tensor, k: usize, output: TopKOutput, shape: Vec<usize>) -> Tensor {
    let n = *x.shape.last().expect("verified: rank ≥ 1");
    let values = x.to_f64();
    let mut picked = Vec::with_capacity(values.len() / n.max(1) * k);
    for row in values.chunks(n.max(1)) {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        picked.extend(order[..k].iter().map(|&j| (j, row[j])));
    }
    match output {
        TopKOutput::Values => Tensor::from_f64(
            x.dtype,
            shape,
            &picked.iter().map(|p| p.1).collect::<Vec<_>>(),
        ),
        TopKOutput::Indices => Tensor::i64(shape, picked.iter().map(|p| p.0 as i64).collect()),
    }
}

fn softmax(x: &Tensor, axis: usize, log: bool, pool: &BufferPool) -> Tensor {
    let (outer, n, inner) = split_axis(&x.shape, axis);
    let src = x.as_f32();
    let mut out = pool.take(src.len());
    let mut row = vec![0f32; n];
    for o in 0..outer {
        for i in 0..inner {
            for j in 0..n {
                row[j] = src[(o * n + j) * inner + i];
            }
            if log {
                norm::log_softmax_rows(&mut row, n);
            } else {
                norm::softmax_rows(&mut row, n);
            }
            for j in 0..n {
                out[(o * n + j) * inner + i] = row[j];
            }
        }
    }
    Tensor::from_f32(x.dtype, x.shape.clone(), out)
}

fn batched_matmul(a: &Tensor, b: &Tensor, shape: Vec<usize>, pool: &BufferPool) -> Tensor {
    let (ra, rb, r) = (a.shape.len(), b.shape.len(), shape.len());
    let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
    let batch_shape = &shape[..r - 2];
    let batches: usize = batch_shape.iter().product();
    let a_batches = broadcast_offsets(&a.shape[..ra - 2], batch_shape);
    let b_batches = broadcast_offsets(&b.shape[..rb - 2], batch_shape);
    let (x, y) = (a.as_f32(), b.as_f32());
    let mut out = pool.take(batches * m * n);
    for (batch, c) in out.chunks_mut((m * n).max(1)).enumerate().take(batches) {
        let (ia, ib) = (a_batches[batch], b_batches[batch]);
        matmul::matmul(
            &x[ia * m * k..(ia + 1) * m * k],
            &y[ib * k * n..(ib + 1) * k * n],
            c,
            m,
            k,
            n,
        );
    }
    Tensor::from_f32(a.dtype, shape, out)
}

/// Gathers elements by offsets.
fn take(data: &Data, offsets: &[usize]) -> Data {
    match data {
        Data::F32(v) => Data::F32(offsets.iter().map(|&i| v[i]).collect()),
        Data::I64(v) => Data::I64(offsets.iter().map(|&i| v[i]).collect()),
        Data::Bool(v) => Data::Bool(offsets.iter().map(|&i| v[i]).collect()),
    }
}

/// Materializes an axis permutation.
pub fn permute(x: &Tensor, perm: &[usize]) -> Tensor {
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let in_strides = strides(&x.shape);
    let permuted: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let offsets = strided_offsets(&shape, &permuted);
    Tensor {
        dtype: x.dtype,
        shape,
        data: take(&x.data, &offsets),
    }
}

fn concat(parts: &[&Tensor], axis: usize, shape: Vec<usize>) -> Tensor {
    let outer: usize = shape[..axis].iter().product();
    let mut offsets_by_part = Vec::new();
    // Build the output as a sequence of (part, offset) picks.
    for o in 0..outer {
        for (p, part) in parts.iter().enumerate() {
            let (_, n, inner) = split_axis(&part.shape, axis);
            let chunk = n * inner;
            offsets_by_part.extend((o * chunk..(o + 1) * chunk).map(|i| (p, i)));
        }
    }
    let data = match &parts[0].data {
        Data::F32(_) => Data::F32(
            offsets_by_part
                .iter()
                .map(|&(p, i)| parts[p].as_f32()[i])
                .collect(),
        ),
        Data::I64(_) => Data::I64(
            offsets_by_part
                .iter()
                .map(|&(p, i)| parts[p].as_i64()[i])
                .collect(),
        ),
        Data::Bool(_) => Data::Bool(
            offsets_by_part
                .iter()
                .map(|&(p, i)| match &parts[p].data {
                    Data::Bool(v) => v[i],
                    _ => unreachable!("verified: parts of one type"),
                })
                .collect(),
        ),
    };
    Tensor {
        dtype: parts[0].dtype,
        shape,
        data,
    }
}

fn slice(x: &Tensor, axis: usize, start: usize, step: usize, shape: Vec<usize>) -> Tensor {
    let (outer, n, inner) = split_axis(&x.shape, axis);
    let count = shape[axis];
    let mut offsets = Vec::with_capacity(outer * count * inner);
    for o in 0..outer {
        for c in 0..count {
            let j = start + c * step;
            offsets.extend((0..inner).map(|i| (o * n + j) * inner + i));
        }
    }
    Tensor {
        dtype: x.dtype,
        shape,
        data: take(&x.data, &offsets),
    }
}

fn broadcast_to(x: &Tensor, shape: Vec<usize>) -> Tensor {
    let offsets = broadcast_offsets(&x.shape, &shape);
    Tensor {
        dtype: x.dtype,
        shape,
        data: take(&x.data, &offsets),
    }
}

fn gather(data: &Tensor, indices: &Tensor, axis: usize) -> OpResult {
    let (outer, n, inner) = split_axis(&data.shape, axis);
    let idx = indices.as_i64();
    let mut offsets = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for &j in idx {
            let j = usize::try_from(j)
                .ok()
                .filter(|&j| j < n)
                .ok_or_else(|| format!("index {j} is out of range for an axis of {n}"))?;
            offsets.extend((0..inner).map(|i| (o * n + j) * inner + i));
        }
    }
    let mut shape = data.shape[..axis].to_vec();
    shape.extend(&indices.shape);
    shape.extend(&data.shape[axis + 1..]);
    Ok(Tensor {
        dtype: data.dtype,
        shape,
        data: take(&data.data, &offsets),
    })
}

fn scatter(data: &Tensor, indices: &Tensor, updates: &Tensor, axis: usize) -> OpResult {
    let mut out = data.clone();
    let data_strides = strides(&data.shape);
    let idx_strides = strides(&indices.shape);
    let idx = indices.as_i64();
    for (flat, &target) in idx.iter().enumerate() {
        let target = usize::try_from(target)
            .ok()
            .filter(|&t| t < data.shape[axis])
            .ok_or_else(|| {
                format!(
                    "index {target} is out of range for an axis of {}",
                    data.shape[axis]
                )
            })?;
        let mut offset = 0;
        for d in 0..indices.shape.len() {
            let coordinate = if d == axis {
                target
            } else {
                (flat / idx_strides[d]) % indices.shape[d]
            };
            offset += coordinate * data_strides[d];
        }
        match (&mut out.data, &updates.data) {
            (Data::F32(o), Data::F32(u)) => o[offset] = u[flat],
            (Data::I64(o), Data::I64(u)) => o[offset] = u[flat],
            (Data::Bool(o), Data::Bool(u)) => o[offset] = u[flat],
            _ => unreachable!("verified: updates of the data's type"),
        }
    }
    Ok(out)
}

fn band_part(x: &Tensor, num_lower: i64, num_upper: i64, exclude: bool) -> Tensor {
    let r = x.shape.len();
    let (m, n) = (x.shape[r - 2], x.shape[r - 1]);
    let keep = |flat: usize| {
        let (i, j) = (((flat / n) % m) as i64, (flat % n) as i64);
        let inside = (num_lower < 0 || i - j <= num_lower) && (num_upper < 0 || j - i <= num_upper);
        inside != exclude
    };
    let mut out = x.clone();
    match &mut out.data {
        Data::F32(v) => v
            .iter_mut()
            .enumerate()
            .filter(|(f, _)| !keep(*f))
            .for_each(|(_, e)| *e = 0.0),
        Data::I64(v) => v
            .iter_mut()
            .enumerate()
            .filter(|(f, _)| !keep(*f))
            .for_each(|(_, e)| *e = 0),
        Data::Bool(v) => v
            .iter_mut()
            .enumerate()
            .filter(|(f, _)| !keep(*f))
            .for_each(|(_, e)| *e = false),
    }
    out
}
