//! Caps on what a GGUF header may declare. Real files are far below every one; the caps
//! exist so that a hostile count cannot make the reader allocate or loop without end.
//! Every length is also checked against the bytes that remain before anything is
//! allocated, so the caps are a second line.

/// Metadata key/value pairs (real files: tens; a few hundred at most).
pub const MAX_KV_COUNT: u64 = 1 << 16;
/// Tensors in one file (large MoE files: tens of thousands).
pub const MAX_TENSOR_COUNT: u64 = 1 << 20;
/// Bytes in a metadata key (the GGUF spec: at most 65535).
pub const MAX_KEY_LEN: u64 = 65_535;
/// Bytes in a tensor name (ggml's GGML_MAX_NAME is 64 including the NUL).
pub const MAX_TENSOR_NAME_LEN: u64 = 63;
/// Bytes in one string value (chat templates reach tens of kilobytes).
pub const MAX_STRING_LEN: u64 = 64 << 20;
/// Elements in one array (vocabularies: up to a few hundred thousand).
pub const MAX_ARRAY_LEN: u64 = 64 << 20;
/// `general.alignment` upper bound.
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// Dimensions of a tensor (ggml's GGML_MAX_DIMS).
pub const MAX_DIMS: u32 = 4;
/// Default alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Bytes in one mapping or one tensor: a Rust slice holds at most `isize::MAX` bytes
/// (2 GiB on a 32-bit target; beyond any file on a 64-bit one).
pub const MAX_MAPPED: u64 = isize::MAX as u64;
