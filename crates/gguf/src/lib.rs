//! The GGUF container format, and nothing else: a hardened reader over a borrowed byte
//! slice (the memory map) and a writer.
//!
//! Invariants:
//! - tensor data is never copied: [`TensorInfo::data`] borrows the mapping;
//! - no input bytes can make the reader panic, read out of bounds or allocate for a
//!   declared length before checking it against what remains; every refusal is a
//!   [`GgufError`] naming the field and byte offset;
//! - this crate does not interpret model metadata (that is the loader's job); it only
//!   enforces the container's own rules (alignment, split sets).

// Sizes in a GGUF file are u64; the loaders (here, the tokenizer, the engine) convert
// counts, lengths and offsets to usize after checking them against the bytes of a
// mapping, which on a 64-bit target holds every such value. A 32-bit target would need
// each of those conversions checked again: refused at build time instead (README).
#[cfg(not(target_pointer_width = "64"))]
compile_error!(
    "llamay builds for 64-bit targets only: GGUF sizes are u64 and the loaders convert them to usize"
);

mod error;
mod file;
pub mod ftype;
pub mod limits;
mod metadata;
mod model;
mod read;
mod value;
mod write;

pub use error::{ErrorKind, GgufError, OpenError};
pub use file::{GgufFile, TensorInfo};
pub use ftype::file_type_name;
pub use metadata::{Metadata, MetadataTypeError, describe};
pub use model::{MappedModel, Model};
pub use value::{Array, GgufStr, StringIter, Strings, Value, ValueType};
pub use write::{GgufWriter, TensorSpec, WriteError};
