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

// Sizes in a GGUF file are u64. The reader refuses, by name, a tensor whose bytes,
// element count or any dimension does not fit this target's `usize` (and `open` a
// file larger than one mapping can be), so on every target, 32-bit included, the
// loaders may convert a parsed tensor's sizes with `as usize`. Metadata counts are
// converted with checks where they are read (the engine's config, the tokenizer).

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
