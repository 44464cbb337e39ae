//! The ggml tensor block formats: the type table, and the portable (reference)
//! dequantisers and quantisers that every SIMD kernel is tested against.
//!
//! This crate knows nothing of models or metadata: it turns blocks of bytes into
//! floats and back.

mod dequant;
pub mod types;

pub use dequant::dequantize;
pub use types::{ALL_TYPES, GgmlType, Support, TypeIdError, readable_type_names};

/// Why a block conversion could not run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{0}")]
    Refused(String),
    #[error("{ty}: {n_bytes} bytes is not a whole number of {type_size}-byte blocks")]
    PartialBlock { ty: GgmlType, n_bytes: usize, type_size: u64 },
    #[error("{ty}: {n_bytes} bytes hold {have} values but the output has room for {want}")]
    LengthMismatch { ty: GgmlType, n_bytes: usize, have: u64, want: usize },
    #[error("{ty}: dequantisation is not implemented yet")]
    NotImplemented { ty: GgmlType },
}
