//! Models from anywhere: references ([`Reference`]), the local store ([`Store`]) and
//! pulling over HTTP ([`pull`]) from Ollama-style registries, Hugging Face and plain
//! URLs — every byte verified against its digest before it is a blob, every digest
//! checked before a path is built from it. Knows references, stores and HTTP; nothing
//! of forward passes.

mod fetch;
mod pull;
mod reference;
mod store;
mod validate;

pub use fetch::{Progress, PullError};
pub use pull::{PullOptions, pull};
pub use reference::{DEFAULT_QUANT, RefError, Reference, check_digest};
pub use store::{Layer, MODEL_LAYER, Manifest, Store, StoreError};
pub use validate::{MAX_HEADER_READ, RemoteHeader, remote_header};
