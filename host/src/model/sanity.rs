//! Checks of what a checkpoint declares before anything is sized from it.
//!
//! A config (config.json, or GGUF metadata mapped to one) says how many
//! layers, how wide and how long a model is, and architectures allocate
//! from those numbers while building their graph. A corrupt or hostile
//! file must not decide those allocations: each size is checked against
//! sane bounds and against the checkpoint itself (no matrix can have more
//! elements than all its tensors together), and the numbers that must be
//! finite and positive are. `--check-weights` scans the weights themselves
//! for NaN and infinity.

use serde_json::Value;

use crate::checkpoint::{Checkpoint, MAX_LAYERS};
use rayon::prelude::*;

use crate::runtime::WeightStore;

/// Layer-count keys: at most [`MAX_LAYERS`], and no more than the tensors.
const LAYER_KEYS: &[&str] = &["num_hidden_layers", "n_layer", "num_layers"];

/// Model widths (one side of a weight matrix whose other side is the
/// hidden size) and their upper bounds.
const WIDTH_KEYS: &[(&str, u64)] = &[
    ("hidden_size", 1 << 17),
    ("n_embd", 1 << 17),
    ("d_model", 1 << 17),
    ("intermediate_size", 1 << 20),
    ("n_inner", 1 << 20),
    ("moe_intermediate_size", 1 << 20),
    ("shared_expert_intermediate_size", 1 << 20),
    ("vocab_size", 1 << 24),
];

/// Other counts and their upper bounds.
const COUNT_KEYS: &[(&str, u64)] = &[
    ("head_dim", 1 << 12),
    ("num_attention_heads", 1 << 12),
    ("n_head", 1 << 12),
    ("num_key_value_heads", 1 << 12),
    ("num_local_experts", 1 << 12),
    ("num_experts", 1 << 12),
    ("num_experts_per_tok", 1 << 12),
    ("max_position_embeddings", 1 << 28),
    ("n_positions", 1 << 28),
    ("sliding_window", 1 << 28),
];

/// Keys that must be finite and positive.
const POSITIVE_KEYS: &[&str] = &["rope_theta", "rope_local_base_freq", "factor"];

/// Checks `config` against the bounds and against `checkpoint`'s tensors.
/// Nested objects (`text_config`, `rope_scaling`) are checked too.
pub fn check_config(config: &Value, checkpoint: &Checkpoint) -> Result<(), String> {
    let elements: u128 = checkpoint
        .tensors
        .values()
        .map(|t| {
            t.info
                .shape
                .iter()
                .map(|&d| u128::from(d))
                .product::<u128>()
        })
        .sum();
    check_object(config, checkpoint.tensors.len() as u64, elements, "")
}

fn check_object(config: &Value, tensors: u64, elements: u128, path: &str) -> Result<(), String> {
    let Some(fields) = config.as_object() else {
        return Ok(());
    };
    let mut hidden = None;
    for (key, value) in fields {
        let name = format!("{path}{key}");
        if value.is_object() {
            check_object(value, tensors, elements, &format!("{name}."))?;
            continue;
        }
        let Some(number) = value.as_f64() else {
            continue;
        };
        let count = || {
            value
                .as_u64()
                .ok_or_else(|| format!("config `{name}` is {value}, not a whole number"))
        };
        if LAYER_KEYS.contains(&key.as_str()) {
            let layers = count()?;
            let limit = MAX_LAYERS.min(tensors);
            if layers > limit {
                return Err(format!(
                    "config `{name}` is {layers}: more than {limit} (the checkpoint has {tensors} tensors)"
                ));
            }
        } else if let Some(&(_, limit)) = WIDTH_KEYS.iter().find(|(k, _)| k == key) {
            let width = count()?;
            if width > limit {
                return Err(format!("config `{name}` is {width}: at most {limit}"));
            }
            if matches!(key.as_str(), "hidden_size" | "n_embd" | "d_model") {
                hidden = Some(width);
            }
        } else if let Some(&(_, limit)) = COUNT_KEYS.iter().find(|(k, _)| k == key) {
            let n = count()?;
            if n > limit {
                return Err(format!("config `{name}` is {n}: at most {limit}"));
            }
        } else if (key.ends_with("eps") || key.ends_with("epsilon"))
            && !(0.0..1.0).contains(&number)
        {
            return Err(format!(
                "config `{name}` is {number}: a norm epsilon must be in [0, 1)"
            ));
        } else if POSITIVE_KEYS.contains(&key.as_str()) && number <= 0.0 {
            return Err(format!("config `{name}` is {number}: it must be positive"));
        }
    }
    // Every width spans a matrix with the hidden size on its other side:
    // no such matrix can hold more elements than the whole checkpoint.
    if let Some(hidden) = hidden {
        for (key, _) in WIDTH_KEYS {
            if let Some(width) = fields.get(*key).and_then(Value::as_u64) {
                if u128::from(width) * u128::from(hidden) > elements {
                    return Err(format!(
                        "config `{path}{key}` ({width}) × the hidden size ({hidden}) is more than the checkpoint's {elements} weight elements"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// `--check-weights`: every weight decodes to finite values (like
/// llama.cpp's `--check-tensors`). Names a weight that does not.
pub fn check_weights(store: &WeightStore) -> Result<(), String> {
    let weights: Vec<_> = store.iter().collect();
    weights.par_iter().try_for_each(|weight| {
        let cols = (*weight.spec.shape.last().unwrap_or(&1) as usize).max(1);
        let mut row = vec![0f32; cols];
        for r in 0..weight.elements() / cols {
            weight.decode_rows(r..r + 1, &mut row)?;
            if let Some(bad) = row.iter().position(|v: &f32| !v.is_finite()) {
                return Err(format!(
                    "weight `{}` has {} at row {r}, column {bad} (--check-weights)",
                    weight.spec.name, row[bad]
                ));
            }
        }
        Ok(())
    })
}
