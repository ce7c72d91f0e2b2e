//! The GGUF header parser: metadata and the tensor directory, every count,
//! length, type and offset checked against the bytes before it is used.

use std::collections::{BTreeMap, HashMap};

use super::{
    GgmlType, GgufArray, GgufTensor, GgufValue, Problem, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH,
    MAX_DIMS, MAX_NAME_BYTES, MIN_KV_BYTES, MIN_TENSOR_INFO_BYTES,
};

/// A parse failure and where it happened.
pub(super) struct Located {
    pub(super) offset: u64,
    pub(super) problem: Problem,
}

impl Located {
    fn at(offset: usize, problem: Problem) -> Self {
        Self {
            offset: offset as u64,
            problem,
        }
    }
}

/// The parsed header, before it is paired with its map.
pub(super) struct Parsed {
    pub(super) version: u32,
    pub(super) alignment: u64,
    pub(super) data_offset: u64,
    pub(super) metadata: BTreeMap<String, GgufValue>,
    pub(super) tensors: Vec<GgufTensor>,
    pub(super) by_name: HashMap<String, usize>,
}

/// A tensor info as stored, before its data range is checked.
struct RawTensor {
    at: usize,
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    offset: u64,
}

/// Refuses a name with control characters or longer than
/// [`MAX_NAME_BYTES`], quoting at most its first 40 characters.
fn check_name(name: &str, what: impl Fn() -> String) -> Result<(), Problem> {
    if name.len() <= MAX_NAME_BYTES && !name.chars().any(char::is_control) {
        return Ok(());
    }
    let shown: String = name.chars().take(40).flat_map(char::escape_debug).collect();
    Err(Problem::BadName {
        what: what(),
        shown: format!("\"{shown}\"…"),
    })
}

/// Parses the header and tensor directory of a whole GGUF file.
pub(super) fn parse(bytes: &[u8]) -> Result<Parsed, Located> {
    let mut r = Reader { bytes, pos: 0 };
    let magic: [u8; 4] = r.fixed("the magic")?;
    if magic != *b"GGUF" {
        return Err(Located::at(0, Problem::BadMagic(magic)));
    }
    let version = r.le("the version", u32::from_le_bytes)?;
    match version {
        2 | 3 => {}
        v if matches!(v.swap_bytes(), 2 | 3) => return Err(Located::at(4, Problem::BigEndian)),
        v => return Err(Located::at(4, Problem::UnsupportedVersion(v))),
    }
    let n_tensors = r.le("the tensor count", u64::from_le_bytes)?;
    let n_kv = r.le("the metadata count", u64::from_le_bytes)?;
    let n_kv = r.count(n_kv, MIN_KV_BYTES, "metadata pairs", 16)?;

    let mut metadata = BTreeMap::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..n_kv {
        let at = r.pos;
        let key = r.string(&format!("metadata key #{i}"))?;
        check_name(&key, || format!("metadata key #{i}")).map_err(|p| Located::at(at, p))?;
        let what = format!("metadata `{key}`");
        let value = r.value(&what)?;
        if key == "general.alignment" {
            alignment = value
                .as_u64()
                .filter(|a| a.is_power_of_two())
                .ok_or_else(|| Located::at(at, Problem::BadAlignment(format!("{value:?}"))))?;
        }
        if metadata.contains_key(&key) {
            return Err(Located::at(at, Problem::DuplicateKey(key)));
        }
        metadata.insert(key, value);
    }

    let n_tensors = r.count(n_tensors, MIN_TENSOR_INFO_BYTES, "tensor infos", 8)?;
    let mut raw = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let at = r.pos;
        let name = r.string(&format!("the name of tensor #{i}"))?;
        check_name(&name, || format!("the name of tensor #{i}")).map_err(|p| Located::at(at, p))?;
        let what = format!("the info of tensor `{name}`");
        let n_dims = r.le(&what, u32::from_le_bytes)?;
        if n_dims > MAX_DIMS {
            return Err(Located::at(at, Problem::TooManyDims { name, n_dims }));
        }
        let dims = (0..n_dims)
            .map(|_| r.le(&what, u64::from_le_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let ty_id = r.le(&what, u32::from_le_bytes)?;
        let ty = GgmlType::from_id(ty_id).ok_or_else(|| {
            Located::at(
                at,
                Problem::UnknownTensorType {
                    name: name.clone(),
                    ty: ty_id,
                },
            )
        })?;
        let offset = r.le(&what, u64::from_le_bytes)?;
        raw.push(RawTensor {
            at,
            name,
            dims,
            ty,
            offset,
        });
    }

    let len = bytes.len() as u64;
    // `r.pos` is at most the file size, so rounding it up cannot overflow.
    let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
    let mut tensors = Vec::with_capacity(raw.len());
    let mut by_name = HashMap::with_capacity(raw.len());
    for t in raw {
        let fail = |problem| Located::at(t.at, problem);
        if by_name.insert(t.name.clone(), tensors.len()).is_some() {
            return Err(fail(Problem::DuplicateTensor(t.name)));
        }
        let size = t.ty.tensor_bytes(&t.name, &t.dims).map_err(fail)?;
        if t.offset % alignment != 0 {
            return Err(fail(Problem::MisalignedOffset {
                name: t.name,
                offset: t.offset,
                alignment,
            }));
        }
        let start = data_offset.saturating_add(t.offset);
        let end = start.saturating_add(size);
        if end > len {
            return Err(fail(Problem::OutOfBounds {
                name: t.name,
                start,
                end,
                len,
            }));
        }
        // Both fit `usize`: they are within the mapped file.
        let range = start as usize..end as usize;
        tensors.push(GgufTensor {
            shape: t.dims.iter().rev().copied().collect(),
            name: t.name,
            ggml_type: t.ty,
            range,
        });
    }
    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
        by_name,
    })
}

/// GGUF metadata value types, by their ids 0..=12.
#[derive(Clone, Copy)]
enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        let all = [
            U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64,
        ];
        all.get(usize::try_from(id).ok()?).copied()
    }

    /// Fewest bytes a value of this type takes.
    fn min_bytes(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 4 + 8,
        }
    }
}

/// A bounds-checked little-endian cursor over the file.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], Located> {
        let left = self.left();
        if n > left {
            return Err(Located::at(
                self.pos,
                Problem::Truncated {
                    what: what.to_owned(),
                    needed: n,
                    left,
                },
            ));
        }
        let start = self.pos;
        // `n <= left`, so it fits `usize` and stays within the slice.
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn fixed<const N: usize>(&mut self, what: &str) -> Result<[u8; N], Located> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn le<const N: usize, T>(&mut self, what: &str, from: fn([u8; N]) -> T) -> Result<T, Located> {
        self.fixed(what).map(from)
    }

    /// `n` fixed-size values; the caller has checked `n` with [`Self::count`].
    fn vec<const N: usize, T>(
        &mut self,
        n: usize,
        what: &str,
        from: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, Located> {
        let raw = self.take((n as u64).saturating_mul(N as u64), what)?;
        Ok(raw
            .chunks_exact(N)
            .map(|chunk| {
                let mut bytes = [0; N];
                bytes.copy_from_slice(chunk);
                from(bytes)
            })
            .collect())
    }

    /// Checks that `count` items of at least `min_bytes` each fit in the rest
    /// of the file (the count was read at `at`).
    fn count(&self, count: u64, min_bytes: u64, what: &str, at: usize) -> Result<usize, Located> {
        let left = self.left();
        if count > left / min_bytes {
            return Err(Located::at(
                at,
                Problem::ImpossibleCount {
                    what: what.to_owned(),
                    count,
                    left,
                },
            ));
        }
        // `count <= left`, which fits `usize`.
        Ok(count as usize)
    }

    fn string(&mut self, what: &str) -> Result<String, Located> {
        let at = self.pos;
        let len = self.le(what, u64::from_le_bytes)?;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec())
            .map_err(|_| Located::at(at, Problem::InvalidUtf8(what.to_owned())))
    }

    /// A value type id and its value (a metadata pair's value).
    fn value(&mut self, what: &str) -> Result<GgufValue, Located> {
        Ok(match self.value_type(what)? {
            ValueType::U8 => GgufValue::U8(self.le(what, u8::from_le_bytes)?),
            ValueType::I8 => GgufValue::I8(self.le(what, i8::from_le_bytes)?),
            ValueType::U16 => GgufValue::U16(self.le(what, u16::from_le_bytes)?),
            ValueType::I16 => GgufValue::I16(self.le(what, i16::from_le_bytes)?),
            ValueType::U32 => GgufValue::U32(self.le(what, u32::from_le_bytes)?),
            ValueType::I32 => GgufValue::I32(self.le(what, i32::from_le_bytes)?),
            ValueType::U64 => GgufValue::U64(self.le(what, u64::from_le_bytes)?),
            ValueType::I64 => GgufValue::I64(self.le(what, i64::from_le_bytes)?),
            ValueType::F32 => GgufValue::F32(self.le(what, f32::from_le_bytes)?),
            ValueType::F64 => GgufValue::F64(self.le(what, f64::from_le_bytes)?),
            ValueType::Bool => GgufValue::Bool(self.le(what, |[b]: [u8; 1]| b != 0)?),
            ValueType::String => GgufValue::String(self.string(what)?),
            ValueType::Array => GgufValue::Array(self.array(what, 1)?),
        })
    }

    fn value_type(&mut self, what: &str) -> Result<ValueType, Located> {
        let at = self.pos;
        let id = self.le(what, u32::from_le_bytes)?;
        ValueType::from_id(id).ok_or_else(|| {
            Located::at(
                at,
                Problem::UnknownValueType {
                    what: what.to_owned(),
                    ty: id,
                },
            )
        })
    }

    /// An array's element type, count and elements; `depth` counts the
    /// arrays this one is inside, itself included.
    fn array(&mut self, what: &str, depth: usize) -> Result<GgufArray, Located> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(Located::at(self.pos, Problem::TooDeep(what.to_owned())));
        }
        let ty = self.value_type(what)?;
        let count_at = self.pos;
        let n = self.le(what, u64::from_le_bytes)?;
        let n = self.count(n, ty.min_bytes(), what, count_at)?;
        Ok(match ty {
            ValueType::U8 => GgufArray::U8(self.vec(n, what, u8::from_le_bytes)?),
            ValueType::I8 => GgufArray::I8(self.vec(n, what, i8::from_le_bytes)?),
            ValueType::U16 => GgufArray::U16(self.vec(n, what, u16::from_le_bytes)?),
            ValueType::I16 => GgufArray::I16(self.vec(n, what, i16::from_le_bytes)?),
            ValueType::U32 => GgufArray::U32(self.vec(n, what, u32::from_le_bytes)?),
            ValueType::I32 => GgufArray::I32(self.vec(n, what, i32::from_le_bytes)?),
            ValueType::U64 => GgufArray::U64(self.vec(n, what, u64::from_le_bytes)?),
            ValueType::I64 => GgufArray::I64(self.vec(n, what, i64::from_le_bytes)?),
            ValueType::F32 => GgufArray::F32(self.vec(n, what, f32::from_le_bytes)?),
            ValueType::F64 => GgufArray::F64(self.vec(n, what, f64::from_le_bytes)?),
            ValueType::Bool => GgufArray::Bool(self.vec(n, what, |[b]: [u8; 1]| b != 0)?),
            ValueType::String => GgufArray::String(
                (0..n)
                    .map(|_| self.string(what))
                    .collect::<Result<_, _>>()?,
            ),
            ValueType::Array => GgufArray::Array(
                (0..n)
                    .map(|_| self.array(what, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}
