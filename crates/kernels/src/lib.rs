//! CPU compute kernels: quantised dot products and matmul per weight format (a portable
//! reference and x86 SIMD versions behind one runtime dispatch point), activation
//! quantisation, and a persistent thread pool. (x86-64: AVX2, AVX-512 VNNI; aarch64:
//! NEON, NEON + dotprod.)
//!
//! Semantics are ggml's (`ggml_vec_dot_*`): the activation is quantised to the weight
//! type's `vec_dot_type` (Q8_0, Q8_1, Q8_K, F16, BF16 or F32), integer sums are formed
//! inside each block, then multiplied by the two scales and accumulated in f32. See
//! `portable` for the exact float order. SIMD kernels for the K-quants and MXFP4 are
//! bit-identical to the portable ones; those for the other 32-blocks and the float types
//! accumulate in f32 vector lanes and agree within a float bound (see the tests).

use llamay_formats::GgmlType;

#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
mod aarch64;
pub mod attn_tile;
mod dispatch;
pub mod math;
mod packed;
mod pool;
mod portable;
mod quant;
mod vecf32;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use packed::{
    GROUP_ROWS, PackedMatrix, matmul_packed, matmul_packed_many, pack, pack_releasing, pack_with,
    packable, packable_with,
};
pub use pool::ThreadPool;
pub use vecf32::{axpy_f32, dequantize_q8_0, dot_f32, silu, swiglu, widen_f16};

pub(crate) type DotFn = fn(&[u8], &[u8], usize) -> f32;

/// A set of kernels. Within one architecture's sets (x86-64: `Avx2 < AvxVnni <
/// Avx512Vnni < Avx512Amx`;
/// aarch64: `Neon < NeonDotprod < NeonI8mm`) the order is increasing order of what the
/// CPU must offer, and `Portable` is below all; sets of different architectures do not
/// cap one another (see `is_available`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KernelSet {
    /// Plain Rust, the reference (`LLAMAY_BACKEND=portable`).
    Portable,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 + AVX-VNNI (256-bit `vpdpbusd`, VEX: Alder Lake and later cores without
    /// AVX-512): the AVX2 row kernels plus the packed GEMM/GEMV at 256 bits.
    AvxVnni,
    /// AVX-512 F/BW/VL + VNNI (falls back to AVX2 for formats without one).
    Avx512Vnni,
    /// AVX-512 VNNI + AMX-TILE/AMX-INT8 with the OS's permission for tile data (Sapphire
    /// Rapids and later): the AVX-512 VNNI kernels, with prefill tiles of 16 tokens on
    /// the tile unit (`x86::amx`).
    Avx512Amx,
    /// aarch64 NEON (ARMv8-A baseline).
    Neon,
    /// NEON + the `dotprod` extension (`sdot`).
    NeonDotprod,
    /// NEON + dotprod + `i8mm`: detected, runs the dotprod kernels for now (`smmla`
    /// needs two-row tiles that `vec_dot` does not have).
    NeonI8mm,
}

impl KernelSet {
    pub fn name(self) -> &'static str {
        match self {
            KernelSet::Portable => "portable",
            KernelSet::Avx2 => "avx2",
            KernelSet::AvxVnni => "avxvnni",
            KernelSet::Avx512Vnni => "avx512vnni",
            KernelSet::Avx512Amx => "avx512amx",
            KernelSet::Neon => "neon",
            KernelSet::NeonDotprod => "neon-dotprod",
            KernelSet::NeonI8mm => "neon-i8mm",
        }
    }

    /// The set named `name` (as `name()` spells it, ASCII case ignored).
    pub fn from_name(name: &str) -> Option<KernelSet> {
        KernelSet::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(name))
    }

    /// Every set, portable first, then each architecture's in increasing order.
    pub const ALL: [KernelSet; 8] = [
        KernelSet::Portable,
        KernelSet::Avx2,
        KernelSet::AvxVnni,
        KernelSet::Avx512Vnni,
        KernelSet::Avx512Amx,
        KernelSet::Neon,
        KernelSet::NeonDotprod,
        KernelSet::NeonI8mm,
    ];

    /// Whether this CPU can run the set: portable, or a set of this CPU's architecture
    /// whose features it has.
    pub fn is_available(self) -> bool {
        dispatch::cap_to_hardware(self) == self
    }

    /// Every set this CPU can run, portable first.
    pub fn available() -> Vec<KernelSet> {
        KernelSet::ALL
            .into_iter()
            .filter(|s| s.is_available())
            .collect()
    }

    /// Whether the set has its own kernel for weights of `wty` (else portable is used).
    pub fn has_kernel(self, wty: GgmlType) -> bool {
        dispatch::has_simd(self, wty)
    }
}

/// The kernel set in use (hardware, capped by `LLAMAY_BACKEND` / `LLAMAY_CPU`).
pub fn active_kernel_set() -> KernelSet {
    dispatch::active()
}

/// The name of the kernel set in use: "avx512amx", "avx512vnni", "avxvnni", "avx2", "neon-i8mm",
/// "neon-dotprod", "neon" or "portable".
pub fn kernel_set() -> &'static str {
    dispatch::active().name()
}

/// The kernel sets this build carries (the one in use is picked among them at run time,
/// by the CPU's features and `LLAMAY_CPU` / `LLAMAY_BACKEND`).
pub fn compiled_kernel_sets() -> &'static [KernelSet] {
    #[cfg(target_arch = "x86_64")]
    {
        &[
            KernelSet::Portable,
            KernelSet::Avx2,
            KernelSet::AvxVnni,
            KernelSet::Avx512Vnni,
            KernelSet::Avx512Amx,
        ]
    }
    #[cfg(target_arch = "aarch64")]
    {
        &[
            KernelSet::Portable,
            KernelSet::Neon,
            KernelSet::NeonDotprod,
            KernelSet::NeonI8mm,
        ]
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        &[KernelSet::Portable]
    }
}

/// Whether `vec_dot`/`matmul` compute on weights of `wty`: the 21 readable weight types
/// (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K IQ4_NL IQ4_XS IQ2_XXS IQ2_XS IQ2_S
/// IQ3_XXS IQ3_S MXFP4). Q8_1 and Q8_K are activation formats, not weights.
pub fn supports(wty: GgmlType) -> bool {
    portable::dot_fn(wty).is_some()
}

/// `n` rows of `cols` values in an activation (vec_dot) type.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedRows {
    pub ty: GgmlType,
    pub cols: usize,
    pub n: usize,
    /// `n` rows of `ty.bytes_for(cols)` bytes each.
    pub data: Vec<u8>,
}

impl Default for QuantizedRows {
    /// No rows (a buffer for `quantize_rows_into`).
    fn default() -> Self {
        QuantizedRows {
            ty: GgmlType::F32,
            cols: 0,
            n: 0,
            data: Vec::new(),
        }
    }
}

impl QuantizedRows {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        row_bytes(self.ty, self.cols).unwrap_or(0)
    }

    /// Row `t`'s bytes.
    pub fn row(&self, t: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[t * rb..(t + 1) * rb]
    }
}

fn row_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
    ty.bytes_for(cols as u64)
        .and_then(|b| usize::try_from(b).ok())
}

type QuantFn = fn(&[f32], &mut [u8]);

/// The AVX2 quantisers behind a safe signature.
#[cfg(target_arch = "x86_64")]
mod quant_simd {
    pub(crate) fn q8_0(x: &[f32], out: &mut [u8]) {
        // SAFETY: handed out by `quant_fn` only when `dispatch::active()` is at least
        // Avx2, i.e. the CPU has avx2 + fma + f16c; block shapes as for the scalar ones.
        unsafe { crate::x86::quant_avx2::q8_0(x, out) }
    }

    pub(crate) fn q8_k(x: &[f32], out: &mut [u8]) {
        // SAFETY: as for `q8_0`.
        unsafe { crate::x86::quant_avx2::q8_k(x, out) }
    }
}

fn quant_fn(ty: GgmlType) -> Option<QuantFn> {
    #[cfg(target_arch = "x86_64")]
    if dispatch::avx2_active() {
        match ty {
            GgmlType::Q8_0 => return Some(quant_simd::q8_0),
            GgmlType::Q8_K => return Some(quant_simd::q8_k),
            _ => {}
        }
    }
    Some(match ty {
        GgmlType::Q8_0 => quant::q8_0,
        GgmlType::Q8_1 => quant::q8_1,
        GgmlType::Q8_K => quant::q8_k,
        GgmlType::F16 => quant::f16,
        GgmlType::BF16 => quant::bf16,
        GgmlType::F32 => quant::f32,
        _ => return None,
    })
}

/// Quantises one row `x` into `out` (`ty`'s bytes for `x.len()` values) with the same
/// quantiser the matmuls use for their activations (ggml-cpu's bytes). Returns false,
/// writing nothing, for a type that is not an activation type or mismatched lengths.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) -> bool {
    match (quant_fn(ty), row_bytes(ty, x.len())) {
        (Some(f), Some(n)) if n == out.len() => {
            f(x, out);
            true
        }
        _ => false,
    }
}

/// A raw pointer that tasks may share because each writes a disjoint part.
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);
// Copy for any T (a derive would ask T: Copy): it is only a pointer.
impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}
// SAFETY: used only to hand disjoint output ranges to pool tasks (see each use).
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// Through a method, so closures capture the whole (Sync) wrapper.
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// Below this many values, quantising on the pool costs more than it saves.
const PAR_QUANT_MIN: usize = 1 << 15;

/// Quantises `x` (`x.len() / cols` rows of `cols` f32) to `ty`, one of the vec_dot
/// types (Q8_0, Q8_1, Q8_K, F16, BF16, F32), rows in parallel on the pool. Bytes are
/// identical to `llamay_formats::quantize` (llama.cpp's `quantize_row_*_ref`) for finite
/// input; non-finite input does not panic. A type that is not a vec_dot type, a `cols`
/// that is not a whole number of blocks, or a partial last row gives an empty result
/// (`n == 0`) — the caller guarantees the shape (debug builds assert it).
pub fn quantize_rows(ty: GgmlType, x: &[f32], cols: usize, pool: &ThreadPool) -> QuantizedRows {
    let mut out = QuantizedRows::default();
    quantize_rows_into(ty, x, cols, pool, &mut out);
    out
}

/// `quantize_rows` into `out`, reusing its buffer: a caller that quantises one layer's
/// activations after another allocates (and zeroes) once. Every byte of the `n` rows is
/// written; `out.data` keeps its capacity.
pub fn quantize_rows_into(
    ty: GgmlType,
    x: &[f32],
    cols: usize,
    pool: &ThreadPool,
    out: &mut QuantizedRows,
) {
    out.ty = ty;
    out.cols = cols;
    out.n = 0;
    let (Some(f), Some(rb)) = (quant_fn(ty), row_bytes(ty, cols)) else {
        debug_assert!(
            false,
            "quantize_rows: {ty} is not a vec_dot type or {cols} is not whole blocks"
        );
        out.data.clear();
        return;
    };
    if cols == 0 || !x.len().is_multiple_of(cols) {
        debug_assert!(
            x.is_empty() && cols > 0,
            "quantize_rows: {} values are not rows of {cols}",
            x.len()
        );
        out.data.clear();
        return;
    }
    let n = x.len() / cols;
    // Grows (zeroing only the growth) or truncates; the rows are then overwritten.
    out.data.resize(n * rb, 0);
    let data = &mut out.data;
    if n == 1 || x.len() < PAR_QUANT_MIN || pool.n_threads() == 1 {
        for (xr, o) in x.chunks_exact(cols).zip(data.chunks_exact_mut(rb)) {
            f(xr, o);
        }
    } else {
        let optr = SyncPtr(data.as_mut_ptr());
        pool.run(n, |t| {
            // SAFETY: task t writes only row t (bytes t*rb..(t+1)*rb of `data`, which has
            // n*rb bytes and outlives the region); rows are disjoint.
            let o = unsafe { std::slice::from_raw_parts_mut(optr.get().add(t * rb), rb) };
            f(&x[t * cols..(t + 1) * cols], o);
        });
    }
    out.n = n;
}

/// The dot product of one weight row (`cols` values in `wty`) with one activation row
/// (`cols` values in `wty.vec_dot_type()`), with ggml's semantics, on the active kernel
/// set. NaN (never a panic) for a type llamay does not compute on, a `cols` that is not
/// whole blocks, or a row shorter than `cols` needs; longer rows are read only up to it.
pub fn vec_dot(wty: GgmlType, w_row: &[u8], a_row: &[u8], cols: usize) -> f32 {
    vec_dot_with(dispatch::active(), wty, w_row, a_row, cols)
}

/// `vec_dot` on a chosen kernel set (capped to what the CPU has) — for tests and benches.
pub fn vec_dot_with(set: KernelSet, wty: GgmlType, w_row: &[u8], a_row: &[u8], cols: usize) -> f32 {
    match dispatch::kernel(set, wty) {
        Some(k) => k.call(w_row, a_row, cols),
        None => f32::NAN,
    }
}

/// `out[t * rows + r] = vec_dot(W[r], A[t])` for every weight row `r < rows` and
/// activation row `t < a.n`, split over the pool. `w` holds `rows` rows of `cols` values
/// in `wty`; `a` must be `wty.vec_dot_type()` rows of `cols` (see `quantize_rows`).
///
/// Shapes are the caller's to guarantee (debug builds assert them); on a mismatch the
/// output that exists is filled with NaN and nothing else happens — no panic, no UB.
pub fn matmul(
    wty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    a: &QuantizedRows,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    matmul_with(dispatch::active(), wty, w, rows, cols, a, out, pool)
}

/// Rows per task for a single activation row (GEMV).
const GEMV_CHUNK: usize = 16;
/// Activation rows per tile in prefill, so the tile's rows stay in L2.
const TOKEN_TILE: usize = 32;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// `matmul_with`'s F16 activations in f32, kept by each calling thread.
    static F16_ACTIVATIONS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `matmul` on a chosen kernel set (capped to what the CPU has) — for tests and benches.
#[allow(clippy::too_many_arguments)]
pub fn matmul_with(
    set: KernelSet,
    wty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    a: &QuantizedRows,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let kernel = dispatch::kernel(set, wty);
    let wrb = row_bytes(wty, cols);
    let arb = row_bytes(wty.vec_dot_type(), cols);
    let ok = kernel.is_some()
        && a.ty == wty.vec_dot_type()
        && a.cols == cols
        && wrb.is_some_and(|b| rows.checked_mul(b).is_some_and(|t| w.len() >= t))
        && arb.is_some_and(|b| a.n.checked_mul(b).is_some_and(|t| a.data.len() >= t))
        && rows.checked_mul(a.n).is_some_and(|t| out.len() >= t);
    let (Some(kernel), Some(wrb), Some(arb), true) = (kernel, wrb, arb, ok) else {
        debug_assert!(
            false,
            "matmul: shapes do not match ({wty}, {rows}x{cols}, activation {} x{} n={})",
            a.ty, a.cols, a.n
        );
        out.fill(f32::NAN);
        return;
    };
    let n = a.n;
    if rows == 0 || n == 0 {
        return;
    }
    let out = &mut out[..rows * n];
    let threads = pool.n_threads();
    // Row chunks: enough for the atomic counter to balance (≥ 4 per thread), but not
    // so small that the per-task cost shows.
    let chunk = if n == 1 {
        (rows / (threads * 8)).clamp(GEMV_CHUNK.min(rows), 256)
    } else {
        (rows / (threads * 4)).clamp(4.min(rows), 64)
    };
    let row_chunks = rows.div_ceil(chunk);
    let tiles = n.div_ceil(TOKEN_TILE);
    let n_tasks = row_chunks * tiles;
    let optr = SyncPtr(out.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    let f16_tiles = (wty == GgmlType::F16)
        .then(|| dispatch::f16_tiles(set))
        .flatten();
    // F16 tiles read the activations in f32: converted once here (exactly), into a
    // buffer the calling thread keeps from call to call.
    #[cfg(target_arch = "x86_64")]
    let f16_act = f16_tiles.map(|_| {
        let mut af = F16_ACTIVATIONS.with(|c| c.take());
        if af.len() < n * cols {
            af.resize(n * cols, 0.0);
        }
        const ROWS: usize = 16;
        pool.for_each_chunk_mut(&mut af[..n * cols], ROWS * cols, |c, rows| {
            for (i, row) in rows.chunks_exact_mut(cols).enumerate() {
                let t = c * ROWS + i;
                // SAFETY: `f16_tiles` found F16C on this CPU; row t < n of `a` holds
                // 2 * cols bytes (arb, checked above) and `row` cols values.
                unsafe { x86::avx2::f16_to_f32(&a.data[t * arb..t * arb + 2 * cols], row) };
            }
        });
        af
    });
    let task = |i: usize| {
        let (rc, tile) = (i % row_chunks, i / row_chunks);
        let (r0, r1) = (rc * chunk, ((rc + 1) * chunk).min(rows));
        let (t0, t1) = (tile * TOKEN_TILE, ((tile + 1) * TOKEN_TILE).min(n));
        #[cfg(target_arch = "x86_64")]
        if let (Some(tiles), Some(af)) = (f16_tiles, f16_act.as_deref()) {
            let run = match tiles {
                dispatch::F16Tiles::Avx2 => x86::avx2::matmul_f16,
                dispatch::F16Tiles::Wide => x86::avx512::matmul_f16,
            };
            // SAFETY: `f16_tiles` found AVX2+FMA+F16C on this CPU (and the AVX-512 VNNI
            // set for `Wide`); `af` holds n rows of cols values (converted below), `w`
            // rows × wrb bytes with wrb = 2 * cols; the outputs (t, r) for t in t0..t1,
            // r in r0..r1 are this task's, disjoint from every other task's, and
            // t * rows + r < n * rows = out.len().
            unsafe {
                run(
                    &w[r0 * wrb..r1 * wrb],
                    wrb,
                    r1 - r0,
                    &af[t0 * cols..t1 * cols],
                    cols,
                    t1 - t0,
                    optr.get().add(t0 * rows + r0),
                    rows,
                );
            }
            return;
        }
        for r in r0..r1 {
            let wr = &w[r * wrb..(r + 1) * wrb];
            for t in t0..t1 {
                let v = kernel.call(wr, &a.data[t * arb..(t + 1) * arb], cols);
                // SAFETY: (t, r) lies in this task's tile, tiles are disjoint, and
                // t*rows + r < n*rows = out.len(); `out` outlives the region.
                unsafe { *optr.get().add(t * rows + r) = v };
            }
        }
    };
    if n_tasks == 1 || threads == 1 {
        (0..n_tasks).for_each(task);
    } else if n == 1 {
        // One token: each thread streams its own consecutive rows.
        pool.run_contiguous(n_tasks, task);
    } else {
        pool.run(n_tasks, task);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(af) = f16_act {
        F16_ACTIVATIONS.with(|c| c.replace(af));
    }
}
