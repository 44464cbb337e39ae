//! Errors of the GGUF reader: every refusal names the field and the byte offset where the
//! file went wrong, so a person can find the problem with a hex editor.

use llamay_formats::TypeIdError;
use std::path::PathBuf;

/// A malformed or unsupported GGUF file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{context} at byte {offset}: {kind}")]
pub struct GgufError {
    /// Byte offset in the file where the offending field starts.
    pub offset: u64,
    /// Which field was being read ("header", "metadata key 'general.alignment'", ...).
    pub context: String,
    pub kind: ErrorKind,
}

/// What exactly is wrong; each class of malformation has its own message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ErrorKind {
    #[error("not a GGUF file (magic is {0:02x?}, expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error(
        "GGUF version 1 is not supported (it predates 64-bit counts); convert the file to version 3 with a current gguf-py or llama.cpp"
    )]
    Version1,
    #[error("unsupported GGUF version {0} (llamay reads versions 2 and 3)")]
    UnknownVersion(u32),
    #[error("file ends early: {what} needs {need} bytes but only {have} remain")]
    Truncated {
        what: &'static str,
        need: u64,
        have: u64,
    },
    #[error("{what} of {len} exceeds the limit of {max}")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str },
    #[error("empty metadata key")]
    EmptyKey,
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    #[error("unknown metadata value type {0} (valid types are 0..=12)")]
    BadValueType(u32),
    #[error("nested arrays are not supported")]
    NestedArray,
    #[error("boolean value is {0}, expected 0 or 1")]
    BadBool(u8),
    #[error("general.alignment must be of type u32, found {0}")]
    AlignmentType(&'static str),
    #[error("general.alignment is {0}; it must be a power of two between 1 and {max}", max = crate::limits::MAX_ALIGNMENT)]
    BadAlignment(u64),
    #[error("tensor has {0} dimensions; at most 4 are supported")]
    TooManyDims(u32),
    #[error("dimension {index} is {value}, which is negative as a signed 64-bit count")]
    NegativeDim { index: usize, value: u64 },
    #[error("element count {0:?} overflows a signed 64-bit integer")]
    ElementOverflow(Vec<u64>),
    #[error(
        "{ty} needs rows that are a multiple of {block} elements, but the first dimension is {ne0}"
    )]
    RowNotBlockMultiple {
        ty: &'static str,
        block: u64,
        ne0: u64,
    },
    #[error(transparent)]
    TensorType(#[from] TypeIdError),
    #[error("byte size of {ty} tensor with shape {shape:?} overflows")]
    SizeOverflow { ty: &'static str, shape: Vec<u64> },
    #[error(
        "is {:.1} GB ({elements} elements); this {}-bit build addresses at most {:.1} GB and {} elements in one tensor",
        *bytes as f64 / 1e9, usize::BITS, crate::limits::MAX_MAPPED as f64 / 1e9, usize::MAX
    )]
    BeyondAddressSpace { bytes: u64, elements: u64 },
    #[error("data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset { offset: u64, alignment: u64 },
    #[error(
        "data offset {offset} overlaps the previous tensor '{previous}', which ends at {previous_end} (tensors must be in order and must not overlap)"
    )]
    Overlap {
        offset: u64,
        previous: String,
        previous_end: u64,
    },
    #[error("tensor data [{start}, {end}) lies outside the file of {file_len} bytes")]
    DataOutOfFile { start: u64, end: u64, file_len: u64 },
    #[error("empty tensor name")]
    EmptyTensorName,
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
}

/// Errors of opening a model: I/O, a malformed file, or an inconsistent split set.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("{path}: file is empty")]
    Empty { path: PathBuf },
    #[error("{path}: malformed GGUF: {source}")]
    Malformed { path: PathBuf, source: GgufError },
    #[error(
        "{path}: the file is {:.1} GB; this {}-bit build maps at most {:.1} GB (each of its tensors fits, the whole does not)",
        *len as f64 / 1e9, usize::BITS, crate::limits::MAX_MAPPED as f64 / 1e9
    )]
    BeyondAddressSpace { path: PathBuf, len: u64 },
    /// A tensor this target cannot address (the file is well formed).
    #[error("{path}: {source}")]
    TensorBeyondAddressSpace { path: PathBuf, source: GgufError },
    #[error("{path}: split model: {message}")]
    Split { path: PathBuf, message: String },
}
