//! The parser: a bounds-checked cursor over the file's bytes. Nothing is allocated for a
//! declared length before that length has been checked against the bytes that remain.

use crate::error::{ErrorKind, GgufError};
use crate::file::{GgufFile, TensorInfo};
use crate::limits::*;
use crate::metadata::Metadata;
use crate::value::{Array, GgufStr, Value, ValueType, decode_scalar};
use llamay_formats::GgmlType;
use std::collections::HashMap;

pub(crate) const MAGIC: &[u8; 4] = b"GGUF";

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    big_endian: bool,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn err(&self, at: usize, context: impl Into<String>, kind: ErrorKind) -> GgufError {
        GgufError {
            offset: at as u64,
            context: context.into(),
            kind,
        }
    }

    fn take(
        &mut self,
        n: u64,
        what: &'static str,
        ctx: &dyn Fn() -> String,
    ) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.err(
                self.pos,
                ctx(),
                ErrorKind::Truncated {
                    what,
                    need: n,
                    have: self.remaining(),
                },
            ));
        }
        let start = self.pos;
        self.pos += n as usize; // n <= remaining, so it fits in usize
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(
        &mut self,
        what: &'static str,
        ctx: &dyn Fn() -> String,
    ) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what, ctx)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        if self.big_endian {
            a.reverse();
        }
        Ok(a)
    }

    fn u32(&mut self, what: &'static str, ctx: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array::<4>(what, ctx).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str, ctx: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array::<8>(what, ctx).map(u64::from_le_bytes)
    }

    /// A length-prefixed string of at most `max` bytes.
    fn string(
        &mut self,
        max: u64,
        what: &'static str,
        ctx: &dyn Fn() -> String,
    ) -> Result<GgufStr<'a>, GgufError> {
        let at = self.pos;
        let len = self.u64("string length", ctx)?;
        if len > max {
            return Err(self.err(at, ctx(), ErrorKind::TooLarge { what, len, max }));
        }
        self.take(len, what, ctx).map(GgufStr)
    }

    /// A string that must be valid UTF-8 (keys, tensor names).
    fn utf8(
        &mut self,
        max: u64,
        what: &'static str,
        ctx: &dyn Fn() -> String,
    ) -> Result<&'a str, GgufError> {
        let at = self.pos;
        let s = self.string(max, what, ctx)?;
        s.to_str()
            .ok_or_else(|| self.err(at, ctx(), ErrorKind::InvalidUtf8 { what }))
    }

    fn value_type(&mut self, ctx: &dyn Fn() -> String) -> Result<ValueType, GgufError> {
        let at = self.pos;
        let id = self.u32("value type", ctx)?;
        ValueType::from_id(id).ok_or_else(|| self.err(at, ctx(), ErrorKind::BadValueType(id)))
    }

    fn value(&mut self, ty: ValueType, ctx: &dyn Fn() -> String) -> Result<Value<'a>, GgufError> {
        match ty {
            ValueType::String => self
                .string(MAX_STRING_LEN, "string value", ctx)
                .map(Value::String),
            ValueType::Array => self.array_value(ctx).map(Value::Array),
            _ => self.scalar(ty, ctx),
        }
    }

    fn scalar(&mut self, ty: ValueType, ctx: &dyn Fn() -> String) -> Result<Value<'a>, GgufError> {
        let at = self.pos;
        let size = ty.fixed_size().unwrap_or(0) as u64;
        let bytes = self.take(size, "scalar value", ctx)?;
        if ty == ValueType::Bool && bytes[0] > 1 {
            return Err(self.err(at, ctx(), ErrorKind::BadBool(bytes[0])));
        }
        decode_scalar(ty, bytes, self.big_endian)
            .ok_or_else(|| self.err(at, ctx(), ErrorKind::BadValueType(ty as u32)))
    }

    fn array_value(&mut self, ctx: &dyn Fn() -> String) -> Result<Array<'a>, GgufError> {
        let type_at = self.pos;
        let elem = self.value_type(ctx)?;
        if elem == ValueType::Array {
            return Err(self.err(type_at, ctx(), ErrorKind::NestedArray));
        }
        let len_at = self.pos;
        let len = self.u64("array length", ctx)?;
        if len > MAX_ARRAY_LEN {
            return Err(self.err(
                len_at,
                ctx(),
                ErrorKind::TooLarge {
                    what: "array length",
                    len,
                    max: MAX_ARRAY_LEN,
                },
            ));
        }
        // Every element takes at least this many bytes (a string: its 8-byte length).
        let min_elem = elem.fixed_size().unwrap_or(8) as u64;
        let need = len * min_elem; // len <= 2^26 and min_elem <= 8: no overflow
        if need > self.remaining() {
            return Err(self.err(
                len_at,
                ctx(),
                ErrorKind::Truncated {
                    what: "array elements",
                    need,
                    have: self.remaining(),
                },
            ));
        }
        if elem == ValueType::String {
            // Validate every element now; keep the bytes where they are.
            let start = self.pos;
            for _ in 0..len {
                self.string(MAX_STRING_LEN, "string array element", ctx)?;
            }
            return Ok(Array::stored_strings(
                &self.buf[start..self.pos],
                len as usize,
                self.big_endian,
            ));
        }
        let raw_at = self.pos;
        let raw = self.take(need, "array elements", ctx)?;
        if elem == ValueType::Bool
            && let Some(i) = raw.iter().position(|&b| b > 1)
        {
            return Err(self.err(raw_at + i, ctx(), ErrorKind::BadBool(raw[i])));
        }
        Ok(Array::scalars(elem, raw, self.big_endian))
    }
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    x.checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

/// Parses a whole GGUF file held in memory (normally a memory map).
/// Parses `buf`. `declared_len`: `None` for a whole file (every tensor's data must lie
/// in `buf` and is borrowed from it); `Some(n)` for the first bytes of an `n`-byte file
/// (the header must lie in `buf`; tensor extents are checked against `n` and their
/// `data` is left empty).
pub(crate) fn parse(buf: &[u8], declared_len: Option<u64>) -> Result<GgufFile<'_>, GgufError> {
    let mut c = Cursor {
        buf,
        pos: 0,
        big_endian: false,
    };
    let header = || "header".to_string();

    let magic: [u8; 4] = c.array("magic", &header)?;
    if &magic != MAGIC {
        return Err(c.err(0, "header", ErrorKind::BadMagic(magic)));
    }
    // The version field tells the byte order: a byte-swapped 2 or 3 is a big-endian file.
    let version_le = c.u32("version", &header)?;
    let version = match version_le {
        2 | 3 => version_le,
        1 => return Err(c.err(4, "header", ErrorKind::Version1)),
        v if is_big_endian_version(v) => {
            c.big_endian = true;
            v.swap_bytes()
        }
        v if v.swap_bytes() == 1 => return Err(c.err(4, "header", ErrorKind::Version1)),
        v => return Err(c.err(4, "header", ErrorKind::UnknownVersion(v))),
    };

    let n_tensors_at = c.pos;
    let n_tensors = c.u64("tensor count", &header)?;
    if n_tensors > MAX_TENSOR_COUNT {
        return Err(c.err(
            n_tensors_at,
            "header",
            ErrorKind::TooLarge {
                what: "tensor count",
                len: n_tensors,
                max: MAX_TENSOR_COUNT,
            },
        ));
    }
    let n_kv_at = c.pos;
    let n_kv = c.u64("metadata count", &header)?;
    if n_kv > MAX_KV_COUNT {
        return Err(c.err(
            n_kv_at,
            "header",
            ErrorKind::TooLarge {
                what: "metadata key/value count",
                len: n_kv,
                max: MAX_KV_COUNT,
            },
        ));
    }
    // A key/value pair is at least 8 (key length) + 1 + 4 (type) + 1 bytes; a tensor info
    // at least 8 (name length) + 4 (dims) + 4 (type) + 8 (offset). Check before reserving anything.
    let min_need = n_kv * 14 + n_tensors * 24;
    if min_need > c.remaining() {
        return Err(c.err(
            c.pos,
            "header",
            ErrorKind::Truncated {
                what: "declared metadata and tensor infos",
                need: min_need,
                have: c.remaining(),
            },
        ));
    }

    let mut entries = Vec::with_capacity(n_kv as usize);
    let mut key_index = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key_at = c.pos;
        let key_ctx = || format!("metadata entry {i} key");
        let key = c.utf8(MAX_KEY_LEN, "metadata key", &key_ctx)?;
        if key.is_empty() {
            return Err(c.err(key_at, key_ctx(), ErrorKind::EmptyKey));
        }
        if key_index.contains_key(key) {
            return Err(c.err(key_at, key_ctx(), ErrorKind::DuplicateKey(key.to_string())));
        }
        let ctx = || format!("metadata key '{key}'");
        let ty = c.value_type(&ctx)?;
        let value = c.value(ty, &ctx)?;
        key_index.insert(key, entries.len());
        entries.push((key, value, key_at as u64));
    }

    let alignment = match key_index.get("general.alignment").map(|&i| &entries[i]) {
        None => DEFAULT_ALIGNMENT,
        Some((_, value, at)) => {
            let ctx = "metadata key 'general.alignment'";
            let Value::U32(a) = *value else {
                return Err(GgufError {
                    offset: *at,
                    context: ctx.into(),
                    kind: ErrorKind::AlignmentType(value.value_type().name()),
                });
            };
            let a = u64::from(a);
            if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                return Err(GgufError {
                    offset: *at,
                    context: ctx.into(),
                    kind: ErrorKind::BadAlignment(a),
                });
            }
            a
        }
    };

    let mut tensors: Vec<TensorInfo<'_>> = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let info_at = c.pos;
        let name_ctx = || format!("tensor info {i} name");
        let name = c.utf8(MAX_TENSOR_NAME_LEN, "tensor name", &name_ctx)?;
        if name.is_empty() {
            return Err(c.err(info_at, name_ctx(), ErrorKind::EmptyTensorName));
        }
        if tensor_index.contains_key(name) {
            return Err(c.err(
                info_at,
                name_ctx(),
                ErrorKind::DuplicateTensor(name.to_string()),
            ));
        }
        let ctx = || format!("tensor '{name}'");
        let dims_at = c.pos;
        let n_dims = c.u32("dimension count", &ctx)?;
        if n_dims > MAX_DIMS {
            return Err(c.err(dims_at, ctx(), ErrorKind::TooManyDims(n_dims)));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        let mut n_elements: u64 = 1;
        for index in 0..n_dims as usize {
            let at = c.pos;
            let value = c.u64("dimension", &ctx)?;
            if value > i64::MAX as u64 {
                return Err(c.err(at, ctx(), ErrorKind::NegativeDim { index, value }));
            }
            shape.push(value);
            n_elements = match n_elements.checked_mul(value) {
                Some(n) if n <= i64::MAX as u64 => n,
                _ => return Err(c.err(dims_at, ctx(), ErrorKind::ElementOverflow(shape))),
            };
        }
        let type_at = c.pos;
        let type_id = c.u32("tensor type", &ctx)?;
        let ty = GgmlType::from_id(type_id).map_err(|e| c.err(type_at, ctx(), e.into()))?;
        let ne0 = shape.first().copied().unwrap_or(1);
        if ne0 % ty.block_size() != 0 {
            return Err(c.err(
                dims_at,
                ctx(),
                ErrorKind::RowNotBlockMultiple {
                    ty: ty.name(),
                    block: ty.block_size(),
                    ne0,
                },
            ));
        }
        let n_bytes = ty.bytes_for(n_elements).ok_or_else(|| {
            c.err(
                dims_at,
                ctx(),
                ErrorKind::SizeOverflow {
                    ty: ty.name(),
                    shape: shape.clone(),
                },
            )
        })?;
        // Every later `as usize` of a tensor's sizes and dimensions relies on this (it
        // can only fail on a 32-bit target).
        let fits = |v: u64| usize::try_from(v).is_ok();
        if n_bytes > MAX_MAPPED || !fits(n_elements) || !shape.iter().all(|&d| fits(d)) {
            return Err(c.err(
                dims_at,
                ctx(),
                ErrorKind::BeyondAddressSpace {
                    bytes: n_bytes,
                    elements: n_elements,
                },
            ));
        }
        let offset_at = c.pos;
        let offset = c.u64("data offset", &ctx)?;
        if offset % alignment != 0 {
            return Err(c.err(
                offset_at,
                ctx(),
                ErrorKind::MisalignedOffset { offset, alignment },
            ));
        }
        // Saturating: a previous tensor whose end overflows u64 ends past any file.
        if let Some(prev) = tensors.last()
            && offset < prev.offset.saturating_add(prev.n_bytes)
        {
            return Err(c.err(
                offset_at,
                ctx(),
                ErrorKind::Overlap {
                    offset,
                    previous: prev.name.to_string(),
                    previous_end: prev.offset.saturating_add(prev.n_bytes),
                },
            ));
        }
        tensor_index.insert(name, tensors.len());
        tensors.push(TensorInfo {
            name,
            ty,
            shape,
            n_elements,
            offset,
            n_bytes,
            info_offset: info_at as u64,
            data: &[],
        });
    }

    // The data section starts at the aligned end of the tensor infos. A file with no
    // tensors (a vocabulary-only file) may end right after its metadata.
    let file_len = declared_len.unwrap_or(buf.len() as u64);
    let data_offset = align_up(c.pos as u64, alignment).unwrap_or(u64::MAX);
    for t in &mut tensors {
        let range = data_offset
            .checked_add(t.offset)
            .and_then(|start| start.checked_add(t.n_bytes).map(|end| (start, end)));
        match range {
            Some((start, end)) if end <= file_len => {
                if declared_len.is_none() {
                    t.data = &buf[start as usize..end as usize];
                }
            }
            _ => {
                return Err(GgufError {
                    offset: t.info_offset,
                    context: format!("tensor '{}'", t.name),
                    kind: ErrorKind::DataOutOfFile {
                        start: data_offset.saturating_add(t.offset),
                        end: data_offset
                            .saturating_add(t.offset)
                            .saturating_add(t.n_bytes),
                        file_len,
                    },
                });
            }
        }
    }

    Ok(GgufFile {
        version,
        big_endian: c.big_endian,
        alignment,
        metadata: Metadata::new(entries, key_index),
        tensors,
        tensor_index,
        data_offset,
        file_len,
        header: &buf[..(c.pos).min(buf.len())],
    })
}

/// Whether the version field, read little-endian, is a byte-swapped 2 or 3: the file
/// is big-endian.
pub(crate) fn is_big_endian_version(version_le: u32) -> bool {
    matches!(version_le.swap_bytes(), 2 | 3)
}
