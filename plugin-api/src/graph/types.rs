//! Tensor types: element types, symbolic shapes and devices.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::architecture::Encoding;

/// Element type of a tensor value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit signed integer (token ids, positions, indices).
    I64,
    /// 32-bit signed integer.
    I32,
    /// Unsigned byte.
    U8,
    /// Boolean (comparison results, masks).
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// Floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Integer types (not bool).
    pub fn is_integer(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::U8)
    }

    /// The dtype a float weight encoding stores, if it is not quantized.
    pub fn of_encoding(encoding: Encoding) -> Option<DType> {
        match encoding {
            Encoding::Float32 => Some(DType::F32),
            Encoding::Float16 => Some(DType::F16),
            Encoding::BFloat16 => Some(DType::BF16),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        };
        f.write_str(name)
    }
}

/// One dimension of a shape: known when the graph is built, or named and bound
/// when it runs (e.g. `T`, the number of tokens in a ragged batch).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    /// A fixed size.
    Static(u64),
    /// A size bound at run time; equal names are equal sizes.
    Symbolic(String),
}

impl Dim {
    /// A symbolic dimension.
    pub fn sym(name: &str) -> Self {
        Dim::Symbolic(name.to_owned())
    }

    /// The size, if static.
    pub fn as_static(&self) -> Option<u64> {
        match self {
            Dim::Static(n) => Some(*n),
            Dim::Symbolic(_) => None,
        }
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Self {
        Dim::Static(n)
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Self {
        Dim::Static(n as u64)
    }
}

impl From<&str> for Dim {
    fn from(name: &str) -> Self {
        Dim::sym(name)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Symbolic(name) => f.write_str(name),
        }
    }
}

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// Host memory.
    #[default]
    Cpu,
    /// A GPU, by ordinal.
    Gpu(u32),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu(n) => write!(f, "gpu:{n}"),
        }
    }
}

/// The type of a tensor value: element type, shape and device.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<Dim>,
    /// Device.
    #[serde(default)]
    pub device: Device,
}

impl TensorType {
    /// A CPU tensor type.
    pub fn new<D: Into<Dim>>(dtype: DType, shape: impl IntoIterator<Item = D>) -> Self {
        Self {
            dtype,
            shape: shape.into_iter().map(Into::into).collect(),
            device: Device::Cpu,
        }
    }

    /// The same type on another device.
    pub fn on(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The shape, if every dimension is static.
    pub fn static_shape(&self) -> Option<Vec<u64>> {
        self.shape.iter().map(Dim::as_static).collect()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, dim) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{dim}")?;
        }
        f.write_str("]")?;
        if self.device != Device::Cpu {
            write!(f, "@{}", self.device)?;
        }
        Ok(())
    }
}

/// A weight as a graph references it: its fully qualified name, logical type
/// and storage encoding. Quantized weights have a float logical dtype (what
/// they compute as) and a quantized `encoding` (how they are stored).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightSpec {
    /// Fully qualified name, e.g. `layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Logical element type.
    pub dtype: DType,
    /// Logical shape (always static).
    pub shape: Vec<u64>,
    /// Storage encoding.
    pub encoding: Encoding,
    /// Device.
    #[serde(default)]
    pub device: Device,
}

impl WeightSpec {
    /// The weight's type as a graph value.
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.iter().copied()).on(self.device)
    }

    /// True when the weight is stored in a quantized block format.
    pub fn is_quantized(&self) -> bool {
        DType::of_encoding(self.encoding).is_none()
    }
}
