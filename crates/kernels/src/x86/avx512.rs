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
