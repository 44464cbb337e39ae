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
mod avx2 {
    use std::arch::x86_64::*;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
