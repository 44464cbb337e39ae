//! Models from anywhere: references ([`Reference`]), the local store ([`Store`]) and
//! pulling over HTTP ([`pull`]) from Ollama-style registries, Hugging Face and plain
//! URLs — every byte verified against its digest before it is a blob, every digest
//! checked before a path is built from it. Knows references, stores and HTTP; nothing
//! of forward passes.

//!
//! A wasm32 build has references and the store but no networking (WASI preview 1 has
//! no sockets): `pull`, `remote_header` and what they use are not compiled there.

#[cfg(not(target_family = "wasm"))]
mod fetch;
#[cfg(not(target_family = "wasm"))]
mod pull;
mod reference;
mod store;
#[cfg(not(target_family = "wasm"))]
mod validate;

#[cfg(not(target_family = "wasm"))]
pub use fetch::{Progress, PullError};
#[cfg(not(target_family = "wasm"))]
pub use pull::{PullOptions, pull};
pub use reference::{DEFAULT_QUANT, RefError, Reference, check_digest};
pub use store::{Layer, MODEL_LAYER, Manifest, Store, StoreError};
#[cfg(not(target_family = "wasm"))]
pub use validate::{MAX_HEADER_READ, RemoteHeader, remote_header};
