//! The engine: the architecture table, config synthesis, strict weight binding, the
//! generic forward pass over a batch of sequences, the KV cache and sampling.
//!
//! ```text
//! MappedModel::open(path)?.parse()?  ──▶  Model::load(&gguf, threads)?  ──▶  model.decode(&mut caches, &batch)?
//! ```

pub mod arch;
mod attention;
pub mod config;
mod forward;
pub mod kv;
mod ops;
pub mod rope;
pub mod sample;
pub mod tensor;
mod weights;

#[cfg(feature = "fault-injection")]
pub use forward::fault;

pub use arch::{ARCHITECTURES, ArchSpec};
pub use config::Config;
pub use forward::{BatchToken, Logits};
pub use kv::{KvCache, KvPrecision};
pub use tensor::Threads;

use llamay_gguf::Model as Gguf;

/// Why a model cannot be loaded: each names what is wrong and, for a refusal, what
/// does work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoadError {
    #[error("the file declares no general.architecture")]
    NoArchitecture,
    #[error("architecture '{name}' is refused: {why}; runnable architectures: {works}")]
    Refused {
        name: String,
        why: &'static str,
        works: String,
    },
    #[error("unknown architecture '{name}'; runnable architectures: {works}")]
    UnknownArchitecture { name: String, works: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("metadata: {0}")]
    Metadata(String),
    #[error("required tensor '{0}' is missing")]
    MissingTensor(String),
    #[error("shape: {0}")]
    Shape(String),
    #[error("{} tensor(s) would be left unread by the {arch} loader: {}", names.len(), names.join(", "))]
    Unbound {
        arch: &'static str,
        names: Vec<String>,
    },
}

impl LoadError {
    /// Tensors the loader would leave unread, when that is why the load failed.
    pub fn unread(&self) -> &[String] {
        match self {
            LoadError::Unbound { names, .. } => names,
            _ => &[],
        }
    }
}

/// Why a decode call was rejected (before any state changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("empty batch")]
    EmptyBatch,
    #[error("token id {token} is outside the vocabulary (0..{n_vocab})")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    #[error("batch names sequence {seq}, but there are {n_seqs}")]
    BadSequence { seq: usize, n_seqs: usize },
    #[error("sequence {seq}: position {pos} given, the next position is {expected}")]
    BadPosition {
        seq: usize,
        pos: usize,
        expected: usize,
    },
    #[error("sequence {seq}: the context of {capacity} tokens is full")]
    ContextFull { seq: usize, capacity: usize },
    #[error("sequence {seq}: its cache {why}")]
    ForeignCache { seq: usize, why: String },
    #[error(
        "sequence {seq}: an earlier batch was interrupted (a panic) after it had written part of this cache; truncate the cache or start a new one"
    )]
    Interrupted { seq: usize },
}

/// A loaded model: its config and weights, borrowing the file's mapping.
pub struct Model<'a> {
    /// Read-only after load: the weights were bound and checked against it.
    config: Config,
    /// Unique per loaded model in this process: the caches it makes carry it, and
    /// `decode` refuses a cache of another model.
    id: u64,
    weights: weights::Weights<'a>,
    threads: Threads,
    /// The compute threads (persistent; the caller participates).
    pool: llamay_kernels::ThreadPool,
    /// Buffers kept from one `decode` to the next, so a batch like the last one finds
    /// its pages already there (a concurrent call that finds them taken uses its own).
    scratch: std::sync::Mutex<forward::Scratch>,
}

fn works() -> String {
    arch::names().join(" ")
}

/// Looks up the architecture a file declares: a row of the table, or a refusal.
pub fn architecture_of(gguf: &Gguf<'_>) -> Result<&'static ArchSpec, LoadError> {
    let name = gguf
        .metadata()
        .architecture()
        .map_err(|e| LoadError::Metadata(e.to_string()))?
        .ok_or(LoadError::NoArchitecture)?;
    if let Some(spec) = arch::find(name) {
        return Ok(spec);
    }
    if let Some((_, why)) = arch::REFUSED.iter().find(|(n, _)| *n == name) {
        return Err(LoadError::Refused {
            name: name.to_string(),
            why,
            works: works(),
        });
    }
    Err(LoadError::UnknownArchitecture {
        name: name.to_string(),
        works: works(),
    })
}

impl<'a> Model<'a> {
    /// Strict load: the architecture must be in the table, every tensor bound to a
    /// slot, every required slot filled, every shape as the config says.
    pub fn load(gguf: &Gguf<'a>, threads: Threads) -> Result<Model<'a>, LoadError> {
        Self::load_releasing(gguf, threads, &|_| {})
    }

    /// [`Model::load`], handing `release` the file bytes of each weight as soon as it
    /// has been repacked (see `Weights::pack`): give it `MappedModel::release` so those
    /// pages do not stay resident beside the packed copy.
    pub fn load_releasing(
        gguf: &Gguf<'a>,
        threads: Threads,
        release: &dyn Fn(&'a [u8]),
    ) -> Result<Model<'a>, LoadError> {
        let (config, mut weights) = Self::bind(gguf, weights::ReadData::Yes)?;
        let pool = llamay_kernels::ThreadPool::new(threads.0.max(1));
        weights.pack(&pool, release);
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Model {
            config,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            weights,
            threads,
            pool,
            scratch: Default::default(),
        })
    }

    /// Everything [`Model::load`] checks, without reading any tensor data: the verdict
    /// `llamay info` reports, at the cost of the metadata alone.
    pub fn check(gguf: &Gguf<'a>) -> Result<Config, LoadError> {
        Self::bind(gguf, weights::ReadData::ShapesOnly).map(|(config, _)| config)
    }

    fn bind(
        gguf: &Gguf<'a>,
        read: weights::ReadData,
    ) -> Result<(Config, weights::Weights<'a>), LoadError> {
        if gguf.big_endian() {
            return Err(LoadError::Unsupported(
                "the file is big-endian; llamay runs little-endian files (convert with gguf-py's gguf_convert_endian)"
                    .into(),
            ));
        }
        if let Some(t) = gguf.tensors().find(|t| !t.ty.is_readable()) {
            return Err(LoadError::Unsupported(format!(
                "tensor '{}': {}",
                t.name,
                t.ty.refusal().unwrap_or_default()
            )));
        }
        let arch = architecture_of(gguf)?;
        let config = Config::from_gguf(arch, gguf)?;
        let weights = weights::Weights::bind(&config, gguf, read)?;
        Ok((config, weights))
    }

    /// A fresh exact (f32) KV cache for one sequence of at most `n_ctx` positions.
    pub fn new_cache(&self, n_ctx: usize) -> KvCache {
        self.new_cache_with(n_ctx, KvPrecision::F32)
    }

    pub fn new_cache_with(&self, n_ctx: usize, precision: KvPrecision) -> KvCache {
        let c = &self.config;
        KvCache::new(c.n_layer, c.k_dim(), c.v_dim(), n_ctx, precision).owned_by(self.id)
    }

    /// The hyper-parameters the model was loaded with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Bytes of weights repacked at load (held in memory besides the mapping).
    pub fn packed_bytes(&self) -> usize {
        self.weights
            .linears()
            .filter_map(|l| l.packed.as_ref())
            .map(|p| p.size_bytes())
            .sum()
    }

    pub fn threads(&self) -> Threads {
        self.threads
    }

    pub fn set_threads(&mut self, threads: Threads) {
        self.threads = threads;
        self.pool = llamay_kernels::ThreadPool::new(threads.0.max(1));
    }
}
