//! Building graphs: [`Graph`] records operations on symbolic [`TensorValue`]s.
//!
//! Operations never fail on the spot. An invalid one (mismatched shapes, a bad
//! axis) records the first error, with the op and the module path that issued
//! it, and yields a poisoned value; later operations on poisoned values add
//! nothing. [`Graph::build`] then returns that error. This keeps model code
//! free of `?` on every line while still reporting exactly where it went wrong.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

use super::infer::infer;
use super::ir::{Constant, GraphIr, InputSpec, Node, Op, ValueId, IR_VERSION};
use super::types::{DType, Dim, TensorType, WeightSpec};

/// A graph under construction. Cheap to clone (a shared handle).
#[derive(Clone)]
pub struct Graph {
    inner: Rc<RefCell<Builder>>,
}

struct Builder {
    ir: GraphIr,
    weight_ids: HashMap<String, ValueId>,
    scopes: Vec<String>,
    error: Option<GraphError>,
}

/// A graph construction error, naming the op and the module that issued it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct GraphError {
    /// The op, e.g. `matmul`.
    pub op: String,
    /// The module path, e.g. `layers.0.mlp` (empty at the top level).
    pub module: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`", self.op)?;
        if !self.module.is_empty() {
            write!(f, " in module `{}`", self.module)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A symbolic tensor: the value of one node of a graph.
#[derive(Clone)]
pub struct TensorValue {
    graph: Graph,
    id: Option<ValueId>,
    ty: TensorType,
}

impl fmt::Debug for TensorValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id {
            Some(id) => write!(f, "%{id}: {}", self.ty),
            None => write!(f, "<poisoned>: {}", self.ty),
        }
    }
}

impl TensorValue {
    /// The value's type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[Dim] {
        &self.ty.shape
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.ty.rank()
    }

    /// The graph the value belongs to.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The node id, unless the value is poisoned by an earlier error.
    pub fn id(&self) -> Option<ValueId> {
        self.id
    }
}

/// Leaves a module scope when dropped (see [`Graph::scope`]).
pub struct ScopeGuard {
    graph: Graph,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        self.graph.inner.borrow_mut().scopes.pop();
    }
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Self {
        let ir = GraphIr {
            version: IR_VERSION,
            name: name.into(),
            inputs: Vec::new(),
            weights: Vec::new(),
            nodes: Vec::new(),
            outputs: Vec::new(),
        };
        Self {
            inner: Rc::new(RefCell::new(Builder {
                ir,
                weight_ids: HashMap::new(),
                scopes: Vec::new(),
                error: None,
            })),
        }
    }

    /// Declares a graph input.
    pub fn input(&self, name: impl Into<String>, ty: TensorType) -> TensorValue {
        let index = {
            let mut inner = self.inner.borrow_mut();
            inner.ir.inputs.push(InputSpec {
                name: name.into(),
                ty: ty.clone(),
            });
            inner.ir.inputs.len() - 1
        };
        self.leaf(Op::Input { index }, ty)
    }

    /// References a weight by its fully qualified name. The same name twice
    /// gives the same value; the same name with another type is an error.
    pub fn weight(&self, spec: &WeightSpec) -> TensorValue {
        let existing = self.inner.borrow().weight_ids.get(&spec.name).copied();
        if let Some(id) = existing {
            let known = {
                let inner = self.inner.borrow();
                let Op::Weight { index } = inner.ir.nodes[id as usize].op else {
                    unreachable!("weight ids point at weight nodes")
                };
                inner.ir.weights[index].clone()
            };
            if known != *spec {
                return self.fail(
                    "weight",
                    format!(
                        "two different weights are named `{}` ({:?} and {:?}); \
                         did load_state_dict finalize the names?",
                        spec.name, known, spec
                    ),
                );
            }
            return TensorValue {
                graph: self.clone(),
                id: Some(id),
                ty: spec.tensor_type(),
            };
        }
        let index = {
            let mut inner = self.inner.borrow_mut();
            inner.ir.weights.push(spec.clone());
            inner.ir.weights.len() - 1
        };
        let value = self.leaf(Op::Weight { index }, spec.tensor_type());
        if let Some(id) = value.id {
            self.inner
                .borrow_mut()
                .weight_ids
                .insert(spec.name.clone(), id);
        }
        value
    }

    /// A constant tensor of `dtype` and static `shape` (row-major values).
    pub fn constant(&self, values: Vec<f64>, dtype: DType, shape: &[u64]) -> TensorValue {
        let count: u64 = shape.iter().product();
        if values.len() as u64 != count {
            return self.fail(
                "constant",
                format!("{} values for shape {shape:?}", values.len()),
            );
        }
        self.leaf(
            Op::Constant(Constant { values }),
            TensorType::new(dtype, shape.iter().copied()),
        )
    }

    /// A scalar (rank-0) constant.
    pub fn scalar(&self, value: f64, dtype: DType) -> TensorValue {
        self.constant(vec![value], dtype, &[])
    }

    /// `start, start + step, …`: `len` values of `dtype`.
    pub fn range(&self, start: f64, step: f64, len: impl Into<Dim>, dtype: DType) -> TensorValue {
        self.leaf(
            Op::Range { start, step },
            TensorType::new(dtype, [len.into()]),
        )
    }

    /// Enters a module scope: nodes created until the guard drops record
    /// `path` (a full path such as `layers.0.mlp`) for error messages.
    pub fn scope(&self, path: impl Into<String>) -> ScopeGuard {
        self.inner.borrow_mut().scopes.push(path.into());
        ScopeGuard {
            graph: self.clone(),
        }
    }

    /// Marks values as the graph's outputs.
    pub fn output(&self, values: &[&TensorValue]) {
        for value in values {
            if !self.owns(value) {
                self.fail("output", "the value belongs to another graph".to_owned());
            } else if let Some(id) = value.id {
                self.inner.borrow_mut().ir.outputs.push(id);
            }
        }
    }

    /// The finished graph, or the first construction error.
    pub fn build(&self) -> Result<GraphIr, GraphError> {
        let inner = self.inner.borrow();
        if let Some(error) = &inner.error {
            return Err(error.clone());
        }
        if inner.ir.outputs.is_empty() {
            return Err(GraphError {
                op: "output".to_owned(),
                module: String::new(),
                message: "the graph has no outputs".to_owned(),
            });
        }
        Ok(inner.ir.clone())
    }

    /// Records an op applied to `inputs`, inferring its type.
    pub(crate) fn apply(&self, op: Op, inputs: &[&TensorValue]) -> TensorValue {
        if let Some(stranger) = inputs.iter().find(|v| !self.owns(v)) {
            let _ = stranger;
            return self.fail(&op.name(), "an operand belongs to another graph".to_owned());
        }
        let ids: Option<Vec<ValueId>> = inputs.iter().map(|v| v.id).collect();
        let types: Vec<&TensorType> = inputs.iter().map(|v| &v.ty).collect();
        let Some(ids) = ids else {
            // An operand is poisoned: the first error is already recorded.
            let ty = types
                .first()
                .map_or_else(|| TensorType::new::<u64>(DType::F32, []), |t| (*t).clone());
            return TensorValue {
                graph: self.clone(),
                id: None,
                ty,
            };
        };
        match infer(&op, &types, None) {
            Ok(ty) => self.push(op, ids, ty),
            Err(message) => self.fail(&op.name(), message),
        }
    }

    /// Records an error for `op` and returns a poisoned value.
    pub(crate) fn fail(&self, op: &str, message: String) -> TensorValue {
        let mut inner = self.inner.borrow_mut();
        if inner.error.is_none() {
            inner.error = Some(GraphError {
                op: op.to_owned(),
                module: inner.scopes.last().cloned().unwrap_or_default(),
                message,
            });
        }
        drop(inner);
        TensorValue {
            graph: self.clone(),
            id: None,
            ty: TensorType::new::<u64>(DType::F32, []),
        }
    }

    fn leaf(&self, op: Op, ty: TensorType) -> TensorValue {
        self.push(op, Vec::new(), ty)
    }

    fn push(&self, op: Op, inputs: Vec<ValueId>, ty: TensorType) -> TensorValue {
        let mut inner = self.inner.borrow_mut();
        let module = inner.scopes.last().cloned().unwrap_or_default();
        let id = ValueId::try_from(inner.ir.nodes.len()).expect("fewer than 2^32 nodes");
        inner.ir.nodes.push(Node {
            op,
            inputs,
            ty: ty.clone(),
            module,
        });
        drop(inner);
        TensorValue {
            graph: self.clone(),
            id: Some(id),
            ty,
        }
    }

    fn owns(&self, value: &TensorValue) -> bool {
        Rc::ptr_eq(&self.inner, &value.graph.inner)
    }
}
