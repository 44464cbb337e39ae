//! An execution context over a loaded model: its thread pool, its scratch buffers and
//! its KV pool. The model's weights are read-only and may be shared by any number of
//! contexts (one per thread, say); a context is used by one caller at a time (`decode`
//! takes `&mut self`), so there is no lock and no silent fall-back to fewer threads.

use crate::cpu::CpuScratch;
use crate::forward::Scratch;
use crate::kv::{KvPool, KvPrecision, SeqId};
use crate::{Model, Threads};
use llamay_kernels::ThreadPool;

/// How a context is made.
#[derive(Clone, Copy, Debug)]
pub struct ContextParams {
    pub threads: Threads,
    /// The KV cache's precision (`--kv`).
    pub kv: KvPrecision,
    /// Most positions one sequence may hold (`-c`).
    pub n_ctx: usize,
    /// Positions the pool holds in every layer, over all its sequences (pages are
    /// allocated as they are first written, up to this). `None`: `n_ctx`, one full
    /// sequence, plus a page per layer for a fork's first copied page.
    pub kv_budget_tokens: Option<usize>,
}

impl ContextParams {
    pub fn new(threads: Threads, kv: KvPrecision, n_ctx: usize) -> Self {
        ContextParams {
            threads,
            kv,
            n_ctx,
            kv_budget_tokens: None,
        }
    }
}

/// Why a context cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    #[error("{0}")]
    Precision(String),
    #[error("a context of 0 tokens holds nothing (-c must be at least 1)")]
    EmptyContext,
    /// The device cannot hold or run this model (named by the device).
    #[error("{0}")]
    Device(String),
}

/// A model's execution context; see the module docs.
pub struct Context<'m> {
    pub(crate) model: &'m Model<'m>,
    pub(crate) pool: ThreadPool,
    pub(crate) scratch: Scratch<Vec<f32>>,
    pub(crate) cpu: CpuScratch,
    pub(crate) kv: KvPool,
    /// Where the forward pass runs when not on the CPU (`Model::context_on`).
    pub(crate) device: Option<Box<crate::ondevice::DeviceState>>,
}

impl<'a> Model<'a> {
    /// A new context over these weights (any number may exist at once).
    pub fn context(&self, p: ContextParams) -> Result<Context<'_>, ContextError> {
        let c = self.config();
        if let Some(why) = p.kv.unfit(c.head_dim_k, c.head_dim_v) {
            return Err(ContextError::Precision(why));
        }
        if p.n_ctx == 0 {
            return Err(ContextError::EmptyContext);
        }
        let windows = (c.swa_layers.iter())
            .map(|&swa| (swa && c.n_swa > 0).then_some(c.n_swa))
            .collect();
        // An encoder attends over each batch's own keys and values and keeps none.
        let budget = match c.causal {
            true => (p.kv_budget_tokens).unwrap_or(p.n_ctx.saturating_add(crate::kv::PAGE)),
            false => 0,
        };
        Ok(Context {
            model: self,
            pool: ThreadPool::new(p.threads.0.max(1)),
            scratch: Scratch::default(),
            cpu: CpuScratch::default(),
            kv: KvPool::new(p.kv, c.k_dim(), c.v_dim(), windows, p.n_ctx, budget),
            device: None,
        })
    }
}

impl<'m> Context<'m> {
    /// Shows every later matrix product's input to `observer` (`None`: to nobody), and
    /// returns the one that watched until now. The CPU's forward pass only: a context
    /// on a device refuses, naming it.
    pub fn observe(
        &mut self,
        observer: Option<Box<dyn crate::ActivationObserver>>,
    ) -> Result<Option<Box<dyn crate::ActivationObserver>>, ContextError> {
        if let Some(d) = self.device() {
            return Err(ContextError::Device(format!(
                "activation observers watch the CPU's forward pass; this context runs on {d} (use the CPU)"
            )));
        }
        Ok(std::mem::replace(&mut self.cpu.act.observer, observer))
    }

    /// The device this context's forward pass runs on (one line), or `None` on the CPU.
    pub fn device(&self) -> Option<String> {
        self.device.as_ref().map(|d| d.describe())
    }

    /// What the device has done since the context was made (submissions, bytes read
    /// back), or `None` on the CPU.
    pub fn device_counters(&self) -> Option<crate::device::DeviceCounters> {
        self.device.as_ref().map(|d| d.counters())
    }

    pub fn model(&self) -> &'m Model<'m> {
        self.model
    }

    pub fn threads(&self) -> Threads {
        Threads(self.pool.n_threads())
    }

    /// The KV pool: sequence lengths, tokens, usage.
    pub fn kv(&self) -> &KvPool {
        &self.kv
    }

    /// The KV pool, to make, fork, truncate and free sequences.
    pub fn kv_mut(&mut self) -> &mut KvPool {
        &mut self.kv
    }

    /// A new empty sequence (shorthand for `kv_mut().new_sequence()`).
    pub fn new_sequence(&mut self) -> SeqId {
        self.kv.new_sequence()
    }
}
