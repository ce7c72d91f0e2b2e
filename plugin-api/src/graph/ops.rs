//! Operations on [`TensorValue`]s, close to `max.graph.ops`. Each records a
//! node in the operands' graph (see [`super::Graph`] for error handling).
//! Axes may be negative (counted from the end).

use std::ops::{Add, Div, Mul, Neg, Sub};

use super::builder::TensorValue;
pub use super::encoder::sequence_attention;
use super::infer::{numel, show};
use super::ir::{AttentionSpec, BinaryOp, MoeSpec, Op, ReduceOp, TopKOutput, UnaryOp};
use super::types::{DType, Dim};

/// Resolves a possibly negative axis against `rank` (`rank` itself is
/// allowed when `inclusive`, for inserting an axis at the end).
fn axis(x: &TensorValue, op: &str, axis: i64, inclusive: bool) -> Option<usize> {
    let rank = x.rank() as i64 + i64::from(inclusive);
    let resolved = if axis < 0 { axis + rank } else { axis };
    if (0..rank).contains(&resolved) {
        Some(resolved as usize)
    } else {
        x.graph().fail(
            op,
            format!("axis {axis} is out of range for rank {}", x.rank()),
        );
        None
    }
}

fn poisoned(x: &TensorValue) -> TensorValue {
    // Re-applying an op with a poisoned operand yields a poisoned value.
    x.graph().fail("(after an earlier error)", String::new())
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident => $op:ident),+ $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(x: &TensorValue) -> TensorValue {
            x.graph().apply(Op::Unary { op: UnaryOp::$op }, &[x])
        }
    )+};
}

unary_ops! {
    /// `-x`.
    neg => Neg,
    /// `|x|`.
    abs => Abs,
    /// `e^x`.
    exp => Exp,
    /// Natural logarithm.
    log => Log,
    /// Square root.
    sqrt => Sqrt,
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt,
    /// `1 / x`.
    reciprocal => Recip,
    /// `x * x`.
    square => Square,
    /// Sine.
    sin => Sin,
    /// Cosine.
    cos => Cos,
    /// Hyperbolic tangent.
    tanh => Tanh,
    /// Logistic sigmoid.
    sigmoid => Sigmoid,
    /// `max(x, 0)`.
    relu => Relu,
    /// `x * sigmoid(x)`.
    silu => Silu,
    /// GELU with the exact erf.
    gelu => Gelu,
    /// GELU with the tanh approximation (`approximate="tanh"`).
    gelu_tanh => GeluTanh,
    /// Round down.
    floor => Floor,
    /// Round up.
    ceil => Ceil,
    /// Logical not of a bool tensor.
    logical_not => Not,
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident => $op:ident),+ $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(a: &TensorValue, b: &TensorValue) -> TensorValue {
            a.graph().apply(Op::Binary { op: BinaryOp::$op }, &[a, b])
        }
    )+};
}

binary_ops! {
    /// `a + b`.
    add => Add,
    /// `a - b`.
    sub => Sub,
    /// `a * b`.
    mul => Mul,
    /// `a / b`.
    div => Div,
    /// `a ^ b`.
    pow => Pow,
    /// Element-wise maximum.
    maximum => Maximum,
    /// Element-wise minimum.
    minimum => Minimum,
    /// `a == b`.
    equal => Equal,
    /// `a != b`.
    not_equal => NotEqual,
    /// `a > b`.
    greater => Greater,
    /// `a >= b`.
    greater_equal => GreaterEqual,
    /// `a < b`.
    less => Less,
    /// `a <= b`.
    less_equal => LessEqual,
    /// Logical and of bool tensors.
    logical_and => And,
    /// Logical or of bool tensors.
    logical_or => Or,
}

/// A scalar constant of `x`'s dtype, to combine with `x`.
pub fn scalar_like(x: &TensorValue, value: f64) -> TensorValue {
    x.graph().scalar(value, x.dtype())
}

/// `cond ? a : b`.
pub fn where_(cond: &TensorValue, a: &TensorValue, b: &TensorValue) -> TensorValue {
    cond.graph().apply(Op::Where, &[cond, a, b])
}

/// Converts to `dtype`.
pub fn cast(x: &TensorValue, dtype: DType) -> TensorValue {
    x.graph().apply(Op::Cast { dtype }, &[x])
}

fn reduce(x: &TensorValue, op: ReduceOp, ax: i64, keep_dims: bool) -> TensorValue {
    match axis(x, "reduce", ax, false) {
        Some(axis) => x.graph().apply(
            Op::Reduce {
                op,
                axis,
                keep_dims,
            },
            &[x],
        ),
        None => poisoned(x),
    }
}

/// Sum along `axis`.
pub fn sum(x: &TensorValue, axis: i64, keep_dims: bool) -> TensorValue {
    reduce(x, ReduceOp::Sum, axis, keep_dims)
}

/// Mean along `axis`.
pub fn mean(x: &TensorValue, axis: i64, keep_dims: bool) -> TensorValue {
    reduce(x, ReduceOp::Mean, axis, keep_dims)
}

/// Maximum along `axis`.
pub fn max(x: &TensorValue, axis: i64, keep_dims: bool) -> TensorValue {
    reduce(x, ReduceOp::Max, axis, keep_dims)
}

/// Minimum along `axis`.
pub fn min(x: &TensorValue, axis: i64, keep_dims: bool) -> TensorValue {
    reduce(x, ReduceOp::Min, axis, keep_dims)
}

/// Index of the maximum along `axis` (the first one on ties), as i64.
pub fn argmax(x: &TensorValue, ax: i64, keep_dims: bool) -> TensorValue {
    match axis(x, "argmax", ax, false) {
        Some(axis) => x.graph().apply(Op::ArgMax { axis, keep_dims }, &[x]),
        None => poisoned(x),
    }
}

/// The `k` largest values along the last axis, descending, and their indices.
pub fn top_k(x: &TensorValue, k: u64) -> (TensorValue, TensorValue) {
    let graph = x.graph();
    (
        graph.apply(
            Op::TopK {
                k,
                output: TopKOutput::Values,
            },
            &[x],
        ),
        graph.apply(
            Op::TopK {
                k,
                output: TopKOutput::Indices,
            },
            &[x],
        ),
    )
}

/// Softmax along `axis`.
pub fn softmax(x: &TensorValue, ax: i64) -> TensorValue {
    match axis(x, "softmax", ax, false) {
        Some(axis) => x.graph().apply(Op::Softmax { axis }, &[x]),
        None => poisoned(x),
    }
}

/// Log-softmax along `axis`.
pub fn log_softmax(x: &TensorValue, ax: i64) -> TensorValue {
    match axis(x, "log_softmax", ax, false) {
        Some(axis) => x.graph().apply(Op::LogSoftmax { axis }, &[x]),
        None => poisoned(x),
    }
}

/// Batched matrix product over the last two axes (batch axes broadcast).
pub fn matmul(a: &TensorValue, b: &TensorValue) -> TensorValue {
    a.graph().apply(Op::MatMul, &[a, b])
}

/// One dimension of a [`reshape`] target: a size, a symbol, or `-1` (inferred).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReshapeDim {
    /// Inferred from the element count (at most one per reshape).
    Infer,
    /// A given dimension.
    Dim(Dim),
}

impl From<i64> for ReshapeDim {
    fn from(n: i64) -> Self {
        if n < 0 {
            ReshapeDim::Infer
        } else {
            ReshapeDim::Dim(Dim::Static(n as u64))
        }
    }
}

impl From<i32> for ReshapeDim {
    fn from(n: i32) -> Self {
        i64::from(n).into()
    }
}

impl From<Dim> for ReshapeDim {
    fn from(dim: Dim) -> Self {
        ReshapeDim::Dim(dim)
    }
}

impl From<&Dim> for ReshapeDim {
    fn from(dim: &Dim) -> Self {
        ReshapeDim::Dim(dim.clone())
    }
}

impl From<&str> for ReshapeDim {
    fn from(name: &str) -> Self {
        ReshapeDim::Dim(Dim::sym(name))
    }
}

/// Same elements, new shape; one dimension may be `-1` and is inferred (it
/// may resolve to a symbolic dimension, e.g. `[T*H, D] → [-1, H, D]`).
pub fn reshape<D: Into<ReshapeDim>>(
    x: &TensorValue,
    shape: impl IntoIterator<Item = D>,
) -> TensorValue {
    let spec: Vec<ReshapeDim> = shape.into_iter().map(Into::into).collect();
    let known: Vec<Dim> = spec
        .iter()
        .filter_map(|d| match d {
            ReshapeDim::Dim(dim) => Some(dim.clone()),
            ReshapeDim::Infer => None,
        })
        .collect();
    let inferred = match spec.len() - known.len() {
        0 => None,
        1 => match infer_dim(x.shape(), &known) {
            Some(dim) => Some(dim),
            None => {
                return x.graph().fail(
                    "reshape",
                    format!("cannot infer -1 when reshaping {} to {spec:?}", x.ty()),
                )
            }
        },
        _ => {
            return x
                .graph()
                .fail("reshape", "more than one -1 in the shape".to_owned())
        }
    };
    let shape = spec
        .into_iter()
        .map(|d| match d {
            ReshapeDim::Dim(dim) => dim,
            ReshapeDim::Infer => inferred.clone().expect("one -1 was resolved"),
        })
        .collect();
    x.graph().apply(Op::Reshape { shape }, &[x])
}

/// The dimension `d` with `numel(known + [d]) == numel(shape)`, if one exists.
fn infer_dim(shape: &[Dim], known: &[Dim]) -> Option<Dim> {
    let (total, mut symbols) = numel(shape);
    let (part, part_symbols) = numel(known);
    for (name, count) in part_symbols {
        let left = symbols.get_mut(&name)?;
        *left = left.checked_sub(count)?;
    }
    symbols.retain(|_, count| *count > 0);
    if part == 0 || total % part != 0 {
        return None;
    }
    let quotient = total / part;
    match (symbols.len(), quotient) {
        (0, n) => Some(Dim::Static(n)),
        (1, 1) => {
            let (name, count) = symbols.into_iter().next()?;
            (count == 1).then_some(Dim::Symbolic(name))
        }
        _ => None,
    }
}

/// Swaps two axes.
pub fn transpose(x: &TensorValue, a: i64, b: i64) -> TensorValue {
    let (Some(a), Some(b)) = (
        axis(x, "transpose", a, false),
        axis(x, "transpose", b, false),
    ) else {
        return poisoned(x);
    };
    let mut perm: Vec<usize> = (0..x.rank()).collect();
    perm.swap(a, b);
    x.graph().apply(Op::Permute { perm }, &[x])
}

/// Reorders axes: output axis `i` is input axis `perm[i]`.
pub fn permute(x: &TensorValue, perm: &[i64]) -> TensorValue {
    let resolved: Option<Vec<usize>> = perm.iter().map(|&p| axis(x, "permute", p, false)).collect();
    match resolved {
        Some(perm) => x.graph().apply(Op::Permute { perm }, &[x]),
        None => poisoned(x),
    }
}

/// Removes a size-1 axis.
pub fn squeeze(x: &TensorValue, ax: i64) -> TensorValue {
    let Some(axis) = axis(x, "squeeze", ax, false) else {
        return poisoned(x);
    };
    if x.shape()[axis] != Dim::Static(1) {
        return x.graph().fail(
            "squeeze",
            format!("axis {axis} of {} is not of size 1", x.ty()),
        );
    }
    let mut shape = x.shape().to_vec();
    shape.remove(axis);
    x.graph().apply(Op::Reshape { shape }, &[x])
}

/// Inserts a size-1 axis at `axis` (`-1`: at the end).
pub fn unsqueeze(x: &TensorValue, ax: i64) -> TensorValue {
    let Some(axis) = axis(x, "unsqueeze", ax, true) else {
        return poisoned(x);
    };
    let mut shape = x.shape().to_vec();
    shape.insert(axis, Dim::Static(1));
    x.graph().apply(Op::Reshape { shape }, &[x])
}

/// Joins tensors along an existing axis.
pub fn concat(parts: &[&TensorValue], ax: i64) -> TensorValue {
    let Some(first) = parts.first() else {
        panic!("concat needs at least one tensor");
    };
    match axis(first, "concat", ax, false) {
        Some(axis) => first.graph().apply(Op::Concat { axis }, parts),
        None => poisoned(first),
    }
}

/// Joins tensors of one shape along a new axis.
pub fn stack(parts: &[&TensorValue], ax: i64) -> TensorValue {
    let Some(first) = parts.first() else {
        panic!("stack needs at least one tensor");
    };
    let expanded: Vec<TensorValue> = parts.iter().map(|p| unsqueeze(p, ax)).collect();
    let refs: Vec<&TensorValue> = expanded.iter().collect();
    let ax = if ax < 0 {
        ax + first.rank() as i64 + 1
    } else {
        ax
    };
    concat(&refs, ax)
}

/// Splits along `axis` into parts of the given sizes (which must add up).
pub fn split(x: &TensorValue, sizes: &[u64], ax: i64) -> Vec<TensorValue> {
    let Some(axis) = axis(x, "split", ax, false) else {
        return sizes.iter().map(|_| poisoned(x)).collect();
    };
    let total: u64 = sizes.iter().sum();
    if x.shape()[axis] != Dim::Static(total) {
        let message = format!("sizes {sizes:?} do not add up to axis {axis} of {}", x.ty());
        return sizes
            .iter()
            .map(|_| x.graph().fail("split", message.clone()))
            .collect();
    }
    let mut start = 0;
    sizes
        .iter()
        .map(|size| {
            let part = x.graph().apply(
                Op::Slice {
                    axis,
                    start,
                    end: start + size,
                    step: 1,
                },
                &[x],
            );
            start += size;
            part
        })
        .collect()
}

/// Elements `start, start+step, …` below `end` along `axis`; negative bounds
/// count from the end, `end = None` means to the end of the axis.
pub fn slice(x: &TensorValue, ax: i64, start: i64, end: Option<i64>, step: u64) -> TensorValue {
    let Some(axis) = axis(x, "slice", ax, false) else {
        return poisoned(x);
    };
    let size = x.shape()[axis].as_static();
    let resolve = |bound: i64| -> Option<u64> {
        if bound >= 0 {
            Some(bound as u64)
        } else {
            size.map(|n| (n as i64 + bound).max(0) as u64)
        }
    };
    let (Some(start), Some(end)) = (resolve(start), end.map_or(Some(u64::MAX), resolve)) else {
        return x.graph().fail(
            "slice",
            format!("negative bounds on the symbolic axis {axis} of {}", x.ty()),
        );
    };
    x.graph().apply(
        Op::Slice {
            axis,
            start,
            end,
            step,
        },
        &[x],
    )
}

/// Broadcasts to `shape` (numpy rules).
pub fn broadcast_to<D: Into<Dim>>(
    x: &TensorValue,
    shape: impl IntoIterator<Item = D>,
) -> TensorValue {
    let shape = shape.into_iter().map(Into::into).collect();
    x.graph().apply(Op::BroadcastTo { shape }, &[x])
}

/// Picks entries of `data` along `axis` at `indices`.
pub fn gather(data: &TensorValue, indices: &TensorValue, ax: i64) -> TensorValue {
    match axis(data, "gather", ax, false) {
        Some(axis) => data.graph().apply(Op::Gather { axis }, &[data, indices]),
        None => poisoned(data),
    }
}

/// PyTorch `scatter`: `data` with `updates` written at `indices` along `axis`.
pub fn scatter(
    data: &TensorValue,
    indices: &TensorValue,
    updates: &TensorValue,
    ax: i64,
) -> TensorValue {
    match axis(data, "scatter", ax, false) {
        Some(axis) => data
            .graph()
            .apply(Op::Scatter { axis }, &[data, indices, updates]),
        None => poisoned(data),
    }
}

/// Keeps the band of the last two axes with `num_lower` sub- and `num_upper`
/// super-diagonals (negative: all), zeroing the rest; `exclude` inverts.
pub fn band_part(x: &TensorValue, num_lower: i64, num_upper: i64, exclude: bool) -> TensorValue {
    x.graph().apply(
        Op::BandPart {
            num_lower,
            num_upper,
            exclude,
        },
        &[x],
    )
}

/// Layer normalization over the last axis.
pub fn layer_norm(
    x: &TensorValue,
    gamma: &TensorValue,
    beta: &TensorValue,
    eps: f32,
) -> TensorValue {
    x.graph().apply(Op::LayerNorm { eps }, &[x, gamma, beta])
}

/// RMS normalization over the last axis: `x / rms(x) * (weight_offset + w)`.
pub fn rms_norm(
    x: &TensorValue,
    weight: &TensorValue,
    eps: f32,
    weight_offset: f32,
) -> TensorValue {
    x.graph()
        .apply(Op::RmsNorm { eps, weight_offset }, &[x, weight])
}

/// Rotary embedding of `x [T, heads, head_dim]` at `positions [T]`.
/// `interleaved` rotates adjacent pairs (GPT-J, GGUF llama); otherwise halves
/// (NeoX, Hugging Face). `scale` multiplies cos and sin (1 unless YaRN).
pub fn rope(
    x: &TensorValue,
    positions: &TensorValue,
    inv_freq: &TensorValue,
    interleaved: bool,
    scale: f32,
) -> TensorValue {
    x.graph()
        .apply(Op::Rope { interleaved, scale }, &[x, positions, inv_freq])
}

/// The inputs describing a ragged batch over the paged KV cache: all tokens of
/// the step flattened, with per-sequence row offsets, context lengths and block
/// tables. Create them once per graph with [`RaggedBatch::inputs`].
#[derive(Clone, Debug)]
pub struct RaggedBatch {
    /// Token ids `[T]` (i64).
    pub tokens: TensorValue,
    /// Position of each token in its sequence `[T]` (i64).
    pub positions: TensorValue,
    /// Sequence `b`'s tokens are rows `row_offsets[b]..row_offsets[b+1]` (`[B+1]`, i64).
    pub row_offsets: TensorValue,
    /// Tokens of each sequence in the cache after this step (`[B]`, i64).
    pub context_lens: TensorValue,
    /// Cache blocks of each sequence (`[B, M]`, i64).
    pub block_tables: TensorValue,
    /// The rows whose logits are returned (`[R]`, i64): usually each
    /// sequence's last token, every row when scoring a whole prompt.
    pub logit_rows: TensorValue,
}

impl RaggedBatch {
    /// Declares the batch inputs on `graph` (symbols `T` tokens, `B`
    /// sequences, `B1` = B+1, `M` blocks per sequence, `R` logit rows).
    pub fn inputs(graph: &super::Graph) -> Self {
        use super::types::TensorType;
        let int = |name: &str, shape: &[&str]| {
            graph.input(name, TensorType::new(DType::I64, shape.iter().copied()))
        };
        Self {
            tokens: int("tokens", &["T"]),
            positions: int("positions", &["T"]),
            row_offsets: int("row_offsets", &["B1"]),
            context_lens: int("context_lens", &["B"]),
            block_tables: int("block_tables", &["B", "M"]),
            logit_rows: int("logit_rows", &["R"]),
        }
    }
}

/// Causal attention of `q [T, Hq, D]` over the paged KV cache, after writing
/// this step's `k, v [T, Hkv, D]` into it.
pub fn paged_attention(
    q: &TensorValue,
    k: &TensorValue,
    v: &TensorValue,
    batch: &RaggedBatch,
    spec: AttentionSpec,
) -> TensorValue {
    q.graph().apply(
        Op::PagedAttention(spec),
        &[
            q,
            k,
            v,
            &batch.row_offsets,
            &batch.context_lens,
            &batch.block_tables,
        ],
    )
}

/// The weights of a mixture's experts, in expert order: gate and up
/// `[I, hidden]`, down `[hidden, I]` (graph weights, in any encoding).
pub struct ExpertWeights<'a> {
    /// Gate projections.
    pub gate: &'a [TensorValue],
    /// Up projections.
    pub up: &'a [TensorValue],
    /// Down projections.
    pub down: &'a [TensorValue],
}

/// A mixture of experts over `x [T, hidden]` routed by `router_logits
/// [T, E]` (see [`Op::MixtureOfExperts`]); `correction_bias [E]` goes with
/// [`super::MoeRouting::Sigmoid`]'s `correction_bias: true`.
pub fn mixture_of_experts(
    x: &TensorValue,
    router_logits: &TensorValue,
    correction_bias: Option<&TensorValue>,
    experts: ExpertWeights<'_>,
    spec: MoeSpec,
) -> TensorValue {
    let mut inputs = vec![x, router_logits];
    inputs.extend(correction_bias);
    inputs.extend(experts.gate.iter().chain(experts.up).chain(experts.down));
    x.graph().apply(Op::MixtureOfExperts(spec), &inputs)
}

/// Prints `x` with `label` when the graph runs, and returns it.
pub fn print(x: &TensorValue, label: impl Into<String>) -> TensorValue {
    x.graph().apply(
        Op::Print {
            label: label.into(),
        },
        &[x],
    )
}

/// Describes a shape for messages.
pub fn describe_shape(shape: &[Dim]) -> String {
    show(shape)
}

macro_rules! arithmetic {
    ($trait:ident, $method:ident, $func:ident) => {
        impl $trait<&TensorValue> for &TensorValue {
            type Output = TensorValue;
            fn $method(self, rhs: &TensorValue) -> TensorValue {
                $func(self, rhs)
            }
        }
        impl $trait<TensorValue> for TensorValue {
            type Output = TensorValue;
            fn $method(self, rhs: TensorValue) -> TensorValue {
                $func(&self, &rhs)
            }
        }
        impl $trait<f64> for &TensorValue {
            type Output = TensorValue;
            fn $method(self, rhs: f64) -> TensorValue {
                $func(self, &scalar_like(self, rhs))
            }
        }
        impl $trait<f64> for TensorValue {
            type Output = TensorValue;
            fn $method(self, rhs: f64) -> TensorValue {
                $func(&self, &scalar_like(&self, rhs))
            }
        }
    };
}

arithmetic!(Add, add, add);
arithmetic!(Sub, sub, sub);
arithmetic!(Mul, mul, mul);
arithmetic!(Div, div, div);

impl Neg for &TensorValue {
    type Output = TensorValue;
    fn neg(self) -> TensorValue {
        neg(self)
    }
}

impl Neg for TensorValue {
    type Output = TensorValue;
    fn neg(self) -> TensorValue {
        neg(&self)
    }
}
