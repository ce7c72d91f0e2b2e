//! Graphs: symbolic tensors, typed inputs, weights and ops (MAX's
//! `max.graph`), and the versioned IR they serialize to.
//!
//! ```
//! use kiln_plugin_api::graph::{ops, DType, Dim, Graph, TensorType};
//!
//! let graph = Graph::new("double");
//! let x = graph.input("x", TensorType::new(DType::F32, [Dim::sym("T"), Dim::Static(4)]));
//! let y = ops::relu(&(&x * 2.0));
//! graph.output(&[&y]);
//! let ir = graph.build().unwrap();
//! assert_eq!(ir.nodes.len(), 4); // input, constant, mul, relu
//! ```

mod builder;
mod encoder;
pub mod infer;
mod ir;
pub mod ops;
mod types;

pub use encoder::{ClassifierBatch, EncoderBatch};
pub use ops::RaggedBatch;

pub use builder::{Graph, GraphError, ScopeGuard, TensorValue};
pub use ir::{
    AttentionSpec, BinaryOp, Constant, GraphIr, InputSpec, IrError, MoeRouting, MoeSpec, Node, Op,
    ReduceOp, SequenceAttentionSpec, TopKOutput, UnaryOp, ValueId, IR_VERSION,
};
pub use types::{DType, Device, Dim, TensorType, WeightSpec};
