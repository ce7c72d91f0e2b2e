//! Modules: layers that own weights and sub-modules, registered by field name
//! (MAX's `nn.Module`), and loading a state dict into them.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use crate::architecture::Encoding;
use crate::error::{Error, Result};
use crate::graph::{DType, Device, Graph, TensorValue, WeightSpec};

/// Weights by fully qualified name, with their type and encoding: what a
/// checkpoint (after weight adaptation) provides and what a module expects.
pub type StateDict = BTreeMap<String, WeightSpec>;

/// A learned parameter. Created with a local name (`weight`); the module tree
/// gives it its fully qualified name (`layers.0.mlp.up_proj.weight`).
#[derive(Debug)]
pub struct Weight {
    local_name: String,
    spec: RefCell<WeightSpec>,
    quantizable: bool,
    loaded: Cell<bool>,
}

impl Weight {
    /// A weight of `dtype` and `shape`, stored unquantized on the CPU.
    pub fn new(local_name: impl Into<String>, dtype: DType, shape: &[u64]) -> Self {
        let local_name = local_name.into();
        let encoding = match dtype {
            DType::F16 => Encoding::Float16,
            DType::BF16 => Encoding::BFloat16,
            _ => Encoding::Float32,
        };
        Self {
            spec: RefCell::new(WeightSpec {
                name: local_name.clone(),
                dtype,
                shape: shape.to_vec(),
                encoding,
                device: Device::Cpu,
            }),
            local_name,
            quantizable: false,
            loaded: Cell::new(false),
        }
    }

    /// Accepts quantized encodings from the checkpoint (matmul and embedding
    /// weights): the data stays quantized and computes as this weight's dtype.
    pub fn quantizable(mut self) -> Self {
        self.quantizable = true;
        self
    }

    /// Places the weight on `device`.
    pub fn on(self, device: Device) -> Self {
        self.spec.borrow_mut().device = device;
        self
    }

    /// The name given at creation.
    pub fn local_name(&self) -> &str {
        &self.local_name
    }

    /// The fully qualified name (the local name until the module tree names it).
    pub fn name(&self) -> String {
        self.spec.borrow().name.clone()
    }

    /// The module path of the weight's owner: its name without the last part.
    pub fn module_path(&self) -> String {
        let name = self.name();
        name.rsplit_once('.')
            .map_or(String::new(), |(path, _)| path.to_owned())
    }

    /// The weight's current description.
    pub fn spec(&self) -> WeightSpec {
        self.spec.borrow().clone()
    }

    /// The weight as a value of `graph`.
    pub fn value(&self, graph: &Graph) -> TensorValue {
        graph.weight(&self.spec.borrow())
    }
}

/// Where a module's [`Module::visit`] registers its weights and sub-modules.
pub struct Registry<'a> {
    path: Vec<String>,
    visit: &'a mut dyn FnMut(&str, &Weight),
}

impl Registry<'_> {
    /// Registers a weight under its field name.
    pub fn weight(&mut self, field: &str, weight: &Weight) {
        self.path.push(field.to_owned());
        let name = self.path.join(".");
        self.path.pop();
        weight.spec.borrow_mut().name = name.clone();
        (self.visit)(&name, weight);
    }

    /// Registers a sub-module under its field name.
    pub fn module(&mut self, field: &str, module: &dyn Module) {
        self.path.push(field.to_owned());
        module.visit(self);
        self.path.pop();
    }

    /// Registers an optional sub-module.
    pub fn optional(&mut self, field: &str, module: Option<&dyn Module>) {
        if let Some(module) = module {
            self.module(field, module);
        }
    }

    /// Registers a list of sub-modules as `field.0`, `field.1`, …
    pub fn list<M: Module>(&mut self, field: &str, modules: &[M]) {
        self.path.push(field.to_owned());
        for (i, module) in modules.iter().enumerate() {
            self.module(&i.to_string(), module);
        }
        self.path.pop();
    }
}

/// A layer that owns weights and sub-modules. Implement [`Module::visit`] by
/// registering each field; names, loading and listing come with it.
pub trait Module {
    /// Registers this module's weights and sub-modules, by field name.
    fn visit(&self, registry: &mut Registry<'_>);

    /// Walks every weight with its fully qualified name, finalizing the names.
    fn for_each_weight(&self, visit: &mut dyn FnMut(&str, &Weight)) {
        let mut registry = Registry {
            path: Vec::new(),
            visit,
        };
        self.visit(&mut registry);
    }

    /// Every weight the module expects, by fully qualified name, with its
    /// shape, dtype and encoding (MAX's `raw_state_dict`).
    fn raw_state_dict(&self) -> StateDict {
        let mut dict = StateDict::new();
        self.for_each_weight(&mut |name, weight| {
            dict.insert(name.to_owned(), weight.spec());
        });
        dict
    }

    /// The weights bound by [`Module::load_state_dict`], by name.
    fn state_dict(&self) -> StateDict {
        let mut dict = StateDict::new();
        self.for_each_weight(&mut |name, weight| {
            if weight.loaded.get() {
                dict.insert(name.to_owned(), weight.spec());
            }
        });
        dict
    }

    /// Finalizes weight names and binds the checkpoint's weights to them,
    /// rejecting missing, unexpected, mis-shaped and mis-typed weights in one
    /// error that names each. A weight keeps the module's dtype and takes the
    /// checkpoint's storage encoding: quantized blocks (for quantizable
    /// weights) or another float width, decoded by the host on use.
    fn load_state_dict(&self, state: &StateDict) -> Result<()> {
        let mut problems = Vec::new();
        let mut used = std::collections::BTreeSet::new();
        self.for_each_weight(&mut |name, weight| {
            let expected = weight.spec();
            let Some(given) = state.get(name) else {
                problems.push(format!(
                    "missing `{name}` ({} {:?})",
                    expected.dtype, expected.shape
                ));
                return;
            };
            used.insert(name.to_owned());
            if given.shape != expected.shape {
                problems.push(format!(
                    "`{name}` has shape {:?}, the module expects {:?}",
                    given.shape, expected.shape
                ));
                return;
            }
            let quantized = given.is_quantized();
            if quantized && !weight.quantizable {
                problems.push(format!(
                    "`{name}` is quantized ({}), the module expects {}",
                    given.encoding, expected.dtype
                ));
                return;
            }
            // Another float width is a storage encoding: the host decodes it
            // to the module's dtype on use. Anything else cannot be a weight.
            if !given.dtype.is_float() {
                problems.push(format!(
                    "`{name}` is {}, the module expects {}",
                    given.dtype, expected.dtype
                ));
                return;
            }
            let mut spec = weight.spec.borrow_mut();
            spec.encoding = given.encoding;
            weight.loaded.set(true);
        });
        problems.extend(
            state
                .keys()
                .filter(|name| !used.contains(*name))
                .map(|name| format!("unexpected `{name}`")),
        );
        if problems.is_empty() {
            Ok(())
        } else {
            // The first few say what is wrong; hundreds would bury it.
            const SHOWN: usize = 4;
            let more = problems.len().saturating_sub(SHOWN);
            let mut listed = problems[..problems.len().min(SHOWN)].join("; ");
            if more > 0 {
                listed.push_str(&format!("; and {more} more"));
            }
            Err(Error::invalid(format!(
                "load_state_dict: {} problem(s): {listed}",
                problems.len()
            )))
        }
    }
}

/// A module that maps one tensor to one tensor.
pub trait Layer: Module {
    /// Records the layer's computation on `x`.
    fn forward(&self, x: &TensorValue) -> TensorValue;
}

/// Layers applied in order; sub-modules are named `0`, `1`, …
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Layer>>,
}

impl Sequential {
    /// A chain of layers.
    pub fn new(layers: Vec<Box<dyn Layer>>) -> Self {
        Self { layers }
    }
}

impl Module for Sequential {
    fn visit(&self, registry: &mut Registry<'_>) {
        for (i, layer) in self.layers.iter().enumerate() {
            registry.module(&i.to_string(), layer.as_ref());
        }
    }
}

impl Layer for Sequential {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        self.layers
            .iter()
            .fold(x.clone(), |x, layer| layer.forward(&x))
    }
}
