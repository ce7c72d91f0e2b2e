//! Weights quantized at load (`--quantization q8_0`): a checkpoint's float
//! matrices become GGUF Q8_0 blocks, the bytes `llama-quantize … Q8_0`
//! would store, so that every backend reads them through the kernels of a
//! Q8_0 GGUF file. The counterpart of vLLM's `--quantization fp8` for
//! checkpoints stored in bf16: about half the bytes a decode step streams.

use std::sync::Arc;

use kiln_kernels::quant::{quantize_row_q8_0, QuantType};
use kiln_kernels::HugePageBuffer;
use kiln_plugin_api::Encoding;
use rayon::prelude::*;

use super::{BoundWeights, CheckpointError};
use crate::runtime::WeightData;

/// How weights are quantized at load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadQuantization {
    /// As stored.
    #[default]
    None,
    /// Float matrices to Q8_0 blocks (32 values and an f16 scale a block).
    Q8_0,
}

/// What [`quantize_matrices`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quantized {
    /// Matrices quantized.
    pub matrices: usize,
    /// Their bytes before and after.
    pub bytes: (usize, usize),
}

/// Rows a task of the thread pool quantizes.
const ROWS_PER_TASK: usize = 64;

/// Quantizes every float weight of `bound` that `llama-quantize` would
/// quantize to Q8_0: those of two axes or more (matrices, stacked experts)
/// whose rows are whole blocks of 32. Vectors (norms, biases) and other
/// encodings stay as they are. The weights' logical types do not change.
pub fn quantize_matrices(
    bound: &mut BoundWeights,
    how: LoadQuantization,
) -> Result<Quantized, CheckpointError> {
    let ty = match how {
        LoadQuantization::None => return Ok(Quantized::default()),
        LoadQuantization::Q8_0 => QuantType::Q8_0,
    };
    let mut chosen: Vec<WeightData> = bound
        .store
        .iter()
        .filter(|w| quantizable(w, ty))
        .cloned()
        .collect();
    chosen.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
    let mut done = Quantized::default();
    for weight in chosen {
        let quantized = quantize(&weight, ty).map_err(CheckpointError::Adaptation)?;
        done.matrices += 1;
        done.bytes.0 += weight.bytes().len();
        done.bytes.1 += quantized.bytes().len();
        bound
            .state_dict
            .insert(quantized.spec.name.clone(), quantized.spec.clone());
        bound
            .store
            .insert(quantized)
            .map_err(CheckpointError::Adaptation)?;
    }
    Ok(done)
}

/// Whether `weight` is a float tensor of two axes or more with rows of
/// whole `ty` blocks.
fn quantizable(weight: &WeightData, ty: QuantType) -> bool {
    let float = matches!(
        weight.spec.encoding,
        Encoding::Float32 | Encoding::Float16 | Encoding::BFloat16
    );
    let shape = &weight.spec.shape;
    float
        && shape.len() >= 2
        && shape
            .last()
            .is_some_and(|&cols| cols > 0 && (cols as usize).is_multiple_of(ty.block_elems()))
}

/// `weight` as `ty` blocks, row by row on the thread pool.
fn quantize(weight: &WeightData, ty: QuantType) -> Result<WeightData, String> {
    let cols = *weight.spec.shape.last().expect("a matrix") as usize;
    let rows = weight.elements() / cols;
    let row_bytes = ty.row_bytes(cols).map_err(|e| e.to_string())?;
    let mut out = HugePageBuffer::new(rows * row_bytes)
        .map_err(|e| format!("`{}`: {e}", weight.spec.name))?;
    out.par_chunks_mut(ROWS_PER_TASK * row_bytes)
        .enumerate()
        .try_for_each(|(task, bytes)| {
            let first = task * ROWS_PER_TASK;
            let count = bytes.len() / row_bytes;
            let mut values = vec![0f32; count * cols];
            weight.decode_rows(first..first + count, &mut values)?;
            for (x, row) in values
                .chunks_exact(cols)
                .zip(bytes.chunks_exact_mut(row_bytes))
            {
                quantize_row_q8_0(x, row).map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        })?;
    let mut spec = weight.spec.clone();
    spec.encoding = Encoding::Q8_0;
    let len = out.len();
    let quantized = WeightData::new(spec, Arc::new(out), 0..len);
    quantized.validate()?;
    Ok(quantized)
}

#[cfg(test)]
mod tests {
    use kiln_plugin_api::graph::{DType, Device, WeightSpec};
    use kiln_plugin_api::nn::StateDict;

    use super::*;
    use crate::runtime::WeightStore;

    fn weight(name: &str, shape: &[u64], values: &[f32]) -> WeightData {
        let spec = WeightSpec {
            name: name.to_owned(),
            dtype: DType::F32,
            shape: shape.to_vec(),
            encoding: Encoding::Float32,
            device: Device::Cpu,
        };
        WeightData::from_f32(spec, values)
    }

    #[test]
    fn matrices_become_q8_0_and_vectors_stay() {
        let values: Vec<f32> = (0..3 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut store = WeightStore::new();
        let mut state_dict = StateDict::new();
        for w in [
            weight("proj.weight", &[3, 64], &values),
            weight("norm.weight", &[64], &values[..64]),
            weight("odd.weight", &[2, 48], &values[..96]),
        ] {
            state_dict.insert(w.spec.name.clone(), w.spec.clone());
            store.insert(w).unwrap();
        }
        let mut bound = BoundWeights {
            state_dict,
            store,
            unused: Vec::new(),
        };
        let done = quantize_matrices(&mut bound, LoadQuantization::Q8_0).unwrap();
        assert_eq!(done.matrices, 1);
        assert_eq!(done.bytes, (3 * 64 * 4, 3 * 2 * 34));
        let proj = bound.store.get("proj.weight").unwrap();
        assert_eq!(proj.spec.encoding, Encoding::Q8_0);
        assert_eq!(bound.state_dict["proj.weight"].encoding, Encoding::Q8_0);
        // The blocks are ggml's: each value within half a step of its block,
        // and what the f16 scale's rounding moves (up to 127 steps × 2^-11).
        let mut decoded = vec![0f32; values.len()];
        proj.decode_rows(0..3, &mut decoded).unwrap();
        for (block, want) in decoded.chunks(32).zip(values.chunks(32)) {
            let step = want.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (got, want) in block.iter().zip(want) {
                let tolerance = step * (0.5 + 127.0 / 2048.0);
                assert!((got - want).abs() <= tolerance, "{got} vs {want}");
            }
        }
        for name in ["norm.weight", "odd.weight"] {
            assert_eq!(
                bound.store.get(name).unwrap().spec.encoding,
                Encoding::Float32
            );
        }
    }
}
