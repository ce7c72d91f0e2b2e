//! safetensors checkpoints: a single file, or shards listed by
//! `model.safetensors.index.json`; each file memory-mapped once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_plugin_api::adapters::CheckpointTensor;
use kiln_plugin_api::WeightsFormat;
use memmap2::Mmap;
use safetensors::SafeTensors;

use super::gguf::GgufValue;
use super::{float_encoding, Checkpoint, CheckpointError, Tensor, TensorBytes};

/// Opens a `.safetensors` file or a sharded checkpoint's index
/// (`*.safetensors.index.json`).
pub fn open_safetensors(path: &Path, bytes: TensorBytes) -> Result<Checkpoint, CheckpointError> {
    let is_index = path.extension().and_then(|e| e.to_str()) == Some("json");
    let shards: Vec<PathBuf> = if is_index {
        read_index(path)?
    } else {
        vec![path.to_owned()]
    };
    let mut tensors = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    for shard in &shards {
        let (shard_tensors, shard_metadata) = read_shard(shard, bytes)?;
        for (name, tensor) in shard_tensors {
            if tensors.insert(name.clone(), tensor).is_some() {
                return Err(CheckpointError::Malformed {
                    path: shard.clone(),
                    message: format!("tensor `{name}` is in more than one shard"),
                });
            }
        }
        metadata.extend(shard_metadata);
    }
    Ok(Checkpoint {
        format: WeightsFormat::Safetensors,
        files: shards,
        tensors,
        metadata,
    })
}

/// The shard files an index lists (each once, in name order).
fn read_index(path: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let malformed = |message: String| CheckpointError::Malformed {
        path: path.to_owned(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    })?;
    let index: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| malformed(format!("not valid JSON: {e}")))?;
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| malformed("no `weight_map` object".to_owned()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut shards: Vec<PathBuf> = map
        .values()
        .map(|file| {
            let file = file
                .as_str()
                .ok_or_else(|| malformed("a `weight_map` entry is not a file name".to_owned()))?;
            if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                return Err(malformed(format!(
                    "shard name `{file}` must be a plain file name"
                )));
            }
            Ok(dir.join(file))
        })
        .collect::<Result<_, _>>()?;
    shards.sort();
    shards.dedup();
    Ok(shards)
}

type Shard = (Vec<(String, Tensor)>, BTreeMap<String, GgufValue>);

fn read_shard(path: &Path, bytes: TensorBytes) -> Result<Shard, CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the file is mapped read-only; like every memory-mapping
    // loader, we assume nobody truncates it while the model is loaded.
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io)?);
    let (header_len, header) =
        SafeTensors::read_metadata(&map[..]).map_err(|e| CheckpointError::Malformed {
            path: path.to_owned(),
            message: format!("not a safetensors file: {e}"),
        })?;
    let data_start = 8 + header_len;
    let owner = super::tensor_bytes::owner(path, map.clone(), bytes);
    let tensors = header
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let storage = format!("{:?}", info.dtype);
            let tensor = Tensor::new(
                CheckpointTensor {
                    name: name.clone(),
                    shape: info.shape.iter().map(|&d| d as u64).collect(),
                    encoding: float_encoding(&storage),
                    storage,
                },
                Arc::clone(&owner),
                data_start + info.data_offsets.0..data_start + info.data_offsets.1,
            );
            (name, tensor)
        })
        .collect();
    let metadata = header
        .metadata()
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), GgufValue::String(v.clone())))
        .collect();
    Ok((tensors, metadata))
}
