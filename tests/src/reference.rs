//! Reading the PyTorch reference fixtures (`tests/fixtures/reference/`) and
//! comparing results against them.

use kiln_host::runtime::{Data, Tensor};
use kiln_plugin_api::graph::DType;
use serde::Deserialize;
use serde_json::Value;

/// A fixture file: cases computed by `gen_reference.py`.
#[derive(Debug, Deserialize)]
pub struct Fixture<C> {
    /// The torch version that computed the values.
    pub torch: String,
    /// The cases.
    pub cases: Vec<C>,
}

/// A tensor as the fixtures store it.
#[derive(Clone, Debug, Deserialize)]
pub struct FixtureTensor {
    /// `f32`, `i64` or `bool`.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub data: Vec<Value>,
}

impl FixtureTensor {
    /// An f32 tensor of `shape` holding `values` (row-major).
    pub fn f32(shape: Vec<usize>, values: &[f64]) -> Self {
        Self {
            dtype: "f32".to_owned(),
            shape,
            data: values.iter().map(|&v| Value::from(v)).collect(),
        }
    }

    /// Row `index` of a `[rows, cols]` tensor, as a `[cols]` tensor.
    pub fn row(&self, index: usize) -> FixtureTensor {
        let cols = self.shape[1];
        FixtureTensor {
            dtype: self.dtype.clone(),
            shape: vec![cols],
            data: self.data[index * cols..(index + 1) * cols].to_vec(),
        }
    }

    /// The logical dtype.
    pub fn dtype(&self) -> DType {
        match self.dtype.as_str() {
            "f32" => DType::F32,
            "i64" => DType::I64,
            "bool" => DType::Bool,
            other => panic!("fixture dtype {other} is not supported"),
        }
    }

    /// The values as f64 (bool as 0/1).
    pub fn values(&self) -> Vec<f64> {
        self.data
            .iter()
            .map(|v| match v {
                Value::Bool(b) => f64::from(u8::from(*b)),
                Value::Number(n) => n.as_f64().expect("numbers"),
                Value::String(s) if s == "nan" || s == "NaN" => f64::NAN,
                Value::String(s) if s.ends_with("inf") || s.ends_with("Infinity") => {
                    if s.starts_with('-') {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    }
                }
                other => panic!("unexpected fixture value {other}"),
            })
            .collect()
    }

    /// The runtime tensor.
    pub fn to_tensor(&self) -> Tensor {
        let values = self.values();
        match self.dtype() {
            DType::F32 => Tensor::f32(
                self.shape.clone(),
                values.iter().map(|&v| v as f32).collect(),
            ),
            DType::I64 => Tensor::i64(
                self.shape.clone(),
                values.iter().map(|&v| v as i64).collect(),
            ),
            _ => Tensor::bool(
                self.shape.clone(),
                values.iter().map(|&v| v != 0.0).collect(),
            ),
        }
    }
}

/// Compares `actual` with `expected` (`|a - e| <= atol + rtol·|e|` for floats,
/// exact otherwise); returns a description of the first mismatch.
pub fn compare(
    actual: &Tensor,
    expected: &FixtureTensor,
    atol: f64,
    rtol: f64,
) -> Result<(), String> {
    if actual.shape != expected.shape {
        return Err(format!(
            "shape {:?}, expected {:?}",
            actual.shape, expected.shape
        ));
    }
    let want = expected.values();
    let got = actual.to_f64();
    let float = matches!(actual.data, Data::F32(_));
    if float != (expected.dtype() == DType::F32) {
        return Err(format!(
            "dtype {}, expected {}",
            actual.dtype, expected.dtype
        ));
    }
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &e)) in got.iter().zip(&want).enumerate() {
        let ok = if float {
            // Both sides are f32 values; compare them as such.
            let (a32, e32) = (a as f32, e as f32);
            (a.is_nan() && e.is_nan()) || a32 == e32 || (a - e).abs() <= atol + rtol * e.abs()
        } else {
            a == e
        };
        if !ok {
            let excess = (a - e).abs();
            if worst.is_none_or(|(_, w)| excess > w || excess.is_nan()) {
                worst = Some((i, excess));
            }
        }
    }
    match worst {
        None => Ok(()),
        Some((i, _)) => Err(format!(
            "element {i}: {} vs expected {} (atol {atol}, rtol {rtol})",
            got[i], want[i]
        )),
    }
}

/// Asserts that `actual` and `expected` have the same length and differ by
/// at most `atol` anywhere; `what` names them in the failure.
pub fn assert_within(actual: &[f32], expected: &[f32], atol: f32, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}");
    for (a, e) in actual.iter().zip(expected) {
        assert!((a - e).abs() <= atol, "{what}: {actual:?} vs {expected:?}");
    }
}
