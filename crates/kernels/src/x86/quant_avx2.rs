//! AVX2 activation quantisers for the two hot vec_dot types, byte-identical to the
//! scalar ones in `crate::quant` for finite input (same max, same scale arithmetic in
//! scalar f32, round-half-to-even by `vroundps`). Reached only through
//! `crate::quant_fn`, which hands them out only when `dispatch::hardware()` found
//! avx2 + fma + f16c.

use super::avx2::hmax_f32 as hmax;
use core::arch::x86_64::*;

/// `v · s` rounded half to even, as i32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn round_scaled(v: __m256, s: __m256) -> __m256i {
    _mm256_cvtps_epi32(_mm256_round_ps(
        _mm256_mul_ps(v, s),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    ))
}

/// Four vectors of eight i32 (each within i8) as 32 bytes in order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn pack_i8(q0: __m256i, q1: __m256i, q2: __m256i, q3: __m256i) -> __m256i {
    let q = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// # Safety
/// avx2 + fma + f16c; `x` whole blocks of 32, `out` 34 bytes per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0(x: &[f32], out: &mut [u8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        // SAFETY: x has 32 floats, b has 34 bytes.
        unsafe {
            let p = x.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for vi in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
            }
            let max = hmax(m);
            let d = max / 127.0;
            let id = _mm256_set1_ps(if max != 0.0 { 127.0 / max } else { 0.0 });
            b[0..2].copy_from_slice(&crate::quant::f16_bits(d));
            let q = pack_i8(
                round_scaled(v[0], id),
                round_scaled(v[1], id),
                round_scaled(v[2], id),
                round_scaled(v[3], id),
            );
            _mm256_storeu_si256(b.as_mut_ptr().add(2) as *mut __m256i, q);
        }
    }
}

/// # Safety
/// avx2 + fma + f16c; `x` whole blocks of 256, `out` 292 bytes per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_k(x: &[f32], out: &mut [u8]) {
    let sign = _mm256_set1_ps(-0.0);
    let ones = _mm256_set1_epi16(1);
    for (x, b) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        // SAFETY: x has 256 floats, b has 292 bytes.
        unsafe {
            let p = x.as_ptr();
            let mut m = _mm256_setzero_ps();
            for i in 0..32 {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * i))));
            }
            let amax = hmax(m);
            if amax == 0.0 {
                b.fill(0);
                continue;
            }
            // The scalar version keeps the first value of largest magnitude, sign included:
            // the first lane whose magnitude equals it, eight at a time.
            let target = _mm256_set1_ps(amax);
            let mut max = amax;
            for i in 0..32 {
                let v = _mm256_loadu_ps(p.add(8 * i));
                let hit = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), target, _CMP_EQ_OQ);
                let bits = _mm256_movemask_ps(hit);
                if bits != 0 {
                    max = x[8 * i + bits.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0 / max;
            let s = _mm256_set1_ps(iscale);
            for c in 0..8 {
                let q = pack_i8(
                    round_scaled(_mm256_loadu_ps(p.add(32 * c)), s),
                    round_scaled(_mm256_loadu_ps(p.add(32 * c + 8)), s),
                    round_scaled(_mm256_loadu_ps(p.add(32 * c + 16)), s),
                    round_scaled(_mm256_loadu_ps(p.add(32 * c + 24)), s),
                );
                _mm256_storeu_si256(b.as_mut_ptr().add(4 + 32 * c) as *mut __m256i, q);
                // Two sums of 16 (bsums 2c and 2c+1).
                for h in 0..2 {
                    let half = if h == 0 {
                        _mm256_castsi256_si128(q)
                    } else {
                        _mm256_extracti128_si256(q, 1)
                    };
                    let w = _mm256_madd_epi16(_mm256_cvtepi8_epi16(half), ones);
                    let w4 =
                        _mm_add_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
                    let w4 = _mm_add_epi32(w4, _mm_shuffle_epi32(w4, 0b01_00_11_10));
                    let w4 = _mm_add_epi32(w4, _mm_shuffle_epi32(w4, 0b10_11_00_01));
                    let sum = _mm_cvtsi128_si32(w4) as i16;
                    let at = 260 + 2 * (2 * c + h);
                    b[at..at + 2].copy_from_slice(&sum.to_le_bytes());
                }
            }
            b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        }
    }
}
