//! Weights quantized at load (`--quantization q8_0|q4_0|q4_k_m|...`): a
//! checkpoint's float matrices become GGUF blocks, the bytes
//! `llama-quantize` would store, so that every backend reads them through
//! the kernels of a GGUF file. The counterpart of vLLM's `--quantization
//! fp8` (Q8_0: about half the bytes a bf16 decode step streams), of its
//! 4-bit bitsandbytes quantization at load (Q4_0: 4.5 bits a weight), and of
//! mistral.rs's in-situ K-quants (Q5_K_M, Q4_K_M, Q3_K_M, Q2_K, IQ4_XS:
//! llama.cpp's mixes, [`super::quant_mix`]).

use std::sync::Arc;

use kiln_kernels::quant::{quantize_row, QuantType};
use kiln_kernels::HugePageBuffer;
use rayon::prelude::*;

use super::quant_mix::{plan_formats, ModelSizes};
use super::{BoundWeights, CheckpointError};
use crate::runtime::{quant_encoding, WeightData};

/// How weights are quantized at load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadQuantization {
    /// As stored.
    #[default]
    None,
    /// Float matrices to Q8_0 blocks (32 values and an f16 scale a block).
    Q8_0,
    /// Float matrices to Q4_0 blocks (32 four-bit values and an f16 scale),
    /// the vocabulary's (embeddings, LM head) to Q8_0.
    Q4_0,
    /// llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the LM head and half of
    /// the value and down projections.
    Q4KM,
    /// llama.cpp's Q5_K_M mix: as [`Self::Q4KM`] with Q5_K.
    Q5KM,
    /// llama.cpp's Q3_K_M mix: Q3_K, with Q6_K for the LM head and Q4_K or
    /// Q5_K for the output, value and down projections.
    Q3KM,
    /// llama.cpp's Q2_K mix: Q2_K, with Q6_K for the LM head and Q3_K (or
    /// Q4_K) for the output, value and down projections.
    Q2K,
    /// llama.cpp's IQ4_XS mix: IQ4_XS (IQ4_NL for rows that are not whole
    /// super-blocks), with Q6_K for the LM head and Q5_K for early down
    /// projections.
    IQ4XS,
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

/// Where each weight starts in the shared buffer: a cache line.
const ALIGN: usize = 64;

/// Quantizes the float weights of `bound` as `how` asks
/// ([`super::quant_mix`] picks each one's format from its name, shape and
/// the model's `sizes`). Vectors
/// (norms, biases), routers and other encodings keep their bytes. The
/// weights' logical types do not change.
///
/// Every weight, quantized or copied, ends up in one buffer (in huge pages,
/// as the CPU backend wants its weights), so nothing refers to the
/// checkpoint's bytes any more: they are freed with the checkpoint.
pub fn quantize_matrices(
    bound: &mut BoundWeights,
    how: LoadQuantization,
    sizes: ModelSizes,
) -> Result<Quantized, CheckpointError> {
    if how == LoadQuantization::None {
        return Ok(Quantized::default());
    }
    let mut weights: Vec<WeightData> = bound.store.iter().cloned().collect();
    weights.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
    // Each weight's encoding and place in the buffer.
    let mut plan = Vec::with_capacity(weights.len());
    let mut total = 0;
    for (weight, ty) in weights.iter().zip(plan_formats(&weights, how, sizes)) {
        let len = match ty {
            Some(ty) => {
                let cols = *weight.spec.shape.last().expect("a matrix") as usize;
                let rows = weight.elements() / cols;
                rows * ty.row_bytes(cols).map_err(|e| adaptation(weight, e))?
            }
            None => weight.bytes().len(),
        };
        plan.push((ty, total..total + len));
        total = (total + len).next_multiple_of(ALIGN);
    }
    let mut buffer = HugePageBuffer::new(total.max(1))
        .map_err(|e| CheckpointError::Adaptation(e.to_string()))?;
    // Disjoint parts of the buffer, one a weight, filled in parallel.
    let mut parts = Vec::with_capacity(weights.len());
    let mut rest: &mut [u8] = &mut buffer;
    let mut at = 0;
    for (_, range) in &plan {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(range.start - at);
        let (part, tail) = tail.split_at_mut(range.len());
        parts.push(part);
        rest = tail;
        at = range.end;
    }
    weights
        .par_iter()
        .zip(&plan)
        .zip(parts)
        .try_for_each(|((weight, (ty, _)), part)| match ty {
            Some(ty) => quantize_into(weight, *ty, part),
            None => {
                part.copy_from_slice(weight.bytes());
                Ok(())
            }
        })
        .map_err(CheckpointError::Adaptation)?;

    let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(buffer);
    let mut done = Quantized::default();
    for (weight, (ty, range)) in weights.iter().zip(plan) {
        let mut spec = weight.spec.clone();
        if let Some(ty) = ty {
            done.matrices += 1;
            done.bytes.0 += weight.bytes().len();
            done.bytes.1 += range.len();
            spec.encoding = quant_encoding(ty);
        }
        let moved = WeightData::new(spec, Arc::clone(&owner), range);
        bound
            .state_dict
            .insert(moved.spec.name.clone(), moved.spec.clone());
        bound
            .store
            .insert(moved)
            .map_err(CheckpointError::Adaptation)?;
    }
    Ok(done)
}

/// A weight's error as the checkpoint's.
fn adaptation(weight: &WeightData, error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Adaptation(format!("`{}`: {error}", weight.spec.name))
}

/// `weight` as `ty` blocks into `out`, rows by tasks of the thread pool.
fn quantize_into(weight: &WeightData, ty: QuantType, out: &mut [u8]) -> Result<(), String> {
    let cols = *weight.spec.shape.last().expect("a matrix") as usize;
    let row_bytes = ty.row_bytes(cols).map_err(|e| e.to_string())?;
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
                quantize_row(ty, x, row).map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        })
        .map_err(|e| format!("`{}`: {e}", weight.spec.name))
}

#[cfg(test)]
mod tests {
    use kiln_plugin_api::graph::{DType, Device, WeightSpec};
    use kiln_plugin_api::nn::StateDict;
    use kiln_plugin_api::Encoding;

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
            weight("scale", &[], &values[..1]),
        ] {
            state_dict.insert(w.spec.name.clone(), w.spec.clone());
            store.insert(w).unwrap();
        }
        let mut bound = BoundWeights {
            state_dict,
            store,
            unused: Vec::new(),
        };
        let done = quantize_matrices(
            &mut bound,
            LoadQuantization::Q8_0,
            ModelSizes::of(&serde_json::json!({})),
        )
        .unwrap();
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
        // The others keep their encoding and bytes, moved to the new buffer.
        for (name, rows, values) in [
            ("norm.weight", 1, &values[..64]),
            ("odd.weight", 2, &values[..96]),
        ] {
            let weight = bound.store.get(name).unwrap();
            assert_eq!(weight.spec.encoding, Encoding::Float32);
            let mut decoded = vec![0f32; values.len()];
            weight.decode_rows(0..rows, &mut decoded).unwrap();
            assert_eq!(decoded, values);
        }
    }
}
