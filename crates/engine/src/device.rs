//! The lower half of the seam: what a device (a GPU crate) implements so that the one
//! forward pass runs on it. The engine names no device API; a device crate names no
//! model. Everything crosses as buffers of f32 (or u32) values the device holds, weight
//! matrices in their GGUF block formats, and [`Op`]s — each a block step with its
//! shapes — that the device records and runs in order. Nothing comes back to the host
//! but what [`Device::read`] asks for: a step recorded whole is one submission.

use llamay_formats::GgmlType;

/// A buffer of 32-bit values the device holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceBuf(pub u32);

/// A weight matrix on the device, in its file's block format: `rows` outputs of `cols`
/// inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceMatrix {
    pub id: u32,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
}

/// Why a device could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The device declines a weight, naming tensor, format and reason.
    #[error("tensor '{tensor}': {reason}")]
    Declined { tensor: String, reason: String },
    /// Anything else, in the device's words (out of memory, a failed call).
    #[error("{0}")]
    Failed(String),
}

/// Normalisation of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormOp {
    /// `x / sqrt(mean(x²) + eps)`.
    Rms,
    /// `(x - mean) / sqrt(var + eps)`.
    Layer,
}

/// An element-wise step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    /// GELU (tanh form) through f16: ggml's table (see `Op::Unary`).
    Gelu,
    /// `c·tanh(x/c)`.
    Softcap(f32),
}

/// A gated step `up ← f(up, gate)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// `up · silu(gate)`.
    Swiglu,
    /// `up · gelu(gate)`.
    Geglu,
    /// gpt-oss's clipped SwiGLU (α = 1.702, limit 7).
    SwigluOai,
}

/// What a device's KV pages hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheType {
    F32,
    /// f16 rounded to nearest even, two to a word; the query rounded to f16 for Q·K.
    F16,
}

impl CacheType {
    /// The 32-bit words `values` cache values take.
    pub fn words(self, values: usize) -> usize {
        match self {
            CacheType::F32 => values,
            CacheType::F16 => values.div_ceil(2),
        }
    }
}

/// Most buffers one of the KV caches (keys, or values) is split over: a device binds a
/// limited range per buffer (`Device::max_buffer_len`; lavapipe's is 128 MiB, less than
/// a serve's default pool of the smallest Gemma). The kernels bind this many per cache.
pub const CACHE_PARTS: usize = 8;

/// Keys or values of a KV pool on a device: page `id` is page `id % pages_per_part` of
/// buffer `parts[id / pages_per_part]`. Both caches split at the same pages. Parts past
/// those the pool needs repeat the first (every binding must name a buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheBufs {
    pub parts: [DeviceBuf; CACHE_PARTS],
    pub pages_per_part: usize,
}

impl CacheBufs {
    /// The buffer holding page `page` and the offset of that page in it, for pages of
    /// `page_words` 32-bit words.
    pub fn locate(&self, page: usize, page_words: usize) -> (DeviceBuf, usize) {
        let part = page / self.pages_per_part;
        (self.parts[part], (page % self.pages_per_part) * page_words)
    }
}

/// One step of a block over device buffers; offsets and lengths count values.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// `out = W x (+ bias)` for `n` rows of `x`: the activation quantised to the
    /// weight's dot type first (as the CPU kernels do).
    Matmul {
        w: DeviceMatrix,
        x: DeviceBuf,
        n: usize,
        out: DeviceBuf,
        bias: Option<DeviceBuf>,
    },
    /// `out = norm(x) · w (+ b)` for `rows` rows of `cols`; `out` may be `x`. The
    /// weight row for row `r` is row `r % w_rows` of `w` (per-head norms).
    Norm {
        kind: NormOp,
        x: DeviceBuf,
        out: DeviceBuf,
        rows: usize,
        cols: usize,
        w: Option<DeviceBuf>,
        w_rows: usize,
        b: Option<DeviceBuf>,
        eps: f32,
    },
    /// Rotates the first `n_rot` values of every `hd`-long head of the `n` rows of
    /// `dim` values in `x`, by `angles` (`(cos, sin)` pairs, `n_rot / 2` per row);
    /// `neox` pairs halves, else neighbours.
    Rope {
        x: DeviceBuf,
        n: usize,
        dim: usize,
        hd: usize,
        n_rot: usize,
        angles: DeviceBuf,
        neox: bool,
    },
    /// `x[i] += y[i % y_len] (+ z[i])` for `n` values: residual adds and biases.
    Add {
        x: DeviceBuf,
        y: DeviceBuf,
        y_len: usize,
        z: Option<DeviceBuf>,
        n: usize,
    },
    /// `table`: ggml's f16 GELU table for `Gelu` (65536 f16 values, two to a word, the
    /// low half first), looked up as the CPU looks it up.
    Unary {
        op: Unary,
        x: DeviceBuf,
        n: usize,
        table: Option<DeviceBuf>,
    },
    /// `table`: as for `Unary`, for `Geglu`.
    Glu {
        op: Glu,
        up: DeviceBuf,
        gate: DeviceBuf,
        n: usize,
        table: Option<DeviceBuf>,
    },
    /// `out[r] = x[index[index_offset + r]]` for `rows` rows of `cols`.
    Gather {
        x: DeviceBuf,
        index: DeviceBuf,
        index_offset: usize,
        rows: usize,
        cols: usize,
        out: DeviceBuf,
    },
    /// Row `t` of `k` (`k_dim` values) and of `v` (`v_dim`) into position
    /// `targets[targets_offset + t]` of the caches (a page's id × PAGE + its slot), for `n` rows.
    KvWrite {
        k: DeviceBuf,
        v: DeviceBuf,
        n: usize,
        k_dim: usize,
        v_dim: usize,
        targets: DeviceBuf,
        /// Where this step's targets start in `targets`.
        targets_offset: usize,
        k_cache: CacheBufs,
        v_cache: CacheBufs,
        cache: CacheType,
    },
    /// Attention of `n` query rows over their sequences' cached positions.
    /// `slots[slots_offset + 3t..][..3]` is token t's (page-table offset, first position seen, end),
    /// and `tables` holds each sequence's page ids in order (position p of a sequence
    /// is at `tables[offset + p / PAGE] × PAGE + p % PAGE` of the caches).
    Attention {
        q: DeviceBuf,
        n: usize,
        k_cache: CacheBufs,
        v_cache: CacheBufs,
        cache: CacheType,
        tables: DeviceBuf,
        slots: DeviceBuf,
        /// Where this layer's slots start in `slots`.
        slots_offset: usize,
        shape: AttentionShape,
        sinks: Option<DeviceBuf>,
        out: DeviceBuf,
    },
}

/// What one layer's attention computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Multiplies Q·K.
    pub scale: f32,
    /// `s ↦ c·tanh(s/c)` after the scale.
    pub softcap: Option<f32>,
}

/// What a device has done: what a test of "one submission per step, only the logits
/// back" counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    pub submissions: u64,
    pub bytes_read: u64,
}

/// A device the forward pass can run on (implemented by the device crates).
pub trait Device: Send {
    /// One line naming it (`llvmpipe (LLVM 15.0.6, 256 bits), Vulkan 1.3.230`).
    fn describe(&self) -> String;
    /// Why the device declines weights of format `ty`, or `None` when it runs them.
    fn declines(&self, ty: GgmlType) -> Option<String>;
    /// The most 32-bit values one buffer a kernel binds may hold.
    fn max_buffer_len(&self) -> usize;
    /// A buffer of `len` 32-bit values; `what` names it in errors.
    fn alloc(&mut self, len: usize, what: &str) -> Result<DeviceBuf, DeviceError>;
    fn free(&mut self, buf: DeviceBuf);
    /// Places a weight as the file holds it, or declines it (`Declined`).
    fn upload_matrix(
        &mut self,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<DeviceMatrix, DeviceError>;
    /// Values into a buffer at `offset`, ordered after the work recorded before.
    fn write_f32(
        &mut self,
        buf: DeviceBuf,
        offset: usize,
        values: &[f32],
    ) -> Result<(), DeviceError>;
    fn write_u32(
        &mut self,
        buf: DeviceBuf,
        offset: usize,
        values: &[u32],
    ) -> Result<(), DeviceError>;
    /// Values from a buffer at `offset`, after every recorded step has run.
    fn read(&mut self, buf: DeviceBuf, offset: usize, out: &mut [f32]) -> Result<(), DeviceError>;
    /// Records one step.
    fn run(&mut self, op: &Op) -> Result<(), DeviceError>;
    /// Copies `len` values between buffers (a copy-on-write page).
    fn copy(
        &mut self,
        src: DeviceBuf,
        src_offset: usize,
        dst: DeviceBuf,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), DeviceError>;
    fn counters(&self) -> DeviceCounters;
    /// Bytes of memory the device computes from (its largest device-local heap).
    fn memory_bytes(&self) -> u64;
}
