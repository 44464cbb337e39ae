//! Typed access to metadata. Only the loader reads keys (design invariant 4); these
//! accessors give it one place to turn a missing or mistyped key into an error.

use crate::value::{Array, Value, ValueType};
use std::collections::HashMap;

/// A metadata key held a value of the wrong type.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("metadata key '{key}': expected {expected}, found {found}")]
pub struct MetadataTypeError {
    pub key: String,
    pub expected: &'static str,
    pub found: String,
}

/// The key/value pairs of one file, in file order, with a hash index.
#[derive(Clone, Debug)]
pub struct Metadata<'a> {
    /// (key, value, byte offset of the entry)
    entries: Vec<(&'a str, Value<'a>, u64)>,
    index: HashMap<&'a str, usize>,
}

impl<'a> Metadata<'a> {
    pub(crate) fn new(
        entries: Vec<(&'a str, Value<'a>, u64)>,
        index: HashMap<&'a str, usize>,
    ) -> Self {
        Metadata { entries, index }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// (key, value) in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &Value<'a>)> + '_ {
        self.entries.iter().map(|(k, v, _)| (*k, v))
    }

    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Byte offset in the file where the entry for `key` starts.
    pub fn offset_of(&self, key: &str) -> Option<u64> {
        self.index.get(key).map(|&i| self.entries[i].2)
    }

    fn typed<T>(
        &self,
        key: &str,
        expected: &'static str,
        f: impl FnOnce(&Value<'a>) -> Option<T>,
    ) -> Result<Option<T>, MetadataTypeError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| MetadataTypeError {
                key: key.to_string(),
                expected,
                found: describe(v),
            }),
        }
    }

    /// An unsigned count stored in any integer width (u8..u64, or a non-negative signed).
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, MetadataTypeError> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, MetadataTypeError> {
        self.typed(key, "an integer", Value::as_i64)
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, MetadataTypeError> {
        self.typed(key, "a number", Value::as_f64)
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, MetadataTypeError> {
        self.typed(key, "a bool", Value::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&'a str>, MetadataTypeError> {
        self.typed(key, "a UTF-8 string", Value::as_str)
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&Array<'a>>, MetadataTypeError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(MetadataTypeError {
                key: key.to_string(),
                expected: "an array",
                found: describe(v),
            }),
        }
    }

    /// `general.architecture`, the one key every model file must have.
    pub fn architecture(&self) -> Result<Option<&'a str>, MetadataTypeError> {
        self.get_str("general.architecture")
    }
}

/// "u32", "array of 262144 string", ...
pub fn describe(v: &Value<'_>) -> String {
    match v {
        Value::Array(a) => format!("array of {} {}", a.len(), a.elem_type()),
        Value::String(s) if s.to_str().is_none() => "string (invalid UTF-8)".into(),
        v => v.value_type().name().to_string(),
    }
}

impl ValueType {
    pub fn is_integer(self) -> bool {
        use ValueType::*;
        matches!(self, U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64)
    }
}
