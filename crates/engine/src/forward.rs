//! The one generic transformer block, driven by the architecture row, and the
//! batch-shaped decode: tokens of several sequences in one call.

use crate::arch::{FfnKind, NormKind, Output, RopeStyle};
use crate::attention::{self, Shape, Slot};
use crate::batch::{BatchToken, Hidden, Logits};
use crate::context::Context;
use crate::kv::{LayerKv, SeqId, Targets, TransientKv};
use crate::moe::{self, MoeScratch};
use crate::ops::{add_bias, gelu_slice, layer_norm, rms_norm, swiglu_oai};
use crate::rope::{self, RopeParams};
use crate::tensor::matmul_quantized;
use crate::weights::{DenseFfn, Ffn, FfnInput, HeadNorm, Linear, Norm};
use crate::{DecodeError, Model};
use llamay_kernels::{QuantizedRows, ThreadPool};
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

/// Rows per task of the row-wise steps (norms, rope).
const ROWS_PER_TASK: usize = 16;
/// Values per task of the element-wise steps (residual adds, GELU).
const ELEMS_PER_TASK: usize = 16 * 1024;

/// Normalises every `cols`-long row of `x`, rows spread over the pool.
fn apply_norm(
    x: &mut [f32],
    norm: &Norm,
    kind: NormKind,
    eps: f32,
    cols: usize,
    pool: &ThreadPool,
) {
    pool.for_each_chunk_mut(x, cols * ROWS_PER_TASK, |_, rows| {
        rows.chunks_mut(cols)
            .for_each(|row| norm_row(row, norm, kind, eps));
    });
}

/// `out = norm(x)` row by row (a copy where there is no norm), rows spread over the
/// pool: the copy happens in the same pass, not on the calling thread before it.
fn norm_into(
    x: &[f32],
    out: &mut Vec<f32>,
    norm: Option<&Norm>,
    kind: NormKind,
    eps: f32,
    cols: usize,
    pool: &ThreadPool,
) {
    out.resize(x.len(), 0.0);
    let chunk = cols * ROWS_PER_TASK;
    pool.for_each_chunk_mut(out, chunk, |i, rows| {
        rows.copy_from_slice(&x[i * chunk..][..rows.len()]);
        if let Some(norm) = norm {
            rows.chunks_mut(cols)
                .for_each(|row| norm_row(row, norm, kind, eps));
        }
    });
}

fn norm_row(row: &mut [f32], norm: &Norm, kind: NormKind, eps: f32) {
    match kind {
        NormKind::Rms => rms_norm(row, &norm.weight, eps),
        NormKind::Layer => layer_norm(row, &norm.weight, norm.bias.as_deref(), eps),
    }
}

/// Normalises every head (`hd`-long row) of Q or K, rows spread over the pool.
fn head_norms(x: &mut [f32], n: &HeadNorm, eps: f32, hd: usize, pool: &ThreadPool) {
    let per_head = n.per_head.then(|| n.weight.len() / hd);
    pool.for_each_chunk_mut(x, hd * ROWS_PER_TASK, |i, rows| {
        for (j, row) in rows.chunks_mut(hd).enumerate() {
            let w = match per_head {
                // Rows are heads of consecutive tokens: row r is head r mod n_heads.
                Some(n_heads) => &n.weight[((i * ROWS_PER_TASK + j) % n_heads) * hd..][..hd],
                None => &n.weight[..],
            };
            match n.kind {
                NormKind::Rms => rms_norm(row, w, eps),
                NormKind::Layer => layer_norm(row, w, None, eps),
            }
        }
    });
}

/// RMS-normalises every `cols`-long row of `x` by `w`, rows spread over the pool.
fn rms_rows(x: &mut [f32], w: &[f32], eps: f32, cols: usize, pool: &ThreadPool) {
    pool.for_each_chunk_mut(x, cols * ROWS_PER_TASK, |_, rows| {
        rows.chunks_mut(cols).for_each(|row| rms_norm(row, w, eps));
    });
}

/// `outs[i] = W_i x + b_i` for projections that read the same input `x`: it is
/// quantised once per dot type (into `act`), not once per projection, and a run of
/// packed projections of one dot type is one pool region (`matmul_packed_many`).
pub(crate) fn linears(
    ls: &[&Linear<'_>],
    x: &[f32],
    act: &mut QuantizedRows,
    outs: &mut [&mut Vec<f32>],
    pool: &ThreadPool,
) {
    debug_assert_eq!(ls.len(), outs.len());
    if let Some((addr, len)) = ls.last().and_then(|l| l.then) {
        pool.prefetch_while_idle(addr, len);
    }
    let (mut i, mut outs) = (0, &mut outs[..]);
    while i < ls.len() {
        let ty = ls[i].w.ty.vec_dot_type();
        let run = ls[i..]
            .iter()
            .take_while(|l| l.w.ty.vec_dot_type() == ty)
            .count();
        llamay_kernels::quantize_rows_into(ty, x, ls[i].w.cols, pool, act);
        let (run_outs, rest) = std::mem::take(&mut outs).split_at_mut(run);
        let run_ls = &ls[i..i + run];
        let packed: Option<Vec<_>> = run_ls.iter().map(|l| l.packed.as_ref()).collect();
        if let Some(packed) = packed {
            let mut jobs: Vec<_> = (packed.into_iter().zip(run_outs.iter_mut()))
                .map(|(p, out)| {
                    out.resize(act.n * p.rows(), 0.0);
                    (p, &mut out[..])
                })
                .collect();
            llamay_kernels::matmul_packed_many(&mut jobs, act, pool);
        } else {
            for (l, out) in run_ls.iter().zip(run_outs.iter_mut()) {
                matmul_quantized(&l.w, l.packed.as_ref(), act, out, pool);
            }
        }
        for (l, out) in run_ls.iter().zip(run_outs.iter_mut()) {
            add_bias(out, l.b.as_ref(), l.w.rows);
        }
        (i, outs) = (i + run, rest);
    }
}

/// `out = W x + b`.
pub(crate) fn linear(
    l: &Linear<'_>,
    x: &[f32],
    act: &mut QuantizedRows,
    out: &mut Vec<f32>,
    pool: &ThreadPool,
) {
    linears(&[l], x, act, &mut [out], pool);
}

/// `x += y`, or `x += y + z` (llama.cpp's order for a parallel residual), in pieces
/// over the pool.
fn add_into(x: &mut [f32], y: &[f32], z: Option<&[f32]>, pool: &ThreadPool) {
    pool.for_each_chunk_mut(x, ELEMS_PER_TASK, |i, xs| {
        let y = &y[i * ELEMS_PER_TASK..];
        match z {
            None => xs.iter_mut().zip(y).for_each(|(a, b)| *a += b),
            Some(z) => {
                let z = &z[i * ELEMS_PER_TASK..];
                for ((a, b), c) in xs.iter_mut().zip(y).zip(z) {
                    *a += b + c;
                }
            }
        }
    });
}

/// Buffers `decode` reuses from layer to layer and, kept in the `Model`, from call to
/// call: each grows on first use and is then overwritten in place (the kernels write
/// every value), so later layers and calls neither allocate nor zero them.
#[derive(Default)]
pub(crate) struct Scratch {
    /// The normalised input of attention (and of a shared-norm parallel FFN).
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    /// The normalised input of a sequential FFN.
    h2: Vec<f32>,
    ffn: FfnScratch,
    /// The quantised input of the projections at hand.
    act: QuantizedRows,
}

#[derive(Default)]
struct FfnScratch {
    dense: FfnBuffers,
    moe: MoeScratch,
}

/// One dense network's intermediate values and output.
#[derive(Default)]
pub(crate) struct FfnBuffers {
    up: Vec<f32>,
    gate: Vec<f32>,
    /// The network's output.
    pub(crate) down: Vec<f32>,
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
        let threads = &self.pool;
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
        if let Some(n) = &model.weights.embd_norm {
            apply_norm(&mut x, n, arch.norm, cfg.norm_eps, e, threads);
        }

        let (qd, kd, vd) = (cfg.q_dim(), cfg.k_dim(), cfg.v_dim());
        let hk = cfg.head_dim_k;
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
        let angles_full = angles_of(&cfg.rope);
        let own_swa = cfg.swa_layers.iter().any(|&s| s) && cfg.rope_swa != cfg.rope;
        let angles_swa = own_swa.then(|| angles_of(&cfg.rope_swa));
        let s = &mut self.scratch;
        for (il, layer) in model.weights.layers.iter().enumerate() {
            #[cfg(feature = "fault-injection")]
            fault::at_layer(il);
            norm_into(
                &x,
                &mut s.h,
                layer.attn_norm.as_ref(),
                arch.norm,
                cfg.norm_eps,
                e,
                threads,
            );

            linears(
                &[&layer.q, &layer.k, &layer.v],
                &s.h,
                &mut s.act,
                &mut [&mut s.q, &mut s.k, &mut s.v],
                threads,
            );
            if let Some(n) = &layer.q_norm {
                head_norms(&mut s.q, n, cfg.norm_eps, hk, threads);
            }
            if let Some(n) = &layer.k_norm {
                head_norms(&mut s.k, n, cfg.norm_eps, hk, threads);
            }
            let swa = cfg.swa_layers[il];
            if arch.rope != RopeStyle::None {
                // Rotate each token's q and k heads, a task per run of tokens.
                let half = cfg.n_rot / 2;
                let angles = match (&angles_swa, swa) {
                    (Some(a), true) => a,
                    _ => &angles_full,
                };
                for (buf, dim) in [(&mut s.q, qd), (&mut s.k, kd)] {
                    threads.for_each_chunk_mut(buf, dim * ROWS_PER_TASK, |i, rows| {
                        for (j, row) in rows.chunks_mut(dim).enumerate() {
                            let t = i * ROWS_PER_TASK + j;
                            let a = &angles[t * half..(t + 1) * half];
                            row.chunks_mut(hk)
                                .for_each(|h| rope::rotate(h, a, arch.rope));
                        }
                    });
                }
            }
            let kv_rows = (s.k.chunks_exact(kd)).zip(s.v.chunks_exact(vd));
            let views: Vec<_> = match &mut cache {
                BatchKv::Pool(targets) => {
                    let store = self.kv.store_mut();
                    for (&(page, slot), (k, v)) in targets[il].iter().zip(kv_rows) {
                        store.write(page, slot, k, v);
                    }
                    seqs.iter().map(|&q| self.kv.layer(q, il)).collect()
                }
                BatchKv::Transient(t) => {
                    for (sl, (k, v)) in slots.iter().zip(kv_rows) {
                        t.write(sl.seq, sl.pos, k, v);
                    }
                    (0..seqs.len()).map(|i| t.layer(i)).collect()
                }
            };
            let sinks = layer.attn_sinks.as_deref();
            let attn = model.attention(&views, &slots, &s.q, swa, sinks, threads);
            linear(&layer.attn_out, &attn, &mut s.act, &mut s.o, threads);
            if let Some(w) = &layer.post_attn_norm {
                rms_rows(&mut s.o, w, cfg.norm_eps, e, threads);
            }

            // A sequential block's FFN reads x + attn; a parallel one's reads x, and both
            // outputs join x together (llama.cpp's order of the adds).
            let (kind, eps) = (arch.norm, cfg.norm_eps);
            let sequential = matches!(
                layer.ffn_input,
                FfnInput::AfterAttention(_) | FfnInput::PostNorm { .. }
            );
            if sequential {
                add_into(&mut x, &s.o, None, threads);
            }
            let h = match &layer.ffn_input {
                FfnInput::AfterAttention(norm) | FfnInput::Parallel(norm) => {
                    norm_into(&x, &mut s.h2, Some(norm), kind, eps, e, threads);
                    &s.h2
                }
                FfnInput::ParallelShared => &s.h,
                FfnInput::PostNorm { attn_out, .. } => {
                    apply_norm(&mut x, attn_out, kind, eps, e, threads);
                    &x
                }
            };
            model.ffn(threads, layer, h, &mut s.ffn, &mut s.act);
            if sequential {
                add_into(&mut x, s.ffn.output(), None, threads);
            } else {
                add_into(&mut x, &s.o, Some(s.ffn.output()), threads);
            }
            if let FfnInput::PostNorm { out, .. } = &layer.ffn_input {
                apply_norm(&mut x, out, kind, eps, e, threads);
            }
        }
        if let BatchKv::Pool(_) = cache {
            for &q in &seqs {
                let tokens: Vec<u32> = (batch.iter().filter(|b| b.seq == q))
                    .map(|b| b.token)
                    .collect();
                self.kv.commit(q, &tokens);
            }
        }

        let index: Vec<usize> = batch
            .iter()
            .enumerate()
            .filter(|(_, b)| b.logits)
            .map(|(i, _)| i)
            .collect();
        let mut h = Vec::with_capacity(index.len() * e);
        for &i in &index {
            h.extend_from_slice(&x[i * e..(i + 1) * e]);
        }
        if let Some(n) = &model.weights.output_norm {
            apply_norm(&mut h, n, arch.norm, cfg.norm_eps, e, threads);
        }
        if head == Head::Hidden {
            return Ok((index, h));
        }
        let mut values = Vec::new();
        linear(&model.weights.output, &h, &mut s.act, &mut values, threads);
        if let Some(c) = cfg.final_softcap {
            values.iter_mut().for_each(|v| *v = (*v / c).tanh() * c);
        }
        Ok((index, values))
    }
}

/// Where a batch's keys and values go.
enum BatchKv {
    /// A decoder's: the context's pool, at each token's (page, slot) per layer.
    Pool(Targets),
    /// An encoder's: pages of the batch alone, gone after it.
    Transient(TransientKv),
}

/// What a batch's flagged tokens give back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Head {
    Logits,
    Hidden,
}

impl FfnScratch {
    /// The last FFN's output (after the post-FFN norm).
    fn output(&self) -> &[f32] {
        &self.dense.down
    }
}

/// `f.down = ffn(h)` for the rows of `h` (`kind` as the architecture row says).
pub(crate) fn dense_ffn(
    kind: FfnKind,
    ffn: &DenseFfn<'_>,
    h: &[f32],
    f: &mut FfnBuffers,
    act: &mut QuantizedRows,
    threads: &ThreadPool,
) {
    match (kind, &ffn.gate) {
        (
            FfnKind::SwiGlu | FfnKind::SwiGluStacked | FfnKind::GeGlu | FfnKind::SwiGluOai,
            Some(gate),
        ) => {
            let outs: &mut [&mut Vec<f32>] = &mut [&mut f.up, &mut f.gate];
            linears(&[&ffn.up, gate], h, act, outs, threads);
            let (up, g) = (&mut f.up, &f.gate);
            match kind {
                // up *= gelu(g), a piece per task (GELU works in place).
                FfnKind::GeGlu => threads.for_each_chunk_mut(up, ELEMS_PER_TASK, |i, u| {
                    let mut gi = g[i * ELEMS_PER_TASK..][..u.len()].to_vec();
                    gelu_slice(&mut gi);
                    u.iter_mut().zip(&gi).for_each(|(u, g)| *u *= g);
                }),
                FfnKind::SwiGluOai => threads.for_each_chunk_mut(up, ELEMS_PER_TASK, |i, u| {
                    swiglu_oai(u, &g[i * ELEMS_PER_TASK..][..u.len()]);
                }),
                _ => llamay_kernels::swiglu(up, g, threads),
            }
        }
        (FfnKind::Gelu, _) => {
            linear(&ffn.up, h, act, &mut f.up, threads);
            threads.for_each_chunk_mut(&mut f.up, ELEMS_PER_TASK, |_, u| gelu_slice(u));
        }
        // The binder gives every gated kind its gate.
        (_, None) => linear(&ffn.up, h, act, &mut f.up, threads),
    }
    linear(&ffn.down, &f.up, act, &mut f.down, threads);
}

impl Model<'_> {
    /// The FFN of `h` into `f.output()`.
    fn ffn(
        &self,
        threads: &ThreadPool,
        layer: &crate::weights::Layer<'_>,
        h: &[f32],
        f: &mut FfnScratch,
        act: &mut QuantizedRows,
    ) {
        let cfg = &self.config;
        match &layer.ffn {
            Ffn::Moe(m) => {
                let mixture = moe::Mixture {
                    weights: m,
                    kind: cfg.arch.ffn,
                    n_embd: cfg.n_embd,
                };
                mixture.forward(h, &mut f.moe, &mut f.dense.down, act, threads);
            }
            Ffn::Dense(d) => dense_ffn(cfg.arch.ffn, d, h, &mut f.dense, act, threads),
        }
        if let Some(w) = &layer.post_ffn_norm {
            rms_rows(&mut f.dense.down, w, cfg.norm_eps, cfg.n_embd, threads);
        }
    }

    /// Causal attention of every batch token over its sequence's cache (see
    /// [`crate::attention`]).
    fn attention(
        &self,
        views: &[LayerKv<'_>],
        slots: &[Slot],
        q: &[f32],
        swa: bool,
        sinks: Option<&[f32]>,
        pool: &ThreadPool,
    ) -> Vec<f32> {
        let cfg = &self.config;
        let shape = Shape {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim_k: cfg.head_dim_k,
            head_dim_v: cfg.head_dim_v,
            scale: cfg.attn_scale,
            softcap: cfg.attn_softcap,
            window: (swa && cfg.n_swa > 0).then_some(cfg.n_swa),
            sinks,
        };
        attention::attention(&shape, views, slots, q, pool)
    }
}
