//! AVX-512 (F, BW, VL) + VNNI kernels for the hot formats (Q4_K, Q6_K, Q8_0). Each
//! `unsafe fn` may only be called when `dispatch::hardware()` found avx2, fma, f16c,
//! avx512f, avx512bw, avx512vl and avx512vnni, with whole blocks (checked by
//! `dispatch::Kernel::call`). `vpdpbusd` (u8·i8, four at a time, into i32, no
//! saturation) replaces AVX2's maddubs+madd.
//!
//! Q4_K/Q6_K form the same exact i32 super-block sums as `portable` and finish with
//! `kq_acc`: bit-identical. Q8_0 accumulates in f32 lanes: within the float bound.

use super::avx2::{bsums_dot, f16p, hsum_f32, load256, mins16};
use crate::portable::{Q8K, f32_at, kq_acc, scales_mins_k4};
use core::arch::x86_64::*;
use llamay_formats::GgmlType;

type SimdDotFn = unsafe fn(&[u8], &[u8], usize) -> f32;

pub(crate) fn dot_fn(wty: GgmlType) -> Option<SimdDotFn> {
    Some(match wty {
        GgmlType::Q4_K => dot_q4_k,
        GgmlType::Q6_K => dot_q6_k,
        GgmlType::Q8_0 => dot_q8_0,
        GgmlType::F16 => dot_f16,
        _ => return None,
    })
}

/// A zmm from two ymm halves.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn load512(p: *const u8) -> __m512i {
    // SAFETY: caller guarantees 64 readable bytes at p.
    unsafe { _mm512_loadu_si512(p as *const _) }
}

/// # Safety
/// The AVX-512 VNNI set (see module doc); whole Q4_K / Q8_K blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    let m4 = _mm512_set1_epi8(0xF);
    for i in 0..n / 256 {
        // SAFETY: block i of each row is in bounds.
        unsafe {
            let x = w.as_ptr().add(144 * i);
            let y = a.as_ptr().add(Q8K * i);
            let (sc, mn) = scales_mins_k4(&w[144 * i + 4..144 * i + 16]);
            let summs = bsums_dot(y, mins16(&mn));
            let mut sumi = _mm512_setzero_si512();
            for j in 0..4 {
                let q4 = load256(x.add(16 + 32 * j));
                let q = _mm512_and_si512(join(q4, _mm256_srli_epi16(q4, 4)), m4);
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, load512(y.add(4 + 64 * j)));
                let sv = join(
                    _mm256_set1_epi32(sc[2 * j] as i32),
                    _mm256_set1_epi32(sc[2 * j + 1] as i32),
                );
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(p, sv));
            }
            let dy = f32_at(a, Q8K * i);
            let isum = _mm512_reduce_add_epi32(sumi);
            acc = kq_acc(acc, f16p(x) * dy, isum, f16p(x.add(2)) * dy, summs);
        }
    }
    acc
}

/// # Safety
/// The AVX-512 VNNI set (see module doc); whole Q6_K / Q8_K blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    let m4 = _mm512_set1_epi8(0xF);
    let m2 = _mm512_set1_epi8(3);
    let k32 = _mm512_set1_epi8(32);
    // Lane l of group g takes scale 4g + l/4.
    let idx: [__m512i; 4] = [0, 1, 2, 3].map(|g| {
        _mm512_setr_epi32(
            4 * g,
            4 * g,
            4 * g,
            4 * g,
            4 * g + 1,
            4 * g + 1,
            4 * g + 1,
            4 * g + 1,
            4 * g + 2,
            4 * g + 2,
            4 * g + 2,
            4 * g + 2,
            4 * g + 3,
            4 * g + 3,
            4 * g + 3,
            4 * g + 3,
        )
    });
    for i in 0..n / 256 {
        // SAFETY: block i of each row is in bounds.
        unsafe {
            let x = w.as_ptr().add(210 * i);
            let y = a.as_ptr().add(Q8K * i);
            let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(x.add(192) as *const __m128i));
            let mut sumi = _mm512_setzero_si512();
            for h in 0..2 {
                let ql = load512(x.add(64 * h));
                let qh = load256(x.add(128 + 32 * h));
                let qh2 = join(qh, _mm256_srli_epi16(qh, 2));
                let q01 = _mm512_or_si512(
                    _mm512_and_si512(ql, m4),
                    _mm512_slli_epi16(_mm512_and_si512(qh2, m2), 4),
                );
                let q23 = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh2, 4), m2), 4),
                );
                for (k, q) in [q01, q23].into_iter().enumerate() {
                    let yv = load512(y.add(4 + 128 * h + 64 * k));
                    let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, yv);
                    let off = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k32, yv);
                    let s = _mm512_permutexvar_epi32(idx[2 * h + k], sc);
                    sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(_mm512_sub_epi32(p, off), s));
                }
            }
            let isum = _mm512_reduce_add_epi32(sumi);
            acc = kq_acc(acc, f16p(x.add(208)) * f32_at(a, Q8K * i), isum, 0.0, 0);
        }
    }
    acc
}

/// # Safety
/// The AVX-512 VNNI set (see module doc); whole Q8_0 / Q8_0 blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / 32;
    let (x, y) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm512_setzero_ps();
    let zero = _mm512_setzero_si512();
    let mut b = 0;
    // SAFETY: blocks b and b+1 are < nb.
    unsafe {
        while b + 2 <= nb {
            let (x0, x1) = (x.add(34 * b), x.add(34 * (b + 1)));
            let (y0, y1) = (y.add(34 * b), y.add(34 * (b + 1)));
            let qx = join(load256(x0.add(2)), load256(x1.add(2)));
            let qy = join(load256(y0.add(2)), load256(y1.add(2)));
            let ax = _mm512_abs_epi8(qx);
            let sy = _mm512_mask_sub_epi8(qy, _mm512_movepi8_mask(qx), zero, qy);
            let p = _mm512_dpbusd_epi32(zero, ax, sy);
            let d = _mm512_castsi512_ps(join(
                _mm256_castps_si256(_mm256_set1_ps(f16p(x0) * f16p(y0))),
                _mm256_castps_si256(_mm256_set1_ps(f16p(x1) * f16p(y1))),
            ));
            acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
            b += 2;
        }
        let mut s = _mm512_reduce_add_ps(acc);
        if b < nb {
            let (x0, y0) = (x.add(34 * b), y.add(34 * b));
            let qx = load256(x0.add(2));
            let qy = load256(y0.add(2));
            let p = _mm256_dpbusd_epi32(
                _mm256_setzero_si256(),
                _mm256_sign_epi8(qx, qx),
                _mm256_sign_epi8(qy, qx),
            );
            s += hsum_f32(_mm256_mul_ps(
                _mm256_set1_ps(f16p(x0) * f16p(y0)),
                _mm256_cvtepi32_ps(p),
            ));
        }
        s
    }
}

/// The sum of a zmm's lanes in a fixed order: the two ymm halves added, then AVX2's
/// horizontal sum.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn hsum16(v: __m512) -> f32 {
    // The upper half through the f64 extract (AVX-512F; the f32 one is AVX-512DQ).
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    // SAFETY: AVX2 is part of this set.
    unsafe { super::avx2::hsum_f32(h) }
}

/// 16 f16 at `p` as f32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn load_f16x16(p: *const u8) -> __m512 {
    // SAFETY: caller guarantees 32 readable bytes at p.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

/// # Safety
/// The AVX-512 VNNI set; `w`, `a` hold `n` f16.
///
/// The 1 × 1 case of [`matmul_f16`]'s arithmetic: one 16-lane accumulator over steps
/// of 16, [`hsum16`], then the scalar tail.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (x, y) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY: every read is below n elements.
    unsafe {
        while i + 16 <= n {
            acc = _mm512_fmadd_ps(load_f16x16(x.add(2 * i)), load_f16x16(y.add(2 * i)), acc);
            i += 16;
        }
        let mut s = hsum16(acc);
        while i < n {
            s += super::avx2::f16p(x.add(2 * i)) * super::avx2::f16p(y.add(2 * i));
            i += 1;
        }
        s
    }
}

/// `out[t * out_stride + r] = W[r] · A[t]` for `rows` f16 weight rows (`wrb` bytes
/// apart) and `tokens` f32 activation rows (`n` values each, packed), in register
/// tiles of 4 rows × 4 tokens (16 zmm accumulators): each converted weight vector serves
/// four tokens, each activation vector four rows. Every (row, token) dot is summed
/// exactly as [`dot_f16`] sums it (the activations are its f16 values, converted
/// exactly), so a token's results do not depend on the batch around it.
///
/// # Safety
/// The AVX-512 VNNI set; `w` holds `rows` rows of `wrb >= 2n` bytes, `a` holds
/// `tokens * n` values, `out` has room for `(tokens - 1) * out_stride + rows` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_f16(
    w: &[u8],
    wrb: usize,
    rows: usize,
    a: &[f32],
    n: usize,
    tokens: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let mut r = 0;
    // SAFETY: forwarded; every tile stays inside rows × tokens.
    unsafe {
        while r < rows {
            let nr = (rows - r).min(4);
            let mut t = 0;
            while t < tokens {
                let nt = (tokens - t).min(4);
                let wp = w.as_ptr().add(r * wrb);
                let ap = a.as_ptr().add(t * n);
                let o = out.add(t * out_stride + r);
                macro_rules! tile {
                    ($($r:literal, $t:literal);*) => {
                        match (nr, nt) {
                            $(($r, $t) => f16_tile::<$r, $t>(wp, wrb, ap, n, o, out_stride),)*
                            _ => f16_tile::<1, 1>(wp, wrb, ap, n, o, out_stride),
                        }
                    };
                }
                tile!(4, 4; 4, 3; 4, 2; 4, 1; 3, 4; 3, 3; 3, 2; 3, 1; 2, 4; 2, 3; 2, 2; 2, 1;
                      1, 4; 1, 3; 1, 2);
                t += nt;
            }
            r += nr;
        }
    }
}

/// One R × T tile of [`matmul_f16`].
///
/// # Safety
/// As `matmul_f16`, for R rows from `w` and T tokens from `a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::needless_range_loop)] // a register tile reads clearest by its indices
unsafe fn f16_tile<const R: usize, const T: usize>(
    w: *const u8,
    wrb: usize,
    a: *const f32,
    n: usize,
    out: *mut f32,
    out_stride: usize,
) {
    // SAFETY: reads below n values of each of the R rows and T tokens; writes R × T
    // outputs the caller has room for.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        let mut i = 0;
        while i + 16 <= n {
            let mut wv = [_mm512_setzero_ps(); R];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = load_f16x16(w.add(j * wrb + 2 * i));
            }
            for t in 0..T {
                let av = _mm512_loadu_ps(a.add(t * n + i));
                for j in 0..R {
                    acc[j][t] = _mm512_fmadd_ps(wv[j], av, acc[j][t]);
                }
            }
            i += 16;
        }
        for j in 0..R {
            for t in 0..T {
                let mut s = hsum16(acc[j][t]);
                for k in i..n {
                    s += super::avx2::f16p(w.add(j * wrb + 2 * k)) * *a.add(t * n + k);
                }
                *out.add(t * out_stride + j) = s;
            }
        }
    }
}
