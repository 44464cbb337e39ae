//! The one generic transformer block, driven by the architecture row, and the
//! batch-shaped decode: tokens of several sequences in one call.

use crate::arch::{FfnKind, NormKind, Residual, RopeStyle};
use crate::attention::{self, Shape};
use crate::kv::KvCache;
use crate::ops::{add_bias, gelu_slice, layer_norm, rms_norm};
use crate::rope::{self, RopeParams};
use crate::tensor::matmul;
use crate::weights::{Linear, Norm};
use crate::{DecodeError, Model};
use llamay_kernels::ThreadPool;

/// One token of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchToken {
    /// Index into the `caches` passed to [`Model::decode`].
    pub seq: usize,
    pub token: u32,
    /// Position in its sequence; must be the sequence's next position.
    pub pos: usize,
    /// Whether logits are wanted for this token.
    pub logits: bool,
}

/// Logits for the tokens that asked for them, in batch order.
pub struct Logits {
    pub n_vocab: usize,
    /// Batch indices that asked for logits.
    pub index: Vec<usize>,
    pub values: Vec<f32>,
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.n_vocab..(i + 1) * self.n_vocab]
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

/// Rows per task of the row-wise steps (norms, rope).
const ROWS_PER_TASK: usize = 16;

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
        for row in rows.chunks_mut(cols) {
            match kind {
                NormKind::Rms => rms_norm(row, &norm.weight, eps),
                NormKind::Layer => layer_norm(row, &norm.weight, norm.bias.as_deref(), eps),
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

/// `y = W x + b` for `n` rows of input.
fn linear(l: &Linear<'_>, x: &[f32], n: usize, pool: &ThreadPool) -> Vec<f32> {
    let mut out = matmul(&l.w, l.packed.as_ref(), x, n, pool);
    add_bias(&mut out, l.b.as_ref(), l.w.rows);
    out
}

impl Model<'_> {
    /// Runs one batch: appends every token's keys and values to its sequence's cache
    /// and returns logits for the tokens that asked. On error nothing is appended.
    pub fn decode(
        &self,
        caches: &mut [KvCache],
        batch: &[BatchToken],
    ) -> Result<Logits, DecodeError> {
        let cfg = &self.config;
        let n = batch.len();
        if n == 0 {
            return Err(DecodeError::EmptyBatch);
        }
        // Validate before touching anything: ids, sequences, positions in order.
        let mut next: Vec<usize> = caches.iter().map(KvCache::len).collect();
        for bt in batch {
            let Some(expected) = next.get_mut(bt.seq) else {
                return Err(DecodeError::BadSequence {
                    seq: bt.seq,
                    n_seqs: caches.len(),
                });
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
            if bt.pos >= caches[bt.seq].capacity() {
                return Err(DecodeError::ContextFull {
                    seq: bt.seq,
                    capacity: caches[bt.seq].capacity(),
                });
            }
            if let Some(pe) = &self.weights.position_embd
                && bt.pos >= pe.rows
            {
                return Err(DecodeError::ContextFull {
                    seq: bt.seq,
                    capacity: pe.rows,
                });
            }
            *expected += 1;
        }

        let e = cfg.n_embd;
        let arch = cfg.arch;
        let threads = &self.pool;
        let mut x = vec![0f32; n * e];
        let mut tmp = vec![0f32; e];
        for (t, bt) in batch.iter().enumerate() {
            let row = &mut x[t * e..(t + 1) * e];
            self.weights.embed_row(bt.token as usize, row);
            if arch.embed_scale_sqrt {
                let s = (e as f32).sqrt();
                row.iter_mut().for_each(|v| *v *= s);
            }
            if let Some(pe) = &self.weights.position_embd {
                pe.dequant_row(bt.pos, &mut tmp);
                row.iter_mut().zip(&tmp).for_each(|(v, p)| *v += p);
            }
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
                let factors = (self.weights.rope_factors)
                    .for_context(caches[bt.seq].capacity(), cfg.n_ctx_orig);
                rope.angles(bt.pos, factors, &mut one);
                all.extend_from_slice(&one);
            }
            all
        };
        let angles_full = angles_of(&cfg.rope);
        let own_swa = cfg.swa_layers.iter().any(|&s| s) && cfg.rope_swa != cfg.rope;
        let angles_swa = own_swa.then(|| angles_of(&cfg.rope_swa));
        for (il, layer) in self.weights.layers.iter().enumerate() {
            let mut h = x.clone();
            apply_norm(
                &mut h,
                &layer.attn_norm,
                arch.norm,
                cfg.norm_eps,
                e,
                threads,
            );

            let mut q = linear(&layer.q, &h, n, threads);
            let mut k = linear(&layer.k, &h, n, threads);
            let v = linear(&layer.v, &h, n, threads);
            if let Some(w) = &layer.q_norm {
                rms_rows(&mut q, w, cfg.norm_eps, hk, threads);
            }
            if let Some(w) = &layer.k_norm {
                rms_rows(&mut k, w, cfg.norm_eps, hk, threads);
            }
            let swa = cfg.swa_layers[il];
            if arch.rope != RopeStyle::None {
                // Rotate each token's q and k heads, a task per run of tokens.
                let half = cfg.n_rot / 2;
                let angles = match (&angles_swa, swa) {
                    (Some(a), true) => a,
                    _ => &angles_full,
                };
                for (buf, dim) in [(&mut q, qd), (&mut k, kd)] {
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
            for (t, bt) in batch.iter().enumerate() {
                caches[bt.seq].append(il, &k[t * kd..(t + 1) * kd], &v[t * vd..(t + 1) * vd]);
            }

            let attn = self.attention(caches, batch, il, &q, swa);
            let mut o = linear(&layer.attn_out, &attn, n, threads);
            if let Some(w) = &layer.post_attn_norm {
                rms_rows(&mut o, w, cfg.norm_eps, e, threads);
            }

            match arch.residual {
                Residual::Sequential => {
                    x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                    let mut h2 = x.clone();
                    if let Some(norm) = &layer.ffn_norm {
                        apply_norm(&mut h2, norm, arch.norm, cfg.norm_eps, e, threads);
                    }
                    let f = self.ffn(layer, &h2, n);
                    x.iter_mut().zip(&f).for_each(|(a, b)| *a += b);
                }
                Residual::Parallel { shared_norm } => {
                    let f = if shared_norm {
                        self.ffn(layer, &h, n)
                    } else {
                        let mut h2 = x.clone();
                        if let Some(norm) = &layer.ffn_norm {
                            apply_norm(&mut h2, norm, arch.norm, cfg.norm_eps, e, threads);
                        }
                        self.ffn(layer, &h2, n)
                    };
                    for ((a, b), c) in x.iter_mut().zip(&o).zip(&f) {
                        *a += b + c;
                    }
                }
            }
        }
        for (seq, cache) in caches.iter_mut().enumerate() {
            let added = batch.iter().filter(|b| b.seq == seq).count();
            cache.commit(added);
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
        apply_norm(
            &mut h,
            &self.weights.output_norm,
            arch.norm,
            cfg.norm_eps,
            e,
            threads,
        );
        let mut values = linear(&self.weights.output, &h, index.len(), threads);
        if let Some(c) = cfg.final_softcap {
            values.iter_mut().for_each(|v| *v = (*v / c).tanh() * c);
        }
        Ok(Logits {
            n_vocab: cfg.n_vocab,
            index,
            values,
        })
    }

    fn ffn(&self, layer: &crate::weights::Layer<'_>, h: &[f32], n: usize) -> Vec<f32> {
        let threads = &self.pool;
        let mut up = linear(&layer.ffn_up, h, n, threads);
        match self.config.arch.ffn {
            FfnKind::SwiGlu | FfnKind::SwiGluStacked | FfnKind::GeGlu => {
                if let Some(gate) = &layer.ffn_gate {
                    let g = linear(gate, h, n, threads);
                    if self.config.arch.ffn == FfnKind::GeGlu {
                        // up *= gelu(g), a piece per task (GELU works in place).
                        const CHUNK: usize = 16 * 1024;
                        threads.for_each_chunk_mut(&mut up, CHUNK, |i, u| {
                            let mut gi = g[i * CHUNK..][..u.len()].to_vec();
                            gelu_slice(&mut gi);
                            u.iter_mut().zip(&gi).for_each(|(u, g)| *u *= g);
                        });
                    } else {
                        llamay_kernels::swiglu(&mut up, &g, threads);
                    }
                }
            }
            FfnKind::Gelu => threads.for_each_chunk_mut(&mut up, 16 * 1024, |_, u| gelu_slice(u)),
        }
        let mut down = linear(&layer.ffn_down, &up, n, threads);
        if let Some(w) = &layer.post_ffn_norm {
            rms_rows(
                &mut down,
                w,
                self.config.norm_eps,
                self.config.n_embd,
                threads,
            );
        }
        down
    }

    /// Causal attention of every batch token over its sequence's cache (see
    /// [`crate::attention`]).
    fn attention(
        &self,
        caches: &[KvCache],
        batch: &[BatchToken],
        il: usize,
        q: &[f32],
        swa: bool,
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
        };
        attention::attention(&shape, caches, batch, il, q, &self.pool)
    }
}
