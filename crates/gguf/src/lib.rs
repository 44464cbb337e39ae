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

mod error;
mod file;
pub mod limits;
mod metadata;
mod model;
mod read;
mod value;
mod write;

pub use error::{ErrorKind, GgufError, OpenError};
pub use file::{GgufFile, TensorInfo};
pub use metadata::{Metadata, MetadataTypeError, describe};
pub use model::{MappedModel, Model};
pub use value::{Array, GgufStr, StringIter, Strings, Value, ValueType};
pub use write::{GgufWriter, TensorSpec, WriteError};
