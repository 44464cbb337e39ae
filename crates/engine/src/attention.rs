//! Causal attention of a batch over its sequences' KV caches, flash-style: keys and
//! values are read in tiles of positions, and each query row keeps a running maximum,
//! a running sum of exponentials and an unnormalised output that is rescaled when the
//! maximum grows (online softmax), so no score vector as long as the context exists.
//!
//! Work is split into tasks of (block of consecutive query tokens of one sequence,
//! KV head): all q heads that share a KV head (GQA) and all tokens of the block read
//! each key and value row once per tile. When that gives too few tasks for the pool
//! (one token decoding at long context), each task's KV range is split as well and the
//! partial (max, sum, output) triples are merged exactly, as flash-decoding does.
//!
//! Numerics: Q·K is `dot_f32` of the query (rounded to f16 for an f16 cache) and the
//! key widened to f32, times the scale, then the soft-cap; exponentials, sums and the
//! weighted sum of values in f32. Only the order of the softmax's operations differs
//! from a plain softmax (the division comes last).

use crate::forward::BatchToken;
use crate::kv::KvCache;
use llamay_kernels::attn_tile::{TILE, pv_tile, scores_tile, softmax_row};
use llamay_kernels::{ThreadPool, axpy_f32};
use std::sync::OnceLock;

/// What one layer's attention computes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Multiplies Q·K.
    pub scale: f32,
    /// `s ↦ c·tanh(s/c)` after the scale.
    pub softcap: Option<f32>,
    /// Sliding window: a token at position `p` sees positions `p + 1 - w ..= p`.
    pub window: Option<usize>,
}

/// How the work is cut; results agree for every setting up to f32 rounding.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    /// Most query tokens of one sequence per task.
    pub block: usize,
    /// Granule of a split KV range, in positions.
    pub tile: usize,
    /// Fewest KV positions a split covers.
    pub min_split: usize,
    /// Tasks wanted per pool thread: fewer (block, KV head) tasks than this get their
    /// KV range split.
    pub tasks_per_thread: usize,
    /// Splits of every KV range, overriding the choice above (tests).
    pub force_splits: Option<usize>,
}

/// Measured on Gemma 3 270M's shape (`bench` below): a tile of 16 rows of 256 keeps
/// the widened K and V tiles (32 KiB) in L1; 16-token blocks share each tile among 64
/// query rows.
pub(crate) const TUNING: Tuning = Tuning {
    block: 16,
    tile: 16,
    min_split: 256,
    tasks_per_thread: 2,
    force_splits: None,
};

/// Consecutive batch tokens of one sequence at consecutive positions.
#[derive(Clone, Copy, Debug)]
struct Block {
    seq: usize,
    /// Batch index of the first token.
    t0: usize,
    n: usize,
    pos0: usize,
}

impl Block {
    /// KV positions any of its tokens sees.
    fn range(&self, shape: &Shape) -> (usize, usize) {
        (first(self.pos0, shape.window), self.pos0 + self.n)
    }
}

/// First position a token at `pos` sees.
fn first(pos: usize, window: Option<usize>) -> usize {
    match window {
        Some(w) if w > 0 => (pos + 1).saturating_sub(w),
        _ => 0,
    }
}

fn blocks(batch: &[BatchToken], max: usize) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    for (t, bt) in batch.iter().enumerate() {
        match out.last_mut() {
            Some(b) if b.seq == bt.seq && b.n < max && b.pos0 + b.n == bt.pos => b.n += 1,
            _ => out.push(Block {
                seq: bt.seq,
                t0: t,
                n: 1,
                pos0: bt.pos,
            }),
        }
    }
    out
}

/// How many parts each task's KV range is cut into: 1 unless the (block, KV head)
/// tasks are too few to keep `threads` busy and the ranges are long.
fn splits(shape: &Shape, tuning: &Tuning, blocks: &[Block], threads: usize) -> usize {
    if let Some(s) = tuning.force_splits {
        return s.max(1);
    }
    let base = blocks.len() * shape.n_head_kv;
    let want = threads * tuning.tasks_per_thread;
    if threads <= 1 || base >= want {
        return 1;
    }
    let longest = blocks
        .iter()
        .map(|b| {
            let (lo, hi) = b.range(shape);
            hi - lo
        })
        .max()
        .unwrap_or(0);
    want.div_ceil(base)
        .min(longest / tuning.min_split.max(1))
        .max(1)
}

/// Online-softmax state of a task's query rows: running max, running sum, and the
/// unnormalised output (`rows × head_dim_v`).
struct Partial {
    m: Vec<f32>,
    l: Vec<f32>,
    acc: Vec<f32>,
}

/// Attention of every batch token over its sequence's cache at layer `il` (whose keys
/// and values for the batch are already appended). `q` is `batch.len() × n_head ×
/// head_dim_k`; returns `batch.len() × n_head × head_dim_v`.
pub(crate) fn attention(
    shape: &Shape,
    caches: &[KvCache],
    batch: &[BatchToken],
    il: usize,
    q: &[f32],
    pool: &ThreadPool,
) -> Vec<f32> {
    attention_with(shape, &TUNING, caches, batch, il, q, pool)
}

pub(crate) fn attention_with(
    shape: &Shape,
    tuning: &Tuning,
    caches: &[KvCache],
    batch: &[BatchToken],
    il: usize,
    q: &[f32],
    pool: &ThreadPool,
) -> Vec<f32> {
    let (nh, nkv, hv) = (shape.n_head, shape.n_head_kv, shape.head_dim_v);
    let group = nh / nkv;
    let blocks = blocks(batch, tuning.block.max(1));
    let tile = tuning.tile.max(1);
    let n_split = splits(shape, tuning, &blocks, pool.n_threads());
    let per_block = nkv * n_split;
    let n_tasks = blocks.len() * per_block;
    // Task `i`: later blocks (longer ranges) first, so the pool ends balanced.
    let task = |i: usize| {
        let b = blocks.len() - 1 - i / per_block;
        let (kvh, s) = ((i % per_block) / n_split, i % n_split);
        (b, kvh, s)
    };
    let slots: Vec<OnceLock<Partial>> = (0..n_tasks).map(|_| OnceLock::new()).collect();
    pool.run(n_tasks, |i| {
        let (b, kvh, s) = task(i);
        let block = &blocks[b];
        let (lo, hi) = block.range(shape);
        let chunk = (hi - lo).div_ceil(n_split).next_multiple_of(tile);
        let c0 = (lo + s * chunk).min(hi);
        let c1 = (c0 + chunk).min(hi);
        let p = run_task(shape, &caches[block.seq], il, q, block, kvh, c0..c1);
        let _ = slots[i].set(p);
    });

    let parts: Vec<Partial> = slots
        .into_iter()
        .map(|s| s.into_inner().expect("every attention task ran"))
        .collect();
    // Each token's block, for the merge below.
    let mut block_of = vec![0usize; batch.len()];
    for (b, block) in blocks.iter().enumerate() {
        block_of[block.t0..block.t0 + block.n].fill(b);
    }
    // Merge every token's partials into its output row, tokens in parallel.
    const TOKENS_PER_TASK: usize = 8;
    let mut out = vec![0f32; batch.len() * nh * hv];
    pool.for_each_chunk_mut(&mut out, TOKENS_PER_TASK * nh * hv, |c, rows| {
        let mut w = vec![0f32; n_split];
        for (j, row) in rows.chunks_exact_mut(nh * hv).enumerate() {
            let t = c * TOKENS_PER_TASK + j;
            let b = block_of[t];
            let i = t - blocks[b].t0;
            for kvh in 0..nkv {
                // Task indices of this (block, kv head), one per split.
                let i0 = (blocks.len() - 1 - b) * per_block + kvh * n_split;
                let ps = &parts[i0..i0 + n_split];
                for g in 0..group {
                    let r = i * group + g;
                    let head = kvh * group + g;
                    let o = &mut row[head * hv..(head + 1) * hv];
                    merge_row(ps, r, hv, &mut w, o);
                }
            }
        }
    });
    out
}

/// Output row `o` (zero on entry) of query row `r` from its partials, one per split:
/// rescaled to the common maximum and normalised by the total sum.
fn merge_row(ps: &[Partial], r: usize, hv: usize, w: &mut [f32], o: &mut [f32]) {
    let m = ps.iter().map(|p| p.m[r]).fold(f32::NEG_INFINITY, f32::max);
    let mut l = 0f32;
    for (w, p) in w.iter_mut().zip(ps) {
        *w = if p.m[r] == f32::NEG_INFINITY {
            0.0
        } else {
            (p.m[r] - m).exp()
        };
        l += p.l[r] * *w;
    }
    if l == 0.0 {
        return;
    }
    let inv = 1.0 / l;
    for (w, p) in w.iter().zip(ps) {
        if *w != 0.0 {
            axpy_f32(o, *w * inv, &p.acc[r * hv..(r + 1) * hv]);
        }
    }
}

/// One task: the query rows of `block` whose heads share KV head `kvh`, over KV
/// positions `range` (each row limited to the positions it sees).
#[allow(clippy::too_many_arguments)]
fn run_task(
    shape: &Shape,
    cache: &KvCache,
    il: usize,
    q: &[f32],
    block: &Block,
    kvh: usize,
    range: std::ops::Range<usize>,
) -> Partial {
    let (nh, hk, hv) = (shape.n_head, shape.head_dim_k, shape.head_dim_v);
    let group = nh / shape.n_head_kv;
    let rows = block.n * group;
    // Query rows `i * group + g`: token `block.t0 + i`, head `kvh * group + g`.
    let mut qs = vec![0f32; rows * hk];
    for (r, dst) in qs.chunks_exact_mut(hk).enumerate() {
        let (t, head) = (block.t0 + r / group, kvh * group + r % group);
        dst.copy_from_slice(&q[(t * nh + head) * hk..(t * nh + head + 1) * hk]);
    }
    cache.precision().round(&mut qs);

    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    let mut acc = vec![0f32; rows * hv];
    let (kdim, vdim) = cache.dims();
    let (keys, values) = (cache.keys(il), cache.values(il));
    let mut kbuf = Vec::new();
    // The tile's values (`TILE × hv`, zero past the range's end); the scores, then the
    // weights, of every row. Keys come transposed from the cache (`hk × TILE`).
    let mut vt = vec![0f32; TILE * hv];
    let mut s = vec![0f32; rows * TILE];
    // The cache's key tiles that meet the range; positions of a tile outside the range
    // (or past the cache's end) get weight 0 through each row's visible span.
    let tiles = if range.is_empty() {
        0..0
    } else {
        range.start / TILE..range.end.div_ceil(TILE)
    };
    for tile in tiles {
        let ts = tile * TILE;
        let te = (ts + TILE).min(range.end);
        let n = te - ts;
        let kt = keys.key_tile(tile, kdim, kvh * hk, hk, &mut kbuf);
        if n < TILE {
            vt[n * hv..].fill(0.0);
        }
        values.rows_into(ts, n, vdim, kvh * hv, hv, &mut vt);
        scores_tile(&qs, rows, hk, kt, &mut s);
        for i in 0..block.n {
            let pos = block.pos0 + i;
            // Tile-local positions this token sees.
            let lo = first(pos, shape.window).max(range.start).max(ts);
            let hi = (pos + 1).min(te);
            let (a, b) = (lo - ts, hi.saturating_sub(ts));
            for r in i * group..(i + 1) * group {
                let srow: &mut [f32; TILE] = (&mut s[r * TILE..(r + 1) * TILE])
                    .try_into()
                    .expect("a score row is TILE long");
                let c = softmax_row(srow, a..b, shape.scale, shape.softcap, &mut m[r], &mut l[r]);
                if c != 1.0 {
                    acc[r * hv..(r + 1) * hv].iter_mut().for_each(|x| *x *= c);
                }
            }
        }
        pv_tile(&s, rows, &vt, hv, &mut acc);
    }
    Partial { m, l, acc }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvPrecision;

    struct Rng(u64);

    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// Plain attention in f64 over the cache's (rounded) keys and values.
    fn reference(
        shape: &Shape,
        caches: &[KvCache],
        batch: &[BatchToken],
        il: usize,
        q: &[f32],
    ) -> Vec<f64> {
        let (nh, hk, hv) = (shape.n_head, shape.head_dim_k, shape.head_dim_v);
        let group = nh / shape.n_head_kv;
        let mut out = vec![0f64; batch.len() * nh * hv];
        for (t, bt) in batch.iter().enumerate() {
            let cache = &caches[bt.seq];
            let (kdim, vdim) = cache.dims();
            let n = bt.pos + 1;
            // Rows of the cache's (rounded) keys and values, positions 0..n.
            let (ks, vs) = (kdim, vdim);
            let mut keys = vec![0f32; n * kdim];
            let mut kb = Vec::new();
            for p in 0..n {
                let kt = cache.keys(il).key_tile(p / TILE, kdim, 0, kdim, &mut kb);
                for c in 0..kdim {
                    keys[p * kdim + c] = kt[c * TILE + p % TILE];
                }
            }
            let mut values = vec![0f32; n * vdim];
            cache.values(il).rows_into(0, n, vdim, 0, vdim, &mut values);
            for head in 0..nh {
                let kvh = head / group;
                let mut qv = q[(t * nh + head) * hk..(t * nh + head + 1) * hk].to_vec();
                cache.precision().round(&mut qv);
                let lo = first(bt.pos, shape.window);
                let scores: Vec<f64> = (lo..n)
                    .map(|p| {
                        let k = &keys[p * ks + kvh * hk..p * ks + (kvh + 1) * hk];
                        let d: f64 = qv
                            .iter()
                            .zip(k)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum();
                        let s = d * f64::from(shape.scale);
                        match shape.softcap {
                            Some(c) => (s / f64::from(c)).tanh() * f64::from(c),
                            None => s,
                        }
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let o = &mut out[(t * nh + head) * hv..(t * nh + head + 1) * hv];
                for (p, w) in (lo..n).zip(&e) {
                    let v = &values[p * vs + kvh * hv..p * vs + (kvh + 1) * hv];
                    for (o, v) in o.iter_mut().zip(v) {
                        *o += w / sum * f64::from(*v);
                    }
                }
            }
        }
        out
    }

    /// Fills a cache for two sequences (`prior` positions each), then appends a batch
    /// of `new` tokens per sequence, interleaved in runs, and compares every tuning.
    #[allow(clippy::too_many_arguments)]
    fn case(
        seed: u64,
        nh: usize,
        nkv: usize,
        hk: usize,
        hv: usize,
        window: Option<usize>,
        softcap: Option<f32>,
        prior: usize,
        new: usize,
        precision: KvPrecision,
    ) {
        let shape = Shape {
            n_head: nh,
            n_head_kv: nkv,
            head_dim_k: hk,
            head_dim_v: hv,
            scale: 1.5 / (hk as f32).sqrt(),
            softcap,
            window,
        };
        let mut rng = Rng(seed);
        let (kd, vd) = (nkv * hk, nkv * hv);
        let n_layer = 2;
        let il = 1;
        let mut caches: Vec<KvCache> = (0..2)
            .map(|_| KvCache::new(n_layer, kd, vd, prior + new, precision))
            .collect();
        for c in &mut caches {
            for _ in 0..prior {
                for layer in 0..n_layer {
                    let k: Vec<f32> = (0..kd).map(|_| rng.f() * 2.0).collect();
                    let v: Vec<f32> = (0..vd).map(|_| rng.f()).collect();
                    c.append(layer, &k, &v);
                }
                c.commit(1);
            }
        }
        // Runs of up to 5 tokens alternating between the sequences.
        let mut batch = Vec::new();
        let mut next = [prior, prior];
        let mut seq = 0;
        while next.iter().any(|&p| p < prior + new) {
            if next[seq] < prior + new {
                let run = 5.min(prior + new - next[seq]);
                for _ in 0..run {
                    batch.push(BatchToken {
                        seq,
                        token: 0,
                        pos: next[seq],
                        logits: false,
                    });
                    next[seq] += 1;
                }
            }
            seq = 1 - seq;
        }
        for bt in &batch {
            for layer in 0..n_layer {
                let k: Vec<f32> = (0..kd).map(|_| rng.f() * 2.0).collect();
                let v: Vec<f32> = (0..vd).map(|_| rng.f()).collect();
                caches[bt.seq].append(layer, &k, &v);
            }
        }
        let q: Vec<f32> = (0..batch.len() * nh * hk).map(|_| rng.f() * 2.0).collect();
        let want = reference(&shape, &caches, &batch, il, &q);
        let pools = [ThreadPool::new(1), ThreadPool::new(3)];
        let tunings = [
            TUNING,
            Tuning {
                block: 3,
                tile: 5,
                min_split: 1,
                tasks_per_thread: 8,
                force_splits: None,
            },
            Tuning {
                block: 1,
                tile: 7,
                force_splits: Some(4),
                ..TUNING
            },
            Tuning {
                block: 64,
                tile: 1000,
                force_splits: Some(3),
                ..TUNING
            },
        ];
        for pool in &pools {
            for tuning in &tunings {
                let got = attention_with(&shape, tuning, &caches, &batch, il, &q, pool);
                assert_eq!(got.len(), want.len());
                for (r, (g, w)) in got.chunks(hv).zip(want.chunks(hv)).enumerate() {
                    let scale = w.iter().fold(0f64, |a, b| a.max(b.abs())).max(1e-3);
                    for (x, y) in g.iter().zip(w) {
                        let err = (f64::from(*x) - y).abs() / scale;
                        assert!(
                            err < 1e-5,
                            "row {r}: {x} vs {y} (rel {err:e}); {tuning:?}, {} threads, \
                             heads {nh}/{nkv}, window {window:?}, softcap {softcap:?}, \
                             {precision:?}",
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn flash_and_split_paths_match_plain_attention() {
        use KvPrecision::{F16, F32};
        // Prefill on an empty cache, GQA 4:1, differing K and V head sizes.
        case(1, 4, 1, 32, 16, None, None, 0, 40, F32);
        // Prefill after context, sliding window shorter than the batch, soft-cap.
        case(2, 8, 2, 16, 16, Some(7), Some(3.0), 30, 23, F32);
        case(3, 2, 2, 24, 24, Some(50), None, 60, 9, F16);
        // Decode of one token at long context (the split path), with and without
        // a window, f16 and f32.
        case(4, 4, 1, 64, 64, None, None, 700, 1, F16);
        case(5, 4, 1, 64, 64, Some(300), Some(50.0), 700, 1, F32);
        case(6, 6, 3, 8, 8, None, Some(1.0), 333, 2, F16);
    }

    #[test]
    fn one_token_at_long_context_splits_its_kv_range() {
        let shape = Shape {
            n_head: 4,
            n_head_kv: 1,
            head_dim_k: 256,
            head_dim_v: 256,
            scale: 1.0,
            softcap: None,
            window: None,
        };
        let at = |pos: usize, n: usize| {
            let batch: Vec<BatchToken> = (pos..pos + n)
                .map(|pos| BatchToken {
                    seq: 0,
                    token: 0,
                    pos,
                    logits: true,
                })
                .collect();
            blocks(&batch, TUNING.block)
        };
        let local = Shape {
            window: Some(512),
            ..shape
        };
        assert_eq!(at(4095, 1)[0].range(&shape), (0, 4096));
        assert_eq!(at(4095, 1)[0].range(&local), (3584, 4096));
        assert_eq!(splits(&shape, &TUNING, &at(4095, 1), 2), 4);
        assert_eq!(splits(&local, &TUNING, &at(4095, 1), 2), 2);
        assert_eq!(splits(&shape, &TUNING, &at(100, 1), 2), 1);
        assert_eq!(splits(&shape, &TUNING, &at(4095, 1), 1), 1);
        // A prefill batch has tasks enough.
        assert_eq!(at(4096, 512).len(), 32);
        assert_eq!(splits(&shape, &TUNING, &at(4096, 512), 2), 1);
    }

    /// The attention this module replaced: per (token, head), a full score vector, a
    /// softmax, then one axpy per value, over f32 keys and values, split over
    /// (token, head) pairs. Kept here only as the timing baseline of `bench`.
    fn previous(
        shape: &Shape,
        keys: &[f32],
        values: &[f32],
        batch: &[BatchToken],
        q: &[f32],
        pool: &ThreadPool,
    ) -> Vec<f32> {
        let (nh, hk, hv) = (shape.n_head, shape.head_dim_k, shape.head_dim_v);
        let group = nh / shape.n_head_kv;
        let (kdim, vdim) = (shape.n_head_kv * hk, shape.n_head_kv * hv);
        let parts = crate::tensor::parallel_ranges(batch.len() * nh, pool, |range| {
            let mut out = vec![0f32; range.len() * hv];
            let mut scores = Vec::new();
            let mut qbuf = vec![0f32; hk];
            for (i, w) in range.enumerate() {
                let (t, head) = (w / nh, w % nh);
                let bt = batch[t];
                let kvh = head / group;
                qbuf.copy_from_slice(&q[(t * nh + head) * hk..(t * nh + head + 1) * hk]);
                KvPrecision::F16.round(&mut qbuf);
                let lo = first(bt.pos, shape.window);
                scores.clear();
                for p in lo..=bt.pos {
                    let k = &keys[p * kdim + kvh * hk..p * kdim + (kvh + 1) * hk];
                    scores.push(llamay_kernels::dot_f32(&qbuf, k) * shape.scale);
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f64;
                for v in scores.iter_mut() {
                    *v = (*v - max).exp();
                    sum += f64::from(*v);
                }
                let inv = (1.0 / sum) as f32;
                let o = &mut out[i * hv..(i + 1) * hv];
                for (j, p) in (lo..=bt.pos).enumerate() {
                    let v = &values[p * vdim + kvh * hv..p * vdim + (kvh + 1) * hv];
                    axpy_f32(o, scores[j] * inv, v);
                }
            }
            out
        });
        parts.concat()
    }

    /// Timing on Gemma 3 270M's shape (4 q heads, 1 KV head, 256 wide) at 4096
    /// positions of f16 cache: one decoded token (global and 512-window layers) and a
    /// 512-token prefill, new vs previous, best of several runs (robust to a shared
    /// machine). `cargo test --release -p llamay-engine --lib attention::tests::bench
    /// -- --ignored --nocapture`
    #[test]
    #[ignore = "timing, not a check"]
    fn bench() {
        let threads: usize = std::env::var("LLAMAY_BENCH_THREADS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2);
        let pool = ThreadPool::new(threads);
        // Gemma 3 270M's shape at depth 4096, and Llama-3.2-1B's prefill from empty:
        // (n_head, n_head_kv, head_dim, depth) and the cases run on that cache.
        type Case = (&'static str, Option<usize>, usize, usize);
        type Dims = (usize, usize, usize, usize);
        let shapes: [(Dims, &[Case]); 2] = [
            (
                (4, 1, 256, 4096),
                &[
                    ("gemma decode d4096, global", None, 1, 200),
                    ("gemma decode d4096, window 512", Some(512), 1, 200),
                    ("gemma prefill 512 @ d4096, global", None, 512, 5),
                    ("gemma prefill 512 @ d4096, window 512", Some(512), 512, 5),
                ],
            ),
            ((32, 8, 64, 0), &[("llama-1b prefill 512", None, 512, 5)]),
        ];
        let best = |f: &mut dyn FnMut() -> Vec<f32>, reps: usize| {
            (0..reps)
                .map(|_| {
                    let t = std::time::Instant::now();
                    std::hint::black_box(f());
                    t.elapsed().as_secs_f64() * 1e3
                })
                .fold(f64::INFINITY, f64::min)
        };
        let env = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(d)
        };
        let tuning = Tuning {
            block: env("LLAMAY_BENCH_BLOCK", TUNING.block),
            tile: env("LLAMAY_BENCH_TILE", TUNING.tile),
            ..TUNING
        };
        for ((nh, nkv, hd, depth), cases) in shapes {
            let mut rng = Rng(9);
            let mut cache = KvCache::new(1, nkv * hd, nkv * hd, depth + 512, KvPrecision::F16);
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for _ in 0..depth + 512 {
                let k: Vec<f32> = (0..nkv * hd).map(|_| rng.f()).collect();
                let v: Vec<f32> = (0..nkv * hd).map(|_| rng.f()).collect();
                cache.append(0, &k, &v);
                // The previous attention read f32 rows widened from the f16 cache.
                keys.extend(k.iter().map(|&x| half::f16::from_f32(x).to_f32()));
                values.extend(v.iter().map(|&x| half::f16::from_f32(x).to_f32()));
            }
            let caches = [cache];
            for &(name, window, len, reps) in cases {
                let shape = Shape {
                    n_head: nh,
                    n_head_kv: nkv,
                    head_dim_k: hd,
                    head_dim_v: hd,
                    scale: 0.0625,
                    softcap: None,
                    window,
                };
                let batch: Vec<BatchToken> = (depth..depth + len)
                    .map(|pos| BatchToken {
                        seq: 0,
                        token: 0,
                        pos,
                        logits: false,
                    })
                    .collect();
                let q: Vec<f32> = (0..len * nh * hd).map(|_| rng.f()).collect();
                let new = best(
                    &mut || attention_with(&shape, &tuning, &caches, &batch, 0, &q, &pool),
                    reps,
                );
                let old = best(
                    &mut || previous(&shape, &keys, &values, &batch, &q, &pool),
                    reps,
                );
                eprintln!(
                    "{name}: {new:.3} ms (previous {old:.3} ms, {:.2}x), {threads} threads",
                    old / new
                );
            }
        }
    }
}
