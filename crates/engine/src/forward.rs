//! The one generic transformer block, driven by the architecture row, and the
//! batch-shaped decode: tokens of several sequences in one call.

use crate::arch::{Output, RopeStyle};
use crate::attention::Slot;
use crate::backend::Backend;
use crate::batch::{BatchToken, Hidden, Logits};
use crate::context::Context;
use crate::cpu::{BatchKv, Cpu};
use crate::kv::{SeqId, TransientKv};
use crate::ondevice::{OnDevice, StepPlan};
use crate::rope::RopeParams;
use crate::weights::FfnInput;
use crate::{DecodeError, Model};
use std::collections::BTreeMap;

/// A test hook (feature `fault-injection`, never in a release build): makes the next
/// `decode` on this thread panic when it reaches a chosen layer, as a failing kernel
/// would, after earlier layers have appended their keys and values.
#[cfg(feature = "fault-injection")]
pub mod fault {
    use std::cell::Cell;

    thread_local! {
        static PANIC_AT: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// The next decode on this thread panics at layer `layer` (once).
    pub fn panic_at_layer(layer: usize) {
        PANIC_AT.with(|c| c.set(Some(layer)));
    }

    pub(crate) fn at_layer(il: usize) {
        if PANIC_AT.with(|c| c.get()) == Some(il) {
            PANIC_AT.with(|c| c.set(None));
            panic!("injected fault at layer {il}");
        }
    }
}

/// Activation rows `decode` reuses from layer to layer and, kept in the context, from
/// call to call: each grows on first use and is then overwritten in place (the
/// operations write every value), so later layers and calls neither allocate nor zero
/// them. `A` is the backend's row buffer.
#[derive(Default)]
pub(crate) struct Scratch<A> {
    /// The residual stream.
    x: A,
    /// The normalised input of attention (and of a shared-norm parallel FFN).
    h: A,
    q: A,
    k: A,
    v: A,
    attn: A,
    o: A,
    /// The normalised input of a sequential FFN.
    h2: A,
    /// The FFN's output.
    ffn: A,
    /// The rows the batch asked for, and the output head's values.
    rows: A,
    logits: A,
}

impl Context<'_> {
    /// Runs one batch: writes every token's keys and values into its sequence's pages
    /// and returns logits for the tokens that asked. Every sequence id, position,
    /// token and the pool's budget are checked first: on error nothing changed.
    pub fn decode(&mut self, batch: &[BatchToken]) -> Result<Logits, DecodeError> {
        let (index, values) = self.run(batch, Head::Logits)?;
        Ok(Logits {
            n_vocab: self.model.config.n_vocab,
            index,
            values,
        })
    }

    /// As [`decode`](Self::decode), but returns the final hidden states (after the
    /// output norm, before the output projection) of the tokens that asked: what
    /// llama.cpp pools into an embedding (`result_norm`).
    pub fn hidden(&mut self, batch: &[BatchToken]) -> Result<Hidden, DecodeError> {
        let (index, values) = self.run(batch, Head::Hidden)?;
        Ok(Hidden {
            n_embd: self.model.config.n_embd,
            index,
            values,
        })
    }

    fn run(
        &mut self,
        batch: &[BatchToken],
        head: Head,
    ) -> Result<(Vec<usize>, Vec<f32>), DecodeError> {
        let model = self.model;
        let cfg = &model.config;
        let n = batch.len();
        if n == 0 {
            return Err(DecodeError::EmptyBatch);
        }
        let n_ctx = self.kv.n_ctx();
        if head == Head::Logits && cfg.arch.output == Output::Embeddings {
            return Err(DecodeError::EncoderHasNoLogits {
                arch: cfg.arch.name,
            });
        }
        // Validate before touching anything: ids, sequences, positions in order.
        let mut next: BTreeMap<SeqId, usize> = BTreeMap::new();
        for bt in batch {
            let expected = match next.entry(bt.seq) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let len = (self.kv.len(bt.seq))
                        .map_err(|_| DecodeError::UnknownSequence { seq: bt.seq })?;
                    // An encoder keeps nothing between batches (its sequences stay
                    // empty): each batch holds its sequences whole.
                    if !cfg.causal && bt.pos != 0 {
                        return Err(DecodeError::EncoderNeedsWholeSequence {
                            seq: bt.seq,
                            pos: bt.pos,
                            arch: cfg.arch.name,
                        });
                    }
                    e.insert(len)
                }
            };
            if bt.token as usize >= cfg.n_vocab {
                return Err(DecodeError::TokenOutOfRange {
                    token: bt.token,
                    n_vocab: cfg.n_vocab,
                });
            }
            if bt.pos != *expected {
                return Err(DecodeError::BadPosition {
                    seq: bt.seq,
                    pos: bt.pos,
                    expected: *expected,
                });
            }
            if bt.pos >= n_ctx {
                return Err(DecodeError::ContextFull {
                    seq: bt.seq,
                    capacity: n_ctx,
                });
            }
            if let Some(pe) = &model.weights.position_embd
                && bt.pos >= pe.rows
            {
                return Err(DecodeError::ContextFull {
                    seq: bt.seq,
                    capacity: pe.rows,
                });
            }
            *expected += 1;
        }
        let seqs: Vec<SeqId> = next.keys().copied().collect();
        let plan: Vec<(SeqId, usize)> = (seqs.iter())
            .map(|&s| (s, batch.iter().filter(|b| b.seq == s).count()))
            .collect();
        let mut cache = if cfg.causal {
            // The pages every token writes, present and private (copy on write); the
            // budget is checked before any page changes hands.
            let order: Vec<(SeqId, usize)> = batch.iter().map(|b| (b.seq, b.pos)).collect();
            BatchKv::Pool(self.kv.reserve(&plan, &order)?)
        } else {
            let lens: Vec<usize> = plan.iter().map(|&(_, n)| n).collect();
            BatchKv::Transient(TransientKv::new(cfg.k_dim(), cfg.v_dim(), &lens))
        };
        let slots: Vec<Slot> = batch
            .iter()
            .map(|b| Slot {
                seq: seqs
                    .binary_search(&b.seq)
                    .expect("every batch sequence is in seqs"),
                pos: b.pos,
                // An encoder's token sees its whole sequence (all of it is in this
                // batch: checked above).
                end: if cfg.causal { b.pos + 1 } else { next[&b.seq] },
            })
            .collect();

        let e = cfg.n_embd;
        let arch = cfg.arch;
        let mut x = vec![0f32; n * e];
        let mut tmp = vec![0f32; e];
        for (t, bt) in batch.iter().enumerate() {
            let row = &mut x[t * e..(t + 1) * e];
            model.weights.embed_row(bt.token as usize, row);
            if arch.embed_scale_sqrt {
                let s = (e as f32).sqrt();
                row.iter_mut().for_each(|v| *v *= s);
            }
            // llama.cpp's order: token, then type (an encoder's; every token is type
            // 0), then position.
            if let Some(tt) = &model.weights.token_types {
                tt.dequant_row(0, &mut tmp);
                row.iter_mut().zip(&tmp).for_each(|(v, p)| *v += p);
            }
            if let Some(pe) = &model.weights.position_embd {
                pe.dequant_row(bt.pos, &mut tmp);
                row.iter_mut().zip(&tmp).for_each(|(v, p)| *v += p);
            }
        }
        // Every token's rope angles, once per layer kind (the same in every layer).
        let angles_of = |rope: &RopeParams| -> Vec<(f32, f32)> {
            if arch.rope == RopeStyle::None {
                return Vec::new();
            }
            let half = cfg.n_rot / 2;
            let (mut all, mut one) = (Vec::with_capacity(n * half), Vec::with_capacity(half));
            for bt in batch {
                let factors = (model.weights.rope_factors).for_context(n_ctx, cfg.n_ctx_orig);
                rope.angles(bt.pos, factors, &mut one);
                all.extend_from_slice(&one);
            }
            all
        };
        let angles = angles_of(&cfg.rope);
        let own_swa = cfg.swa_layers.iter().any(|&s| s) && cfg.rope_swa != cfg.rope;
        let angles_swa = own_swa.then(|| angles_of(&cfg.rope_swa));
        let index: Vec<usize> = batch
            .iter()
            .enumerate()
            .filter(|(_, b)| b.logits)
            .map(|(i, _)| i)
            .collect();

        let values = match self.device.as_deref_mut() {
            None => {
                let mut cpu = Cpu {
                    model,
                    pool: &self.pool,
                    scratch: &mut self.cpu,
                    kv: &mut self.kv,
                    cache: &mut cache,
                    seqs: &seqs,
                    slots: &slots,
                    angles: &angles,
                    angles_swa: angles_swa.as_deref(),
                };
                forward(model, &mut cpu, &mut self.scratch, x, &index, head)
            }
            Some(st) => {
                let BatchKv::Pool(targets) = &cache else {
                    // `context_on` refuses encoders.
                    return Err(DecodeError::Device(
                        "an encoder's batch on the device".into(),
                    ));
                };
                let plan = StepPlan {
                    seqs: &seqs,
                    slots: &slots,
                    targets,
                    angles: &angles,
                    angles_swa: angles_swa.as_deref(),
                    index: &index,
                };
                let mut scratch = std::mem::take(&mut st.scratch);
                let result = OnDevice::begin(model, &self.pool, st, &mut self.kv, &plan).and_then(
                    |mut dev| {
                        let values = forward(model, &mut dev, &mut scratch, x, &index, head);
                        dev.err.map_or(Ok(values), Err)
                    },
                );
                st.scratch = scratch;
                // On failure nothing is committed: the sequences keep their lengths,
                // and the pages this batch reserved are rewritten by the next one.
                result.map_err(|e| DecodeError::Device(e.to_string()))?
            }
        };
        if let BatchKv::Pool(_) = cache {
            for &q in &seqs {
                let tokens: Vec<u32> = (batch.iter().filter(|b| b.seq == q))
                    .map(|b| b.token)
                    .collect();
                self.kv.commit(q, &tokens);
            }
        }
        Ok((index, values))
    }
}

/// The forward pass of a validated batch on backend `b`: the embedding rows `x` in,
/// the values `head` asks for of rows `index` out. One generic block runs every
/// architecture row (invariant 3) on every backend (the seam, `backend.rs`).
fn forward<B: Backend>(
    model: &Model<'_>,
    b: &mut B,
    s: &mut Scratch<B::Act>,
    x: Vec<f32>,
    index: &[usize],
    head: Head,
) -> Vec<f32> {
    let cfg = &model.config;
    let (e, arch, eps) = (cfg.n_embd, cfg.arch, cfg.norm_eps);
    b.load(x, &mut s.x);
    if let Some(n) = &model.weights.embd_norm {
        b.norm(&mut s.x, n, arch.norm, eps, e);
    }
    let (qd, kd, hk) = (cfg.q_dim(), cfg.k_dim(), cfg.head_dim_k);
    for (il, layer) in model.weights.layers.iter().enumerate() {
        #[cfg(feature = "fault-injection")]
        fault::at_layer(il);
        b.norm_into(&s.x, &mut s.h, layer.attn_norm.as_ref(), arch.norm, eps, e);
        b.linears(
            &[&layer.q, &layer.k, &layer.v],
            &s.h,
            &mut [&mut s.q, &mut s.k, &mut s.v],
        );
        if let Some(n) = &layer.q_norm {
            b.head_norm(&mut s.q, n, eps, hk);
        }
        if let Some(n) = &layer.k_norm {
            b.head_norm(&mut s.k, n, eps, hk);
        }
        let swa = cfg.swa_layers[il];
        b.rope(&mut s.q, qd, swa);
        b.rope(&mut s.k, kd, swa);
        let sinks = layer.attn_sinks.as_deref();
        b.attention(il, &s.q, &s.k, &s.v, swa, sinks, &mut s.attn);
        b.linears(&[&layer.attn_out], &s.attn, &mut [&mut s.o]);
        if let Some(w) = &layer.post_attn_norm {
            b.rms(&mut s.o, w, eps, e);
        }

        // A sequential block's FFN reads x + attn; a parallel one's reads x, and both
        // outputs join x together (llama.cpp's order of the adds).
        let sequential = matches!(
            layer.ffn_input,
            FfnInput::AfterAttention(_) | FfnInput::PostNorm { .. }
        );
        if sequential {
            b.add(&mut s.x, &s.o, None);
        }
        let h = match &layer.ffn_input {
            FfnInput::AfterAttention(norm) | FfnInput::Parallel(norm) => {
                b.norm_into(&s.x, &mut s.h2, Some(norm), arch.norm, eps, e);
                &s.h2
            }
            FfnInput::ParallelShared => &s.h,
            FfnInput::PostNorm { attn_out, .. } => {
                b.norm(&mut s.x, attn_out, arch.norm, eps, e);
                &s.x
            }
        };
        b.ffn(layer, h, &mut s.ffn);
        if sequential {
            b.add(&mut s.x, &s.ffn, None);
        } else {
            b.add(&mut s.x, &s.o, Some(&s.ffn));
        }
        if let FfnInput::PostNorm { out, .. } = &layer.ffn_input {
            b.norm(&mut s.x, out, arch.norm, eps, e);
        }
    }

    // The head in runs of at most `B::HEAD_ROWS` rows: a device holds one run's
    // logits in a buffer of its own size limit (the CPU takes them all at once).
    let mut out = Vec::new();
    let mut start = 0;
    while start < index.len() {
        let rows = start..index.len().min(start + B::HEAD_ROWS);
        start = rows.end;
        b.gather(&s.x, index, rows, e, &mut s.rows);
        if let Some(n) = &model.weights.output_norm {
            b.norm(&mut s.rows, n, arch.norm, eps, e);
        }
        let values = if head == Head::Hidden {
            b.read(&mut s.rows)
        } else {
            b.linears(&[&model.weights.output], &s.rows, &mut [&mut s.logits]);
            if let Some(c) = cfg.final_softcap {
                b.softcap(&mut s.logits, c);
            }
            b.read(&mut s.logits)
        };
        if out.is_empty() {
            out = values;
        } else {
            out.extend_from_slice(&values);
        }
    }
    out
}

/// What a batch's flagged tokens give back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Head {
    Logits,
    Hidden,
}
