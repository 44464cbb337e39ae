//! One parsed GGUF file: header facts, metadata and the tensor table, all borrowing the
//! file's bytes. Tensor data is a slice of the memory map, never a copy.

use crate::error::GgufError;
use crate::metadata::Metadata;
use llamay_formats::GgmlType;
use std::collections::HashMap;

/// One tensor's entry in the table.
#[derive(Clone, Debug)]
pub struct TensorInfo<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// Dimensions in GGUF order: ne0 (the row length) first.
    pub shape: Vec<u64>,
    pub n_elements: u64,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    pub n_bytes: u64,
    /// Where this tensor's info record starts in the file (for error messages).
    pub info_offset: u64,
    /// The tensor's bytes, borrowed from the file (big-endian in a big-endian file).
    pub data: &'a [u8],
}

impl TensorInfo<'_> {
    /// Elements per row (ne0).
    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }
}

/// A parsed GGUF file.
#[derive(Clone, Debug)]
pub struct GgufFile<'a> {
    pub version: u32,
    /// Recognised by the byte-swapped version field. Metadata is decoded to native
    /// values; tensor data stays as stored.
    pub big_endian: bool,
    pub alignment: u64,
    pub metadata: Metadata<'a>,
    pub tensors: Vec<TensorInfo<'a>>,
    pub(crate) tensor_index: HashMap<&'a str, usize>,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    pub file_len: u64,
    /// The bytes from the magic to the end of the tensor infos: metadata and tensor
    /// table, what identifies the model (see `header_bytes`).
    pub(crate) header: &'a [u8],
}

impl<'a> GgufFile<'a> {
    /// Parses a GGUF file from its bytes. Every declared length, count and offset is
    /// checked; the result borrows `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, GgufError> {
        crate::read::parse(bytes, None)
    }

    /// Parses the header of a `file_len`-byte file from its first bytes (`validate`
    /// reads a remote file's header through HTTP Range requests): metadata and tensor
    /// table checked as by [`GgufFile::parse`], tensor extents against `file_len`;
    /// every tensor's `data` is empty. A prefix too short for the header is an error
    /// whose kind is `Truncated`.
    pub fn parse_header(prefix: &'a [u8], file_len: u64) -> Result<Self, GgufError> {
        crate::read::parse(prefix, Some(file_len))
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo<'a>> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Bytes of tensor data in the file.
    /// The header as stored: magic, metadata and tensor table (not the data).
    pub fn header_bytes(&self) -> &'a [u8] {
        self.header
    }

    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}
