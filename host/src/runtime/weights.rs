//! Weight data as the runtime reads it: bytes in the stored encoding, shared
//! and never copied (a memory map or an owned buffer), decoded on use.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use half::{bf16, f16};
use kiln_kernels::quant::{dequantize_row, QuantType};
use kiln_plugin_api::graph::WeightSpec;
use kiln_plugin_api::Encoding;

use super::tensor::Tensor;

/// One weight: its description and its bytes.
#[derive(Clone)]
pub struct WeightData {
    /// Name, logical type and shape, storage encoding.
    pub spec: WeightSpec,
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl std::fmt::Debug for WeightData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightData")
            .field("spec", &self.spec)
            .field("bytes", &self.range.len())
            .finish()
    }
}

impl WeightData {
    /// A weight whose bytes are `range` of `owner` (e.g. a memory-mapped file).
    pub fn new(
        spec: WeightSpec,
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        range: Range<usize>,
    ) -> Self {
        Self { spec, owner, range }
    }

    /// An f32 weight from values (tests, constants).
    pub fn from_f32(mut spec: WeightSpec, values: &[f32]) -> Self {
        spec.encoding = Encoding::Float32;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let len = bytes.len();
        Self::new(spec, Arc::new(bytes), 0..len)
    }

    /// The stored bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.owner.as_ref().as_ref()[self.range.clone()]
    }

    /// The GGUF block format of a quantized weight.
    pub fn quant_type(&self) -> Option<QuantType> {
        quant_type(self.spec.encoding)
    }

    /// Number of logical elements.
    pub fn elements(&self) -> usize {
        self.spec.shape.iter().product::<u64>() as usize
    }

    /// Checks that the byte length matches the shape and encoding.
    pub fn validate(&self) -> Result<(), String> {
        let cols = *self.spec.shape.last().unwrap_or(&1) as usize;
        let rows = self.elements() / cols.max(1);
        let expected = match self.quant_type() {
            Some(ty) => {
                ty.row_bytes(cols)
                    .map_err(|e| format!("weight `{}`: {e}", self.spec.name))?
                    * rows
            }
            None => self.elements() * bytes_per_element(self.spec.encoding),
        };
        if expected == self.bytes().len() {
            Ok(())
        } else {
            Err(format!(
                "weight `{}` ({} {:?}) needs {expected} bytes, has {}",
                self.spec.name,
                self.spec.encoding,
                self.spec.shape,
                self.bytes().len()
            ))
        }
    }

    /// Decodes rows `rows` (of the last axis) to f32.
    pub fn decode_rows(&self, rows: Range<usize>, out: &mut [f32]) -> Result<(), String> {
        let cols = *self.spec.shape.last().unwrap_or(&1) as usize;
        let bytes = self.bytes();
        match self.quant_type() {
            Some(ty) => {
                let row_bytes = ty.row_bytes(cols).map_err(|e| e.to_string())?;
                for (i, row) in rows.enumerate() {
                    dequantize_row(
                        ty,
                        &bytes[row * row_bytes..(row + 1) * row_bytes],
                        &mut out[i * cols..(i + 1) * cols],
                    )
                    .map_err(|e| e.to_string())?;
                }
            }
            None => {
                let width = bytes_per_element(self.spec.encoding);
                let start = rows.start * cols * width;
                let chunk = &bytes[start..start + rows.len() * cols * width];
                decode_float(self.spec.encoding, chunk, out);
            }
        }
        Ok(())
    }

    /// The whole weight decoded as a tensor of `dtype` (the graph's logical type).
    pub fn to_tensor(&self, dtype: kiln_plugin_api::graph::DType) -> Result<Tensor, String> {
        let shape: Vec<usize> = self.spec.shape.iter().map(|&d| d as usize).collect();
        let cols = *shape.last().unwrap_or(&1);
        let rows = self.elements() / cols.max(1);
        let mut values = vec![0f32; self.elements()];
        self.decode_rows(0..rows, &mut values)?;
        Ok(Tensor::from_f32(dtype, shape, values))
    }
}

/// Decodes little-endian float bytes of an unquantized encoding.
fn decode_float(encoding: Encoding, bytes: &[u8], out: &mut [f32]) {
    match encoding {
        Encoding::Float16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        Encoding::BFloat16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

fn bytes_per_element(encoding: Encoding) -> usize {
    match encoding {
        Encoding::Float16 | Encoding::BFloat16 => 2,
        _ => 4,
    }
}

/// The GGUF block format of an encoding, if it is quantized.
pub fn quant_type(encoding: Encoding) -> Option<QuantType> {
    Some(match encoding {
        Encoding::Float32 | Encoding::Float16 | Encoding::BFloat16 => return None,
        Encoding::Q8_0 => QuantType::Q8_0,
        Encoding::Q4_0 => QuantType::Q4_0,
        Encoding::Q4_1 => QuantType::Q4_1,
        Encoding::Q5_0 => QuantType::Q5_0,
        Encoding::Q5_1 => QuantType::Q5_1,
        Encoding::Q2K => QuantType::Q2K,
        Encoding::Q3K => QuantType::Q3K,
        Encoding::Q4K => QuantType::Q4K,
        Encoding::Q5K => QuantType::Q5K,
        Encoding::Q6K => QuantType::Q6K,
        Encoding::Iq4Nl => QuantType::IQ4NL,
        Encoding::Iq4Xs => QuantType::IQ4XS,
    })
}

/// The encoding of a GGUF block format (the inverse of [`quant_type`]).
pub fn quant_encoding(ty: QuantType) -> Encoding {
    match ty {
        QuantType::Q4_0 => Encoding::Q4_0,
        QuantType::Q4_1 => Encoding::Q4_1,
        QuantType::Q5_0 => Encoding::Q5_0,
        QuantType::Q5_1 => Encoding::Q5_1,
        QuantType::Q8_0 => Encoding::Q8_0,
        QuantType::Q2K => Encoding::Q2K,
        QuantType::Q3K => Encoding::Q3K,
        QuantType::Q4K => Encoding::Q4K,
        QuantType::Q5K => Encoding::Q5K,
        QuantType::Q6K => Encoding::Q6K,
        QuantType::IQ4NL => Encoding::Iq4Nl,
        QuantType::IQ4XS => Encoding::Iq4Xs,
    }
}

/// Weights by name.
#[derive(Clone, Debug, Default)]
pub struct WeightStore {
    weights: HashMap<String, WeightData>,
}

impl WeightStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a weight after checking its size.
    pub fn insert(&mut self, weight: WeightData) -> Result<(), String> {
        weight.validate()?;
        self.weights.insert(weight.spec.name.clone(), weight);
        Ok(())
    }

    /// The weight called `name`.
    pub fn get(&self, name: &str) -> Option<&WeightData> {
        self.weights.get(name)
    }

    /// Every weight, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &WeightData> {
        self.weights.values()
    }
}
