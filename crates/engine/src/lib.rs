//! The engine: the architecture table, config synthesis, strict weight binding, the
//! generic forward pass over a batch of sequences, the KV cache and sampling.
//!
//! ```text
//! Model::open(path, threads)?  ──▶  model.context(params)?  ──▶  ctx.decode(&batch)?
//! (or MappedModel::open(path)?.parse()? ──▶ Model::load(&gguf, threads)? for a borrowed file)
//! ```

pub mod arch;
mod attention;
mod backend;
mod batch;
pub mod config;
mod context;
mod cpu;
pub mod device;
pub mod embed;
mod forward;
pub mod grammar;
pub mod kv;
pub mod lookup;
mod moe;
mod ondevice;
mod ops;
pub mod rope;
pub mod sample;
mod snapshot;
pub mod tensor;
mod weights;

#[cfg(feature = "fault-injection")]
pub use forward::fault;

pub use arch::{ARCHITECTURES, ArchSpec};
pub use batch::{BatchToken, Hidden, Logits};
pub use config::{Config, Pooling};
pub use context::{Context, ContextError, ContextParams};
pub use kv::{KvError, KvPool, KvPrecision, KvUsage, PAGE, SeqId};
pub use ondevice::arch_on_device;
pub use snapshot::SnapshotError;
pub use tensor::Threads;

/// Watches the inputs of the forward pass's matrix products on the CPU (`llamay
/// imatrix` sums them): set on a context with [`Context::observe`].
pub trait ActivationObserver: Send {
    /// `x` holds rows of `cols` values that the matrix `weight` (a tensor name) is
    /// about to multiply; `expert` is (expert, experts in the tensor) when the matrix
    /// is one expert's rows of a stacked expert tensor.
    fn matmul_input(
        &mut self,
        weight: &str,
        expert: Option<(usize, usize)>,
        x: &[f32],
        cols: usize,
    );
}

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
    #[error("batch names sequence {seq}, which does not exist in this context")]
    UnknownSequence { seq: SeqId },
    #[error("sequence {seq}: position {pos} given, the next position is {expected}")]
    BadPosition {
        seq: SeqId,
        pos: usize,
        expected: usize,
    },
    #[error("sequence {seq}: the context of {capacity} tokens is full")]
    ContextFull { seq: SeqId, capacity: usize },
    #[error(
        "the KV pool is full: this batch needs {need} more page(s) of {PAGE} positions, {free} of its budget of {budget} pages are free (free or truncate a sequence, or raise the budget)"
    )]
    PoolFull {
        need: usize,
        free: usize,
        budget: usize,
    },
    #[error(
        "sequence {seq}: an encoder ({arch}) reads a sequence whole, in one batch from position 0 (this one starts at {pos})"
    )]
    EncoderNeedsWholeSequence {
        seq: SeqId,
        pos: usize,
        arch: &'static str,
    },
    #[error("{arch} is an encoder: it computes embeddings, not next-token logits")]
    EncoderHasNoLogits { arch: &'static str },
    /// The device failed mid-step (the batch is not committed: the sequences are as
    /// they were).
    #[error("the device failed: {0}")]
    Device(String),
}

/// A loaded model: its config and weights, read-only after load, borrowing the file's
/// mapping (`Model<'static>` from [`Model::open`] owns it). Computation happens in a
/// [`Context`]; any number of contexts, on any threads, may share one model.
pub struct Model<'a> {
    /// The weights were bound and checked against it.
    config: Config,
    /// SHA-256 of every shard's header (metadata and tensor table) and a sample of each
    /// tensor's bytes: what a KV snapshot names as its model (see `identity`).
    identity: [u8; 32],
    weights: weights::Weights<'a>,
    /// The mapping the weights borrow, when the model owns it (declared last: dropped
    /// after the weights).
    _mapping: Option<std::sync::Arc<llamay_gguf::MappedModel>>,
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
        // Before the packing releases the file pages it samples.
        let identity = identity(gguf);
        let pool = llamay_kernels::ThreadPool::new(threads.0.max(1));
        weights.pack(&pool, release);
        weights.link_decode_order();
        Ok(Model {
            config,
            identity,
            weights,
            _mapping: None,
        })
    }

    /// What identifies this model's file: see [`Model::identity`]'s computation in
    /// `identity` (headers, plus the first and last 4 KiB of every tensor).
    pub fn identity(&self) -> &[u8; 32] {
        &self.identity
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
        if let Some(t) = gguf.tensors().find(|t| gguf.big_endian_data(t)) {
            return Err(LoadError::Unsupported(format!(
                "tensor '{}' is {} in a big-endian file, a format without a defined big-endian layout (gguf-py's gguf_convert_endian converts {}); convert the file to little-endian",
                t.name,
                t.ty,
                llamay_formats::byte_order::BIG_ENDIAN_FORMATS
            )));
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
}

impl Model<'static> {
    /// Maps `path` (and its sibling shards) and loads it into a model that owns the
    /// mapping: what a server holds (behind an `Arc`) and shares between threads.
    pub fn open(path: &std::path::Path, threads: Threads) -> Result<Model<'static>, OpenError> {
        let mapped = std::sync::Arc::new(llamay_gguf::MappedModel::open(path)?);
        // SAFETY: the reference points into the `Arc`'s allocation, which the returned
        // model keeps alive in `_mapping` for as long as it exists (the field is dropped
        // after `weights`, and nothing moves the `MappedModel` out of the `Arc`). The
        // mapping's bytes are read-only and never change address.
        let owner: &'static llamay_gguf::MappedModel = unsafe { &*std::sync::Arc::as_ptr(&mapped) };
        let gguf = owner.parse()?;
        let release = |data: &'static [u8]| {
            owner.release(data);
        };
        let mut model = Model::load_releasing(&gguf, threads, &release)?;
        model._mapping = Some(mapped);
        Ok(model)
    }
}

/// Why [`Model::open`] failed: the file, or the load.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Open(#[from] llamay_gguf::OpenError),
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// SHA-256 over every shard's header (magic to the end of the tensor table), then the
/// first and last 4 KiB of every tensor's data: two files with the same metadata and
/// tensor table but other weights (a fine-tune that kept its name) differ, at the cost
/// of reading 8 KiB per tensor rather than the whole file.
fn identity(gguf: &Gguf<'_>) -> [u8; 32] {
    use sha2::Digest;
    const SAMPLE: usize = 4096;
    let mut h = sha2::Sha256::new();
    for shard in &gguf.shards {
        h.update(shard.header_bytes());
    }
    for t in gguf.tensors() {
        let d = t.data;
        h.update(&d[..d.len().min(SAMPLE)]);
        h.update(&d[d.len().saturating_sub(SAMPLE)..]);
    }
    h.finalize().into()
}
