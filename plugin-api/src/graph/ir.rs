//! The graph IR: what crosses the plugin boundary, serialized and versioned.
//!
//! A graph is a list of nodes in topological order; a value is the output of
//! the node at that index. Inputs, weights and constants are nodes too. Every
//! node records the module path that created it, so errors can name it.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::types::{DType, Dim, TensorType, WeightSpec};

/// Version of the IR format. Bumped when a change would make an older host
/// misread a graph; additions that older hosts reject cleanly (a new op is an
/// unknown variant) do not need a bump.
pub const IR_VERSION: u32 = 1;

/// Index of a node, and of the value it produces.
pub type ValueId = u32;

/// A complete graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphIr {
    /// IR format version ([`IR_VERSION`]).
    pub version: u32,
    /// The graph's name.
    pub name: String,
    /// Graph inputs, in call order.
    pub inputs: Vec<InputSpec>,
    /// Weights the graph reads, by fully qualified name.
    pub weights: Vec<WeightSpec>,
    /// Nodes in topological order.
    pub nodes: Vec<Node>,
    /// The values the graph returns.
    pub outputs: Vec<ValueId>,
}

/// A named graph input.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InputSpec {
    /// Name, for messages and for binding by name.
    pub name: String,
    /// Type; symbolic dimensions are bound from the actual input.
    pub ty: TensorType,
}

/// One operation and the value it produces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// Operand values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<ValueId>,
    /// The type of the produced value.
    pub ty: TensorType,
    /// Module path of the code that created it, e.g. `layers.3.mlp`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub module: String,
}

/// Element-wise functions of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Recip,
    Square,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    Silu,
    /// GELU with the exact erf.
    Gelu,
    /// GELU with the tanh approximation.
    GeluTanh,
    Floor,
    Ceil,
    /// Logical not (bool).
    Not,
}

/// Element-wise functions of two operands (numpy broadcasting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Equal,
    NotEqual,
    Greater,
    GreaterEqual,
    Less,
    LessEqual,
    And,
    Or,
}

impl BinaryOp {
    /// Comparisons and logical ops produce booleans.
    pub fn is_predicate(self) -> bool {
        matches!(
            self,
            BinaryOp::Equal
                | BinaryOp::NotEqual
                | BinaryOp::Greater
                | BinaryOp::GreaterEqual
                | BinaryOp::Less
                | BinaryOp::LessEqual
                | BinaryOp::And
                | BinaryOp::Or
        )
    }
}

/// Reductions over one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
}

/// Which output of a top-k.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopKOutput {
    /// The k largest values, in descending order.
    Values,
    /// Their indices (i64).
    Indices,
}

/// Constant data, stored as f64 (exact for every supported dtype but i64
/// beyond 2^53, which constants do not need).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Constant {
    /// Values in row-major order.
    pub values: Vec<f64>,
}

/// An operation. Inputs are listed per variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Op {
    /// Graph input `index`. No inputs.
    Input {
        /// Position in [`GraphIr::inputs`].
        index: usize,
    },
    /// Weight `index`. No inputs.
    Weight {
        /// Position in [`GraphIr::weights`].
        index: usize,
    },
    /// A constant tensor. No inputs.
    Constant(Constant),
    /// Element-wise function. Inputs: `[x]`.
    Unary {
        /// Which function.
        op: UnaryOp,
    },
    /// Element-wise function with broadcasting. Inputs: `[a, b]`.
    Binary {
        /// Which function.
        op: BinaryOp,
    },
    /// `cond ? a : b` with broadcasting. Inputs: `[cond, a, b]`.
    Where,
    /// Element type conversion. Inputs: `[x]`.
    Cast {
        /// Target type.
        dtype: DType,
    },
    /// Reduction over `axis`. Inputs: `[x]`.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Axis reduced.
        axis: usize,
        /// Keep the reduced axis with size 1.
        keep_dims: bool,
    },
    /// Index of the maximum along `axis` (first on ties), i64. Inputs: `[x]`.
    #[serde(rename = "argmax")]
    ArgMax {
        /// Axis reduced.
        axis: usize,
        /// Keep the reduced axis with size 1.
        keep_dims: bool,
    },
    /// The `k` largest along the last axis. Inputs: `[x]`.
    TopK {
        /// How many.
        k: u64,
        /// Values or indices.
        output: TopKOutput,
    },
    /// Softmax along `axis`. Inputs: `[x]`.
    Softmax {
        /// Axis normalized.
        axis: usize,
    },
    /// Log-softmax along `axis`. Inputs: `[x]`.
    LogSoftmax {
        /// Axis normalized.
        axis: usize,
    },
    /// Batched matrix product over the last two axes, batch axes broadcast.
    /// Inputs: `[a, b]`.
    #[serde(rename = "matmul")]
    MatMul,
    /// Same elements, new shape. Inputs: `[x]`.
    Reshape {
        /// The new shape (no `-1`: the builder resolves it).
        shape: Vec<Dim>,
    },
    /// Axis permutation: output axis `i` is input axis `perm[i]`. Inputs: `[x]`.
    Permute {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Concatenation along `axis`. Inputs: the parts.
    Concat {
        /// Axis joined.
        axis: usize,
    },
    /// Elements `start, start+step, …` below `end` along `axis` (bounds
    /// already normalized and clamped to the axis). Inputs: `[x]`.
    Slice {
        /// Axis sliced.
        axis: usize,
        /// First index.
        start: u64,
        /// One past the last index (clamped to the axis at run time).
        end: u64,
        /// Stride (≥ 1).
        step: u64,
    },
    /// Broadcast to `shape` (numpy rules). Inputs: `[x]`.
    BroadcastTo {
        /// Target shape.
        shape: Vec<Dim>,
    },
    /// `out[.., i.., ..] = data[.., indices[i..], ..]` along `axis`.
    /// Inputs: `[data, indices]`.
    Gather {
        /// Axis indexed.
        axis: usize,
    },
    /// PyTorch `scatter`: a copy of `data` with `data[..idx[i]..] = updates[i]`
    /// along `axis`. Inputs: `[data, indices, updates]`.
    Scatter {
        /// Axis indexed.
        axis: usize,
    },
    /// Keeps a band of the last two axes, zeroing the rest (`tf.linalg.band_part`;
    /// negative bounds keep everything on that side). Inputs: `[x]`.
    BandPart {
        /// Sub-diagonals kept (negative: all).
        num_lower: i64,
        /// Super-diagonals kept (negative: all).
        num_upper: i64,
        /// Invert: zero the band, keep the rest.
        exclude: bool,
    },
    /// `start, start+step, …`, as many values as the node's one dimension.
    /// No inputs.
    Range {
        /// First value.
        start: f64,
        /// Increment.
        step: f64,
    },
    /// Layer normalization over the last axis. Inputs: `[x, gamma, beta]`.
    LayerNorm {
        /// Variance epsilon.
        eps: f32,
    },
    /// RMS normalization over the last axis: `x / rms(x) * (offset + w)`.
    /// Inputs: `[x, w]`.
    RmsNorm {
        /// Variance epsilon.
        eps: f32,
        /// Added to the weight (1 for Gemma's `(1 + w)`).
        weight_offset: f32,
    },
    /// Rotary position embedding of `x [T, H, D]` at `positions [T]` with
    /// inverse frequencies `inv_freq [D/2]`. Inputs: `[x, positions, inv_freq]`.
    Rope {
        /// Rotate adjacent pairs (GPT-J/GGUF llama) instead of halves (NeoX/HF).
        interleaved: bool,
        /// Multiplies cos and sin (YaRN attention scaling; 1 otherwise).
        scale: f32,
    },
    /// Causal attention over the paged KV cache for a ragged batch. Writes
    /// this step's keys and values into the cache of `layer`, then attends.
    /// Inputs: `[q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], row_offsets [B+1],
    /// context_lens [B], block_tables [B, M]]`; output `[T, Hq, D]`.
    PagedAttention(AttentionSpec),
    /// Attention within each sequence of a ragged batch over this step's
    /// own keys and values, with no cache (since 1.4): what an encoder such
    /// as BERT runs, bidirectional unless `causal`. Inputs: `[q [T, Hq, D],
    /// k [T, Hkv, D], v [T, Hkv, D], row_offsets [B+1]]`; output `[T, Hq, D]`.
    SequenceAttention(SequenceAttentionSpec),
    /// A mixture of experts (since 1.3): each token's router scores pick
    /// `top_k` of `num_experts` gated MLPs, whose outputs are summed with
    /// the routing weights. Only the picked experts are computed. Inputs:
    /// `[x [T, hidden], router_logits [T, E]]`, then the router's score
    /// correction bias `[E]` when [`MoeRouting::Sigmoid`] has one, then
    /// every expert's gate `[I, hidden]`, every expert's up `[I, hidden]`
    /// and every expert's down projection `[hidden, I]` (weights, in expert
    /// order). Output `[T, hidden]`.
    MixtureOfExperts(MoeSpec),
    /// Prints `x` at run time, labelled, and passes it through. Inputs: `[x]`.
    Print {
        /// Label printed before the values.
        label: String,
    },
}

/// Attributes of [`Op::PagedAttention`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionSpec {
    /// Which layer's cache.
    pub layer: u32,
    /// Score scale (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Attend only to the last `window` positions (including the current one).
    #[serde(default)]
    pub sliding_window: Option<u32>,
    /// Gemma-2-style logit soft cap: `cap * tanh(score / cap)`.
    #[serde(default)]
    pub softcap: Option<f32>,
}

/// Attributes of [`Op::SequenceAttention`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SequenceAttentionSpec {
    /// Score scale (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Each position attends only to itself and earlier ones; otherwise to
    /// every position of its sequence (bidirectional).
    pub causal: bool,
}

/// Attributes of [`Op::MixtureOfExperts`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeSpec {
    /// Experts `E`.
    pub num_experts: u32,
    /// Experts per token `k`.
    pub top_k: u32,
    /// How router logits become scores and picks.
    pub routing: MoeRouting,
    /// Divide the picked scores by their sum.
    pub renormalize: bool,
    /// Multiplies the routing weights (DeepSeek's `routed_scaling_factor`;
    /// 1 otherwise).
    pub scale: f32,
    /// The experts' gate activation (`Silu`, `Gelu`, `GeluTanh` or `Relu`):
    /// an expert computes `down(act(gate(x)) * up(x))`.
    pub activation: UnaryOp,
}

/// How a mixture of experts routes a token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MoeRouting {
    /// Softmax over all experts, then the `top_k` largest (Mixtral, Qwen-MoE).
    Softmax,
    /// Sigmoid scores; experts are picked by score plus an optional
    /// correction bias, within the `top_groups` best of `groups` equal groups
    /// (a group ranks by the sum of its two best biased scores), and weighted
    /// by their unbiased scores (DeepSeek-V3). One group: plain top-k.
    Sigmoid {
        /// A correction bias `[E]` input follows the router logits.
        correction_bias: bool,
        /// Expert groups (`n_group`).
        groups: u32,
        /// Groups a token may pick from (`topk_group`).
        top_groups: u32,
    },
}

impl MoeSpec {
    /// Inputs before the expert weights: x, the logits, and the bias if any.
    pub fn leading_inputs(&self) -> usize {
        match self.routing {
            MoeRouting::Sigmoid {
                correction_bias: true,
                ..
            } => 3,
            _ => 2,
        }
    }
}

impl Op {
    /// The op's name as printed, e.g. `add`, `matmul`.
    pub fn name(&self) -> String {
        let json = serde_json::to_value(self).unwrap_or_default();
        let kind = json.get("kind").and_then(|k| k.as_str()).unwrap_or("op");
        match self {
            Op::Unary { op } => format!("{op:?}").to_lowercase(),
            Op::Binary { op } => format!("{op:?}").to_lowercase(),
            Op::Reduce { op, .. } => format!("reduce_{op:?}").to_lowercase(),
            _ => kind.to_owned(),
        }
    }

    /// True for ops with an effect beyond their value (never removed).
    pub fn has_side_effect(&self) -> bool {
        matches!(self, Op::Print { .. } | Op::PagedAttention(_))
    }
}

/// Why a serialized graph could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IrError {
    /// Malformed bytes.
    #[error("malformed graph IR: {0}")]
    Malformed(#[from] serde_json::Error),
    /// Written by a newer plugin than this host understands.
    #[error(
        "graph IR version {found} is not supported (this host reads versions 1 to {IR_VERSION})"
    )]
    Version {
        /// The version in the data.
        found: u32,
    },
}

impl GraphIr {
    /// Serializes the graph (JSON).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("graph IR serializes")
    }

    /// Reads a serialized graph, checking its version: every version up to
    /// [`IR_VERSION`] is read (the IR only grows: new ops and optional fields).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, IrError> {
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let Versioned { version } = serde_json::from_slice(bytes)?;
        if !(1..=IR_VERSION).contains(&version) {
            return Err(IrError::Version { found: version });
        }
        Ok(serde_json::from_slice(bytes)?)
    }
}

impl fmt::Display for GraphIr {
    /// A readable listing: one line per node, `%id = op(args) {attrs} : type  # module`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "graph {} (ir v{}) {{", self.name, self.version)?;
        for (id, node) in self.nodes.iter().enumerate() {
            let args: Vec<String> = node.inputs.iter().map(|v| format!("%{v}")).collect();
            let detail = match &node.op {
                Op::Input { index } => format!("input \"{}\"", self.inputs[*index].name),
                Op::Weight { index } => {
                    let weight = &self.weights[*index];
                    format!("weight \"{}\" ({})", weight.name, weight.encoding)
                }
                Op::Constant(c) if c.values.len() <= 8 => format!("constant {:?}", c.values),
                Op::Constant(c) => format!("constant [{} values]", c.values.len()),
                op => {
                    let attrs = serde_json::to_value(op).unwrap_or_default();
                    let attrs: Vec<String> = attrs
                        .as_object()
                        .into_iter()
                        .flatten()
                        .filter(|(k, _)| *k != "kind" && *k != "op")
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    let attrs = if attrs.is_empty() {
                        String::new()
                    } else {
                        format!(" {{{}}}", attrs.join(", "))
                    };
                    format!("{}({}){attrs}", op.name(), args.join(", "))
                }
            };
            write!(f, "  %{id} = {detail} : {}", node.ty)?;
            if !node.module.is_empty() {
                write!(f, "  # {}", node.module)?;
            }
            writeln!(f)?;
        }
        let outputs: Vec<String> = self.outputs.iter().map(|v| format!("%{v}")).collect();
        writeln!(f, "  return {}", outputs.join(", "))?;
        write!(f, "}}")
    }
}
