//! The CPU backend: the seam's operations (`backend::Backend`) on host rows, through
//! the kernels crate and the persistent thread pool. Also the CPU-only paths that are
//! not a block step of their own: the mixture of experts' per-expert networks
//! (`moe.rs`), the encoders' pooling heads (`embed.rs`).

use crate::ActivationObserver;
use crate::Model;
use crate::arch::{FfnKind, NormKind, RopeStyle};
use crate::attention::{self, Shape, Slot};
use crate::backend::Backend;
use crate::kv::{KvPool, LayerKv, SeqId, Targets, TransientKv};
use crate::moe::{self, MoeScratch};
use crate::ops::{add_bias, gelu_slice, layer_norm, rms_norm, swiglu_oai};
use crate::rope;
use crate::tensor::matmul_quantized;
use crate::weights::{DenseFfn, Ffn, HeadNorm, Layer, Linear, Norm};
use llamay_kernels::{QuantizedRows, ThreadPool};

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
    input: &mut MatmulInput,
    outs: &mut [&mut Vec<f32>],
    pool: &ThreadPool,
) {
    debug_assert_eq!(ls.len(), outs.len());
    if let Some(o) = input.observer.as_mut() {
        // A fused tensor bound as several projections (Q, K and V of one attn_qkv;
        // gate and up of one stacked ffn_up) is one product of this input.
        for (i, l) in ls.iter().enumerate() {
            let seen = ls[..i]
                .iter()
                .any(|p| p.w.name == l.w.name && p.expert == l.expert);
            if !seen {
                o.matmul_input(l.w.name, l.expert, x, l.w.cols);
            }
        }
    }
    let act = &mut input.rows;
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
    act: &mut MatmulInput,
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

/// The input of the projections at hand: quantised once per dot type, and shown to
/// the activation observer where one watches (`Context::observe`).
#[derive(Default)]
pub(crate) struct MatmulInput {
    pub(crate) rows: QuantizedRows,
    pub(crate) observer: Option<Box<dyn ActivationObserver>>,
}

/// What the CPU keeps from call to call besides the activation rows: the quantised
/// input of the projections at hand and the feed-forward networks' buffers.
#[derive(Default)]
pub(crate) struct CpuScratch {
    /// The input of the projections at hand.
    pub(crate) act: MatmulInput,
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

/// Where a batch's keys and values go.
pub(crate) enum BatchKv {
    /// A decoder's: the context's pool, at each token's (page, slot) per layer.
    Pool(Targets),
    /// An encoder's: pages of the batch alone, gone after it.
    Transient(TransientKv),
}

/// One step on the CPU: the model, the pool, the KV cache and what the step writes
/// into it, the rope angles of its tokens.
pub(crate) struct Cpu<'s, 'm> {
    pub model: &'m Model<'m>,
    pub pool: &'s ThreadPool,
    pub scratch: &'s mut CpuScratch,
    pub kv: &'s mut KvPool,
    pub cache: &'s mut BatchKv,
    /// The batch's sequences, in id order (a slot's `seq` indexes this).
    pub seqs: &'s [SeqId],
    pub slots: &'s [Slot],
    /// Every token's rope angles (`n_rot / 2` per token), and the sliding-window
    /// layers' own where they differ.
    pub angles: &'s [(f32, f32)],
    pub angles_swa: Option<&'s [(f32, f32)]>,
}

impl Backend for Cpu<'_, '_> {
    type Act = Vec<f32>;
    const HEAD_ROWS: usize = usize::MAX;

    fn load(&mut self, rows: Vec<f32>, x: &mut Vec<f32>) {
        *x = rows;
    }

    fn norm(&mut self, x: &mut Vec<f32>, norm: &Norm, kind: NormKind, eps: f32, cols: usize) {
        apply_norm(x, norm, kind, eps, cols, self.pool);
    }

    fn norm_into(
        &mut self,
        x: &Vec<f32>,
        out: &mut Vec<f32>,
        norm: Option<&Norm>,
        kind: NormKind,
        eps: f32,
        cols: usize,
    ) {
        norm_into(x, out, norm, kind, eps, cols, self.pool);
    }

    fn rms(&mut self, x: &mut Vec<f32>, w: &[f32], eps: f32, cols: usize) {
        rms_rows(x, w, eps, cols, self.pool);
    }

    fn head_norm(&mut self, x: &mut Vec<f32>, n: &HeadNorm, eps: f32, hd: usize) {
        head_norms(x, n, eps, hd, self.pool);
    }

    fn linears(&mut self, ls: &[&Linear<'_>], x: &Vec<f32>, outs: &mut [&mut Vec<f32>]) {
        linears(ls, x, &mut self.scratch.act, outs, self.pool);
    }

    fn rope(&mut self, x: &mut Vec<f32>, dim: usize, swa: bool) {
        let cfg = &self.model.config;
        let (half, hk, style) = (cfg.n_rot / 2, cfg.head_dim_k, cfg.arch.rope);
        if style == RopeStyle::None {
            return;
        }
        let angles = match (self.angles_swa, swa) {
            (Some(a), true) => a,
            _ => self.angles,
        };
        // Rotate each token's heads, a task per run of tokens.
        self.pool
            .for_each_chunk_mut(x, dim * ROWS_PER_TASK, |i, rows| {
                for (j, row) in rows.chunks_mut(dim).enumerate() {
                    let t = i * ROWS_PER_TASK + j;
                    let a = &angles[t * half..(t + 1) * half];
                    row.chunks_mut(hk).for_each(|h| rope::rotate(h, a, style));
                }
            });
    }

    fn attention(
        &mut self,
        il: usize,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        swa: bool,
        sinks: Option<&[f32]>,
        out: &mut Vec<f32>,
    ) {
        let cfg = &self.model.config;
        let kv_rows = (k.chunks_exact(cfg.k_dim())).zip(v.chunks_exact(cfg.v_dim()));
        let views: Vec<LayerKv<'_>> = match &mut *self.cache {
            BatchKv::Pool(targets) => {
                let store = self.kv.store_mut();
                for (&(page, slot), (k, v)) in targets[il].iter().zip(kv_rows) {
                    store.write(page, slot, k, v);
                }
                (self.seqs.iter()).map(|&s| self.kv.layer(s, il)).collect()
            }
            BatchKv::Transient(t) => {
                for (sl, (k, v)) in self.slots.iter().zip(kv_rows) {
                    t.write(sl.seq, sl.pos, k, v);
                }
                (0..self.seqs.len()).map(|i| t.layer(i)).collect()
            }
        };
        *out = self
            .model
            .attention(&views, self.slots, q, swa, sinks, self.pool);
    }

    fn add(&mut self, x: &mut Vec<f32>, y: &Vec<f32>, z: Option<&Vec<f32>>) {
        add_into(x, y, z.map(|z| &z[..]), self.pool);
    }

    fn ffn(&mut self, layer: &Layer<'_>, h: &Vec<f32>, out: &mut Vec<f32>) {
        let s = &mut *self.scratch;
        self.model
            .ffn(self.pool, layer, h, &mut s.dense, &mut s.moe, &mut s.act);
        // The network wrote its own buffer; hand it over (every value of the one
        // handed back is overwritten by the next network).
        std::mem::swap(out, &mut s.dense.down);
    }

    fn gather(
        &mut self,
        x: &Vec<f32>,
        index: &[usize],
        run: std::ops::Range<usize>,
        cols: usize,
        out: &mut Vec<f32>,
    ) {
        out.clear();
        for &i in &index[run] {
            out.extend_from_slice(&x[i * cols..(i + 1) * cols]);
        }
    }

    fn softcap(&mut self, x: &mut Vec<f32>, c: f32) {
        x.iter_mut()
            .for_each(|v| *v = llamay_kernels::math::tanh(*v / c) * c);
    }

    fn read(&mut self, x: &mut Vec<f32>) -> Vec<f32> {
        std::mem::take(x)
    }
}

/// `f.down = ffn(h)` for the rows of `h` (`kind` as the architecture row says).
pub(crate) fn dense_ffn(
    kind: FfnKind,
    ffn: &DenseFfn<'_>,
    h: &[f32],
    f: &mut FfnBuffers,
    act: &mut MatmulInput,
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
    /// The FFN of `h` into `dense.down`.
    fn ffn(
        &self,
        threads: &ThreadPool,
        layer: &Layer<'_>,
        h: &[f32],
        dense: &mut FfnBuffers,
        moe: &mut MoeScratch,
        act: &mut MatmulInput,
    ) {
        let cfg = &self.config;
        match &layer.ffn {
            Ffn::Moe(m) => {
                let mixture = moe::Mixture {
                    weights: m,
                    kind: cfg.arch.ffn,
                    n_embd: cfg.n_embd,
                };
                mixture.forward(h, moe, &mut dense.down, act, threads);
            }
            Ffn::Dense(d) => dense_ffn(cfg.arch.ffn, d, h, dense, act, threads),
        }
        if let Some(w) = &layer.post_ffn_norm {
            rms_rows(&mut dense.down, w, cfg.norm_eps, cfg.n_embd, threads);
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
            heads: cfg.attention_shape(),
            window: (swa && cfg.n_swa > 0).then_some(cfg.n_swa),
            sinks,
        };
        attention::attention(&shape, views, slots, q, pool)
    }
}
