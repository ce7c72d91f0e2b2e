//! GGUF metadata values.

/// One metadata value, in the type the file stores it as.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// `bool` (any nonzero byte reads as true).
    Bool(bool),
    /// `string` (UTF-8; other bytes are an error at open).
    String(String),
    /// `array`, of any element type (arrays included).
    Array(GgufArray),
}

/// A metadata array: elements of one type, stored unboxed.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    /// `uint8` elements.
    U8(Vec<u8>),
    /// `int8` elements.
    I8(Vec<i8>),
    /// `uint16` elements.
    U16(Vec<u16>),
    /// `int16` elements.
    I16(Vec<i16>),
    /// `uint32` elements.
    U32(Vec<u32>),
    /// `int32` elements.
    I32(Vec<i32>),
    /// `uint64` elements.
    U64(Vec<u64>),
    /// `int64` elements.
    I64(Vec<i64>),
    /// `float32` elements.
    F32(Vec<f32>),
    /// `float64` elements.
    F64(Vec<f64>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// `string` elements.
    String(Vec<String>),
    /// Nested arrays (each with its own element type).
    Array(Vec<GgufArray>),
}

/// Applies `$body` to the vector inside any [`GgufArray`] variant.
macro_rules! each_array {
    ($array:expr, $v:ident => $body:expr) => {
        match $array {
            GgufArray::U8($v) => $body,
            GgufArray::I8($v) => $body,
            GgufArray::U16($v) => $body,
            GgufArray::I16($v) => $body,
            GgufArray::U32($v) => $body,
            GgufArray::I32($v) => $body,
            GgufArray::U64($v) => $body,
            GgufArray::I64($v) => $body,
            GgufArray::F32($v) => $body,
            GgufArray::F64($v) => $body,
            GgufArray::Bool($v) => $body,
            GgufArray::String($v) => $body,
            GgufArray::Array($v) => $body,
        }
    };
}

impl GgufArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        each_array!(self, v => v.len())
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF name of the element type (`"uint32"`, `"string"`, `"array"`).
    pub fn element_type(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "uint8",
            GgufArray::I8(_) => "int8",
            GgufArray::U16(_) => "uint16",
            GgufArray::I16(_) => "int16",
            GgufArray::U32(_) => "uint32",
            GgufArray::I32(_) => "int32",
            GgufArray::U64(_) => "uint64",
            GgufArray::I64(_) => "int64",
            GgufArray::F32(_) => "float32",
            GgufArray::F64(_) => "float64",
            GgufArray::Bool(_) => "bool",
            GgufArray::String(_) => "string",
            GgufArray::Array(_) => "array",
        }
    }
}

impl GgufValue {
    /// The GGUF name of the value's type (`"uint32"`, `"string"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "uint8",
            GgufValue::I8(_) => "int8",
            GgufValue::U16(_) => "uint16",
            GgufValue::I16(_) => "int16",
            GgufValue::U32(_) => "uint32",
            GgufValue::I32(_) => "int32",
            GgufValue::U64(_) => "uint64",
            GgufValue::I64(_) => "int64",
            GgufValue::F32(_) => "float32",
            GgufValue::F64(_) => "float64",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
        }
    }

    /// Any integer type holding a value that fits `u64` (not negative).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type holding a value that fits `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float, widened to `f64` exactly.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(v) => Some(v),
            _ => None,
        }
    }

    /// An array.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

impl GgufValue {
    /// The value as JSON (integers and floats as numbers, non-finite floats
    /// as `null`, arrays as arrays).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            GgufValue::U8(v) => Value::from(*v),
            GgufValue::I8(v) => Value::from(*v),
            GgufValue::U16(v) => Value::from(*v),
            GgufValue::I16(v) => Value::from(*v),
            GgufValue::U32(v) => Value::from(*v),
            GgufValue::I32(v) => Value::from(*v),
            GgufValue::U64(v) => Value::from(*v),
            GgufValue::I64(v) => Value::from(*v),
            GgufValue::F32(v) => Value::from(*v),
            GgufValue::F64(v) => Value::from(*v),
            GgufValue::Bool(v) => Value::from(*v),
            GgufValue::String(v) => Value::from(v.as_str()),
            GgufValue::Array(v) => v.to_json(),
        }
    }
}

impl GgufArray {
    /// The array as a JSON array (see [`GgufValue::to_json`]).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            GgufArray::Array(v) => v.iter().map(GgufArray::to_json).collect(),
            GgufArray::String(v) => v.as_slice().into(),
            GgufArray::F32(v) => v.as_slice().into(),
            GgufArray::F64(v) => v.as_slice().into(),
            GgufArray::Bool(v) => v.as_slice().into(),
            GgufArray::U8(v) => v.as_slice().into(),
            GgufArray::I8(v) => v.as_slice().into(),
            GgufArray::U16(v) => v.as_slice().into(),
            GgufArray::I16(v) => v.as_slice().into(),
            GgufArray::U32(v) => v.as_slice().into(),
            GgufArray::I32(v) => v.as_slice().into(),
            GgufArray::U64(v) => v.as_slice().into(),
            GgufArray::I64(v) => v.as_slice().into(),
        }
    }
}
