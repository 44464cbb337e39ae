//! f32 vector primitives for attention (Q·K and the weighted sum of V): a portable
//! reference and an AVX2+FMA version chosen at the one dispatch point.

/// Portable dot product: eight independent accumulators, fixed order.
pub(crate) fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; 8];
    let chunks = n / 8;
    for i in 0..chunks {
        for l in 0..8 {
            acc[l] += a[i * 8 + l] * b[i * 8 + l];
        }
    }
    let mut tail = 0f32;
    for i in chunks * 8..n {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Portable `y += alpha * x`.
pub(crate) fn axpy_portable(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// `exp(x)` for 8 lanes: Cephes' range reduction (x = k·ln2 + r, |r| ≤ ln2/2, the
    /// constant split in two for accuracy) and its degree-5 polynomial, within 2 ulp;
    /// −∞ and anything below −87.3 give 0.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) fn exp8(x: __m256) -> __m256 {
        let lo = _mm256_set1_ps(-87.336_54);
        let under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
        let x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.376_26));
        let k = _mm256_round_ps(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let r2 = _mm256_mul_ps(r, r);
        let y = _mm256_add_ps(_mm256_fmadd_ps(y, r2, r), _mm256_set1_ps(1.0));
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)),
            23,
        ));
        _mm256_andnot_ps(under, _mm256_mul_ps(y, pow2))
    }

    /// `dst[i] = src[i]` widened from f16 (exact), 8 at a time.
    ///
    /// # Safety
    /// AVX2, FMA and F16C (the AVX2 set's features).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn widen_f16(src: &[half::f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let (ps, pd) = (src.as_ptr() as *const u16, dst.as_mut_ptr());
        let mut i = 0;
        // SAFETY: 8 values at i..i+8 <= n of both slices.
        unsafe {
            while i + 8 <= n {
                let h = _mm_loadu_si128(ps.add(i) as *const __m128i);
                _mm256_storeu_ps(pd.add(i), _mm256_cvtph_ps(h));
                i += 8;
            }
        }
        for (d, s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            *d = s.to_f32();
        }
    }

    /// [`super::dequantize_q8_0`] for whole blocks.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `src` holds `dst.len() / 32` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
        for (b, d) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
            let scale = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            // SAFETY: b holds 2 + 32 bytes, d 32 floats; the loads and stores are
            // unaligned.
            unsafe {
                let s = _mm256_set1_ps(scale);
                let q = b.as_ptr().add(2);
                for k in 0..4 {
                    let q8 = _mm_loadl_epi64(q.add(8 * k) as *const __m128i);
                    let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
                    _mm256_storeu_ps(d.as_mut_ptr().add(8 * k), _mm256_mul_ps(f, s));
                }
            }
        }
    }

    /// `up[i] *= silu(gate[i])` over the shorter length, exp by [`exp8`].
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA (checked by the dispatch in `swiglu`).
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn swiglu(up: &mut [f32], gate: &[f32]) {
        let n = up.len().min(gate.len());
        let (pu, pg) = (up.as_mut_ptr(), gate.as_ptr());
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        // SAFETY: each access covers 8 floats at i..i+8 <= n of both slices.
        unsafe {
            while i + 8 <= n {
                let g = _mm256_loadu_ps(pg.add(i));
                let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
                let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
                _mm256_storeu_ps(pu.add(i), _mm256_mul_ps(_mm256_loadu_ps(pu.add(i)), s));
                i += 8;
            }
        }
        for j in i..n {
            up[j] *= super::silu(gate[j]);
        }
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA (checked by the dispatch in `dot_f32`).
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: each load reads 8 floats at i..i+8 <= n of both slices.
        unsafe {
            while i + 16 <= n {
                acc0 =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
                acc1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i + 8)),
                    _mm256_loadu_ps(pb.add(i + 8)),
                    acc1,
                );
                i += 16;
            }
            if i + 8 <= n {
                acc0 =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
                i += 8;
            }
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc0, acc1)) };
        let mut sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
            + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
        for j in i..n {
            sum += a[j] * b[j];
        }
        sum
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA (checked by the dispatch in `axpy_f32`).
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let va = _mm256_set1_ps(alpha);
        let mut i = 0;
        // SAFETY: each access covers 8 floats at i..i+8 <= n of both slices.
        unsafe {
            while i + 8 <= n {
                let v = _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), v);
                i += 8;
            }
        }
        for j in i..n {
            y[j] += alpha * x[j];
        }
    }
}

/// `Σ a[i]·b[i]` over the shorter length.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::dispatch::avx2_active() {
        // SAFETY: the active kernel set is at least AVX2, which the dispatch only
        // reports when the CPU has AVX2 and FMA.
        return unsafe { avx2::dot(a, b) };
    }
    dot_portable(a, b)
}

/// `y[i] += alpha · x[i]` over the shorter length.
pub fn axpy_f32(y: &mut [f32], alpha: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::dispatch::avx2_active() {
        // SAFETY: as in `dot_f32`.
        return unsafe { avx2::axpy(y, alpha, x) };
    }
    axpy_portable(y, alpha, x)
}

/// SiLU, `x · sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Elements per task of [`swiglu`].
const SWIGLU_CHUNK: usize = 16 * 1024;

/// `dst[i] = src[i]` as f32 (exact) over the shorter length: the f16 KV cache's tiles,
/// widened inline (F16C) rather than through a call per eight values.
pub fn widen_f16(src: &[half::f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::dispatch::avx2_active() {
        // SAFETY: the AVX2 set (and any wider x86 set) implies AVX2, FMA and F16C.
        return unsafe { avx2::widen_f16(src, dst) };
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// `dst[i] = d · q[i]` for ggml `q8_0` blocks (an f16 scale `d` and 32 int8 each):
/// `dst.len() / 32` blocks of `src`, as ggml's `dequantize_row_q8_0` (exact: an int8
/// times an f16 scale is one f32 rounding, the same on every path). A short `src`
/// leaves the rest of `dst` untouched.
pub fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    let blocks = (src.len() / 34).min(dst.len() / 32);
    let (src, dst) = (&src[..blocks * 34], &mut dst[..blocks * 32]);
    #[cfg(target_arch = "x86_64")]
    if crate::dispatch::avx2_active() {
        // SAFETY: the AVX2 set implies AVX2, FMA and F16C; lengths cut to whole blocks.
        return unsafe { avx2::dequantize_q8_0(src, dst) };
    }
    for (b, d) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
        let scale = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        for (o, &q) in d.iter_mut().zip(&b[2..]) {
            *o = f32::from(q as i8) * scale;
        }
    }
}

/// `up[i] *= silu(gate[i])` (SwiGLU's gate), over the pool. The SIMD exp is within a few
/// ulp of libm's, as llama.cpp's own vectorised SiLU is.
pub fn swiglu(up: &mut [f32], gate: &[f32], pool: &crate::ThreadPool) {
    let n = up.len().min(gate.len());
    pool.for_each_chunk_mut(&mut up[..n], SWIGLU_CHUNK, |i, u| {
        let g = &gate[i * SWIGLU_CHUNK..][..u.len()];
        #[cfg(target_arch = "x86_64")]
        if crate::dispatch::avx2_active() {
            // SAFETY: as in `dot_f32`.
            return unsafe { avx2::swiglu(u, g) };
        }
        u.iter_mut().zip(g).for_each(|(u, &g)| *u *= silu(g));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widen_f16_is_exact() {
        let bits: Vec<u16> = (0..=u16::MAX).step_by(7).collect();
        for n in [0usize, 1, 7, 8, 9, 100, bits.len()] {
            let src: Vec<half::f16> = bits[..n].iter().map(|&b| half::f16::from_bits(b)).collect();
            let mut dst = vec![0f32; n + 3];
            widen_f16(&src, &mut dst);
            for (d, s) in dst.iter().zip(&src) {
                let want = s.to_f32();
                assert!(
                    d.to_bits() == want.to_bits() || (d.is_nan() && want.is_nan()),
                    "{s}"
                );
            }
            assert!(dst[n..].iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn simd_matches_portable_within_rounding() {
        let mut s = 7u32;
        let mut next = || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for n in [0usize, 1, 7, 8, 9, 16, 31, 64, 256, 1000] {
            let a: Vec<f32> = (0..n).map(|_| next()).collect();
            let b: Vec<f32> = (0..n).map(|_| next()).collect();
            let exact: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let bound = 1e-5 * (n as f64 + 1.0);
            assert!(
                (f64::from(dot_f32(&a, &b)) - exact).abs() < bound,
                "dot n={n}"
            );
            assert!(
                (f64::from(dot_portable(&a, &b)) - exact).abs() < bound,
                "portable dot n={n}"
            );
            let mut y1 = b.clone();
            let mut y2 = b.clone();
            axpy_f32(&mut y1, 0.37, &a);
            axpy_portable(&mut y2, 0.37, &a);
            for (p, q) in y1.iter().zip(&y2) {
                assert!((p - q).abs() <= 1e-6, "axpy n={n}");
            }
        }
    }

    #[test]
    fn swiglu_is_silu_times_up_within_a_few_ulp() {
        let pool = crate::ThreadPool::new(2);
        let n = 40_000 + 5;
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 - 20_000.0) * 0.005).collect();
        let up: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut got = up.clone();
        swiglu(&mut got, &gate, &pool);
        for i in 0..n {
            let want = up[i] * silu(gate[i]);
            assert!(
                (got[i] - want).abs() <= 8.0 * f32::EPSILON * want.abs() + 1e-30,
                "{i}: silu({}) · {} = {} vs {want}",
                gate[i],
                up[i],
                got[i]
            );
        }
        assert!(silu(-100.0).abs() < 1e-30 && silu(100.0) == 100.0);
    }
}
