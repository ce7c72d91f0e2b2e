//! GGUF files (llama.cpp's checkpoint format), memory-mapped and zero-copy.
//!
//! [`GgufFile::open`] maps the file and parses GGUF versions 2 and 3
//! (little-endian; the two lay out identically): the metadata into
//! [`GgufValue`]s and the tensor directory into [`GgufTensor`]s. Every count,
//! length, type and offset is checked against the file before it is used, so
//! a malformed or truncated file gives a [`GgufError::Invalid`] naming the
//! byte and the problem; nothing is allocated from an unchecked count.
//! [`GgufFile::weight_data`] hands a tensor to the runtime as a
//! [`WeightData`] that borrows the map.
//!
//! Tensor types: every ggml type is recognised at open (an unknown type id is
//! an error there, since its size is unknown), so every tensor's byte range is
//! checked. F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K,
//! Q5_K, Q6_K, IQ4_NL and IQ4_XS map to an [`Encoding`]; the others (the
//! other IQ types, TQ*, MXFP4, integer types, ...) open fine and fail only when the tensor is used
//! ([`GgufTensor::encoding`], [`GgufFile::weight_data`]).
//!
//! Shapes are given in PyTorch / Hugging Face order: GGUF stores dimensions
//! innermost first, so they are reversed, and a quantized row is the last axis.
//!
//! [`GgufFile::hf_config`] and [`hf_tensor_name`] (in `hf.rs`) read the
//! file in Hugging Face terms.

mod hf;
mod parse;
mod value;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_kernels::quant::QuantType;
use kiln_plugin_api::graph::{DType, Device, WeightSpec};
use kiln_plugin_api::Encoding;
use memmap2::Mmap;

pub use hf::hf_tensor_name;
pub use value::{GgufArray, GgufValue};

use crate::runtime::WeightData;

/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a GGUF tensor may have (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Deepest array nesting accepted (guards the recursion, not a GGUF limit).
const MAX_ARRAY_DEPTH: usize = 16;
/// Fewest bytes a metadata pair takes: key length, value type, one byte.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes a tensor info takes: name length, dims count, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// The longest metadata key or tensor name accepted: errors quote names,
/// and a file must not be able to fill them.
const MAX_NAME_BYTES: usize = 256;

/// Errors from reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read GGUF file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a well-formed GGUF file Kiln can read.
    #[error("{}: invalid GGUF file at byte {offset}: {problem}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Where the offending field starts.
        offset: u64,
        /// What is wrong.
        problem: Problem,
    },
    /// No tensor has this name.
    #[error("no tensor named `{0}` in the GGUF file")]
    NoTensor(String),
    /// The tensor's ggml type has no Kiln encoding.
    #[error("tensor `{name}` is stored as {ty}, which Kiln cannot decode")]
    UnsupportedType {
        /// The tensor.
        name: String,
        /// Its ggml type.
        ty: GgmlType,
    },
    /// A metadata value the file itself contradicts.
    #[error("GGUF metadata `{key}` is {value}, which cannot be: {reason}")]
    Implausible {
        /// The key.
        key: String,
        /// Its value.
        value: String,
        /// Why it cannot be.
        reason: String,
    },
    /// A required metadata key is absent.
    #[error("GGUF metadata has no `{0}`")]
    MissingKey(String),
    /// A metadata value has the wrong type.
    #[error("GGUF metadata `{key}` is {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the caller asked for.
        expected: &'static str,
        /// The stored type.
        found: &'static str,
    },
    /// `general.architecture` names an architecture without a config mapping.
    #[error("GGUF architecture `{0}` has no Hugging Face config mapping")]
    UnsupportedArchitecture(String),
    /// Well-formed, but describes something Kiln does not support.
    #[error("unsupported GGUF file: {0}")]
    Unsupported(String),
}

/// What is wrong with a malformed GGUF file.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Problem {
    /// A metadata key or tensor name that is not a short printable name.
    #[error("{what} is not a name (control characters or over {MAX_NAME_BYTES} bytes): {shown}")]
    BadName {
        /// Which name.
        what: String,
        /// Its start, escaped.
        shown: String,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file (magic {0:02x?}, expected \"GGUF\")")]
    BadMagic([u8; 4]),
    /// A version other than 2 or 3.
    #[error("GGUF version {0} is not supported (Kiln reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    /// A byte-swapped version: a big-endian file.
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    /// The file ends inside a field.
    #[error("file ends inside {what}: {needed} bytes needed, {left} left")]
    Truncated {
        /// The field.
        what: String,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file.
        left: u64,
    },
    /// A count that the rest of the file cannot possibly hold.
    #[error("{what}: count {count} cannot fit in the {left} bytes left")]
    ImpossibleCount {
        /// What is counted.
        what: String,
        /// The stored count.
        count: u64,
        /// Bytes left in the file.
        left: u64,
    },
    /// A string that is not UTF-8.
    #[error("{0} is not valid UTF-8")]
    InvalidUtf8(String),
    /// A metadata value type id outside GGUF's 0..=12.
    #[error("{what} has unknown value type {ty}")]
    UnknownValueType {
        /// The value.
        what: String,
        /// The stored type id.
        ty: u32,
    },
    /// Arrays nested deeper than Kiln accepts.
    #[error("{0} nests arrays more than {MAX_ARRAY_DEPTH} deep")]
    TooDeep(String),
    /// A key that appears twice.
    #[error("duplicate metadata key `{0}`")]
    DuplicateKey(String),
    /// `general.alignment` that is not a power of two.
    #[error("`general.alignment` must be a power of two, found {0}")]
    BadAlignment(String),
    /// A tensor name that appears twice.
    #[error("duplicate tensor `{0}`")]
    DuplicateTensor(String),
    /// More than four dimensions.
    #[error("tensor `{name}` has {n_dims} dimensions, at most {MAX_DIMS} allowed")]
    TooManyDims {
        /// The tensor.
        name: String,
        /// The stored count.
        n_dims: u32,
    },
    /// A ggml type id this reader does not know.
    #[error("tensor `{name}` has unknown ggml type {ty}")]
    UnknownTensorType {
        /// The tensor.
        name: String,
        /// The stored type id.
        ty: u32,
    },
    /// A row that is not a whole number of blocks.
    #[error("tensor `{name}`: {ty} rows need a multiple of {block} values, found {cols}")]
    UnalignedRow {
        /// The tensor.
        name: String,
        /// Its type.
        ty: GgmlType,
        /// Values per block.
        block: u64,
        /// The row length.
        cols: u64,
    },
    /// A tensor whose size overflows.
    #[error("tensor `{name}` with dimensions {dims:?} is too large")]
    TooLarge {
        /// The tensor.
        name: String,
        /// Its dimensions, as stored (innermost first).
        dims: Vec<u64>,
    },
    /// A data offset that is not a multiple of the alignment.
    #[error("tensor `{name}` has offset {offset}, not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor.
        name: String,
        /// Its offset in the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// Tensor data past the end of the file.
    #[error("tensor `{name}` needs bytes {start}..{end} of a {len}-byte file")]
    OutOfBounds {
        /// The tensor.
        name: String,
        /// First byte, from the start of the file (saturated).
        start: u64,
        /// One past the last byte (saturated).
        end: u64,
        /// The file size.
        len: u64,
    },
}

/// A ggml tensor type: one of the ids GGUF files use, with its block layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType {
    id: u32,
    name: &'static str,
    block_elems: u64,
    block_bytes: u64,
}

/// Every ggml type: id, name, values per block, bytes per block.
const GGML_TYPES: [(u32, &str, u64, u64); 34] = [
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    /// The type with ggml id `id`, if it is one.
    pub fn from_id(id: u32) -> Option<Self> {
        GGML_TYPES
            .iter()
            .find(|t| t.0 == id)
            .map(|&(id, name, block_elems, block_bytes)| Self {
                id,
                name,
                block_elems,
                block_bytes,
            })
    }

    /// The ggml type id.
    pub fn id(self) -> u32 {
        self.id
    }

    /// The ggml name (`"Q4_K"`).
    pub fn name(self) -> &'static str {
        self.name
    }

    /// The Kiln encoding, for the types Kiln can decode.
    pub fn encoding(self) -> Option<Encoding> {
        Some(match self.id {
            0 => Encoding::Float32,
            1 => Encoding::Float16,
            30 => Encoding::BFloat16,
            id => crate::runtime::quant_encoding(QuantType::from_gguf_type_id(id).ok()?),
        })
    }

    /// Bytes of a tensor with dimensions `dims` (innermost first), or the
    /// problem; Kiln's block formats are sized by [`QuantType::row_bytes`].
    fn tensor_bytes(self, name: &str, dims: &[u64]) -> Result<u64, Problem> {
        let cols = dims.first().copied().unwrap_or(1);
        if cols % self.block_elems != 0 {
            return Err(Problem::UnalignedRow {
                name: name.to_owned(),
                ty: self,
                block: self.block_elems,
                cols,
            });
        }
        let row = match QuantType::from_gguf_type_id(self.id) {
            Ok(quant) => usize::try_from(cols)
                .ok()
                .and_then(|cols| quant.row_bytes(cols).ok())
                .and_then(|bytes| u64::try_from(bytes).ok()),
            Err(_) => (cols / self.block_elems).checked_mul(self.block_bytes),
        };
        dims.iter()
            .skip(1)
            .try_fold(row, |bytes, &dim| bytes?.checked_mul(dim).map(Some))
            .flatten()
            .ok_or_else(|| Problem::TooLarge {
                name: name.to_owned(),
                dims: dims.to_vec(),
            })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// One tensor of a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    name: String,
    shape: Vec<u64>,
    ggml_type: GgmlType,
    range: Range<usize>,
}

impl GgufTensor {
    /// The GGUF name (`blk.0.attn_q.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shape in PyTorch / Hugging Face order (GGUF's dimensions reversed).
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The stored ggml type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// The Kiln encoding, or [`GgufError::UnsupportedType`].
    pub fn encoding(&self) -> Result<Encoding, GgufError> {
        self.ggml_type
            .encoding()
            .ok_or_else(|| GgufError::UnsupportedType {
                name: self.name.clone(),
                ty: self.ggml_type,
            })
    }

    /// The tensor's bytes, as a range of the whole file.
    pub fn byte_range(&self) -> Range<usize> {
        self.range.clone()
    }
}

/// A memory-mapped, parsed GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: Arc<Mmap>,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensor>,
    by_name: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses the GGUF file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this value; as with any
        // memory-mapped loader, the file must not be changed while mapped.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let parsed = parse::parse(&map).map_err(|e| GgufError::Invalid {
            path: path.to_owned(),
            offset: e.offset,
            problem: e.problem,
        })?;
        Ok(Self {
            path: path.to_owned(),
            map: Arc::new(map),
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            by_name: parsed.by_name,
        })
    }

    /// The memory map: tensor bytes are [`GgufTensor::byte_range`] of it.
    pub fn map(&self) -> &Arc<Mmap> {
        &self.map
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The tensor data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the tensor data section starts in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// All metadata, by key, taken out of the file (tensors that cloned the
    /// [`map`](Self::map) keep it alive).
    pub fn into_metadata(self) -> BTreeMap<String, GgufValue> {
        self.metadata
    }

    /// The metadata value at `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// A string value; `None` when absent, an error when of another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.typed(key, "a string", GgufValue::as_str)
    }

    /// A non-negative integer of any integer type; `None` when absent.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.typed(key, "a non-negative integer", GgufValue::as_u64)
    }

    /// A bool value; `None` when absent.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "a bool", GgufValue::as_bool)
    }

    /// A float32 or float64 value; `None` when absent.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.typed(key, "a float", GgufValue::as_f64)
    }

    /// An array value; `None` when absent.
    pub fn get_array(&self, key: &str) -> Result<Option<&GgufArray>, GgufError> {
        self.typed(key, "an array", GgufValue::as_array)
    }

    /// `general.architecture` (`llama`, `qwen2`, ...).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")?
            .ok_or_else(|| GgufError::MissingKey("general.architecture".into()))
    }

    /// The tensors, in file order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor `name` as runtime weight data borrowing the file's map. Its
    /// logical dtype is its float type, or F32 for a quantized tensor.
    pub fn weight_data(&self, name: &str) -> Result<WeightData, GgufError> {
        let tensor = self
            .tensor(name)
            .ok_or_else(|| GgufError::NoTensor(name.to_owned()))?;
        let encoding = tensor.encoding()?;
        let spec = WeightSpec {
            name: tensor.name.clone(),
            dtype: DType::of_encoding(encoding).unwrap_or(DType::F32),
            shape: tensor.shape.clone(),
            encoding,
            device: Device::Cpu,
        };
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = self.map.clone();
        Ok(WeightData::new(spec, owner, tensor.byte_range()))
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        cast: impl FnOnce(&'a GgufValue) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        let Some(value) = self.metadata.get(key) else {
            return Ok(None);
        };
        cast(value).map(Some).ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: value.type_name(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_agree_with_the_kernels() {
        for quant in QuantType::ALL {
            let ty = GgmlType::from_id(quant.gguf_type_id()).expect("known id");
            assert_eq!(ty.name(), quant.name());
            assert_eq!(ty.block_elems, quant.block_elems() as u64);
            assert_eq!(ty.block_bytes, quant.block_bytes() as u64);
            assert!(ty.encoding().is_some());
        }
    }

    #[test]
    fn tensor_bytes_checks_rows_and_overflow() {
        let q4k = GgmlType::from_id(12).expect("Q4_K");
        assert_eq!(q4k.tensor_bytes("t", &[512, 3]), Ok(3 * 288));
        assert!(matches!(
            q4k.tensor_bytes("t", &[32, 1]),
            Err(Problem::UnalignedRow { .. })
        ));
        let f32_ = GgmlType::from_id(0).expect("F32");
        assert!(matches!(
            f32_.tensor_bytes("t", &[u64::MAX / 2, 3]),
            Err(Problem::TooLarge { .. })
        ));
    }
}
