//! The KV cache of one sequence. The paged allocator and the quantised precisions plug
//! in behind the same methods.

/// How keys and values are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPrecision {
    /// Exact: what the projections produced.
    F32,
    /// Rounded to f16, as llama.cpp's default cache (`-ctk f16 -ctv f16`) holds them;
    /// queries are rounded to f16 for the Q·K product too, as its f16 dot does. Chosen
    /// to reproduce llama.cpp's default numerics; stored widened (memory as f32).
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

    pub(crate) fn round(self, x: &mut [f32]) {
        if self == KvPrecision::F16 {
            for v in x {
                *v = half::f16::from_f32(*v).to_f32();
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
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
    /// Most positions this sequence may hold (the context size).
    capacity: usize,
}

impl KvCache {
    pub fn new(
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
            k: vec![Vec::new(); n_layer],
            v: vec![Vec::new(); n_layer],
            len: 0,
            capacity,
        }
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

    /// Appends the keys and values of `n` new positions for `layer`; the caller appends
    /// every layer, then calls [`KvCache::commit`].
    pub(crate) fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let (ks, vs) = (self.k[layer].len(), self.v[layer].len());
        self.k[layer].extend_from_slice(k);
        self.v[layer].extend_from_slice(v);
        self.precision.round(&mut self.k[layer][ks..]);
        self.precision.round(&mut self.v[layer][vs..]);
    }

    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Keys of `layer` for positions `0..n` (including uncommitted ones of the batch).
    pub(crate) fn keys(&self, layer: usize) -> &[f32] {
        &self.k[layer]
    }

    pub(crate) fn values(&self, layer: usize) -> &[f32] {
        &self.v[layer]
    }

    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.k_dim, self.v_dim)
    }

    /// Forgets positions from `pos` on (a new turn, a stop string).
    pub fn truncate(&mut self, pos: usize) {
        if pos < self.len {
            for l in &mut self.k {
                l.truncate(pos * self.k_dim);
            }
            for l in &mut self.v {
                l.truncate(pos * self.v_dim);
            }
            self.len = pos;
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|l| l.len() * 4).sum()
    }
}
