//! Metadata values. Strings and array payloads borrow the file's bytes; numeric arrays
//! are decoded element by element on access, so a 262k-entry vocabulary costs no copy.

use std::borrow::Cow;
use std::fmt;

/// The 13 GGUF metadata value types, with their on-disk ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The name gguf-py uses (`UINT32`, `STRING`, ...), lower-cased.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Size in bytes of a fixed-size value; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A GGUF string: bytes that should be UTF-8. Values are not rejected for bad UTF-8
/// (some real vocabularies carry partial sequences); keys and tensor names are.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgufStr<'a>(pub &'a [u8]);

impl<'a> GgufStr<'a> {
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }

    pub fn to_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.0).ok()
    }

    pub fn to_string_lossy(&self) -> Cow<'a, str> {
        String::from_utf8_lossy(self.0)
    }
}

impl<'a> From<&'a str> for GgufStr<'a> {
    fn from(s: &'a str) -> Self {
        GgufStr(s.as_bytes())
    }
}

impl fmt::Debug for GgufStr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string_lossy(), f)
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(GgufStr<'a>),
    Array(Array<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Value<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type, as i128 so every width and sign fits.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer type whose value is non-negative and fits in u64: real files store
    /// counts as u32, i32 or u64 interchangeably.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_integer().and_then(|v| u64::try_from(v).ok())
    }

    pub fn as_i64(&self) -> Option<i64> {
        self.as_integer().and_then(|v| i64::try_from(v).ok())
    }

    /// A float of either width, or an integer (converted).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_integer().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match self {
            Value::String(s) => s.to_str(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array<'a>> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// An array of one element type. Scalars keep their raw bytes (little- or big-endian
/// as in the file) and decode on access; strings read from a file stay where they are
/// (a 262k-token vocabulary costs no allocation) and are walked on iteration.
#[derive(Clone, Debug)]
pub struct Array<'a> {
    elem: ValueType,
    data: ArrayData<'a>,
}

#[derive(Clone, Debug)]
enum ArrayData<'a> {
    Scalars {
        raw: Cow<'a, [u8]>,
        big_endian: bool,
    },
    /// `count` length-prefixed strings exactly as in the file; the parser has checked
    /// every length against the bytes.
    StoredStrings {
        raw: &'a [u8],
        count: usize,
        big_endian: bool,
    },
    Strings(Vec<GgufStr<'a>>),
}

impl PartialEq for Array<'_> {
    /// Element-wise: a string array read from a file equals the same strings built in
    /// memory.
    fn eq(&self, other: &Self) -> bool {
        self.elem == other.elem && self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// The strings of a string array.
#[derive(Clone, Copy, Debug)]
pub struct Strings<'s, 'a> {
    data: &'s ArrayData<'a>,
}

impl<'s, 'a> Strings<'s, 'a> {
    pub fn len(&self) -> usize {
        match self.data {
            ArrayData::StoredStrings { count, .. } => *count,
            ArrayData::Strings(v) => v.len(),
            ArrayData::Scalars { .. } => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The strings in order.
    pub fn iter(&self) -> StringIter<'s, 'a> {
        match self.data {
            ArrayData::StoredStrings {
                raw,
                count,
                big_endian,
            } => StringIter::Stored {
                raw,
                remaining: *count,
                big_endian: *big_endian,
            },
            ArrayData::Strings(v) => StringIter::Owned(v.iter()),
            ArrayData::Scalars { .. } => StringIter::Owned([].iter()),
        }
    }
}

/// Iterator over a string array's elements.
pub enum StringIter<'s, 'a> {
    Stored {
        raw: &'a [u8],
        remaining: usize,
        big_endian: bool,
    },
    Owned(std::slice::Iter<'s, GgufStr<'a>>),
}

impl<'a> Iterator for StringIter<'_, 'a> {
    type Item = GgufStr<'a>;

    fn next(&mut self) -> Option<GgufStr<'a>> {
        match self {
            StringIter::Owned(it) => it.next().copied(),
            StringIter::Stored {
                raw,
                remaining,
                big_endian,
            } => {
                if *remaining == 0 {
                    return None;
                }
                let mut len = [0u8; 8];
                len.copy_from_slice(raw.get(..8)?);
                if *big_endian {
                    len.reverse();
                }
                let n = usize::try_from(u64::from_le_bytes(len)).ok()?;
                let s = raw.get(8..8usize.checked_add(n)?)?;
                *raw = &raw[8 + n..];
                *remaining -= 1;
                Some(GgufStr(s))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match self {
            StringIter::Owned(it) => it.len(),
            StringIter::Stored { remaining, .. } => *remaining,
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for StringIter<'_, '_> {}

impl<'a> Array<'a> {
    /// An array of fixed-size scalars from raw bytes; the caller has checked that
    /// `raw.len()` is a multiple of the element size and that bools are 0 or 1.
    pub(crate) fn scalars(elem: ValueType, raw: &'a [u8], big_endian: bool) -> Self {
        debug_assert!(
            elem.fixed_size()
                .is_some_and(|s| raw.len().is_multiple_of(s))
        );
        Array {
            elem,
            data: ArrayData::Scalars {
                raw: Cow::Borrowed(raw),
                big_endian,
            },
        }
    }

    /// Strings as the parser found them: `count` length-prefixed strings in `raw`.
    pub(crate) fn stored_strings(raw: &'a [u8], count: usize, big_endian: bool) -> Self {
        Array {
            elem: ValueType::String,
            data: ArrayData::StoredStrings {
                raw,
                count,
                big_endian,
            },
        }
    }

    pub fn strings(items: Vec<GgufStr<'a>>) -> Self {
        Array {
            elem: ValueType::String,
            data: ArrayData::Strings(items),
        }
    }

    /// Builds an array from scalar values, all of the same type. Returns `None` if
    /// the values are not all the same fixed-size scalar type.
    pub fn from_values(elem: ValueType, values: &[Value<'_>]) -> Option<Array<'static>> {
        elem.fixed_size()?;
        let mut raw = Vec::new();
        for v in values {
            if v.value_type() != elem {
                return None;
            }
            encode_scalar_le(v, &mut raw);
        }
        Some(Array {
            elem,
            data: ArrayData::Scalars {
                raw: Cow::Owned(raw),
                big_endian: false,
            },
        })
    }

    pub fn from_u32s(values: &[u32]) -> Array<'static> {
        let raw = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Array {
            elem: ValueType::U32,
            data: ArrayData::Scalars {
                raw: Cow::Owned(raw),
                big_endian: false,
            },
        }
    }

    pub fn from_i32s(values: &[i32]) -> Array<'static> {
        let raw = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Array {
            elem: ValueType::I32,
            data: ArrayData::Scalars {
                raw: Cow::Owned(raw),
                big_endian: false,
            },
        }
    }

    pub fn from_f32s(values: &[f32]) -> Array<'static> {
        let raw = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Array {
            elem: ValueType::F32,
            data: ArrayData::Scalars {
                raw: Cow::Owned(raw),
                big_endian: false,
            },
        }
    }

    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    pub fn len(&self) -> usize {
        match &self.data {
            ArrayData::Scalars { raw, .. } => raw.len() / self.elem.fixed_size().unwrap_or(1),
            ArrayData::StoredStrings { count, .. } => *count,
            ArrayData::Strings(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` (for stored strings this walks from the start: use [`Array::iter`]
    /// to visit them all).
    pub fn get(&self, i: usize) -> Option<Value<'a>> {
        match &self.data {
            ArrayData::Strings(s) => s.get(i).map(|s| Value::String(*s)),
            ArrayData::StoredStrings { .. } => self.as_strings()?.iter().nth(i).map(Value::String),
            ArrayData::Scalars { raw, big_endian } => {
                let size = self.elem.fixed_size()?;
                let start = i.checked_mul(size)?;
                let bytes = raw.get(start..start.checked_add(size)?)?;
                decode_scalar(self.elem, bytes, *big_endian)
            }
        }
    }

    pub fn iter(&self) -> Box<dyn Iterator<Item = Value<'a>> + '_> {
        match self.as_strings() {
            Some(s) => Box::new(s.iter().map(Value::String)),
            None => Box::new((0..self.len()).filter_map(move |i| self.get(i))),
        }
    }

    /// The string elements; `None` if this is not a string array.
    pub fn as_strings(&self) -> Option<Strings<'_, 'a>> {
        match &self.data {
            ArrayData::Strings(_) | ArrayData::StoredStrings { .. } => {
                Some(Strings { data: &self.data })
            }
            ArrayData::Scalars { .. } => None,
        }
    }

    /// The raw little- or big-endian payload of a scalar array, for writers.
    pub(crate) fn raw_scalars(&self) -> Option<(&[u8], bool)> {
        match &self.data {
            ArrayData::Scalars { raw, big_endian } => Some((raw, *big_endian)),
            ArrayData::Strings(_) | ArrayData::StoredStrings { .. } => None,
        }
    }
}

/// Decodes one fixed-size scalar. `bytes` has exactly the type's size.
pub(crate) fn decode_scalar(
    ty: ValueType,
    bytes: &[u8],
    big_endian: bool,
) -> Option<Value<'static>> {
    fn arr<const N: usize>(b: &[u8], big: bool) -> Option<[u8; N]> {
        let mut a: [u8; N] = b.try_into().ok()?;
        if big {
            a.reverse();
        }
        Some(a)
    }
    let b = big_endian;
    Some(match ty {
        ValueType::U8 => Value::U8(*bytes.first()?),
        ValueType::I8 => Value::I8(*bytes.first()? as i8),
        ValueType::Bool => Value::Bool(*bytes.first()? != 0),
        ValueType::U16 => Value::U16(u16::from_le_bytes(arr(bytes, b)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(arr(bytes, b)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(arr(bytes, b)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(arr(bytes, b)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(arr(bytes, b)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(arr(bytes, b)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(arr(bytes, b)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(arr(bytes, b)?)),
        ValueType::String | ValueType::Array => return None,
    })
}

/// Appends a fixed-size scalar in little-endian order; strings and arrays are not
/// scalars and append nothing.
pub(crate) fn encode_scalar_le(v: &Value<'_>, out: &mut Vec<u8>) {
    match *v {
        Value::U8(x) => out.push(x),
        Value::I8(x) => out.push(x as u8),
        Value::Bool(x) => out.push(x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::String(_) | Value::Array(_) => {}
    }
}
