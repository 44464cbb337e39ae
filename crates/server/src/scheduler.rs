//! One loaded model's engine thread: continuous batching over its KV pool.
//!
//! Every engine step is one `decode` call carrying the next token of every running
//! sequence plus one chunk of the oldest prompt still being prefilled, so a long prompt
//! holds the others up by at most one chunk. A new request starts from the longest
//! prefix it shares with a sequence the pool still holds (a finished request's), forked
//! copy-on-write and truncated to the shared part. Generation runs here, never on the
//! async runtime's workers (design invariant 6); requests arrive over a channel and
//! their tokens leave over each request's own channel. A request whose receiver is
//! gone (the client disconnected) is dropped at the next step.
//!
//! Batch invariance: the engine computes every row of a batch independently of the
//! others, in the same order whatever the batch holds (crates/engine/tests/
//! batch_invariance.rs), and each request has its own sampler, so a request's tokens
//! at temperature 0 — or at any temperature with a given seed — are the same alone,
//! batched with any others, prefilled in other chunks, or started from a cached prefix.

use crate::stop::StopMatcher;
use llamay_engine::arch::Output;
use llamay_engine::grammar::{Constraint, Rules, TokenTrie};
use llamay_engine::lookup::LookupIndex;
use llamay_engine::sample::{Sampler, SamplerParams};
use llamay_engine::{
    BatchToken, Context, ContextParams, DecodeError, KvPrecision, Model, Pooling, SeqId, Threads,
};
use llamay_tokenizer::{StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Prompt tokens one step may carry (bounds the activations' memory and how long a
/// prefill holds the running sequences up).
pub const PREFILL_CHUNK: usize = 512;

/// Finished sequences kept for their prefixes (at least; four per slot where more).
const MAX_IDLE: usize = 16;

/// The shortest shared prefix worth a fork (a lone BOS is not), unless it is the
/// whole prompt but its last token.
const MIN_REUSE: usize = 16;

/// One request for the engine.
pub struct Job {
    /// The whole prompt, BOS included; at least one token.
    pub prompt: Vec<u32>,
    pub params: SamplerParams,
    /// Most tokens to generate (`usize::MAX`: until the context is full).
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub grammar: Option<Arc<Rules>>,
    /// `Some(n)`: report each token's log-probability and the `n` likeliest.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// Render control tokens' text (chat output, whose markup is often control tokens).
    pub render_special: bool,
    /// Most positions this request's sequence may reach (≤ the server's context).
    pub n_ctx: usize,
    pub events: UnboundedSender<Event>,
}

/// A request for embeddings: each input's final hidden states, mean-pooled (as
/// llama.cpp's `--pooling mean`) for a decoder, pooled as its file says for an encoder
/// (BERT), in input order.
pub struct EmbedJob {
    /// Each input's tokens, BOS included; each at least one token, within the context.
    pub inputs: Vec<Vec<u32>>,
    pub reply: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
}

/// What the engine thread receives.
enum Work {
    Generate(Job),
    Embed(EmbedJob),
}

/// An embedding request being computed: one chunk per engine loop.
struct Embedding {
    job: EmbedJob,
    /// The input being pooled, its sequence and how many of its tokens are in.
    input: usize,
    seq: Option<SeqId>,
    fed: usize,
    sum: Vec<f64>,
    out: Vec<Vec<f32>>,
}

/// What the engine tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// One generated token and the text it released (may be empty: part of a
    /// character, or held back as a possible stop string's start).
    Token(Piece),
    Done(Summary),
    Failed(String),
}

#[derive(Debug, Clone)]
pub struct Piece {
    pub token: u32,
    pub text: String,
    pub logprob: Option<TokenLogprob>,
}

#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// The likeliest tokens at this position and their log-probabilities.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// End of generation, a stop string, or a complete grammar sentence.
    Stop,
    /// The token limit or the context's end.
    Length,
}

#[derive(Debug, Clone)]
pub struct Summary {
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Prompt tokens that came from the cache rather than being computed.
    pub cached_tokens: usize,
    pub generated: usize,
    pub prompt_eval: Duration,
    pub eval: Duration,
    /// Text held back at the end (a stop-string prefix that never completed).
    pub tail: String,
    /// The prompt and the generated tokens (Ollama's `context`).
    pub tokens: Vec<u32>,
}

/// Opens the device a loaded model runs on (`serve --device`): called once per model
/// load, on the loading thread.
pub type DeviceOpener =
    Arc<dyn Fn() -> Result<Box<dyn llamay_engine::device::Device>, String> + Send + Sync>;

/// How a scheduler is set up.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    pub threads: Threads,
    pub kv: KvPrecision,
    /// Positions one sequence may hold.
    pub n_ctx: usize,
    /// Sequences decoded together.
    pub parallel: usize,
    /// Requests allowed to wait beyond `parallel`.
    pub queue: usize,
    /// `--draft-lookup`: prompt-lookup draft tokens per request per step (0: off).
    pub max_draft: usize,
}

/// Counters the scheduler keeps for `/metrics`, `/api/ps` and admission.
#[derive(Default, Debug)]
pub struct Gauges {
    pub waiting: AtomicUsize,
    pub running: AtomicUsize,
    /// Requests submitted and not yet finished (admission bound).
    pub in_flight: AtomicUsize,
    /// Pages the running requests hold (idle, reusable prefixes not counted).
    pub kv_pages_used: AtomicUsize,
    pub kv_pages_total: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub draft_tokens: AtomicU64,
    pub draft_accepted: AtomicU64,
    /// The engine thread ended (its model is gone).
    pub stopped: AtomicBool,
}

/// Why a request was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// `--parallel` are running and `--queue` are waiting.
    Busy,
    /// The engine thread is gone.
    Stopped,
}

/// The handle the HTTP side holds: submits jobs to the engine thread.
pub struct Scheduler {
    jobs: Mutex<mpsc::Sender<Work>>,
    pub gauges: Arc<Gauges>,
    config: EngineConfig,
    /// The model is an encoder (embeddings only), by this architecture name.
    encoder: Option<&'static str>,
    /// The encoder is a cross-encoder: its "embedding" is a relevance score.
    reranker: bool,
    placement: Placement,
}

/// Where a loaded model's forward pass runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// No device was asked for.
    Cpu,
    /// On the device `name`; the matrices it declines (`host_bytes` of them) stay on
    /// the CPU.
    Device { name: String, host_bytes: u64 },
    /// On the CPU because the server's device declines the model as a whole (why).
    CpuDeclined(String),
}

impl Scheduler {
    /// Starts the engine thread for `model`.
    pub fn start(
        model: Arc<Model<'static>>,
        tok: Arc<Tokenizer>,
        config: EngineConfig,
        device: Option<&DeviceOpener>,
    ) -> Result<Scheduler, String> {
        let n_ctx = config.n_ctx;
        let arch = model.config().arch;
        let encoder = (arch.output == Output::Embeddings).then_some(arch.name);
        let reranker = encoder.is_some() && model.config().pooling == Pooling::Rank;
        // Made here so that a bad configuration is an error now, not a dead thread.
        let probe = model
            .context(ContextParams::new(Threads(1), config.kv, n_ctx))
            .map_err(|e| e.to_string())?;
        drop(probe);
        // The device is opened here; the engine thread places the model there and says
        // when it is ready. A model whose block the device does not run (an encoder, a
        // mixture) is served from the CPU instead, as Ollama serves what its GPU cannot
        // hold: `--device` is the server's, and one model's shape should not make the
        // others' routes fail. The registry logs the placement and `/api/ps` shows it.
        let device = device.map(|open| open()).transpose()?;
        let (device, placement) = match device {
            None => (None, Placement::Cpu),
            Some(dev) => {
                let why = model.device_unsupported(config.kv);
                if why.is_empty() {
                    let on_device = Placement::Device {
                        name: dev.describe(),
                        host_bytes: model.device_declined_bytes(&*dev),
                    };
                    (Some(dev), on_device)
                } else {
                    let why = format!("{} does not run it: {}", dev.describe(), why.join("; "));
                    (None, Placement::CpuDeclined(why))
                }
            }
        };
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (tx, rx) = mpsc::channel();
        let gauges = Arc::new(Gauges::default());
        let g = gauges.clone();
        std::thread::Builder::new()
            .name("llamay-engine".into())
            .spawn(move || {
                // Marks the scheduler stopped however the thread ends (a panic included),
                // so the registry loads the model afresh instead of queueing into nothing.
                struct Stopped(Arc<Gauges>);
                impl Drop for Stopped {
                    fn drop(&mut self) {
                        self.0.stopped.store(true, Ordering::SeqCst);
                    }
                }
                let _stopped = Stopped(g.clone());
                match Engine::new(&model, &tok, config, g, device) {
                    Ok(mut engine) => {
                        let _ = ready_tx.send(Ok(()));
                        engine.run(rx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| format!("cannot start the engine thread: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "the engine thread ended before it was ready".to_string())??;
        Ok(Scheduler {
            jobs: Mutex::new(tx),
            gauges,
            config,
            encoder,
            reranker,
            placement,
        })
    }

    /// Where the model runs.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn config(&self) -> EngineConfig {
        self.config
    }

    /// `Some(architecture)` when the model computes embeddings only (an encoder).
    pub fn encoder(&self) -> Option<&'static str> {
        self.encoder
    }

    /// Whether the model is a cross-encoder (rank pooling): it scores pairs.
    pub fn reranker(&self) -> bool {
        self.reranker
    }

    /// Queues a job unless `parallel + queue` requests are already in flight.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        self.send(Work::Generate(job))
    }

    /// Queues an embedding request, under the same bound.
    pub fn submit_embed(&self, job: EmbedJob) -> Result<(), Refused> {
        self.send(Work::Embed(job))
    }

    fn send(&self, work: Work) -> Result<(), Refused> {
        let limit = self.config.parallel + self.config.queue;
        let g = &self.gauges;
        if g.stopped.load(Ordering::SeqCst) {
            return Err(Refused::Stopped);
        }
        if g.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Refused::Busy);
        }
        let generate = matches!(work, Work::Generate(_));
        if generate {
            g.waiting.fetch_add(1, Ordering::SeqCst);
        }
        let sent = self.jobs.lock().map_err(|_| Refused::Stopped)?.send(work);
        if sent.is_err() {
            g.in_flight.fetch_sub(1, Ordering::SeqCst);
            if generate {
                g.waiting.fetch_sub(1, Ordering::SeqCst);
            }
            return Err(Refused::Stopped);
        }
        Ok(())
    }

    /// Whether nothing is queued or running.
    pub fn idle(&self) -> bool {
        self.gauges.in_flight.load(Ordering::SeqCst) == 0
    }
}

/// A running request.
struct Slot<'t> {
    job: Job,
    seq: SeqId,
    /// Prompt tokens in the KV (reused ones included).
    fed: usize,
    cached: usize,
    /// The sampled token not yet decoded.
    next: Option<u32>,
    sampler: Sampler,
    history: Vec<u32>,
    /// The history's n-grams for prompt-lookup drafts (`--draft-lookup`).
    lookup: LookupIndex,
    constraint: Option<Constraint>,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    generated: usize,
    /// A stop string ended it (what the decoder still holds is past the stop).
    stopped: bool,
    started: Instant,
    first_token: Option<Instant>,
}

/// A finished request's sequence, kept for the prefix it may share with the next.
struct Idle {
    seq: SeqId,
    used: Instant,
}

struct Engine<'m, 't> {
    ctx: Context<'m>,
    tok: &'t Tokenizer,
    config: EngineConfig,
    gauges: Arc<Gauges>,
    waiting: VecDeque<Job>,
    slots: Vec<Slot<'t>>,
    embeds: VecDeque<Embedding>,
    idle: Vec<Idle>,
    /// The vocabulary's trie, built on the first constrained request.
    trie: Option<Arc<TokenTrie>>,
}

/// A slot's rows in a step's batch: its token at `pos` (a decode token or a prompt's
/// last) and the draft tokens after it.
struct Rows {
    slot: usize,
    /// Batch index of the first row.
    first: usize,
    pos: usize,
    drafts: Vec<u32>,
}

impl<'m, 't> Engine<'m, 't> {
    fn new(
        model: &'m Model<'static>,
        tok: &'t Tokenizer,
        config: EngineConfig,
        gauges: Arc<Gauges>,
        device: Option<Box<dyn llamay_engine::device::Device>>,
    ) -> Result<Self, String> {
        let mut p = ContextParams::new(config.threads, config.kv, config.n_ctx);
        // `--parallel` full sequences, and a page per sequence for forks' first copies.
        p.kv_budget_tokens = Some(
            config
                .parallel
                .saturating_mul(config.n_ctx + llamay_engine::PAGE),
        );
        let mut ctx = match device {
            None => model.context(p),
            Some(dev) => model.context_on(p, dev),
        }
        .map_err(|e| e.to_string())?;
        // A rejected draft is cut from the cache after its batch.
        ctx.kv_mut().keep_for_rollback(config.max_draft);
        Ok(Engine {
            ctx,
            tok,
            config,
            gauges,
            waiting: VecDeque::new(),
            slots: Vec::new(),
            embeds: VecDeque::new(),
            idle: Vec::new(),
            trie: None,
        })
    }

    fn run(&mut self, rx: mpsc::Receiver<Work>) {
        loop {
            if self.slots.is_empty() && self.waiting.is_empty() && self.embeds.is_empty() {
                match rx.recv() {
                    Ok(w) => self.take(w),
                    Err(_) => return, // the model was unloaded
                }
            }
            while let Ok(w) = rx.try_recv() {
                self.take(w);
            }
            self.drop_cancelled();
            self.admit();
            self.publish();
            if !self.slots.is_empty() {
                self.step();
            }
            // Embeddings go one chunk at a time between the generation steps.
            if !self.embeds.is_empty() {
                self.embed_step();
            }
            self.publish();
        }
    }

    fn take(&mut self, w: Work) {
        match w {
            Work::Generate(j) => self.waiting.push_back(j),
            Work::Embed(job) => self.embeds.push_back(Embedding {
                job,
                input: 0,
                seq: None,
                fed: 0,
                sum: Vec::new(),
                out: Vec::new(),
            }),
        }
    }

    /// One chunk of the oldest embedding request's current input.
    fn embed_step(&mut self) {
        let Some(mut e) = self.embeds.pop_front() else {
            return;
        };
        if e.job.reply.is_closed() {
            if let Some(s) = e.seq {
                let _ = self.ctx.kv_mut().free(s);
            }
            self.finish_job();
            return;
        }
        let Some(tokens) = e.job.inputs.get(e.input) else {
            let _ = e.job.reply.send(Ok(std::mem::take(&mut e.out)));
            self.finish_job();
            return;
        };
        if tokens.is_empty() || tokens.len() > self.config.n_ctx {
            let why = format!(
                "embedding input {} has {} tokens; give 1 to {}",
                e.input,
                tokens.len(),
                self.config.n_ctx
            );
            let _ = e.job.reply.send(Err(why));
            self.finish_job();
            return;
        }
        let cfg = self.ctx.model().config();
        if cfg.arch.output == Output::Embeddings {
            // An encoder reads each input whole and pools it as its file says.
            match self.ctx.embed(&[tokens], cfg.pooling) {
                Ok(mut v) => e.out.append(&mut v),
                Err(err) => {
                    let why = format!("embedding input {}: {err}", e.input);
                    let _ = e.job.reply.send(Err(why));
                    self.finish_job();
                    return;
                }
            }
            e.input += 1;
            if e.input == e.job.inputs.len() {
                let _ = e.job.reply.send(Ok(std::mem::take(&mut e.out)));
                self.finish_job();
            } else {
                self.embeds.push_front(e);
            }
            return;
        }
        let seq = *e.seq.get_or_insert_with(|| self.ctx.new_sequence());
        let n = PREFILL_CHUNK.min(tokens.len() - e.fed);
        let batch: Vec<BatchToken> = (e.fed..e.fed + n)
            .map(|p| BatchToken {
                seq,
                token: tokens[p],
                pos: p,
                logits: true,
            })
            .collect();
        let hidden = loop {
            match self.ctx.hidden(&batch) {
                Ok(h) => break h,
                Err(DecodeError::PoolFull { .. }) if self.evict_one() => continue,
                Err(err) => {
                    let _ = self.ctx.kv_mut().free(seq);
                    let _ = e
                        .job
                        .reply
                        .send(Err(format!("embedding input {}: {err}", e.input)));
                    self.finish_job();
                    return;
                }
            }
        };
        e.sum.resize(hidden.n_embd, 0.0);
        for r in 0..hidden.len() {
            for (s, &v) in e.sum.iter_mut().zip(hidden.row(r)) {
                *s += v as f64;
            }
        }
        e.fed += n;
        if e.fed == tokens.len() {
            let len = tokens.len() as f64;
            e.out
                .push(e.sum.iter().map(|&s| (s / len) as f32).collect());
            e.sum.clear();
            let _ = self.ctx.kv_mut().free(seq);
            e.seq = None;
            e.fed = 0;
            e.input += 1;
        }
        if e.input == e.job.inputs.len() {
            let _ = e.job.reply.send(Ok(std::mem::take(&mut e.out)));
            self.finish_job();
            return;
        }
        self.embeds.push_front(e);
    }

    fn publish(&self) {
        let g = &self.gauges;
        g.running.store(self.slots.len(), Ordering::SeqCst);
        let u = self.ctx.kv().usage();
        let running: Vec<SeqId> = self.slots.iter().map(|s| s.seq).collect();
        g.kv_pages_used
            .store(self.ctx.kv().pages_held(&running), Ordering::SeqCst);
        g.kv_pages_total.store(u.pages_total, Ordering::SeqCst);
    }

    fn finish_job(&self) {
        self.gauges.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Requests whose client is gone: their slot and sequence are freed now.
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|j| !j.events.is_closed());
        for _ in self.waiting.len()..before {
            self.gauges.waiting.fetch_sub(1, Ordering::SeqCst);
            self.finish_job();
        }
        let mut i = 0;
        while i < self.slots.len() {
            if self.slots[i].job.events.is_closed() {
                let s = self.slots.swap_remove(i);
                self.retire(s.seq);
                self.finish_job();
            } else {
                i += 1;
            }
        }
    }

    /// Keeps a finished sequence for prefix reuse. The least recently used go first
    /// when the pool needs room for running requests, and beyond [`MAX_IDLE`].
    fn retire(&mut self, seq: SeqId) {
        self.idle.push(Idle {
            seq,
            used: Instant::now(),
        });
        if self.idle.len() > MAX_IDLE.max(4 * self.config.parallel) {
            self.evict_one();
        }
    }

    fn evict_one(&mut self) -> bool {
        let Some(i) = (0..self.idle.len()).min_by_key(|&i| self.idle[i].used) else {
            return false;
        };
        let s = self.idle.swap_remove(i);
        let _ = self.ctx.kv_mut().free(s.seq);
        true
    }

    fn admit(&mut self) {
        while self.slots.len() < self.config.parallel {
            let Some(job) = self.waiting.pop_front() else {
                return;
            };
            self.gauges.waiting.fetch_sub(1, Ordering::SeqCst);
            match self.start(job) {
                Ok(slot) => self.slots.push(slot),
                Err(refused) => {
                    let (job, why) = *refused;
                    let _ = job.events.send(Event::Failed(why));
                    self.finish_job();
                }
            }
        }
    }

    fn start(&mut self, job: Job) -> Result<Slot<'t>, Box<(Job, String)>> {
        let n_ctx = job.n_ctx.min(self.config.n_ctx);
        if job.prompt.is_empty() {
            return Err(Box::new((job, "the prompt has no tokens".into())));
        }
        if job.prompt.len() >= n_ctx {
            let why = format!(
                "the prompt has {} tokens and the context holds {n_ctx}: shorten it or raise num_ctx / --ctx-size",
                job.prompt.len()
            );
            return Err(Box::new((job, why)));
        }
        let constraint = match &job.grammar {
            None => None,
            Some(rules) => match self.trie() {
                Ok(trie) => Some(Constraint::new(rules.clone(), trie)),
                Err(why) => return Err(Box::new((job, why))),
            },
        };
        let (seq, cached) = self.reuse_prefix(&job.prompt);
        let decoder = if job.render_special {
            StreamDecoder::rendering_special(self.tok)
        } else {
            StreamDecoder::new(self.tok)
        };
        Ok(Slot {
            seq,
            fed: cached,
            cached,
            next: None,
            sampler: Sampler::new(job.params.clone()),
            history: job.prompt.clone(),
            lookup: LookupIndex::default(),
            constraint,
            decoder,
            stop: StopMatcher::new(job.stop.clone()),
            generated: 0,
            stopped: false,
            started: Instant::now(),
            first_token: None,
            job,
        })
    }

    fn trie(&mut self) -> Result<Arc<TokenTrie>, String> {
        if let Some(t) = &self.trie {
            return Ok(t.clone());
        }
        let (pieces, eog) = self.tok.grammar_vocabulary();
        if eog.is_empty() {
            return Err("the vocabulary has no end-of-generation token, so a constrained answer could never end".into());
        }
        let t = Arc::new(TokenTrie::new(&pieces, &eog));
        self.trie = Some(t.clone());
        Ok(t)
    }

    /// A sequence holding the longest prefix of `prompt` an idle or running sequence
    /// holds (at most all but its last token, whose logits are needed), and its length.
    /// Forking a running one is what makes a request's `n` choices share one prefill.
    fn reuse_prefix(&mut self, prompt: &[u32]) -> (SeqId, usize) {
        let held = |seq: SeqId| -> Option<usize> {
            let held = self.ctx.kv().tokens(seq).ok()?;
            let n = common_prefix(held, prompt).min(prompt.len() - 1);
            (n >= MIN_REUSE || (n > 0 && n == prompt.len() - 1)).then_some(n)
        };
        // (length, parent, index in `idle` if idle)
        let mut candidates: Vec<(usize, SeqId, Option<usize>)> = (self.idle.iter().enumerate())
            .filter_map(|(i, s)| Some((held(s.seq)?, s.seq, Some(i))))
            .chain(
                self.slots
                    .iter()
                    .filter_map(|s| Some((held(s.seq)?, s.seq, None))),
            )
            .collect();
        candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
        for (n, parent, idle) in candidates {
            let Ok(seq) = self.ctx.kv_mut().fork(parent) else {
                continue;
            };
            // A sliding window may have released what the shorter prefix needs.
            if self.ctx.kv_mut().truncate(seq, n).is_ok() {
                if let Some(i) = idle {
                    self.idle[i].used = Instant::now();
                }
                return (seq, n);
            }
            let _ = self.ctx.kv_mut().free(seq);
        }
        (self.ctx.new_sequence(), 0)
    }

    fn step(&mut self) {
        let mut batch = Vec::new();
        let mut plan: Vec<Rows> = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(t) = s.next {
                let pos = self.ctx.kv().len(s.seq).unwrap_or(0);
                let drafts = Self::draft_for(&self.config, s, pos);
                plan.push(Rows {
                    slot: i,
                    first: batch.len(),
                    pos,
                    drafts: drafts.clone(),
                });
                for (k, token) in std::iter::once(t).chain(drafts).enumerate() {
                    batch.push(BatchToken {
                        seq: s.seq,
                        token,
                        pos: pos + k,
                        logits: true,
                    });
                }
            }
        }
        let room = PREFILL_CHUNK.saturating_sub(batch.len()).max(1);
        let mut prefilled = None;
        if let Some(i) = self.slots.iter().position(|s| s.next.is_none()) {
            let s = &self.slots[i];
            let n = room.min(s.job.prompt.len() - s.fed);
            for p in s.fed..s.fed + n {
                let last = p + 1 == s.job.prompt.len();
                if last {
                    plan.push(Rows {
                        slot: i,
                        first: batch.len(),
                        pos: p,
                        drafts: Vec::new(),
                    });
                }
                batch.push(BatchToken {
                    seq: s.seq,
                    token: s.job.prompt[p],
                    pos: p,
                    logits: last,
                });
            }
            prefilled = Some((i, n));
        }
        let logits = loop {
            match self.ctx.decode(&batch) {
                Ok(l) => break l,
                Err(DecodeError::PoolFull { .. }) if self.evict_one() => continue,
                Err(e) => {
                    // Nothing changed; the newest request gives way so the rest go on.
                    let i = self.slots.len() - 1;
                    let s = self.slots.remove(i);
                    let _ = s.job.events.send(Event::Failed(format!(
                        "the server's KV cache cannot hold this request now: {e}"
                    )));
                    let _ = self.ctx.kv_mut().free(s.seq);
                    self.finish_job();
                    return;
                }
            }
        };
        if let Some((i, n)) = prefilled {
            self.slots[i].fed += n;
        }
        // Logits rows are in batch order, and only tokens that asked have one.
        let row_of: Vec<usize> = {
            let mut r = vec![usize::MAX; batch.len()];
            for (k, &b) in logits.index.iter().enumerate() {
                r[b] = k;
            }
            r
        };
        let mut done = Vec::new();
        for r in plan {
            // Sample after the token, then after each draft token while the draft is
            // what the sampler picks: the accepted ones are already in the cache.
            let mut k = 0;
            let finish = loop {
                let row = logits.row(row_of[r.first + k]);
                if let Some(f) = self.sample(r.slot, row, r.pos + 1 + k) {
                    break Some(f);
                }
                let picked = self.slots[r.slot].next;
                if k < r.drafts.len() && picked == Some(r.drafts[k]) {
                    k += 1;
                    continue;
                }
                break None;
            };
            if !r.drafts.is_empty() {
                let g = &self.gauges;
                g.draft_tokens
                    .fetch_add(r.drafts.len() as u64, Ordering::Relaxed);
                g.draft_accepted.fetch_add(k as u64, Ordering::Relaxed);
                // The rejected part of the draft leaves the cache.
                let seq = self.slots[r.slot].seq;
                let _ = self.ctx.kv_mut().truncate(seq, r.pos + 1 + k);
            }
            if let Some(f) = finish {
                done.push((r.slot, f));
            }
        }
        done.sort_by_key(|d| std::cmp::Reverse(d.0));
        for (i, finish) in done {
            let s = self.slots.swap_remove(i);
            self.complete(s, finish);
        }
    }

    /// A prompt-lookup draft for a slot about to decode at `pos` (`--draft-lookup`);
    /// empty otherwise. Any request may carry one, greedy, sampled or constrained: the
    /// sampler is still asked once per kept token, in order, with the same state, and
    /// a draft token is kept only where it is what the sampler picked.
    fn draft_for(config: &EngineConfig, s: &mut Slot<'_>, pos: usize) -> Vec<u32> {
        let max = config.max_draft;
        if max == 0 {
            return Vec::new();
        }
        let n_ctx = s.job.n_ctx.min(config.n_ctx);
        let room = (n_ctx.saturating_sub(pos + 1))
            .min(s.job.max_tokens.saturating_sub(s.generated + 1))
            .min(max);
        s.lookup.draft(&s.history, room)
    }

    /// Samples slot `i`'s next token from the logits after its first `kv_len`
    /// positions; `Some` when it is finished.
    fn sample(&mut self, i: usize, logits: &[f32], kv_len: usize) -> Option<Finish> {
        let n_ctx_server = self.config.n_ctx;
        let tok = self.tok;
        let s = &mut self.slots[i];
        s.first_token.get_or_insert_with(Instant::now);
        let id = match &mut s.constraint {
            None => s.sampler.sample(logits, &s.history),
            Some(c) => {
                let Some(id) = s.sampler.sample_constrained(logits, &s.history, c) else {
                    let _ = s.job.events.send(Event::Failed(format!(
                        "the grammar admits no token of this vocabulary here (after {} tokens)",
                        s.generated
                    )));
                    return Some(Finish::Stop);
                };
                if !tok.is_eog(id) {
                    c.accept(id);
                }
                id
            }
        };
        if tok.is_eog(id) && (!s.job.ignore_eos || s.constraint.is_some()) {
            return Some(Finish::Stop);
        }
        s.history.push(id);
        s.generated += 1;
        let text = s.decoder.push(id).unwrap_or_default();
        let released = s.stop.push(&text);
        let logprob = s.job.logprobs.map(|n| logprob_of(logits, id, n));
        let _ = s.job.events.send(Event::Token(Piece {
            token: id,
            text: released.text,
            logprob,
        }));
        s.stopped = released.stopped;
        if released.stopped
            || s.constraint
                .as_ref()
                .is_some_and(|c| c.state().is_finished())
        {
            return Some(Finish::Stop);
        }
        if s.generated >= s.job.max_tokens || kv_len >= s.job.n_ctx.min(n_ctx_server) {
            return Some(Finish::Length);
        }
        s.next = Some(id);
        None
    }

    fn complete(&mut self, mut s: Slot<'t>, finish: Finish) {
        let now = Instant::now();
        let first = s.first_token.unwrap_or(now);
        let tail = if s.stopped {
            String::new()
        } else {
            let rest = s.decoder.finish();
            let r = s.stop.push(&rest);
            if r.stopped {
                r.text
            } else {
                r.text + &s.stop.flush()
            }
        };
        let g = &self.gauges;
        g.prompt_tokens
            .fetch_add(s.job.prompt.len() as u64, Ordering::Relaxed);
        g.cached_tokens
            .fetch_add(s.cached as u64, Ordering::Relaxed);
        g.generated_tokens
            .fetch_add(s.generated as u64, Ordering::Relaxed);
        let summary = Summary {
            finish,
            prompt_tokens: s.job.prompt.len(),
            cached_tokens: s.cached,
            generated: s.generated,
            prompt_eval: first - s.started,
            eval: now - first,
            tail,
            tokens: std::mem::take(&mut s.history),
        };
        let _ = s.job.events.send(Event::Done(summary));
        self.retire(s.seq);
        self.finish_job();
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The log-probability of `id` under `logits`' softmax, and the `n` likeliest tokens.
fn logprob_of(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    let n = n.min(logits.len());
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        for (i, &x) in logits.iter().enumerate() {
            if top.len() < n || x > top[top.len() - 1].1 {
                let at = top.partition_point(|&(_, y)| y >= x);
                top.insert(at, (i as u32, x));
                top.truncate(n);
            }
        }
    }
    TokenLogprob {
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&x| x - lse),
        top: top.into_iter().map(|(t, x)| (t, x - lse)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_normalised_top_list() {
        let l = [1.0f32, 3.0, 2.0, 0.5];
        let lp = logprob_of(&l, 2, 2);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
        let total: f32 = l.iter().map(|&x| (x - 3.0).exp()).sum();
        assert!((lp.logprob - ((2.0f32 - 3.0).exp() / total).ln()).abs() < 1e-6);
        assert!(lp.top[0].1 > lp.top[1].1);
    }

    #[test]
    fn common_prefix_counts_equal_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
