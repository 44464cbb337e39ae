//! Weights as the forward pass sees them, and the one matmul interface every
//! projection goes through (the CPU-kernels work replaces its body, not its callers).
//!
//! Numerics follow llama.cpp where they shape the result: the activation is rounded
//! through the weight format's dot-product type (Q8_0, Q8_1, Q8_K, F16, BF16) before
//! the dot product, and products accumulate in f32.

use crate::LoadError;
use llamay_formats::{GgmlType, dequantize, quantize};
use llamay_gguf::TensorInfo;
use std::ops::Range;

/// A 2-D weight borrowed from the mapping: `rows` outputs of `cols` inputs each.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
}

impl<'a> Matrix<'a> {
    /// Binds a tensor as a matrix of `cols` columns; its remaining dimensions are rows.
    pub fn from_tensor(t: &TensorInfo<'a>, cols: usize, rows: usize) -> Result<Self, LoadError> {
        if t.row_len() as usize != cols || t.n_elements as usize != cols * rows {
            return Err(LoadError::Shape(format!(
                "tensor '{}' has shape {:?}, expected [{cols}, {rows}]",
                t.name, t.shape
            )));
        }
        if let Some(why) = t.ty.refusal() {
            return Err(LoadError::Unsupported(format!(
                "tensor '{}': {why}",
                t.name
            )));
        }
        let row_bytes = t.ty.bytes_for(cols as u64).ok_or_else(|| {
            LoadError::Shape(format!(
                "tensor '{}': {cols} columns is not a whole number of {} blocks",
                t.name, t.ty
            ))
        })? as usize;
        Ok(Matrix {
            name: t.name,
            ty: t.ty,
            data: t.data,
            rows,
            cols,
            row_bytes,
        })
    }

    /// Rows `range` of this matrix as a matrix of its own (zero copy): how a stacked
    /// projection (Phi-3's gate+up, fused QKV) is split at load.
    pub fn rows_slice(&self, range: Range<usize>) -> Matrix<'a> {
        let data = &self.data[range.start * self.row_bytes..range.end * self.row_bytes];
        Matrix {
            rows: range.len(),
            data,
            ..*self
        }
    }

    /// Dequantises row `r` into `out` (length `cols`).
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        let bytes = &self.data[r * self.row_bytes..(r + 1) * self.row_bytes];
        // Shapes and types were checked at bind time, so this cannot fail.
        let _ = dequantize(self.ty, bytes, out);
    }
}

/// Rounds each row of `x` (rows of `cols`) through `ty`'s vec_dot type, as llama.cpp's
/// CPU backend quantises the activation before the dot product.
pub fn round_activations(ty: GgmlType, x: &mut [f32], cols: usize) {
    match ty.vec_dot_type() {
        GgmlType::F32 => {}
        // ggml-cpu's own activation quantiser for Q8_0/Q8_1 (x86 `quantize_row_q8_0`),
        // not the reference one: the multiplier is 127/max rather than 1/(max/127), and
        // it rounds half to even. The difference decides real models' greedy ties.
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            for block in x.chunks_mut(32) {
                let max = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = half::f16::from_f32(max / 127.0).to_f32();
                let id = if max != 0.0 { 127.0 / max } else { 0.0 };
                for v in block.iter_mut() {
                    *v = (*v * id).round_ties_even() * d;
                }
            }
        }
        vt => {
            for row in x.chunks_mut(cols) {
                // Non-finite activations cannot be quantised; leave them (the output shows it).
                if let Ok(q) = quantize(vt, row) {
                    let _ = dequantize(vt, &q, row);
                }
            }
        }
    }
}

/// How many threads compute; one per physical core by default.
#[derive(Clone, Copy, Debug)]
pub struct Threads(pub usize);

/// Runs `f` over `n` items split into contiguous ranges, one per thread; results in
/// range order.
pub fn parallel_ranges<T: Send>(
    n: usize,
    threads: Threads,
    f: impl Fn(Range<usize>) -> T + Sync,
) -> Vec<T> {
    let t = threads.0.clamp(1, n.max(1));
    if t == 1 {
        return vec![f(0..n)];
    }
    let per = n.div_ceil(t);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..t)
            .map(|i| {
                let range = (i * per).min(n)..((i + 1) * per).min(n);
                let f = &f;
                s.spawn(move || f(range))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// The portable dot product: eight independent accumulators in a fixed order.
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for i in 0..chunks {
        for l in 0..8 {
            acc[l] += a[i * 8 + l] * b[i * 8 + l];
        }
    }
    let mut tail = 0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// AVX2+FMA dot product: two 8-lane accumulators with fused multiply-adds.
///
/// # Safety
/// The caller must have checked that the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: every load reads 8 floats at offsets i..i+8 <= n of both slices.
    unsafe {
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                acc1,
            );
            i += 16;
        }
        if i + 8 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            i += 8;
        }
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` has room for 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc0, acc1)) };
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for j in i..n {
        sum += a[j] * b[j];
    }
    sum
}

/// Whether the AVX2 path may run: detected once; `LLAMAY_BACKEND=portable` forces the
/// reference path.
fn use_avx2() -> bool {
    use std::sync::OnceLock;
    static USE: OnceLock<bool> = OnceLock::new();
    *USE.get_or_init(|| {
        if std::env::var("LLAMAY_BACKEND").is_ok_and(|v| v == "portable") {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The kernel set `dot` uses, for `llamay version`.
pub fn kernel_set() -> &'static str {
    if use_avx2() {
        "avx2+fma (f32 dot); portable dequantisation"
    } else {
        "portable"
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: use_avx2() checked AVX2 and FMA at run time.
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

/// `out[t][r] = W[r] · x[t]` for `n` tokens. `x` holds `n × W.cols` values already
/// passed through [`round_activations`]; `out` has room for `n × W.rows`.
pub fn matmul(w: &Matrix<'_>, x: &[f32], n: usize, out: &mut [f32], threads: Threads) {
    debug_assert_eq!(x.len(), n * w.cols);
    debug_assert_eq!(out.len(), n * w.rows);
    let parts = parallel_ranges(w.rows, threads, |rows| {
        let mut buf = vec![0f32; w.cols];
        let mut part = vec![0f32; rows.len() * n];
        for (i, r) in rows.clone().enumerate() {
            w.dequant_row(r, &mut buf);
            for t in 0..n {
                part[i * n + t] = dot(&buf, &x[t * w.cols..(t + 1) * w.cols]);
            }
        }
        (rows, part)
    });
    for (rows, part) in parts {
        for (i, r) in rows.enumerate() {
            for t in 0..n {
                out[t * w.rows + r] = part[i * n + t];
            }
        }
    }
}

/// A 1-D weight (norm scale, bias), dequantised to f32 at load: small and read often.
pub fn vector(t: &TensorInfo<'_>, len: usize) -> Result<Vec<f32>, LoadError> {
    if t.n_elements as usize != len {
        return Err(LoadError::Shape(format!(
            "tensor '{}' has shape {:?}, expected [{len}]",
            t.name, t.shape
        )));
    }
    let mut v = vec![0f32; len];
    dequantize(t.ty, t.data, &mut v)
        .map_err(|e| LoadError::Unsupported(format!("tensor '{}': {e}", t.name)))?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_dot_matches_portable() {
        let mut seed = 1u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for n in [0usize, 1, 7, 8, 15, 16, 17, 33, 640, 2048, 2051] {
            let a: Vec<f32> = (0..n).map(|_| next()).collect();
            let b: Vec<f32> = (0..n).map(|_| next()).collect();
            let exact: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let bound = 1e-5 * (n as f64).max(1.0).sqrt();
            assert!(
                (f64::from(dot_portable(&a, &b)) - exact).abs() < bound,
                "portable n={n}"
            );
            assert!(
                (f64::from(dot(&a, &b)) - exact).abs() < bound,
                "dispatched n={n}"
            );
        }
    }
}
