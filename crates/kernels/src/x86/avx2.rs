//! AVX2 + FMA + F16C kernels. Each `unsafe fn` here may only be called when the CPU
//! has avx2, fma and f16c (checked once in `dispatch`) and the slices hold at least
//! `n / block_size` blocks of their type (checked by `dispatch::Kernel::call`).
//!
//! K-quants compute the same exact i32 sums per super-block as `portable` and finish
//! with the shared `kq_acc`, so they are bit-identical to it; so is MXFP4 (exact block
//! sums, then portable's float steps in block order). The other 32-blocks and the
//! float types accumulate in f32 vector lanes (FMA), so they agree with `portable`
//! within a float bound (see tests).

use crate::portable::{KVALUES_MXFP4, Q8K, e8m0_half, f32_at, kq_acc, q3k_scales, scales_mins_k4};
use core::arch::x86_64::*;

// ------------------------------------------------------------------ helpers

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b00_00_00_01));
    _mm_cvtsi128_si32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Largest lane of `m`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn hmax_f32(m: __m256) -> f32 {
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    _mm_cvtss_f32(m4)
}

/// One f16 (little-endian bytes at `p`) to f32 with F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn f16p(p: *const u8) -> f32 {
    // SAFETY: caller guarantees 2 readable bytes at p.
    let h = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 32 readable bytes at p.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// 16 packed nibbles to 32 bytes: low nibbles first, then the high ones (ggml's order).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes at p.
    let t = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(b, _mm256_set1_epi8(0x0F))
}

/// 32 bits at `p` to 32 bytes of 0xFF (bit set) / 0x00.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bits32(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 4 readable bytes at p.
    let x = unsafe { (p as *const u32).read_unaligned() };
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0,
    );
    let b = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1))
}

/// Σ u8·i8 in groups of 8 → i32x8 (no saturation for |u|·|i| ≤ 16383·… as used here).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mul_sum_us8(ax: __m256i, sy: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// Σ i8·i8 via |x| and sign(y, x).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: same features.
    unsafe { mul_sum_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
}

// ------------------------------------------------------------------ floats

/// # Safety
/// avx2+fma+f16c; `w`, `a` hold `n` f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (x, y) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every read is below n elements.
    unsafe {
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let p = i + 8 * k;
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(p)), _mm256_loadu_ps(y.add(p)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(y.add(i)), acc[0]);
            i += 8;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum_f32(v);
        while i < n {
            s += x.add(i).read_unaligned() * y.add(i).read_unaligned();
            i += 1;
        }
        s
    }
}

/// # Safety
/// avx2+fma+f16c; `w`, `a` hold `n` f16.
///
/// The 1 × 1 case of [`matmul_f16`]'s arithmetic (one 8-lane accumulator over steps of
/// 8, `hsum_f32`, then the scalar tail), so a dot gives the same bits alone or in a tile.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (x, y) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: every read is below n elements.
    unsafe {
        let ld = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        while i + 8 <= n {
            acc = _mm256_fmadd_ps(ld(x.add(2 * i)), ld(y.add(2 * i)), acc);
            i += 8;
        }
        let mut s = hsum_f32(acc);
        while i < n {
            s += f16p(x.add(2 * i)) * f16p(y.add(2 * i));
            i += 1;
        }
        s
    }
}

/// f16 values (`src`, little-endian) to f32 (`dst`, as many), exactly.
///
/// # Safety
/// avx2+fma+f16c; `src` holds `2 * dst.len()` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let mut i = 0;
    // SAFETY: reads below 2n bytes of src, writes below n values of dst.
    unsafe {
        while i + 8 <= n {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
            i += 8;
        }
        while i < n {
            dst[i] = f16p(src.as_ptr().add(2 * i));
            i += 1;
        }
    }
}

/// Weight rows per register tile of [`matmul_f16`].
const F16_ROWS: usize = 4;

/// `out[t * out_stride + r] = W[r] · A[t]` for `rows` f16 weight rows (`wrb` bytes
/// apart from `w`) and `tokens` activation rows in f32 (`n` values each, `a` packed),
/// in tiles of 4 rows × `TOKENS` tokens: each converted weight vector serves the tile's
/// tokens and each activation vector four rows. Every (row, token) dot is summed
/// exactly as [`dot_f16`] sums it (the activations are its f16 values, converted
/// exactly), so a token's results do not depend on the batch around it. (The AVX-512
/// sets have their own, 16 lanes wide: `avx512::matmul_f16`.)
///
/// # Safety
/// The features of the entry; `w` holds `rows` rows of `wrb >= 2n` bytes, `a` holds
/// `tokens * n` values, `out` has room for `(tokens - 1) * out_stride + rows` values.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_f16_tiles<const TOKENS: usize>(
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
            let nr = (rows - r).min(F16_ROWS);
            let mut t = 0;
            while t < tokens {
                let nt = (tokens - t).min(TOKENS);
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
                tile!(4, 2; 4, 1; 3, 2; 3, 1; 2, 2; 2, 1; 1, 2);
                t += nt;
            }
            r += nr;
        }
    }
}

/// [`matmul_f16_tiles`] with 2 tokens per tile (16 ymm registers).
///
/// # Safety
/// avx2+fma+f16c; as `matmul_f16_tiles`.
#[target_feature(enable = "avx2,fma,f16c")]
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
    // SAFETY: forwarded.
    unsafe { matmul_f16_tiles::<2>(w, wrb, rows, a, n, tokens, out, out_stride) }
}

/// One R × T tile of [`matmul_f16`].
///
/// # Safety
/// As `matmul_f16`, for R rows from `w` and T tokens from `a`.
#[target_feature(enable = "avx2,fma,f16c")]
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
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let mut i = 0;
        while i + 8 <= n {
            let mut wv = [_mm256_setzero_ps(); R];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = _mm256_cvtph_ps(_mm_loadu_si128(w.add(j * wrb + 2 * i) as *const __m128i));
            }
            for t in 0..T {
                let av = _mm256_loadu_ps(a.add(t * n + i));
                for j in 0..R {
                    acc[j][t] = _mm256_fmadd_ps(wv[j], av, acc[j][t]);
                }
            }
            i += 8;
        }
        for j in 0..R {
            for t in 0..T {
                let mut s = hsum_f32(acc[j][t]);
                for k in i..n {
                    s += f16p(w.add(j * wrb + 2 * k)) * *a.add(t * n + k);
                }
                *out.add(t * out_stride + j) = s;
            }
        }
    }
}

/// # Safety
/// avx2+fma+f16c; `w`, `a` hold `n` bf16.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (x, y) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    // SAFETY: every read is below n elements.
    unsafe {
        let ld = |p: *const u8| {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
        };
        while i + 16 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let p = 2 * (i + 8 * k);
                *a = _mm256_fmadd_ps(ld(x.add(p)), ld(y.add(p)), *a);
            }
            i += 16;
        }
        let mut s = hsum_f32(_mm256_add_ps(acc[0], acc[1]));
        while i < n {
            let bx = f32::from_bits(((x.add(2 * i) as *const u16).read_unaligned() as u32) << 16);
            let by = f32::from_bits(((y.add(2 * i) as *const u16).read_unaligned() as u32) << 16);
            s += bx * by;
            i += 1;
        }
        s
    }
}

// ------------------------------------------------------------------ 32-blocks

/// Shared loop over 32-blocks against Q8_0: `qx(block ptr)` gives the 32 weight bytes
/// (signed) of a block; `dx(block ptr)` its scale.
macro_rules! legacy_q8_0 {
    ($w:expr, $a:expr, $n:expr, $ts:expr, |$p:ident| $qx:expr, $dx:expr) => {{
        let (mut xp, mut yp) = ($w.as_ptr(), $a.as_ptr());
        let mut acc = _mm256_setzero_ps();
        for _ in 0..$n / 32 {
            let $p = xp;
            let qx: __m256i = $qx;
            let qy = load256(yp.add(2));
            let d = _mm256_set1_ps($dx * f16p(yp));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(mul_sum_i8(qx, qy)), acc);
            xp = xp.add($ts);
            yp = yp.add(34);
        }
        hsum_f32(acc)
    }};
}

/// # Safety
/// avx2+fma+f16c; whole Q4_0 / Q8_0 blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: block reads stay inside the n/32 blocks.
    unsafe {
        legacy_q8_0!(
            w,
            a,
            n,
            18,
            |p| _mm256_sub_epi8(nibbles32(p.add(2)), _mm256_set1_epi8(8)),
            f16p(p)
        )
    }
}

/// # Safety
/// avx2+fma+f16c; whole Q5_0 / Q8_0 blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: block reads stay inside the n/32 blocks.
    unsafe {
        legacy_q8_0!(
            w,
            a,
            n,
            22,
            |p| _mm256_or_si256(
                nibbles32(p.add(6)),
                _mm256_andnot_si256(bits32(p.add(2)), _mm256_set1_epi8(0xF0u8 as i8))
            ),
            f16p(p)
        )
    }
}

/// # Safety
/// avx2+fma+f16c; whole Q8_0 / Q8_0 blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: block reads stay inside the n/32 blocks.
    unsafe { legacy_q8_0!(w, a, n, 34, |p| load256(p.add(2)), f16p(p)) }
}

/// MXFP4's sixteen values (ggml's `kvalues_mxfp4`, E2M1 doubled) in both 128-bit
/// halves, for `vpshufb`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mxfp4_table() -> __m256i {
    // SAFETY: the table has 16 bytes.
    let t = unsafe { _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i) };
    _mm256_broadcastsi128_si256(t)
}

/// The exact integer sum `Σ kvalues_mxfp4[nibble]·q` of one MXFP4 block (`x`, 17 bytes)
/// against one Q8_0 block (`y`, 34 bytes), spread over eight i32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mxfp4_block(table: __m256i, x: *const u8, y: *const u8) -> __m256i {
    // SAFETY: the caller guarantees a whole block at each pointer.
    unsafe {
        let v = _mm256_shuffle_epi8(table, nibbles32(x.add(1)));
        // |v| ≤ 12, so a `vpmaddubsw` pair is at most 2 · 12 · 128: exact.
        mul_sum_i8(v, load256(y.add(2)))
    }
}

/// Two 16-byte runs as one ymm: `lo` in the low half, `hi` in the high one (a load and
/// a memory-operand `vinserti128`: no shuffle-port work).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load2x128(lo: *const u8, hi: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes at each pointer.
    unsafe {
        _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(lo as *const __m128i)),
            _mm_loadu_si128(hi as *const __m128i),
            1,
        )
    }
}

/// The exact integer sums of MXFP4 blocks `x0`/`y0` (low 128-bit half) and `x1`/`y1`
/// (high half), four i32 lanes each.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mxfp4_block_pair(
    table: __m256i,
    x0: *const u8,
    x1: *const u8,
    y0: *const u8,
    y1: *const u8,
) -> __m256i {
    // SAFETY: the caller guarantees a whole block at each pointer.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let q = load2x128(x0.add(1), x1.add(1));
        // Elements 0..16 of each block (low nibbles), then 16..32 (high nibbles).
        let v0 = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
        let v1 = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
        let a0 = load2x128(y0.add(2), y1.add(2));
        let a1 = load2x128(y0.add(18), y1.add(18));
        // |v| ≤ 12: a `vpmaddubsw` pair is at most 2 · 12 · 128 and the sum of two
        // pairs 6144, exact in i16.
        let p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(v0, v0), _mm256_sign_epi8(a0, v0));
        let p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(v1, v1), _mm256_sign_epi8(a1, v1));
        _mm256_madd_epi16(_mm256_add_epi16(p0, p1), _mm256_set1_epi16(1))
    }
}

/// ggml's `GGML_E8M0_TO_FP32_HALF` on eight i32 lanes (each 0..=255): `(e − 1) << 23`,
/// or the subnormals `0x0020_0000 << e` for e < 2. Exact, as the scalar one.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn e8m0_half8(e: __m256i) -> __m256 {
    let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small))
}

/// # Safety
/// avx2+fma+f16c; whole MXFP4 / Q8_0 blocks for `n`.
///
/// Bit-identical to `portable::dot_mxfp4`: each block's integer sum is exact, its
/// scale `dy · e8m0_half(e)` and the product with the sum are the same f32 multiplies
/// (eight blocks per vector), and the products are added to one f32 in block order.
/// The additions are a serial chain (one per block); the integer sums of the next
/// blocks run beside it.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_mxfp4(w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / 32;
    let (x, y) = (w.as_ptr(), a.as_ptr());
    let mut acc = 0.0f32;
    let mut b = 0;
    // Eight blocks per step, in pairs (2i, 2i + 1) whose sums share a ymm; after the
    // `vphaddd` rounds lane j holds block LANE[j], and the scales are gathered in that
    // order.
    const LANE: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
    // SAFETY: every block read is below nb (the caller's contract).
    unsafe {
        let table = mxfp4_table();
        while b + 8 <= nb {
            let (xb, yb) = (x.add(17 * b), y.add(34 * b));
            let s: [__m256i; 4] = core::array::from_fn(|i| {
                let (i0, i1) = (2 * i, 2 * i + 1);
                mxfp4_block_pair(
                    table,
                    xb.add(17 * i0),
                    xb.add(17 * i1),
                    yb.add(34 * i0),
                    yb.add(34 * i1),
                )
            });
            // [b0 b2 | b1 b3] halves, then [b0 b2 b4 b6 | b1 b3 b5 b7].
            let t0 = _mm256_hadd_epi32(s[0], s[1]);
            let t1 = _mm256_hadd_epi32(s[2], s[3]);
            let sumi = _mm256_cvtepi32_ps(_mm256_hadd_epi32(t0, t1));
            let h = |j: usize| (yb.add(34 * LANE[j]) as *const i16).read_unaligned();
            let dy = _mm256_cvtph_ps(_mm_setr_epi16(
                h(0),
                h(1),
                h(2),
                h(3),
                h(4),
                h(5),
                h(6),
                h(7),
            ));
            let x8 = |j: usize| *xb.add(17 * LANE[j]) as i32;
            let e = _mm256_setr_epi32(x8(0), x8(1), x8(2), x8(3), x8(4), x8(5), x8(6), x8(7));
            let d = _mm256_mul_ps(dy, e8m0_half8(e));
            let mut prod = [0f32; 8];
            _mm256_storeu_ps(prod.as_mut_ptr(), _mm256_mul_ps(d, sumi));
            // Block k sits in lane (k % 2) · 4 + k / 2.
            for k in 0..8 {
                acc += prod[(k % 2) * 4 + k / 2];
            }
            b += 8;
        }
        while b < nb {
            let (xb, yb) = (x.add(17 * b), y.add(34 * b));
            let sumi = hsum_i32(mxfp4_block(table, xb, yb));
            acc += (f16p(yb) * e8m0_half(*xb)) * sumi as f32;
            b += 1;
        }
    }
    acc
}

/// Shared loop over 32-blocks with a min against Q8_1 (unsigned weights).
macro_rules! legacy_q8_1 {
    ($w:expr, $a:expr, $n:expr, $ts:expr, |$p:ident| $qx:expr) => {{
        let (mut xp, mut yp) = ($w.as_ptr(), $a.as_ptr());
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0.0f32;
        for _ in 0..$n / 32 {
            let $p = xp;
            let qx: __m256i = $qx;
            let qy = load256(yp.add(4));
            let d = _mm256_set1_ps(f16p(xp) * f16p(yp));
            summs += f16p(xp.add(2)) * f16p(yp.add(2));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(mul_sum_us8(qx, qy)), acc);
            xp = xp.add($ts);
            yp = yp.add(36);
        }
        hsum_f32(acc) + summs
    }};
}

/// # Safety
/// avx2+fma+f16c; whole Q4_1 / Q8_1 blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: block reads stay inside the n/32 blocks.
    unsafe { legacy_q8_1!(w, a, n, 20, |p| nibbles32(p.add(4))) }
}

/// # Safety
/// avx2+fma+f16c; whole Q5_1 / Q8_1 blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: block reads stay inside the n/32 blocks.
    unsafe {
        legacy_q8_1!(w, a, n, 24, |p| _mm256_or_si256(
            nibbles32(p.add(8)),
            _mm256_and_si256(bits32(p.add(4)), _mm256_set1_epi8(0x10))
        ))
    }
}

// ------------------------------------------------------------------ K-quants

/// i16x16 with lanes 0..8 = `lo`, 8..16 = `hi` (two 16-element sub-block scales).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale_pair(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// Σ bsums[j] · m[j] over 16 sub-blocks, m given as i16x16.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn bsums_dot(y: *const u8, m: __m256i) -> i32 {
    // SAFETY: a Q8_K block has its 16 bsums at 260.
    unsafe { hsum_i32(_mm256_madd_epi16(load256(y.add(260)), m)) }
}

/// # Safety
/// avx2+fma+f16c; whole Q2_K / Q8_K blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q2_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    for i in 0..n / 256 {
        // SAFETY: block i of each row is in bounds.
        unsafe {
            let x = w.as_ptr().add(84 * i);
            let y = a.as_ptr().add(Q8K * i);
            let sc = _mm_loadu_si128(x as *const __m128i);
            let mins =
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0xF)));
            let summs = bsums_dot(y, mins);
            let scb = &w[84 * i..84 * i + 16];
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let q2 = load256(x.add(16 + 32 * h));
                for k in 0..4 {
                    let q = _mm256_and_si256(
                        _mm256_srlv_epi32(q2, _mm256_set1_epi32(2 * k as i32)),
                        _mm256_set1_epi8(3),
                    );
                    let q8 = load256(y.add(4 + 128 * h + 32 * k));
                    let p = _mm256_maddubs_epi16(q, q8);
                    let s = 8 * h + 2 * k;
                    let sv = scale_pair((scb[s] & 0xF) as i32, (scb[s + 1] & 0xF) as i32);
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sv));
                }
            }
            let dy = f32_at(a, Q8K * i);
            acc = kq_acc(
                acc,
                dy * f16p(x.add(80)),
                hsum_i32(sumi),
                dy * f16p(x.add(82)),
                summs,
            );
        }
    }
    acc
}

/// # Safety
/// avx2+fma+f16c; whole Q3_K / Q8_K blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q3_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    for i in 0..n / 256 {
        // SAFETY: block i of each row is in bounds.
        unsafe {
            let x = w.as_ptr().add(110 * i);
            let y = a.as_ptr().add(Q8K * i);
            let sc = q3k_scales(&w[110 * i + 96..110 * i + 108]);
            let hb = load256(x);
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let q3 = load256(x.add(32 + 32 * h));
                for k in 0..4 {
                    let g = 4 * h + k;
                    let low = _mm256_and_si256(
                        _mm256_srlv_epi32(q3, _mm256_set1_epi32(2 * k as i32)),
                        _mm256_set1_epi8(3),
                    );
                    let hbit = _mm256_and_si256(
                        _mm256_srlv_epi32(hb, _mm256_set1_epi32(g as i32)),
                        _mm256_set1_epi8(1),
                    );
                    let sub4 = _mm256_slli_epi16(_mm256_xor_si256(hbit, _mm256_set1_epi8(1)), 2);
                    let q8 = load256(y.add(4 + 32 * g));
                    let p = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(low, q8),
                        _mm256_maddubs_epi16(sub4, q8),
                    );
                    let sv = scale_pair(sc[2 * g] as i32, sc[2 * g + 1] as i32);
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sv));
                }
            }
            acc = kq_acc(
                acc,
                f16p(x.add(108)) * f32_at(a, Q8K * i),
                hsum_i32(sumi),
                0.0,
                0,
            );
        }
    }
    acc
}

/// The eight Q4_K/Q5_K mins as i16x16 (each repeated for the two 16-bsums it covers).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn mins16(mn: &[u8; 8]) -> __m256i {
    // SAFETY: `mn` has 8 bytes.
    let m = _mm_cvtepu8_epi16(unsafe { _mm_loadl_epi64(mn.as_ptr() as *const __m128i) });
    // duplicate each i16: [m0 m0 m1 m1 ...]
    _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m))
}

/// # Safety
/// avx2+fma+f16c; whole Q4_K / Q8_K blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    let m4 = _mm256_set1_epi8(0xF);
    for i in 0..n / 256 {
        // SAFETY: block i of each row is in bounds.
        unsafe {
            let x = w.as_ptr().add(144 * i);
            let y = a.as_ptr().add(Q8K * i);
            let (sc, mn) = scales_mins_k4(&w[144 * i + 4..144 * i + 16]);
            let summs = bsums_dot(y, mins16(&mn));
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let q4 = load256(x.add(16 + 32 * j));
                let lo = _mm256_and_si256(q4, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
                let pl = _mm256_maddubs_epi16(lo, load256(y.add(4 + 64 * j)));
                let ph = _mm256_maddubs_epi16(hi, load256(y.add(36 + 64 * j)));
                let pl = _mm256_madd_epi16(pl, _mm256_set1_epi16(sc[2 * j] as i16));
                let ph = _mm256_madd_epi16(ph, _mm256_set1_epi16(sc[2 * j + 1] as i16));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
            }
            let dy = f32_at(a, Q8K * i);
            acc = kq_acc(
                acc,
                f16p(x) * dy,
                hsum_i32(sumi),
                f16p(x.add(2)) * dy,
                summs,
            );
        }
    }
    acc
}

/// # Safety
/// avx2+fma+f16c; whole Q5_K / Q8_K blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    let m4 = _mm256_set1_epi8(0xF);
    let one = _mm256_set1_epi8(1);
    for i in 0..n / 256 {
        // SAFETY: block i of each row is in bounds.
        unsafe {
            let x = w.as_ptr().add(176 * i);
            let y = a.as_ptr().add(Q8K * i);
            let (sc, mn) = scales_mins_k4(&w[176 * i + 4..176 * i + 16]);
            let summs = bsums_dot(y, mins16(&mn));
            let qh = load256(x.add(16));
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let q4 = load256(x.add(48 + 32 * j));
                let hl =
                    _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_set1_epi32(2 * j as i32)), one);
                let hh = _mm256_and_si256(
                    _mm256_srlv_epi32(qh, _mm256_set1_epi32(2 * j as i32 + 1)),
                    one,
                );
                let lo = _mm256_or_si256(_mm256_and_si256(q4, m4), _mm256_slli_epi16(hl, 4));
                let hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4),
                    _mm256_slli_epi16(hh, 4),
                );
                let pl = _mm256_maddubs_epi16(lo, load256(y.add(4 + 64 * j)));
                let ph = _mm256_maddubs_epi16(hi, load256(y.add(36 + 64 * j)));
                let pl = _mm256_madd_epi16(pl, _mm256_set1_epi16(sc[2 * j] as i16));
                let ph = _mm256_madd_epi16(ph, _mm256_set1_epi16(sc[2 * j + 1] as i16));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
            }
            let dy = f32_at(a, Q8K * i);
            acc = kq_acc(
                acc,
                f16p(x) * dy,
                hsum_i32(sumi),
                f16p(x.add(2)) * dy,
                summs,
            );
        }
    }
    acc
}

/// # Safety
/// avx2+fma+f16c; whole Q6_K / Q8_K blocks for `n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    let k32 = _mm256_set1_epi8(32);
    for i in 0..n / 256 {
        // SAFETY: block i of each row is in bounds.
        unsafe {
            let x = w.as_ptr().add(210 * i);
            let y = a.as_ptr().add(Q8K * i);
            let sc = &w[210 * i + 192..210 * i + 208];
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let ql0 = load256(x.add(64 * h));
                let ql1 = load256(x.add(64 * h + 32));
                let qh = load256(x.add(128 + 32 * h));
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                    ),
                ];
                for (k, &qk) in q.iter().enumerate() {
                    let q8 = load256(y.add(4 + 128 * h + 32 * k));
                    let p = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(qk, q8),
                        _mm256_maddubs_epi16(k32, q8),
                    );
                    let s = 8 * h + 2 * k;
                    let sv = scale_pair(sc[s] as i8 as i32, sc[s + 1] as i8 as i32);
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sv));
                }
            }
            acc = kq_acc(
                acc,
                f16p(x.add(208)) * f32_at(a, Q8K * i),
                hsum_i32(sumi),
                0.0,
                0,
            );
        }
    }
    acc
}
