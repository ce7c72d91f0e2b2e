//! Concrete tensors of the CPU runtime.
//!
//! Float values are held as f32 whatever their logical type; f16 and bf16
//! results are rounded to their type after every op (as PyTorch computes them
//! in f32 and stores them rounded). Integers are held as i64, booleans as bool.

use half::{bf16, f16};
use kiln_plugin_api::graph::DType;

/// Element storage.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// f32, f16 and bf16 values.
    F32(Vec<f32>),
    /// i64, i32 and u8 values.
    I64(Vec<i64>),
    /// Booleans.
    Bool(Vec<bool>),
}

impl Data {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tensor: logical type, concrete shape, row-major data.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Logical element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Elements, row-major.
    pub data: Data,
}

impl Tensor {
    /// A tensor of `dtype` from f32 values (rounded to f16/bf16 when needed).
    pub fn from_f32(dtype: DType, shape: Vec<usize>, mut values: Vec<f32>) -> Self {
        debug_assert_eq!(values.len(), shape.iter().product::<usize>());
        round_floats(dtype, &mut values);
        Self {
            dtype,
            shape,
            data: Data::F32(values),
        }
    }

    /// An f32 tensor.
    pub fn f32(shape: Vec<usize>, values: Vec<f32>) -> Self {
        Self::from_f32(DType::F32, shape, values)
    }

    /// An i64 tensor.
    pub fn i64(shape: Vec<usize>, values: Vec<i64>) -> Self {
        debug_assert_eq!(values.len(), shape.iter().product::<usize>());
        Self {
            dtype: DType::I64,
            shape,
            data: Data::I64(values),
        }
    }

    /// A bool tensor.
    pub fn bool(shape: Vec<usize>, values: Vec<bool>) -> Self {
        Self {
            dtype: DType::Bool,
            shape,
            data: Data::Bool(values),
        }
    }

    /// A tensor of `dtype` from f64 values (constants).
    pub fn from_f64(dtype: DType, shape: Vec<usize>, values: &[f64]) -> Self {
        match storage_of(dtype) {
            Storage::F32 => {
                Self::from_f32(dtype, shape, values.iter().map(|&v| v as f32).collect())
            }
            Storage::I64 => Self {
                dtype,
                shape,
                data: Data::I64(values.iter().map(|&v| v as i64).collect()),
            },
            Storage::Bool => Self::bool(shape, values.iter().map(|&v| v != 0.0).collect()),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The f32 values (float tensors only).
    pub fn as_f32(&self) -> &[f32] {
        match &self.data {
            Data::F32(v) => v,
            _ => panic!("expected a float tensor, got {}", self.dtype),
        }
    }

    /// The i64 values (integer tensors only).
    pub fn as_i64(&self) -> &[i64] {
        match &self.data {
            Data::I64(v) => v,
            _ => panic!("expected an integer tensor, got {}", self.dtype),
        }
    }

    /// The values as f64, whatever the storage.
    pub fn to_f64(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
        }
    }
}

/// How a logical dtype is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// As f32.
    F32,
    /// As i64.
    I64,
    /// As bool.
    Bool,
}

/// The storage class of a logical dtype.
pub fn storage_of(dtype: DType) -> Storage {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Storage::F32,
        DType::I64 | DType::I32 | DType::U8 => Storage::I64,
        DType::Bool => Storage::Bool,
    }
}

/// Rounds f32 values to a narrower float type in place.
pub fn round_floats(dtype: DType, values: &mut [f32]) {
    match dtype {
        DType::F16 => values
            .iter_mut()
            .for_each(|v| *v = f16::from_f32(*v).to_f32()),
        DType::BF16 => values
            .iter_mut()
            .for_each(|v| *v = bf16::from_f32(*v).to_f32()),
        _ => {}
    }
}

/// Wraps integers to a narrower integer type (as a cast does).
pub fn wrap_integers(dtype: DType, values: &mut [i64]) {
    match dtype {
        DType::I32 => values.iter_mut().for_each(|v| *v = i64::from(*v as i32)),
        DType::U8 => values.iter_mut().for_each(|v| *v = i64::from(*v as u8)),
        _ => {}
    }
}

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}
