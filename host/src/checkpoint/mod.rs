//! Checkpoints: weights and metadata from safetensors and GGUF files,
//! memory-mapped and zero-copy, and binding them to an architecture's module
//! names through its weight adapter.

pub mod gguf;
pub(crate) mod quant_mix;
pub mod quantize;
mod safetensors;
mod tensor_bytes;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use kiln_plugin_api::adapters::{self, AdaptRequest, AdaptResponse};
use kiln_plugin_api::graph::{DType, Device, WeightSpec};
use kiln_plugin_api::nn::StateDict;
use kiln_plugin_api::{Encoding, WeightsFormat};

use self::gguf::GgufValue;
pub use self::safetensors::open_safetensors;
pub use self::tensor_bytes::TensorBytes;
use crate::runtime::{WeightData, WeightStore};

/// Why a checkpoint could not be read or bound.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is malformed.
    #[error("{}: {message}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A GGUF file that cannot be read (the error names the file).
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// The adapter maps a weight to something the checkpoint cannot provide.
    #[error("weight adaptation: {0}")]
    Adaptation(String),
}

/// The most layers a model may declare (the largest real ones have ~130).
pub const MAX_LAYERS: u64 = 1024;

/// A tensor of a checkpoint: its description and where its bytes are.
#[derive(Clone)]
pub struct Tensor {
    /// Name, shape, storage type and encoding.
    pub info: adapters::CheckpointTensor,
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("info", &self.info)
            .field("bytes", &self.range.len())
            .finish()
    }
}

impl Tensor {
    /// A tensor whose bytes are `range` of `owner`.
    pub fn new(
        info: adapters::CheckpointTensor,
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        range: Range<usize>,
    ) -> Self {
        Self { info, owner, range }
    }

    /// Size of the data in bytes.
    pub fn byte_len(&self) -> usize {
        self.range.len()
    }

    /// The tensor (or rows `rows` of it) as the weight `name`, zero-copy.
    /// Fails for tensors that cannot be weights (integers) and for row ranges
    /// outside the tensor.
    pub fn weight(&self, name: &str, rows: Option<(u64, u64)>) -> Result<WeightData, String> {
        let encoding = self.info.encoding.ok_or_else(|| {
            format!(
                "`{}` is stored as {}, which Kiln cannot read as weights (it reads F32, F16, \
                 BF16 and the block formats {})",
                self.info.name,
                self.info.storage,
                kiln_kernels::quant::QuantType::ALL
                    .map(|t| t.name())
                    .join(", ")
            )
        })?;
        let mut shape = self.info.shape.clone();
        let mut range = self.range.clone();
        if let Some((start, end)) = rows {
            // A vector's rows are its elements; otherwise rows of the matrix
            // view: every axis but the last is a row axis (a stacked
            // `[E, N, K]` tensor has `E·N` rows of `K`).
            let (total, row_shape): (u64, &[u64]) = match shape.as_slice() {
                [] => return Err(format!("`{}` has no rows", self.info.name)),
                [n] => (*n, &[]),
                [leading @ .., cols] => (leading.iter().product(), std::slice::from_ref(cols)),
            };
            if start >= end || end > total {
                return Err(format!(
                    "rows {start}..{end} of `{}` (which has {total})",
                    self.info.name
                ));
            }
            let row_bytes = self.range.len() / total as usize;
            range = self.range.start + start as usize * row_bytes
                ..self.range.start + end as usize * row_bytes;
            shape = [&[end - start], row_shape].concat();
        }
        let dtype = DType::of_encoding(encoding).unwrap_or(DType::F32);
        let spec = WeightSpec {
            name: name.to_owned(),
            dtype,
            shape,
            encoding,
            device: Device::Cpu,
        };
        let weight = WeightData::new(spec, Arc::clone(&self.owner), range);
        weight.validate()?;
        Ok(weight)
    }
}

/// A whole checkpoint: every tensor by name, and the file-level metadata.
#[derive(Debug)]
pub struct Checkpoint {
    /// The format.
    pub format: WeightsFormat,
    /// The files it was read from.
    pub files: Vec<PathBuf>,
    /// Tensors by name.
    pub tensors: BTreeMap<String, Tensor>,
    /// File-level metadata in the types the file stores: GGUF key/values
    /// (a vocabulary's arrays stay unboxed, not JSON), safetensors'
    /// `__metadata__` strings as [`GgufValue::String`].
    pub metadata: BTreeMap<String, GgufValue>,
}

/// A checkpoint bound to module names: the state dict for `load_state_dict`
/// and the weight data for the runtime.
#[derive(Debug)]
pub struct BoundWeights {
    /// Module weights as the adapter named them.
    pub state_dict: StateDict,
    /// Their data, by module name.
    pub store: WeightStore,
    /// Checkpoint tensors the adapter did not use.
    pub unused: Vec<String>,
}

impl Checkpoint {
    /// Describes the tensors for a weight adapter.
    pub fn adapt_request(&self, config: &serde_json::Value) -> AdaptRequest {
        AdaptRequest {
            format: self.format,
            tensors: self.tensors.values().map(|t| t.info.clone()).collect(),
            config: config.clone(),
        }
    }

    /// Applies an adapter's answer: every module weight becomes a zero-copy
    /// view of its source tensor.
    pub fn bind(&self, adaptation: &AdaptResponse) -> Result<BoundWeights, CheckpointError> {
        let mut state_dict = StateDict::new();
        let mut store = WeightStore::new();
        let mut used = std::collections::BTreeSet::new();
        for adapted in &adaptation.weights {
            let source = self.tensors.get(&adapted.source).ok_or_else(|| {
                CheckpointError::Adaptation(format!(
                    "`{}` maps to `{}`, which the checkpoint does not have",
                    adapted.name, adapted.source
                ))
            })?;
            if state_dict.contains_key(&adapted.name) {
                return Err(CheckpointError::Adaptation(format!(
                    "two tensors map to `{}`",
                    adapted.name
                )));
            }
            let weight = source
                .weight(&adapted.name, adapted.rows)
                .map_err(CheckpointError::Adaptation)?;
            used.insert(adapted.source.clone());
            state_dict.insert(adapted.name.clone(), weight.spec.clone());
            store.insert(weight).map_err(CheckpointError::Adaptation)?;
        }
        let unused = self
            .tensors
            .keys()
            .filter(|n| !used.contains(*n))
            .cloned()
            .collect();
        Ok(BoundWeights {
            state_dict,
            store,
            unused,
        })
    }
}

/// Opens a GGUF file as a checkpoint (tensors from the map or a copy, as
/// `bytes` says; metadata in its stored types), with its metadata mapped to a
/// Hugging Face shaped config.
pub fn open_gguf(
    path: &std::path::Path,
    bytes: TensorBytes,
) -> Result<(Checkpoint, serde_json::Value), CheckpointError> {
    let malformed = |e: gguf::GgufError| CheckpointError::Malformed {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let file = gguf::GgufFile::open(path)?;
    let owner = tensor_bytes::owner(path, file.map().clone(), bytes);
    let in_config = file.config_tensor_names();
    let tensors = file
        .tensors()
        .iter()
        .filter(|t| !in_config.contains(&t.name()))
        .map(|t| {
            let info = adapters::CheckpointTensor {
                name: t.name().to_owned(),
                shape: t.shape().to_vec(),
                storage: t.ggml_type().name().to_owned(),
                encoding: t.encoding().ok(),
            };
            (
                t.name().to_owned(),
                Tensor::new(info, Arc::clone(&owner), t.byte_range()),
            )
        })
        .collect();
    let config = file.hf_config().map_err(malformed)?;
    let metadata = file.into_metadata();
    let checkpoint = Checkpoint {
        format: WeightsFormat::Gguf,
        files: vec![path.to_owned()],
        tensors,
        metadata,
    };
    Ok((checkpoint, config))
}

/// The encoding of a float storage type name, as safetensors spells it.
pub fn float_encoding(storage: &str) -> Option<Encoding> {
    match storage {
        "F32" => Some(Encoding::Float32),
        "F16" => Some(Encoding::Float16),
        "BF16" => Some(Encoding::BFloat16),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_plugin_api::Encoding;

    fn f32_tensor(shape: &[u64]) -> Tensor {
        let count: u64 = shape.iter().product();
        let bytes: Vec<u8> = (0..count).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let len = bytes.len();
        let info = adapters::CheckpointTensor {
            name: "t".into(),
            shape: shape.to_vec(),
            storage: "F32".into(),
            encoding: Some(Encoding::Float32),
        };
        Tensor::new(info, Arc::new(bytes), 0..len)
    }

    fn first_value(weight: &WeightData) -> f32 {
        weight.to_tensor(DType::F32).unwrap().as_f32()[0]
    }

    /// Row ranges of a vector (a fused bias), a matrix and a stacked tensor.
    #[test]
    fn row_ranges_of_every_rank() {
        let bias = f32_tensor(&[6]).weight("b", Some((2, 5))).unwrap();
        assert_eq!(bias.spec.shape, [3]);
        assert_eq!(first_value(&bias), 2.0);
        let matrix = f32_tensor(&[4, 3]).weight("m", Some((1, 3))).unwrap();
        assert_eq!(matrix.spec.shape, [2, 3]);
        assert_eq!(first_value(&matrix), 3.0);
        let stacked = f32_tensor(&[2, 4, 3]).weight("s", Some((4, 8))).unwrap();
        assert_eq!(stacked.spec.shape, [4, 3]);
        assert_eq!(first_value(&stacked), 12.0);
        assert!(f32_tensor(&[4, 3]).weight("m", Some((3, 5))).is_err());
        assert!(f32_tensor(&[]).weight("x", Some((0, 1))).is_err());
    }
}
