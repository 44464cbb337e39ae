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
//! key widened to f32 — or, for int8 keys, ggml's `q8_0 · q8_0` integer dot with the
//! query quantised to `q8_0`, as llama.cpp computes it — times the scale, then the
//! soft-cap; int8 values are dequantised a tile at a time; exponentials, sums and the
//! weighted sum of values in f32. Only the order of the softmax's operations differs
//! from a plain softmax (the division comes last).

use crate::device::AttentionShape;
use crate::kv::{LayerKv, first_seen as first};
use llamay_formats::GgmlType;
use llamay_kernels::attn_tile::{KvRows, Next, TILE, pv_tile, scores_tile, softmax_row};
use llamay_kernels::{ThreadPool, axpy_f32};
use std::sync::OnceLock;

/// What one layer's attention computes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape<'s> {
    /// The heads' geometry, scale and soft-cap (what a device is given too).
    pub heads: AttentionShape,
    /// Sliding window: a token at position `p` sees positions `p + 1 - w ..= p`.
    pub window: Option<usize>,
    /// Attention sinks (gpt-oss): one logit per head, already scaled, that joins each
    /// of its rows' softmax denominators and adds no value.
    pub sinks: Option<&'s [f32]>,
}

/// How the work is cut. Results are bit-identical for every `block` and every pool;
/// `segment` changes the rounding (it is where each row's softmax restarts).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    /// Most query tokens of one sequence per task.
    pub block: usize,
    /// KV positions per segment (a multiple of the key tile, `TILE`): the cache is cut
    /// at fixed absolute positions, every segment a row sees gets its own online softmax
    /// from a fresh state, and a row's segments are folded in order. So a row's
    /// arithmetic depends on its position and the cache alone, not on the batch around
    /// it or the threads: one-token decode (whose segments spread over the pool) and a
    /// batch (whose block tasks fold their segments themselves) agree bit for bit.
    pub segment: usize,
}

/// Measured on Gemma 3 270M's shape (`bench` below): 16-token blocks share each key
/// tile (16 rows of 256 keep the widened K and V tiles, 32 KiB, in L1) among 64 query
/// rows. Segments of 512 positions: one-token decode at depth 4096 gets eight tasks
/// (as fast as the data-dependent split they replaced, 0.261 vs 0.266 ms); restarting
/// the softmax per segment costs prefill 512 @ d4096 5% (57.3 vs 54.7 ms) — 256 gave
/// decode nothing more and cost prefill 20%.
pub(crate) const TUNING: Tuning = Tuning {
    block: 16,
    segment: 512,
};

/// Most query rows of a task whose tiles prefetch the next ones. A decode step reads
/// its cache once, from DRAM, and prefetching shortens the wait (Zen 5, Gemma's global
/// layer at 4096 positions, cold: 0.54–0.59 → 0.36–0.38 ms on one thread, 0.31–0.40 →
/// 0.26–0.31 ms on two); a prefill block reads each tile for many rows, mostly from
/// cache, where the prefetches only cost (warm, the same layer: 0.13 → 0.17 ms).
const PREFETCH_ROWS: usize = 32;

/// Consecutive batch tokens of one sequence at consecutive positions.
#[derive(Clone, Copy, Debug)]
struct Block {
    seq: usize,
    /// Batch index of the first token.
    t0: usize,
    n: usize,
    pos0: usize,
    /// The end of the positions its last token sees (see [`Slot::end`]).
    end: usize,
    /// Every token sees up to `end` (bidirectional attention); else token `i` sees up
    /// to `pos0 + i + 1` (causal).
    uniform: bool,
}

impl Block {
    /// KV positions any of its tokens sees.
    fn range(&self, shape: &Shape<'_>) -> (usize, usize) {
        (first(self.pos0, shape.window), self.end)
    }

    /// The end of the positions its token `i` sees.
    fn end_of(&self, i: usize) -> usize {
        if self.uniform {
            self.end
        } else {
            self.pos0 + i + 1
        }
    }

    /// Takes `bt` as its next token if it continues the block under the same rule.
    fn extend(&mut self, bt: &Slot, max: usize) -> bool {
        if bt.seq != self.seq || self.n >= max || self.pos0 + self.n != bt.pos {
            return false;
        }
        let causal_next = bt.end == self.end + 1 && bt.end == bt.pos + 1;
        let same_end = bt.end == self.end;
        let ok = match (self.n, self.uniform) {
            (1, _) => causal_next || same_end,
            (_, true) => same_end,
            (_, false) => causal_next,
        };
        if ok {
            self.uniform = same_end;
            self.end = bt.end;
            self.n += 1;
        }
        ok
    }
}

/// One batch token as attention sees it: its sequence (an index into the views),
/// position, and the end of the positions it sees.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub seq: usize,
    pub pos: usize,
    /// `pos + 1` under causal attention; under bidirectional attention (an encoder)
    /// the sequence's length, the same for all its tokens.
    pub end: usize,
}

#[cfg(test)]
impl Slot {
    /// A token under causal attention.
    pub fn causal(seq: usize, pos: usize) -> Slot {
        Slot {
            seq,
            pos,
            end: pos + 1,
        }
    }
}

fn blocks(batch: &[Slot], max: usize) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    for (t, bt) in batch.iter().enumerate() {
        if !out.last_mut().is_some_and(|b| b.extend(bt, max)) {
            out.push(Block {
                seq: bt.seq,
                t0: t,
                n: 1,
                pos0: bt.pos,
                end: bt.end,
                uniform: true,
            });
        }
    }
    out
}

/// The segments (see [`Tuning::segment`]) that meet `lo..hi`, as position ranges.
fn segments(lo: usize, hi: usize, segment: usize) -> impl Iterator<Item = (usize, usize)> {
    let first = if hi > lo { lo / segment } else { 0 };
    let last = if hi > lo { hi.div_ceil(segment) } else { 0 };
    (first..last).map(move |k| ((k * segment).max(lo), ((k + 1) * segment).min(hi)))
}

/// Online-softmax state of a task's query rows: running max, running sum, and the
/// unnormalised output (`rows × head_dim_v`).
struct Partial {
    m: Vec<f32>,
    l: Vec<f32>,
    acc: Vec<f32>,
}

/// Attention of every batch token over its sequence's layer (`views[slot.seq]`, whose
/// keys and values for the batch are already written). `q` is `batch.len() × n_head ×
/// head_dim_k`; returns `batch.len() × n_head × head_dim_v`.
pub(crate) fn attention(
    shape: &Shape<'_>,
    views: &[LayerKv<'_>],
    batch: &[Slot],
    q: &[f32],
    pool: &ThreadPool,
) -> Vec<f32> {
    attention_with(shape, &TUNING, views, batch, q, pool)
}

pub(crate) fn attention_with(
    shape: &Shape<'_>,
    tuning: &Tuning,
    views: &[LayerKv<'_>],
    batch: &[Slot],
    q: &[f32],
    pool: &ThreadPool,
) -> Vec<f32> {
    let (nh, nkv, hv) = (
        shape.heads.n_head,
        shape.heads.n_head_kv,
        shape.heads.head_dim_v,
    );
    let group = nh / nkv;
    let blocks = blocks(batch, tuning.block.max(1));
    let segment = tuning.segment.max(1).next_multiple_of(TILE);
    let ranges: Vec<(usize, usize)> = blocks.iter().map(|b| b.range(shape)).collect();
    // One task per (block, KV head) folds that block's segments in order itself; when
    // those are too few for the pool (one token at long context), one task per
    // segment, folded in the same order in the merge. The same folds either way.
    let want = 2 * pool.n_threads();
    let per_segment = blocks.len() * nkv < want;
    let n_seg: Vec<usize> = if per_segment {
        (ranges.iter())
            .map(|&(lo, hi)| segments(lo, hi, segment).count().max(1))
            .collect()
    } else {
        vec![1; blocks.len()]
    };
    // Still too few tasks (one token in a short window: one segment, or a long one
    // and a sliver): the q heads of a KV head are split into `parts` runs, each task
    // reading the same keys for fewer rows. Rows are computed alone, so their results
    // do not depend on the split.
    let n_tasks = nkv * n_seg.iter().sum::<usize>();
    let parts = (1..=group)
        .find(|&p| group.is_multiple_of(p) && n_tasks * p >= want)
        .unwrap_or(group);
    let gp = group / parts;
    // Tasks (block, KV head, head part, segment index), later blocks (longer ranges)
    // first so the pool ends balanced; `first[b]` is block b's first task, then each
    // (KV head, part)'s run of `n_seg[b]` tasks.
    let mut tasks = Vec::new();
    let mut first = vec![0usize; blocks.len()];
    for b in (0..blocks.len()).rev() {
        first[b] = tasks.len();
        for kvh in 0..nkv {
            for part in 0..parts {
                tasks.extend((0..n_seg[b]).map(|k| (b, kvh, part, k)));
            }
        }
    }
    let slots: Vec<OnceLock<Partial>> = (0..tasks.len()).map(|_| OnceLock::new()).collect();
    pool.run(tasks.len(), |i| {
        let (b, kvh, part, k) = tasks[i];
        let block = &blocks[b];
        let (lo, hi) = ranges[b];
        let heads = kvh * group + part * gp..kvh * group + (part + 1) * gp;
        let run = |(c0, c1)| run_task(shape, &views[block.seq], q, block, &heads, c0..c1);
        let p = if per_segment {
            segments(lo, hi, segment)
                .nth(k)
                .map_or_else(|| run((lo, lo)), run)
        } else {
            let mut segs = segments(lo, hi, segment).map(run);
            let mut state = segs.next().unwrap_or_else(|| run((lo, lo)));
            for p in segs {
                state.fold(&p, hv);
            }
            state
        };
        let _ = slots[i].set(p);
    });

    let mut partials: Vec<Partial> = slots
        .into_iter()
        .map(|s| s.into_inner().expect("every attention task ran"))
        .collect();
    // Fold each (block, KV head, part)'s segment partials into its first, in order
    // (only when tasks were per segment).
    if per_segment {
        for b in 0..blocks.len() {
            for run in 0..nkv * parts {
                let i0 = first[b] + run * n_seg[b];
                let (head, rest) = partials[i0..i0 + n_seg[b]].split_at_mut(1);
                for p in rest.iter() {
                    head[0].fold(p, hv);
                }
            }
        }
    }
    // Each token's block, for the output below.
    let mut block_of = vec![0usize; batch.len()];
    for (b, block) in blocks.iter().enumerate() {
        block_of[block.t0..block.t0 + block.n].fill(b);
    }
    // Every row normalised into the output, tokens in parallel.
    const TOKENS_PER_TASK: usize = 8;
    let mut out = vec![0f32; batch.len() * nh * hv];
    pool.for_each_chunk_mut(&mut out, TOKENS_PER_TASK * nh * hv, |c, rows| {
        for (j, row) in rows.chunks_exact_mut(nh * hv).enumerate() {
            let t = c * TOKENS_PER_TASK + j;
            let b = block_of[t];
            let i = t - blocks[b].t0;
            for kvh in 0..nkv {
                for g in 0..group {
                    let p = &partials[first[b] + (kvh * parts + g / gp) * n_seg[b]];
                    let r = i * gp + g % gp;
                    let head = kvh * group + g;
                    let sink = shape.sinks.map(|s| s[head]);
                    p.normalise_row(r, hv, sink, &mut row[head * hv..(head + 1) * hv]);
                }
            }
        }
    });
    out
}

impl Partial {
    /// Folds `p` (the partial of a later segment, same rows) into `self`, row by row:
    /// the one merge step both task shapes use, so their results agree bit for bit.
    fn fold(&mut self, p: &Partial, hv: usize) {
        for r in 0..self.m.len() {
            self.fold_row(r, p, hv);
        }
    }

    /// Row `r` of [`Partial::fold`]. A segment the row does not see (max −∞) changes
    /// nothing.
    fn fold_row(&mut self, r: usize, p: &Partial, hv: usize) {
        let pm = p.m[r];
        if pm == f32::NEG_INFINITY {
            return;
        }
        let acc = &mut self.acc[r * hv..(r + 1) * hv];
        let pacc = &p.acc[r * hv..(r + 1) * hv];
        if self.m[r] == f32::NEG_INFINITY {
            self.m[r] = pm;
            self.l[r] = p.l[r];
            acc.copy_from_slice(pacc);
            return;
        }
        let m = self.m[r].max(pm);
        let (a, b) = ((self.m[r] - m).exp(), (pm - m).exp());
        self.m[r] = m;
        self.l[r] = self.l[r] * a + p.l[r] * b;
        if a != 1.0 {
            acc.iter_mut().for_each(|x| *x *= a);
        }
        axpy_f32(acc, b, pacc);
    }

    /// Row `r`'s output (`o`, zero on entry): the weighted sum over the total weight,
    /// a sink's weight included (as ggml adds it, after the keys: when it exceeds the
    /// running maximum, the sum so far is rescaled to it).
    fn normalise_row(&self, r: usize, hv: usize, sink: Option<f32>, o: &mut [f32]) {
        let (m, mut l) = (self.m[r], self.l[r]);
        let mut rescale = 1.0;
        if let Some(s) = sink {
            if s > m {
                rescale = (m - s).exp();
                l = l * rescale + 1.0;
            } else {
                l += (s - m).exp();
            }
        }
        if l == 0.0 {
            return;
        }
        axpy_f32(o, rescale / l, &self.acc[r * hv..(r + 1) * hv]);
    }
}

/// One task: the query rows of `block` for q heads `heads` (which share one KV head),
/// over KV positions `range` (each row limited to the positions it sees).
fn run_task(
    shape: &Shape<'_>,
    kv: &LayerKv<'_>,
    q: &[f32],
    block: &Block,
    heads: &std::ops::Range<usize>,
    range: std::ops::Range<usize>,
) -> Partial {
    let (nh, hk, hv) = (
        shape.heads.n_head,
        shape.heads.head_dim_k,
        shape.heads.head_dim_v,
    );
    let kvh = heads.start / (nh / shape.heads.n_head_kv);
    let group = heads.len();
    let rows = block.n * group;
    // Query rows `i * group + g`: token `block.t0 + i`, head `heads.start + g`.
    let mut qs = vec![0f32; rows * hk];
    for (r, dst) in qs.chunks_exact_mut(hk).enumerate() {
        let (t, head) = (block.t0 + r / group, heads.start + r % group);
        dst.copy_from_slice(&q[(t * nh + head) * hk..(t * nh + head + 1) * hk]);
    }
    let precision = kv.precision();
    precision.round_query(&mut qs);
    // For int8 keys, the query rows in `q8_0` (as llama.cpp quantises Q for a `q8_0`
    // cache), so each score is ggml's integer block dot.
    let q8_row = hk / 32 * 34;
    let q8: Option<Vec<u8>> = precision.int8_keys().then(|| {
        let mut out = vec![0u8; rows * q8_row];
        for (x, o) in qs.chunks_exact(hk).zip(out.chunks_exact_mut(q8_row)) {
            llamay_kernels::quantize_row(GgmlType::Q8_0, x, o);
        }
        out
    });

    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    let mut acc = vec![0f32; rows * hv];
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
    for tile in tiles.clone() {
        let ts = tile * TILE;
        let te = (ts + TILE).min(range.end);
        let n = te - ts;
        // A few rows (decode, a short draft): the next tile's keys and values (inside
        // the range, so its page is held), prefetched while this one is computed.
        let (mut next_k, mut next_v) = (Next::NONE, Next::NONE);
        if rows <= PREFETCH_ROWS && tile + 1 < tiles.end {
            if q8.is_none() {
                next_k = Next::of(kv.key_tile(tile + 1, kvh * hk, hk));
            }
            if let Some((v, _)) = kv.value_rows(ts + TILE, kvh * hv) {
                next_v = Next::of(v);
            }
        }
        // A whole tile of an f32 or f16 cache is read where it lies; a partial one is
        // copied with zeros past its end (stale slots of a page may hold anything).
        let (values, vs) = match kv.value_rows(ts, kvh * hv) {
            Some(rows) if n == TILE => rows,
            _ => {
                vt[n * hv..].fill(0.0);
                kv.values_into(ts, n, kvh * hv, hv, &mut vt);
                (KvRows::F32(&vt[..]), hv)
            }
        };
        match &q8 {
            Some(q8) => {
                let (keys, stride) = kv.key_rows_q8(tile, kvh * hk);
                for (r, srow) in s.chunks_exact_mut(TILE).enumerate() {
                    let qr = &q8[r * q8_row..(r + 1) * q8_row];
                    for (j, sj) in srow.iter_mut().enumerate() {
                        *sj = if j < n {
                            let k = &keys[j * stride..j * stride + q8_row];
                            llamay_kernels::vec_dot(GgmlType::Q8_0, k, qr, hk)
                        } else {
                            0.0
                        };
                    }
                }
            }
            None => {
                let keys = kv.key_tile(tile, kvh * hk, hk);
                scores_tile(&qs, rows, hk, keys, next_k, &mut s);
            }
        }
        for i in 0..block.n {
            let pos = block.pos0 + i;
            // Tile-local positions this token sees.
            let lo = first(pos, shape.window).max(range.start).max(ts);
            let hi = block.end_of(i).min(te);
            let (a, b) = (lo - ts, hi.saturating_sub(ts));
            for r in i * group..(i + 1) * group {
                let srow: &mut [f32; TILE] = (&mut s[r * TILE..(r + 1) * TILE])
                    .try_into()
                    .expect("a score row is TILE long");
                let c = softmax_row(
                    srow,
                    a..b,
                    shape.heads.scale,
                    shape.heads.softcap,
                    &mut m[r],
                    &mut l[r],
                );
                if c != 1.0 {
                    acc[r * hv..(r + 1) * hv].iter_mut().for_each(|x| *x *= c);
                }
            }
        }
        pv_tile(&s, rows, (values, vs), hv, next_v, &mut acc);
    }
    Partial { m, l, acc }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvPool, KvPrecision, SeqId};

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

    /// Plain attention in f64 over the cache's (rounded) keys and values, the query
    /// rounded as the cache's score product reads it.
    fn reference(shape: &Shape<'_>, views: &[LayerKv<'_>], batch: &[Slot], q: &[f32]) -> Vec<f64> {
        let (nh, hk, hv) = (
            shape.heads.n_head,
            shape.heads.head_dim_k,
            shape.heads.head_dim_v,
        );
        let group = nh / shape.heads.n_head_kv;
        let mut out = vec![0f64; batch.len() * nh * hv];
        for (t, bt) in batch.iter().enumerate() {
            let kv = &views[bt.seq];
            let n = bt.end;
            let (ks, vs) = (shape.heads.n_head_kv * hk, shape.heads.n_head_kv * hv);
            let keys: Vec<Vec<f32>> = (0..n).map(|p| kv.key_row(p)).collect();
            let mut values = vec![0f32; n * vs];
            for p in 0..n {
                kv.values_into(p, 1, 0, vs, &mut values[p * vs..(p + 1) * vs]);
            }
            for head in 0..nh {
                let kvh = head / group;
                let mut qv = q[(t * nh + head) * hk..(t * nh + head + 1) * hk].to_vec();
                kv.precision().round_query(&mut qv);
                if kv.precision().int8_keys() {
                    let mut b = vec![0u8; hk / 32 * 34];
                    llamay_kernels::quantize_row(GgmlType::Q8_0, &qv, &mut b);
                    llamay_kernels::dequantize_q8_0(&b, &mut qv);
                }
                let lo = first(bt.pos, shape.window);
                let scores: Vec<f64> = (lo..n)
                    .map(|p| {
                        let k = &keys[p][kvh * hk..(kvh + 1) * hk];
                        debug_assert_eq!(keys[p].len(), ks);
                        let d: f64 = qv
                            .iter()
                            .zip(k)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum();
                        let s = d * f64::from(shape.heads.scale);
                        match shape.heads.softcap {
                            Some(c) => (s / f64::from(c)).tanh() * f64::from(c),
                            None => s,
                        }
                    })
                    .collect();
                let sink = shape.sinks.map(|s| f64::from(s[head]));
                let max = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
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

    /// Writes `n` random positions per sequence of `order` into `pool` (every layer).
    fn write(pool: &mut KvPool, order: &[(SeqId, usize)], n_layer: usize, rng: &mut Rng) {
        let (kd, vd) = pool.dims();
        let mut plan: Vec<(SeqId, usize)> = Vec::new();
        for &(s, _) in order {
            match plan.iter_mut().find(|(q, _)| *q == s) {
                Some(p) => p.1 += 1,
                None => plan.push((s, 1)),
            }
        }
        let targets = pool.reserve(&plan, order).unwrap();
        for t in 0..order.len() {
            for layer_targets in targets.iter().take(n_layer) {
                let k: Vec<f32> = (0..kd).map(|_| rng.f() * 2.0).collect();
                let v: Vec<f32> = (0..vd).map(|_| rng.f()).collect();
                let (page, slot) = layer_targets[t];
                pool.store_mut().write(page, slot, &k, &v);
            }
        }
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
        mode: Mode,
    ) {
        let mut rng = Rng(seed);
        // Sinks from well below to well above the scores (|score| ≲ 6 here), so both of
        // the final step's branches run.
        let sinks: Vec<f32> = (0..nh)
            .map(|h| 8.0 * (h as f32 / nh as f32) - 4.0 + rng.f())
            .collect();
        let bidirectional = mode == Mode::Bidirectional;
        let shape = Shape {
            heads: AttentionShape {
                n_head: nh,
                n_head_kv: nkv,
                head_dim_k: hk,
                head_dim_v: hv,
                scale: 1.5 / (hk as f32).sqrt(),
                softcap,
            },
            window,
            sinks: (mode == Mode::Sinks).then_some(&sinks[..]),
        };
        let (kd, vd) = (nkv * hk, nkv * hv);
        let n_layer = 2;
        let il = 1;
        // No window in the pool: the reference reads every position.
        let mut pool = KvPool::new(
            precision,
            kd,
            vd,
            vec![None; n_layer],
            prior + new,
            4 * (prior + new) + 256,
        );
        let seqs = [pool.new_sequence(), pool.new_sequence()];
        for &s in &seqs {
            let order: Vec<(SeqId, usize)> = (0..prior).map(|p| (s, p)).collect();
            if prior > 0 {
                write(&mut pool, &order, n_layer, &mut rng);
                pool.commit(s, &vec![0; prior]);
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
                    let pos = next[seq];
                    batch.push(Slot {
                        seq,
                        pos,
                        // An encoder's token sees its whole sequence.
                        end: if bidirectional { prior + new } else { pos + 1 },
                    });
                    next[seq] += 1;
                }
            }
            seq = 1 - seq;
        }
        let order: Vec<(SeqId, usize)> = batch.iter().map(|b| (seqs[b.seq], b.pos)).collect();
        write(&mut pool, &order, n_layer, &mut rng);
        let views: Vec<LayerKv<'_>> = seqs.iter().map(|&s| pool.layer(s, il)).collect();
        let q: Vec<f32> = (0..batch.len() * nh * hk).map(|_| rng.f() * 2.0).collect();
        let want = reference(&shape, &views, &batch, &q);
        let pools = [ThreadPool::new(1), ThreadPool::new(3)];
        let tunings = [
            TUNING,
            Tuning {
                block: 3,
                segment: 16,
            },
            Tuning {
                block: 1,
                segment: 48,
            },
            Tuning {
                block: 64,
                segment: 4096,
            },
        ];
        // Each tuning's result on one thread; on three, the same bits (more tasks, and
        // at one token the q heads split among them, change nothing).
        let mut alone: Vec<Vec<f32>> = Vec::new();
        for tp in &pools {
            for (k, tuning) in tunings.iter().enumerate() {
                let got = attention_with(&shape, tuning, &views, &batch, &q, tp);
                match alone.get(k) {
                    Some(a) => assert!(
                        a.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{tuning:?}: {} threads differ from one; heads {nh}/{nkv}, \
                         window {window:?}, {precision:?}, {mode:?}",
                        tp.n_threads()
                    ),
                    None => alone.push(got.clone()),
                }
                assert_eq!(got.len(), want.len());
                for (r, (g, w)) in got.chunks(hv).zip(want.chunks(hv)).enumerate() {
                    let scale = w.iter().fold(0f64, |a, b| a.max(b.abs())).max(1e-3);
                    for (x, y) in g.iter().zip(w) {
                        let err = (f64::from(*x) - y).abs() / scale;
                        assert!(
                            err < 1e-5,
                            "row {r}: {x} vs {y} (rel {err:e}); {tuning:?}, {} threads, \
                             heads {nh}/{nkv}, window {window:?}, softcap {softcap:?}, \
                             {precision:?}, {mode:?}",
                            tp.n_threads()
                        );
                    }
                }
            }
        }
    }

    /// What a `case` adds to causal attention.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Mode {
        Causal,
        /// Every token of a sequence sees all of it (an encoder).
        Bidirectional,
        /// Causal, with a sink logit per head (gpt-oss).
        Sinks,
    }

    #[test]
    fn flash_and_split_paths_match_plain_attention() {
        use KvPrecision::{F16, F32, Q8, Vq8};
        use Mode::{Bidirectional, Causal, Sinks};
        // Prefill on an empty cache, GQA 4:1, differing K and V head sizes.
        case(1, 4, 1, 32, 16, None, None, 0, 40, F32, Causal);
        // Prefill after context, sliding window shorter than the batch, soft-cap.
        case(2, 8, 2, 16, 16, Some(7), Some(3.0), 30, 23, F32, Causal);
        case(3, 2, 2, 24, 24, Some(50), None, 60, 9, F16, Causal);
        // Decode of one token at long context (the split path), with and without
        // a window, f16 and f32.
        case(4, 4, 1, 64, 64, None, None, 700, 1, F16, Causal);
        case(5, 4, 1, 64, 64, Some(300), Some(50.0), 700, 1, F32, Causal);
        case(6, 6, 3, 8, 8, None, Some(1.0), 333, 2, F16, Causal);
        // int8 values, and int8 keys with the integer score product: prefill and the
        // split decode path.
        case(7, 4, 2, 32, 64, Some(20), None, 30, 23, Vq8, Causal);
        case(8, 8, 2, 64, 32, None, Some(30.0), 100, 40, Q8, Causal);
        case(9, 4, 1, 64, 64, Some(300), None, 700, 1, Q8, Causal);
        // Bidirectional (an encoder): every token of a sequence sees all of it,
        // short and past a segment, f32 and f16.
        case(10, 4, 4, 32, 32, None, None, 0, 40, F32, Bidirectional);
        case(
            11,
            8,
            2,
            16,
            16,
            None,
            Some(5.0),
            0,
            600,
            F16,
            Bidirectional,
        );
        case(12, 2, 1, 64, 64, None, None, 0, 3, F32, Bidirectional);
        // Sinks: prefill with a window (gpt-oss's sliding layers), the split decode
        // path at depth, f16 and int8 keys.
        case(13, 8, 2, 64, 64, Some(16), None, 30, 23, F32, Sinks);
        case(14, 4, 1, 64, 64, None, None, 700, 1, F16, Sinks);
        case(15, 8, 2, 64, 64, Some(128), None, 300, 9, Q8, Sinks);
    }

    #[test]
    fn one_token_at_long_context_gets_one_task_per_segment() {
        let shape = Shape {
            heads: AttentionShape {
                n_head: 4,
                n_head_kv: 1,
                head_dim_k: 256,
                head_dim_v: 256,
                scale: 1.0,
                softcap: None,
            },
            window: None,
            sinks: None,
        };
        let at = |pos: usize, n: usize| {
            let batch: Vec<Slot> = (pos..pos + n).map(|pos| Slot::causal(0, pos)).collect();
            blocks(&batch, TUNING.block)
        };
        let local = Shape {
            window: Some(512),
            ..shape
        };
        assert_eq!(at(4095, 1)[0].range(&shape), (0, 4096));
        assert_eq!(at(4095, 1)[0].range(&local), (3584, 4096));
        let count = |b: &[Block], sh: &Shape<'_>| {
            let (lo, hi) = b[0].range(sh);
            segments(lo, hi, TUNING.segment).count()
        };
        assert_eq!(count(&at(4095, 1), &shape), 8);
        assert_eq!(count(&at(4095, 1), &local), 1);
        assert_eq!(count(&at(100, 1), &shape), 1);
        // A window that starts mid-segment: the first segment is cut at its start.
        assert_eq!(
            segments(3000, 4096, 256).collect::<Vec<_>>()[..2],
            [(3000, 3072), (3072, 3328)]
        );
        assert_eq!(segments(5, 5, 256).count(), 0);
        // A prefill batch has blocks enough.
        assert_eq!(at(4096, 512).len(), 32);
    }

    /// The attention this module replaced: per (token, head), a full score vector, a
    /// softmax, then one axpy per value, over f32 keys and values, split over
    /// (token, head) pairs. Kept here only as the timing baseline of `bench`.
    fn previous(
        shape: &Shape<'_>,
        keys: &[f32],
        values: &[f32],
        batch: &[Slot],
        q: &[f32],
        pool: &ThreadPool,
    ) -> Vec<f32> {
        let (nh, hk, hv) = (
            shape.heads.n_head,
            shape.heads.head_dim_k,
            shape.heads.head_dim_v,
        );
        let group = nh / shape.heads.n_head_kv;
        let (kdim, vdim) = (shape.heads.n_head_kv * hk, shape.heads.n_head_kv * hv);
        let parts = crate::tensor::parallel_ranges(batch.len() * nh, pool, |range| {
            let mut out = vec![0f32; range.len() * hv];
            let mut scores = Vec::new();
            let mut qbuf = vec![0f32; hk];
            for (i, w) in range.enumerate() {
                let (t, head) = (w / nh, w % nh);
                let bt = batch[t];
                let kvh = head / group;
                qbuf.copy_from_slice(&q[(t * nh + head) * hk..(t * nh + head + 1) * hk]);
                KvPrecision::F16.round_query(&mut qbuf);
                let lo = first(bt.pos, shape.window);
                scores.clear();
                for p in lo..=bt.pos {
                    let k = &keys[p * kdim + kvh * hk..p * kdim + (kvh + 1) * hk];
                    scores.push(llamay_kernels::dot_f32(&qbuf, k) * shape.heads.scale);
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
        // LLAMAY_BENCH_COLD=1: 128 MiB are read between repetitions (untimed), so the
        // cache comes from DRAM, as in a decode step after the weights' matmuls.
        let cold = std::env::var("LLAMAY_BENCH_COLD").is_ok_and(|v| v == "1");
        let flush: Vec<u8> = (0..if cold { 128usize << 20 } else { 0 })
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        let best = |f: &mut dyn FnMut() -> Vec<f32>, reps: usize| {
            (0..reps)
                .map(|_| {
                    // Read, not written: a decode step's weights leave clean lines, and
                    // dirty ones would add their write-backs to the timed reads.
                    let sum = flush.chunks(64).fold(0u8, |a, l| a.wrapping_add(l[0]));
                    std::hint::black_box(sum);
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
            segment: env("LLAMAY_BENCH_SEGMENT", TUNING.segment),
        };
        for ((nh, nkv, hd, depth), cases) in shapes {
            let mut rng = Rng(9);
            let precision = std::env::var("LLAMAY_BENCH_KV")
                .ok()
                .and_then(|s| KvPrecision::parse(&s))
                .unwrap_or(KvPrecision::F16);
            let n = depth + 512;
            let mut cache = KvPool::new(precision, nkv * hd, nkv * hd, vec![None], n, n + 64);
            let s = cache.new_sequence();
            let order: Vec<(SeqId, usize)> = (0..n).map(|p| (s, p)).collect();
            let targets = cache.reserve(&[(s, n)], &order).unwrap();
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for &(page, slot) in &targets[0] {
                let k: Vec<f32> = (0..nkv * hd).map(|_| rng.f()).collect();
                let v: Vec<f32> = (0..nkv * hd).map(|_| rng.f()).collect();
                cache.store_mut().write(page, slot, &k, &v);
                // The previous attention read f32 rows widened from the f16 cache.
                keys.extend(k.iter().map(|&x| half::f16::from_f32(x).to_f32()));
                values.extend(v.iter().map(|&x| half::f16::from_f32(x).to_f32()));
            }
            let views = [cache.layer(s, 0)];
            for &(name, window, len, reps) in cases {
                // LLAMAY_BENCH_CASE=decode runs only the cases whose name holds it, and
                // LLAMAY_BENCH_REPS multiplies their repetitions (for a profiler).
                if std::env::var("LLAMAY_BENCH_CASE").is_ok_and(|c| !name.contains(c.as_str())) {
                    continue;
                }
                let reps = reps * env("LLAMAY_BENCH_REPS", 1);
                let shape = Shape {
                    heads: AttentionShape {
                        n_head: nh,
                        n_head_kv: nkv,
                        head_dim_k: hd,
                        head_dim_v: hd,
                        scale: 0.0625,
                        softcap: None,
                    },
                    window,
                    sinks: None,
                };
                let batch: Vec<Slot> = (depth..depth + len)
                    .map(|pos| Slot::causal(0, pos))
                    .collect();
                let q: Vec<f32> = (0..len * nh * hd).map(|_| rng.f()).collect();
                let new = best(
                    &mut || attention_with(&shape, &tuning, &views, &batch, &q, &pool),
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
