//! The generation loop `run` and `chat` share: prefill a sequence, then sample, decode
//! and hand each token to the caller until a stop condition — and the sampling flags
//! both take.

use anyhow::bail;
use llamay_engine::grammar::Constraint;
use llamay_engine::lookup::LookupIndex;
use llamay_engine::sample::{Sampler, SamplerParams};
use llamay_engine::{BatchToken, Context, KvError, SeqId};
use llamay_tokenizer::Tokenizer;

/// Prompt tokens evaluated per decode call: bounds the activations' memory.
pub const PREFILL_CHUNK: usize = 512;

/// `run`'s and `chat`'s sampling flags (cli.md).
#[derive(clap::Args, Clone)]
pub struct SamplingArgs {
    /// Tokens to generate (-1: until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    pub n_predict: i64,
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Speculate up to N tokens per step by prompt lookup (the continuation of the
    /// last n-gram's previous occurrence), verified in one batch: the output is the
    /// same as without it, greedy or sampled.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "N",
        conflicts_with = "draft_model"
    )]
    pub draft_lookup: usize,
    /// Speculate with a smaller model sharing the vocabulary: its greedy guesses are
    /// verified in one batch (the output is the same as without it).
    #[arg(long, value_name = "FILE")]
    pub draft_model: Option<std::path::PathBuf>,
    /// Most tokens the draft model guesses per step (default 16).
    #[arg(long, value_name = "N", requires = "draft_model")]
    pub draft_max: Option<usize>,
}

impl SamplingArgs {
    /// The validated sampler parameters.
    pub fn params(&self) -> anyhow::Result<SamplerParams> {
        let params = SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplerParams::default()
        };
        params.validate().map_err(anyhow::Error::msg)?;
        Ok(params)
    }

    /// `--draft-lookup` / `--draft-max`: the most draft tokens per step (0: no
    /// speculation).
    pub fn draft(&self) -> anyhow::Result<usize> {
        let (flag, n) = match (self.draft_model.is_some(), self.draft_max) {
            (true, Some(n)) => ("--draft-max", n),
            (true, None) => return Ok(16),
            (false, _) => ("--draft-lookup", self.draft_lookup),
        };
        if n > 64 {
            bail!("{flag} {n}: at most 64 draft tokens");
        }
        if n == 0 && self.draft_model.is_some() {
            bail!("--draft-max 0: give at least 1 (or leave out --draft-model)");
        }
        Ok(n)
    }

    /// The most tokens one answer may have.
    pub fn limit(&self) -> anyhow::Result<usize> {
        match self.n_predict {
            -1 => Ok(usize::MAX),
            n if n >= 1 => Ok(n as usize),
            n => bail!(
                "-n {n}: give the number of tokens to generate (>= 1), or -1 to generate until the end"
            ),
        }
    }
}

/// Decodes `tokens` into `seq` from position `pos0`, in chunks; the logits after the
/// last one.
pub fn prefill(
    ctx: &mut Context<'_>,
    seq: SeqId,
    tokens: &[u32],
    pos0: usize,
) -> anyhow::Result<Vec<f32>> {
    let mut logits = Vec::new();
    for (c, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
        let base = pos0 + c * PREFILL_CHUNK;
        let last = base + chunk.len() == pos0 + tokens.len();
        let batch: Vec<BatchToken> = chunk
            .iter()
            .enumerate()
            .map(|(i, &t)| BatchToken {
                seq,
                token: t,
                pos: base + i,
                logits: last && i + 1 == chunk.len(),
            })
            .collect();
        let out = ctx.decode(&batch)?;
        if last {
            logits = out.row(0).to_vec();
        }
    }
    Ok(logits)
}

/// Keeps the part of `seq`'s cache that `tokens` starts with (all but the last token at
/// most: its logits are wanted) and cuts the rest; where a sliding window released what
/// the cut needs, the sequence starts over. Returns the sequence (a new one when it
/// started over) and how many of `tokens` it holds.
pub fn keep_shared_prefix(
    ctx: &mut Context<'_>,
    seq: SeqId,
    tokens: &[u32],
) -> anyhow::Result<(SeqId, usize)> {
    let held = ctx.kv().tokens(seq)?;
    let keep = (held.iter().zip(tokens).take_while(|(a, b)| a == b).count())
        .min(tokens.len().saturating_sub(1));
    if keep == held.len() {
        return Ok((seq, keep));
    }
    match ctx.kv_mut().truncate(seq, keep) {
        Ok(()) => Ok((seq, keep)),
        Err(KvError::WindowReleased { .. }) => {
            ctx.kv_mut().free(seq)?;
            Ok((ctx.new_sequence(), 0))
        }
        Err(e) => Err(e.into()),
    }
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    EndOfGeneration,
    Length,
    ContextFull,
    /// The caller asked to stop (Ctrl-C in `chat`).
    Interrupted,
    /// The grammar's sentence is complete and nothing may follow it.
    GrammarComplete,
}

impl Stop {
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::EndOfGeneration => "end of generation",
            Stop::Length => "length",
            Stop::ContextFull => "context full",
            Stop::Interrupted => "interrupted",
            Stop::GrammarComplete => "grammar complete",
        }
    }
}

/// What the caller says after each token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// The sampling side of one answer: the sampler, the tokens its penalties look back on
/// (grows as tokens are generated), and the limits.
pub struct Sampling<'d> {
    pub sampler: Sampler,
    pub history: Vec<u32>,
    pub limit: usize,
    pub ignore_eos: bool,
    /// `--json` / `--json-schema` / `--grammar`: every token keeps the output a prefix
    /// of the grammar's sentences; an end token only once it is a whole one.
    pub constraint: Option<Constraint>,
    /// `--draft-lookup` / `--draft-model`: speculation.
    pub speculation: Speculation<'d>,
}

/// Speculation: after each token, a draft of the tokens likely to follow it (the
/// continuation of the last n-gram's earlier occurrence, or a small model's greedy
/// guess) is decoded in the same call as the token, and each draft token is kept while
/// it is what the sampler picks from the logits before it.
///
/// The engine's rows do not depend on the batch (crates/engine/tests/batch_invariance.rs),
/// so those logits are the ones one-token decoding computes; and the sampler is asked
/// exactly once per generated token, in order, with the same history, constraint and
/// random state as without speculation. The output is therefore token for token the
/// same, greedy or sampled (the standard rejection rule for a draft proposed with
/// certainty: a draft token `x` survives with probability p(x), and where it does not,
/// the token kept is drawn from p without x).
#[derive(Default)]
pub struct Speculation<'d> {
    /// Most draft tokens per step (0: off).
    pub max_draft: usize,
    /// Where drafts come from (None: no speculation).
    pub drafter: Option<Box<dyn Drafter + 'd>>,
    pub drafted: usize,
    pub accepted: usize,
}

impl<'d> Speculation<'d> {
    /// `max_draft` tokens per step from `drafter`, or none when `max_draft` is 0.
    pub fn new(max_draft: usize, drafter: Box<dyn Drafter + 'd>) -> Self {
        Speculation {
            max_draft,
            drafter: (max_draft > 0).then_some(drafter),
            ..Speculation::default()
        }
    }
}

/// A source of draft tokens.
pub trait Drafter {
    /// Up to `max` tokens guessed to follow `tokens` (the sequence so far, its last token
    /// not yet decoded).
    fn draft(&mut self, tokens: &[u32], max: usize) -> anyhow::Result<Vec<u32>>;
}

/// Prompt lookup (`--draft-lookup`): the most frequent continuation of the last 4
/// (else 3, 2, 1) tokens' earlier occurrences, from an index kept as the text grows.
#[derive(Default)]
pub struct PromptLookup(LookupIndex);

impl Drafter for PromptLookup {
    fn draft(&mut self, tokens: &[u32], max: usize) -> anyhow::Result<Vec<u32>> {
        Ok(self.0.draft(tokens, max))
    }
}

/// What the sampler decided for one position.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pick {
    Token(u32),
    /// An end-of-generation token that ends the answer.
    End,
}

impl Sampling<'_> {
    /// The token the sampler picks from `logits` (penalised and constrained as set up),
    /// pushed onto the history; `generated` only names the place in an error.
    fn pick(&mut self, logits: &[f32], tok: &Tokenizer, generated: usize) -> anyhow::Result<Pick> {
        let id = match &mut self.constraint {
            None => self.sampler.sample(logits, &self.history),
            Some(c) => {
                let Some(id) = self.sampler.sample_constrained(logits, &self.history, c) else {
                    bail!(
                        "the grammar admits no token of this vocabulary here (after {generated} tokens)"
                    );
                };
                if tok.is_eog(id) {
                    // Accepted only where the output is a whole sentence.
                    return Ok(Pick::End);
                }
                c.accept(id);
                id
            }
        };
        if tok.is_eog(id) && !self.ignore_eos {
            return Ok(Pick::End);
        }
        self.history.push(id);
        Ok(Pick::Token(id))
    }

    fn grammar_complete(&self) -> bool {
        self.constraint
            .as_ref()
            .is_some_and(|c| c.state().is_finished())
    }

    /// Samples from `logits` (after the prefilled `seq`), decoding each token into
    /// `seq` and handing it to `on_token`, until end of generation (unless
    /// `ignore_eos`; the end token is neither handed over nor decoded), `limit` tokens,
    /// a full context, or `on_token` says stop. The last token handed over is not
    /// decoded (nothing needs its logits) unless it was a draft token. Returns how many
    /// tokens were handed over and why it stopped.
    pub fn run(
        &mut self,
        ctx: &mut Context<'_>,
        seq: SeqId,
        tok: &Tokenizer,
        logits: Vec<f32>,
        mut on_token: impl FnMut(u32) -> anyhow::Result<Flow>,
    ) -> anyhow::Result<(usize, Stop)> {
        let n_ctx = ctx.kv().n_ctx();
        let mut generated = 0usize;
        if self.limit == 0 {
            return Ok((0, Stop::Length));
        }
        if self.speculation.drafter.is_some() {
            // A rejected draft is cut from the cache after its batch.
            ctx.kv_mut().keep_for_rollback(self.speculation.max_draft);
        }
        let mut next = self.pick(&logits, tok, generated)?;
        loop {
            let Pick::Token(id) = next else {
                return Ok((generated, Stop::EndOfGeneration));
            };
            generated += 1;
            if on_token(id)? == Flow::Stop {
                return Ok((generated, Stop::Interrupted));
            }
            if self.grammar_complete() {
                return Ok((generated, Stop::GrammarComplete));
            }
            let pos = ctx.kv().len(seq)?;
            if pos >= n_ctx {
                return Ok((generated, Stop::ContextFull));
            }
            if generated == self.limit {
                return Ok((generated, Stop::Length));
            }
            // Room for the token and its draft in the context and the answer.
            let room = (n_ctx - pos - 1).min(self.limit - generated);
            let max = self.speculation.max_draft.min(room);
            let draft = match &mut self.speculation.drafter {
                Some(d) if max > 0 => d.draft(&self.history, max)?,
                _ => Vec::new(),
            };
            debug_assert!(draft.len() <= max);
            let batch: Vec<BatchToken> = std::iter::once(id)
                .chain(draft.iter().copied())
                .enumerate()
                .map(|(i, token)| BatchToken {
                    seq,
                    token,
                    pos: pos + i,
                    logits: true,
                })
                .collect();
            let l = ctx.decode(&batch)?;
            self.speculation.drafted += draft.len();
            // Each row's pick is the next token; a draft token is kept while it is
            // that pick (it is then already in the cache).
            let mut k = 0;
            let stop = loop {
                next = self.pick(l.row(k), tok, generated)?;
                if k == draft.len() || next != Pick::Token(draft[k]) {
                    break None;
                }
                k += 1;
                generated += 1;
                if on_token(draft[k - 1])? == Flow::Stop {
                    break Some(Stop::Interrupted);
                }
                if self.grammar_complete() {
                    break Some(Stop::GrammarComplete);
                }
                if generated == self.limit {
                    break Some(Stop::Length);
                }
            };
            self.speculation.accepted += k;
            // The rejected part of the draft leaves the cache.
            if k < draft.len() {
                ctx.kv_mut().truncate(seq, pos + 1 + k)?;
            }
            if let Some(stop) = stop {
                return Ok((generated, stop));
            }
        }
    }
}
