//! The generation loop `run` and `chat` share: prefill a sequence, then sample, decode
//! and hand each token to the caller until a stop condition — and the sampling flags
//! both take.

use anyhow::bail;
use llamay_engine::grammar::Constraint;
use llamay_engine::sample::{Sampler, SamplerParams, lookup_draft};
use llamay_engine::{BatchToken, Context, SeqId};
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
    /// last n-gram's previous occurrence), verified in one batch; needs --temp 0.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub draft_lookup: usize,
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

    /// `--draft-lookup`: the most draft tokens per step (0: no speculation).
    pub fn draft(&self) -> anyhow::Result<usize> {
        if self.draft_lookup > 0 && self.temp != 0.0 {
            bail!(
                "--draft-lookup {}: speculation is exact only for greedy decoding here; give --temp 0 (sampled speculation is not implemented)",
                self.draft_lookup
            );
        }
        if self.draft_lookup > 64 {
            bail!(
                "--draft-lookup {}: at most 64 draft tokens",
                self.draft_lookup
            );
        }
        Ok(self.draft_lookup)
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
pub struct Sampling {
    pub sampler: Sampler,
    pub history: Vec<u32>,
    pub limit: usize,
    pub ignore_eos: bool,
    /// `--json` / `--json-schema` / `--grammar`: every token keeps the output a prefix
    /// of the grammar's sentences; an end token only once it is a whole one.
    pub constraint: Option<Constraint>,
    /// `--draft-lookup`: speculation (greedy, unconstrained answers only).
    pub speculation: Speculation,
}

/// Prompt-lookup speculation: after each token, the continuation of the most recent
/// earlier occurrence of the last 3 (else 2, else 1) tokens is proposed and verified in
/// the same decode call as the token. The engine's rows do not depend on the batch
/// (crates/engine/tests/batch_invariance.rs), so verifying a draft computes the logits
/// one-token decoding would: the output is token for token the same.
#[derive(Clone, Copy, Debug, Default)]
pub struct Speculation {
    /// Most draft tokens per step (0: off).
    pub max_draft: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl Sampling {
    /// Samples from `logits` (after the prefilled `seq`), decoding each token into
    /// `seq` and handing it to `on_token`, until end of generation (unless
    /// `ignore_eos`; the end token is neither handed over nor decoded), `limit` tokens,
    /// a full context, or `on_token` says stop. The last token handed over is not
    /// decoded (nothing needs its logits). Returns how many tokens were handed over
    /// and why it stopped.
    pub fn run(
        &mut self,
        ctx: &mut Context<'_>,
        seq: SeqId,
        tok: &Tokenizer,
        mut logits: Vec<f32>,
        mut on_token: impl FnMut(u32) -> anyhow::Result<Flow>,
    ) -> anyhow::Result<(usize, Stop)> {
        let n_ctx = ctx.kv().n_ctx();
        let mut generated = 0usize;
        while generated < self.limit {
            let id = match &mut self.constraint {
                None => self.sampler.sample(&logits, &self.history),
                Some(c) => {
                    let Some(id) = self.sampler.sample_constrained(&logits, &self.history, c)
                    else {
                        bail!(
                            "the grammar admits no token of this vocabulary here (after {generated} tokens)"
                        );
                    };
                    if tok.is_eog(id) {
                        // Accepted only where the output is a whole sentence.
                        return Ok((generated, Stop::EndOfGeneration));
                    }
                    c.accept(id);
                    id
                }
            };
            if tok.is_eog(id) && !self.ignore_eos {
                return Ok((generated, Stop::EndOfGeneration));
            }
            self.history.push(id);
            generated += 1;
            if on_token(id)? == Flow::Stop {
                return Ok((generated, Stop::Interrupted));
            }
            if self
                .constraint
                .as_ref()
                .is_some_and(|c| c.state().is_finished())
            {
                return Ok((generated, Stop::GrammarComplete));
            }
            let pos = ctx.kv().len(seq)?;
            if pos >= n_ctx {
                return Ok((generated, Stop::ContextFull));
            }
            if generated == self.limit {
                break;
            }
            let speculate = self.speculation.max_draft > 0
                && self.constraint.is_none()
                && self.sampler.is_greedy();
            let room = (n_ctx - pos - 1).min(self.limit - generated);
            let draft: Vec<u32> = if speculate {
                let d = lookup_draft(&self.history, self.speculation.max_draft.min(room));
                d.to_vec()
            } else {
                Vec::new()
            };
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
            // Accept the draft while it is what this sampler picks (never an end token:
            // the loop above decides those).
            let mut accepted = 0;
            while accepted < draft.len() {
                let want = self.sampler.sample(l.row(accepted), &self.history);
                if want != draft[accepted] || tok.is_eog(want) {
                    break;
                }
                self.history.push(want);
                accepted += 1;
            }
            self.speculation.drafted += draft.len();
            self.speculation.accepted += accepted;
            // The rejected part of the draft leaves the cache.
            if accepted < draft.len() {
                ctx.kv_mut().truncate(seq, pos + 1 + accepted)?;
            }
            for (j, &d) in draft[..accepted].iter().enumerate() {
                generated += 1;
                if on_token(d)? == Flow::Stop {
                    return Ok((generated, Stop::Interrupted));
                }
                if generated == self.limit {
                    return Ok((generated, Stop::Length));
                }
                debug_assert!(pos + 2 + j <= n_ctx);
            }
            logits.clear();
            logits.extend_from_slice(l.row(accepted));
        }
        Ok((generated, Stop::Length))
    }
}
