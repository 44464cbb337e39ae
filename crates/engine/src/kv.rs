//! The KV cache of one sequence. The paged allocator and the quantised precisions plug
//! in behind the same methods.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Grows `v` to hold `need` elements: capacity in chunks of CHUNK rows of `dim`, never
/// past `max_rows` rows (unless `need` itself is more).
fn reserve_rows<T>(v: &mut Vec<T>, need: usize, dim: usize, max_rows: usize) {
    if need > v.capacity() {
        let rows = need.div_ceil(dim.max(1));
        let target = rows.next_multiple_of(CHUNK).min(max_rows).max(rows) * dim;
        v.reserve_exact(target - v.len());
    }
}

/// Positions per key tile: keys are stored transposed in tiles of this many positions,
/// the layout attention's score products read (a tile's keys in SIMD lanes), so reading
/// a tile is one contiguous copy, never a transposition.
pub(crate) const KEY_TILE: usize = llamay_kernels::attn_tile::TILE;

/// How keys and values are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPrecision {
    /// Exact: what the projections produced.
    F32,
    /// Stored as f16, as llama.cpp's default cache (`-ctk f16 -ctv f16`) holds them
    /// (half the memory of f32); queries are rounded to f16 for the Q·K product too, as
    /// its f16 dot does, and products accumulate in f32.
    F16,
}

impl KvPrecision {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(KvPrecision::F32),
            "f16" => Some(KvPrecision::F16),
            _ => None,
        }
    }

    /// Rounds `x` through this precision (a no-op for f32).
    pub(crate) fn round(self, x: &mut [f32]) {
        if self == KvPrecision::F16 {
            for v in x {
                *v = f16::from_f32(*v).to_f32();
            }
        }
    }

    fn elem_bytes(self) -> usize {
        match self {
            KvPrecision::F32 => 4,
            KvPrecision::F16 => 2,
        }
    }
}

/// Positions the storage grows by: the cache reserves whole chunks (never past the
/// context size) instead of growing per token or doubling.
const CHUNK: usize = 256;

/// One layer's keys or values, `[len][dim]`, at the cache's precision.
#[derive(Clone, Debug)]
enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Store {
    fn new(precision: KvPrecision) -> Self {
        match precision {
            KvPrecision::F32 => Store::F32(Vec::new()),
            KvPrecision::F16 => Store::F16(Vec::new()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Store::F32(v) => v.len(),
            Store::F16(v) => v.len(),
        }
    }

    fn allocated(&self) -> usize {
        match self {
            Store::F32(v) => v.capacity() * 4,
            Store::F16(v) => v.capacity() * 2,
        }
    }

    /// Appends `x` (whole rows of `dim`), reserving whole chunks of positions up to
    /// `max_rows`.
    fn append(&mut self, x: &[f32], dim: usize, max_rows: usize) {
        match self {
            Store::F32(v) => {
                reserve_rows(v, v.len() + x.len(), dim, max_rows);
                v.extend_from_slice(x);
            }
            Store::F16(v) => {
                reserve_rows(v, v.len() + x.len(), dim, max_rows);
                let start = v.len();
                v.resize(start + x.len(), f16::ZERO);
                v[start..].convert_from_f32_slice(x);
            }
        }
    }

    /// Appends the rows of `x` (`dim` values each) as positions `row0..` of a store laid
    /// out in key tiles: `[tile][dim][KEY_TILE]`, position p at lane p % KEY_TILE of tile
    /// p / KEY_TILE. Whole tiles are allocated (zero lanes past the last row).
    fn append_tiled(&mut self, x: &[f32], dim: usize, row0: usize, max_rows: usize) {
        let rows = x.len() / dim.max(1);
        let need = (row0 + rows).div_ceil(KEY_TILE) * KEY_TILE * dim;
        fn scatter<T: Copy>(
            v: &mut Vec<T>,
            x: &[f32],
            dim: usize,
            row0: usize,
            need: usize,
            max_rows: usize,
            conv: impl Fn(f32) -> T,
        ) {
            reserve_rows(v, need, dim, max_rows.next_multiple_of(KEY_TILE));
            if v.len() < need {
                v.resize(need, conv(0.0));
            }
            for (r, row) in x.chunks_exact(dim).enumerate() {
                let p = row0 + r;
                let base = (p / KEY_TILE) * dim * KEY_TILE + p % KEY_TILE;
                for (c, &val) in row.iter().enumerate() {
                    v[base + c * KEY_TILE] = conv(val);
                }
            }
        }
        match self {
            Store::F32(v) => scatter(v, x, dim, row0, need, max_rows, |x| x),
            Store::F16(v) => scatter(v, x, dim, row0, need, max_rows, f16::from_f32),
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            Store::F32(v) => v.truncate(n),
            Store::F16(v) => v.truncate(n),
        }
    }

    fn rows(&self) -> KvRows<'_> {
        match self {
            Store::F32(v) => KvRows::F32(v),
            Store::F16(v) => KvRows::F16(v),
        }
    }
}

/// One layer's keys or values as attention reads them: `[positions][dim]`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl<'a> KvRows<'a> {
    /// Columns `off..off + len` of rows `p0..p0 + n` (rows `stride` apart) written to
    /// `dst` as `n` contiguous f32 rows: one pass, copied from f32 storage or widened
    /// from f16.
    pub(crate) fn rows_into(
        self,
        p0: usize,
        n: usize,
        stride: usize,
        off: usize,
        len: usize,
        dst: &mut [f32],
    ) {
        for (j, d) in dst[..n * len].chunks_exact_mut(len).enumerate() {
            let at = (p0 + j) * stride + off;
            match self {
                KvRows::F32(s) => d.copy_from_slice(&s[at..at + len]),
                KvRows::F16(s) => llamay_kernels::widen_f16(&s[at..at + len], d),
            }
        }
    }

    /// Tile `t` of a key store (`[tile][stride][KEY_TILE]`, see `Store::append_tiled`):
    /// the `len` values from `off` of every position in it, transposed (`len ×
    /// KEY_TILE`, value d of lane j at `d * KEY_TILE + j`). f32 rows are borrowed, f16
    /// ones widened into `buf`. Lanes past the store's last row hold zeros or stale keys:
    /// the caller masks them.
    pub(crate) fn key_tile<'b>(
        self,
        t: usize,
        stride: usize,
        off: usize,
        len: usize,
        buf: &'b mut Vec<f32>,
    ) -> &'b [f32]
    where
        'a: 'b,
    {
        let at = (t * stride + off) * KEY_TILE;
        match self {
            KvRows::F32(s) => &s[at..at + len * KEY_TILE],
            KvRows::F16(s) => {
                buf.resize(len * KEY_TILE, 0.0);
                llamay_kernels::widen_f16(&s[at..at + len * KEY_TILE], buf);
                buf
            }
        }
    }
}

/// Keys and values of every layer for the positions a sequence has seen.
#[derive(Clone, Debug)]
pub struct KvCache {
    precision: KvPrecision,
    k_dim: usize,
    v_dim: usize,
    /// Per layer: keys `[len][k_dim]`, values `[len][v_dim]`.
    k: Vec<Store>,
    v: Vec<Store>,
    len: usize,
    /// Most positions this sequence may hold (the context size).
    capacity: usize,
    /// The model that made this cache (0: made inside the crate, for tests).
    model: u64,
    /// Set while a batch writes uncommitted rows; still set after a panic mid-batch,
    /// when the layers hold different numbers of rows and the next append would land
    /// at the wrong position. `truncate` restores a consistent state.
    interrupted: bool,
}

impl KvCache {
    pub(crate) fn new(
        n_layer: usize,
        k_dim: usize,
        v_dim: usize,
        capacity: usize,
        precision: KvPrecision,
    ) -> Self {
        KvCache {
            precision,
            k_dim,
            v_dim,
            k: (0..n_layer).map(|_| Store::new(precision)).collect(),
            v: (0..n_layer).map(|_| Store::new(precision)).collect(),
            len: 0,
            capacity,
            model: 0,
            interrupted: false,
        }
    }

    pub(crate) fn owned_by(mut self, model: u64) -> Self {
        self.model = model;
        self
    }

    /// Why this cache cannot take a batch of model `model` (`n_layer` layers of keys
    /// `k_dim` and values `v_dim` wide), if it cannot.
    pub(crate) fn unfit_for(
        &self,
        model: u64,
        n_layer: usize,
        k_dim: usize,
        v_dim: usize,
    ) -> Option<String> {
        if self.model != model {
            return Some("was made by another model".into());
        }
        if (self.k.len(), self.k_dim, self.v_dim) != (n_layer, k_dim, v_dim) {
            return Some(format!(
                "holds {} layers of keys {} and values {} wide; this model has {n_layer} layers of {k_dim} and {v_dim}",
                self.k.len(),
                self.k_dim,
                self.v_dim
            ));
        }
        None
    }

    pub(crate) fn is_interrupted(&self) -> bool {
        self.interrupted
    }

    /// Marks the start of a batch that appends to this cache; [`KvCache::commit`]
    /// ends it.
    pub(crate) fn begin(&mut self) {
        self.interrupted = true;
    }

    pub fn precision(&self) -> KvPrecision {
        self.precision
    }

    /// Positions stored (the next token's position).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Appends the keys and values of `n` new positions for `layer` (rounded to the
    /// cache's precision); the caller appends every layer, then calls
    /// [`KvCache::commit`].
    pub(crate) fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let row0 = self.v[layer].len() / self.v_dim.max(1);
        self.k[layer].append_tiled(k, self.k_dim, row0, self.capacity);
        self.v[layer].append(v, self.v_dim, self.capacity);
    }

    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
        self.interrupted = false;
    }

    /// Keys of `layer` for positions `0..n` (including uncommitted ones of the batch).
    pub(crate) fn keys(&self, layer: usize) -> KvRows<'_> {
        self.k[layer].rows()
    }

    pub(crate) fn values(&self, layer: usize) -> KvRows<'_> {
        self.v[layer].rows()
    }

    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.k_dim, self.v_dim)
    }

    /// Forgets positions from `pos` on (a new turn, a stop string), and any rows an
    /// interrupted batch left uncommitted. The memory stays reserved for the positions
    /// that follow.
    pub fn truncate(&mut self, pos: usize) {
        let pos = pos.min(self.len);
        for l in &mut self.k {
            l.truncate(pos.div_ceil(KEY_TILE) * KEY_TILE * self.k_dim);
        }
        for l in &mut self.v {
            l.truncate(pos * self.v_dim);
        }
        self.len = pos;
        self.interrupted = false;
    }

    /// Bytes the stored positions take at the cache's precision (2 per value for f16,
    /// 4 for f32).
    pub fn bytes(&self) -> usize {
        let rows: usize = self.v.iter().map(|v| v.len() / self.v_dim.max(1)).sum();
        rows * (self.k_dim + self.v_dim) * self.precision.elem_bytes()
    }

    /// Bytes allocated, including positions reserved ahead (at most one chunk of
    /// [`CHUNK`] positions per layer beyond [`KvCache::bytes`], or what a truncation
    /// left).
    pub fn bytes_allocated(&self) -> usize {
        self.k.iter().chain(&self.v).map(Store::allocated).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_cache_stores_half_the_bytes_and_rounds_like_f16() {
        let (kd, vd) = (8, 4);
        let mut a = KvCache::new(2, kd, vd, 1000, KvPrecision::F16);
        let mut b = KvCache::new(2, kd, vd, 1000, KvPrecision::F32);
        let k: Vec<f32> = (0..3 * kd).map(|i| i as f32 * 0.1234567 - 1.0).collect();
        let v: Vec<f32> = (0..3 * vd).map(|i| i as f32 * -0.7654321 + 2.0).collect();
        for c in [&mut a, &mut b] {
            for l in 0..2 {
                c.append(l, &k, &v);
            }
            c.commit(3);
        }
        assert_eq!(a.bytes() * 2, b.bytes());
        assert_eq!(b.bytes(), 2 * 3 * (kd + vd) * 4);
        assert!(a.bytes_allocated() >= a.bytes());
        // Capacity is reserved in chunks, never past the context size.
        assert!(a.bytes_allocated() <= 2 * CHUNK * (kd + vd) * 2);
        // Keys come back transposed by tile (lane = position), values as rows.
        let mut buf = Vec::new();
        let kt = a.keys(1).key_tile(0, kd, 2, 3, &mut buf).to_vec();
        for p in 0..KEY_TILE {
            for c in 0..3 {
                let want = if p < 3 {
                    f16::from_f32(k[p * kd + 2 + c]).to_f32()
                } else {
                    0.0
                };
                assert_eq!(kt[c * KEY_TILE + p], want, "position {p}, value {c}");
            }
        }
        let mut row = vec![0f32; 2];
        b.values(0).rows_into(2, 1, vd, 1, 2, &mut row);
        assert_eq!(row, &v[2 * vd + 1..2 * vd + 3]);
        a.truncate(1);
        assert_eq!((a.len(), a.bytes()), (1, 2 * (kd + vd) * 2));
        let mut small = KvCache::new(1, 4, 4, 3, KvPrecision::F32);
        small.append(0, &[0.0; 4], &[0.0; 4]);
        // Values: the 3 rows of the context; keys: one whole tile.
        assert_eq!(small.bytes_allocated(), (3 + KEY_TILE) * 4 * 4);
    }
}
