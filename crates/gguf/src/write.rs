//! The GGUF writer: little-endian, version 3, laid out as gguf-py lays it out (header,
//! metadata, tensor infos, zero padding to the alignment, then each tensor's data padded
//! to the alignment), so a file gguf-py wrote, read and rewritten, is byte-identical.

use crate::limits::{DEFAULT_ALIGNMENT, MAX_ALIGNMENT, MAX_DIMS, MAX_KEY_LEN, MAX_TENSOR_NAME_LEN};
use crate::read::MAGIC;
use crate::value::{Array, Value, ValueType, encode_scalar_le};
use llamay_formats::GgmlType;
use std::borrow::Cow;
use std::collections::HashSet;
use std::io::{self, Write};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot write GGUF: {0}")]
    Invalid(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

fn invalid(msg: impl Into<String>) -> WriteError {
    WriteError::Invalid(msg.into())
}

/// A tensor declared to the writer.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
    pub n_bytes: u64,
    /// Offset relative to the data section, assigned in declaration order.
    pub offset: u64,
}

/// Collects metadata and tensor declarations, then streams the file.
#[derive(Clone, Debug)]
pub struct GgufWriter<'a> {
    alignment: u64,
    kvs: Vec<(String, Value<'a>)>,
    keys: HashSet<String>,
    tensors: Vec<TensorSpec>,
    names: HashSet<String>,
    data_len: u64,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

fn pad(n: u64, alignment: u64) -> u64 {
    n.div_ceil(alignment) * alignment - n
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            kvs: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            data_len: 0,
        }
    }

    /// Adds a key/value pair. `general.alignment` (a u32 power of two) also sets the
    /// alignment the file is written with; it must come before any tensor.
    pub fn add_kv(&mut self, key: &str, value: Value<'a>) -> Result<(), WriteError> {
        if key.is_empty() || key.len() as u64 > MAX_KEY_LEN {
            return Err(invalid(format!(
                "metadata key of {} bytes (must be 1..={MAX_KEY_LEN})",
                key.len()
            )));
        }
        if !self.keys.insert(key.to_string()) {
            return Err(invalid(format!("duplicate metadata key '{key}'")));
        }
        if let Value::Array(a) = &value
            && a.elem_type() == ValueType::Array
        {
            return Err(invalid(format!(
                "metadata key '{key}': nested arrays are not supported"
            )));
        }
        if key == "general.alignment" {
            let Value::U32(a) = value else {
                return Err(invalid("general.alignment must be a u32"));
            };
            let a = u64::from(a);
            if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                return Err(invalid(format!(
                    "general.alignment {a} is not a power of two up to {MAX_ALIGNMENT}"
                )));
            }
            if !self.tensors.is_empty() {
                return Err(invalid(
                    "general.alignment must be set before tensors are added",
                ));
            }
            self.alignment = a;
        }
        self.kvs.push((key.to_string(), value));
        Ok(())
    }

    /// Declares a tensor (shape in GGUF order, ne0 first); its data is supplied when the
    /// file is written, in declaration order.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        shape: &[u64],
    ) -> Result<&TensorSpec, WriteError> {
        if name.is_empty() || name.len() as u64 > MAX_TENSOR_NAME_LEN {
            return Err(invalid(format!(
                "tensor name '{name}' must be 1..={MAX_TENSOR_NAME_LEN} bytes"
            )));
        }
        if shape.len() > MAX_DIMS as usize {
            return Err(invalid(format!(
                "tensor '{name}' has {} dimensions (max {MAX_DIMS})",
                shape.len()
            )));
        }
        let n_elements = shape
            .iter()
            .try_fold(1u64, |acc, &d| {
                acc.checked_mul(d).filter(|&n| n <= i64::MAX as u64)
            })
            .ok_or_else(|| {
                invalid(format!(
                    "tensor '{name}': element count of {shape:?} overflows"
                ))
            })?;
        let ne0 = shape.first().copied().unwrap_or(1);
        if ne0 % ty.block_size() != 0 {
            return Err(invalid(format!(
                "tensor '{name}': {ty} rows must be a multiple of {} elements, got {ne0}",
                ty.block_size()
            )));
        }
        let n_bytes = ty
            .bytes_for(n_elements)
            .ok_or_else(|| invalid(format!("tensor '{name}': byte size overflows")))?;
        if !self.names.insert(name.to_string()) {
            return Err(invalid(format!("duplicate tensor name '{name}'")));
        }
        let offset = self.data_len;
        self.data_len = n_bytes
            .checked_add(pad(n_bytes, self.alignment))
            .and_then(|n| offset.checked_add(n))
            .ok_or_else(|| invalid("total tensor data overflows"))?;
        self.tensors.push(TensorSpec {
            name: name.to_string(),
            ty,
            shape: shape.to_vec(),
            n_bytes,
            offset,
        });
        Ok(self.tensors.last().expect("just pushed"))
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Writes the whole file. `tensor_data(i)` supplies tensor `i`'s bytes, called in
    /// order; each must be exactly the declared size.
    pub fn write<W: Write>(
        &self,
        w: &mut W,
        mut tensor_data: impl FnMut(usize) -> Result<Cow<'a, [u8]>, WriteError>,
    ) -> Result<(), WriteError> {
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (key, value) in &self.kvs {
            put_str(&mut head, key.as_bytes());
            head.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            put_value(&mut head, value)?;
        }
        for t in &self.tensors {
            put_str(&mut head, t.name.as_bytes());
            head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&t.offset.to_le_bytes());
        }
        let p = pad(head.len() as u64, self.alignment);
        head.resize(head.len() + p as usize, 0);
        w.write_all(&head)?;
        let zeros = vec![0u8; self.alignment as usize];
        for (i, t) in self.tensors.iter().enumerate() {
            let data = tensor_data(i)?;
            if data.len() as u64 != t.n_bytes {
                return Err(invalid(format!(
                    "tensor '{}': {} bytes supplied, {} declared",
                    t.name,
                    data.len(),
                    t.n_bytes
                )));
            }
            w.write_all(&data)?;
            w.write_all(&zeros[..pad(t.n_bytes, self.alignment) as usize])?;
        }
        Ok(())
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

fn put_value(out: &mut Vec<u8>, value: &Value<'_>) -> Result<(), WriteError> {
    match value {
        Value::String(s) => put_str(out, s.as_bytes()),
        Value::Array(a) => put_array(out, a)?,
        v => encode_scalar_le(v, out),
    }
    Ok(())
}

fn put_array(out: &mut Vec<u8>, a: &Array<'_>) -> Result<(), WriteError> {
    out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    if let Some(strings) = a.as_strings() {
        for s in strings.iter() {
            put_str(out, s.as_bytes());
        }
    } else if let Some((raw, false)) = a.raw_scalars() {
        out.extend_from_slice(raw);
    } else {
        // A big-endian source array: re-encode element by element.
        for v in a.iter() {
            encode_scalar_le(&v, out);
        }
    }
    Ok(())
}
