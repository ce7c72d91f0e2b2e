//! What the compiler produces: the optimized graph and the ordered kernel
//! steps that execute it, with each value's last use for memory reuse.

use kiln_plugin_api::graph::{BinaryOp, DType, GraphIr, UnaryOp, ValueId};
use serde::{Deserialize, Serialize};

/// A compiled graph, ready for a backend. Serializable for the compile cache.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Program {
    /// The optimized graph; values are its node ids.
    pub graph: GraphIr,
    /// Kernel launches in execution order.
    pub steps: Vec<Step>,
    /// For each value, the index of the last step that reads it (`None`:
    /// never read by a step, or a graph output, which lives to the end).
    pub last_use: Vec<Option<usize>>,
    /// What the passes did.
    pub report: CompileReport,
}

/// One kernel launch producing one value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The value produced (a node of [`Program::graph`]; its type is the node's).
    pub output: ValueId,
    /// What runs.
    pub kernel: Kernel,
    /// The values read.
    pub inputs: Vec<ValueId>,
}

/// The kernels a step can launch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Kernel {
    /// The output node's own op.
    Node,
    /// `y = x · Wᵀ` straight from weight `weight` in its stored encoding
    /// (lowered from `matmul(x, transpose(W))`). Inputs: `[x]`.
    Linear {
        /// Index into the graph's weights.
        weight: usize,
    },
    /// Rows of weight `weight` picked by ids, decoded row by row (lowered from
    /// `gather(W, ids, 0)`). Inputs: `[ids]`.
    Embedding {
        /// Index into the graph's weights.
        weight: usize,
    },
    /// A mixture of experts reading each expert's weights in their stored
    /// encoding (lowered from `mixture_of_experts`). Inputs: the op's
    /// leading inputs (x, router logits, the correction bias if any).
    MixtureOfExperts {
        /// Index into the graph's weights of each expert's gate projection.
        gate: Vec<usize>,
        /// Each expert's up projection.
        up: Vec<usize>,
        /// Each expert's down projection.
        down: Vec<usize>,
    },
    /// A chain of element-wise ops computed in one pass over the output.
    /// Inputs: the chain's external operands (broadcast to the output shape).
    Fused {
        /// Instructions in order; instruction `i` defines register `i`, the
        /// last one is the output.
        program: Vec<Instr>,
    },
}

/// One instruction of a fused element-wise program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instr {
    /// The operation.
    pub op: ElementOp,
    /// Its operands.
    pub args: Vec<Operand>,
    /// The result's type.
    pub dtype: DType,
}

/// Element-wise operations that fuse.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ElementOp {
    /// A unary function.
    Unary {
        /// Which.
        f: UnaryOp,
    },
    /// A binary function.
    Binary {
        /// Which.
        f: BinaryOp,
    },
    /// `cond ? a : b`.
    Where,
    /// Type conversion.
    Cast,
}

/// An operand of a fused instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operand {
    /// External operand `i` of the step.
    Input(usize),
    /// The result of instruction `i`.
    Reg(usize),
}

/// Node counts through the pipeline, for `host inspect --graph` and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileReport {
    /// Nodes received.
    pub nodes_in: usize,
    /// Removed as dead.
    pub dead_removed: usize,
    /// Merged as common subexpressions.
    pub cse_merged: usize,
    /// Replaced by constants.
    pub folded: usize,
    /// Matmuls lowered to weight kernels (linear, embedding).
    pub lowered: usize,
    /// Element-wise ops absorbed into fused kernels.
    pub fused_ops: usize,
    /// Fused kernels formed.
    pub fused_kernels: usize,
    /// Steps in the program.
    pub steps: usize,
}
