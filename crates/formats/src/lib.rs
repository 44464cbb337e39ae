//! The ggml tensor block formats: the type table, and the portable (reference)
//! dequantisers and quantisers that every SIMD kernel is tested against.
//!
//! This crate knows nothing of models or metadata: it turns blocks of bytes into
//! floats and back. Every conversion is bit-exact against llama.cpp b11434.

pub mod byte_order;
mod dequant;
mod fp16;
mod iquants;
mod kquants;
mod lattice;
mod legacy;
mod num;
mod quant;
mod tables;
pub mod types;

pub use dequant::dequantize;
pub use num::nearest_int;
pub use quant::{quantize, quantize_mxfp4_for_fixtures, quantize_weighted, requires_imatrix};
pub use types::{ALL_TYPES, GgmlType, Support, TypeIdError, readable_type_names};

/// Why a block conversion could not run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{0}")]
    Refused(String),
    #[error("{ty}: {n_bytes} bytes is not a whole number of {type_size}-byte blocks")]
    PartialBlock {
        ty: GgmlType,
        n_bytes: usize,
        type_size: u64,
    },
    #[error("{ty}: {n_bytes} bytes hold {have} values but the output has room for {want}")]
    LengthMismatch {
        ty: GgmlType,
        n_bytes: usize,
        have: u64,
        want: usize,
    },
    #[error("{ty}: dequantisation is not implemented yet")]
    NotImplemented { ty: GgmlType },
    #[error("{ty}: {n_values} values is not a whole number of {block_size}-value blocks")]
    PartialInput {
        ty: GgmlType,
        n_values: usize,
        block_size: u64,
    },
    #[error("cannot quantise to {ty}: value {index} is {what}; weights must be finite")]
    NonFinite {
        ty: GgmlType,
        index: usize,
        what: &'static str,
    },
    #[error(
        "llamay reads {ty} but never writes it (it never writes MXFP4); writable types: \
         F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1, the K-quants, IQ4_NL IQ4_XS IQ3_XXS \
         IQ3_S IQ2_S, and IQ2_XS IQ2_XXS with an importance matrix"
    )]
    NotWritable { ty: GgmlType },
    #[error(
        "{ty} needs an importance matrix: llama.cpp refuses to make it without one \
         (ggml_quantize_requires_imatrix)"
    )]
    ImatrixRequired { ty: GgmlType },
    #[error(
        "cannot quantise to {ty}: llama.cpp's quantiser aborts on these values or \
         importance weights ({why})"
    )]
    QuantiserAborts { ty: GgmlType, why: &'static str },
    #[error(
        "{ty}: a row of {n_per_row} values is not a whole, non-zero number of {block_size}-value blocks"
    )]
    BadRowLength {
        ty: GgmlType,
        n_per_row: usize,
        block_size: u64,
    },
    #[error("{ty}: {n_values} values is not a whole number of {n_per_row}-value rows")]
    PartialRow {
        ty: GgmlType,
        n_values: usize,
        n_per_row: usize,
    },
    #[error(
        "{ty}: {n_weights} importance weights for rows of {n_per_row} values; \
         the importance matrix needs one weight per column"
    )]
    WeightsLength {
        ty: GgmlType,
        n_weights: usize,
        n_per_row: usize,
    },
    #[error(
        "cannot quantise to {ty}: importance weight {index} is {what}; importance weights must be finite"
    )]
    NonFiniteWeight {
        ty: GgmlType,
        index: usize,
        what: &'static str,
    },
}

#[cfg(test)]
mod table_tests;
