//! AVX-512 VNNI kernels over the packed layout (`crate::packed`): one call computes 16
//! rows (one group) against up to `TILE` tokens. Each 64-byte weight vector is unpacked
//! once and multiplied (`vpdpbusd`) with every token's four broadcast activation bytes;
//! lane r accumulates row r, so results are stored without reduction.
//!
//! Float steps follow `portable` exactly, per lane (separate multiply and add, no FMA),
//! so the results are bit-identical to the portable kernels.
//!
//! Every function here may only be called when `dispatch::hardware()` found avx2, fma,
//! f16c, avx512f, avx512bw, avx512vl and avx512vnni (guaranteed by `packed::packable`).

use crate::packed::{MXFP4_UNSIGNED, Tile};
use crate::x86::packed256::{k45_prefetch, prefetch_legacy, q6_k_prefetch};
use core::arch::x86_64::*;
use llamay_formats::GgmlType;

/// Tokens per register tile.
pub(crate) const TILE: usize = 8;

/// Runs the kernel for `ty` on `m` tokens (1..=TILE).
///
/// # Safety
/// The AVX-512 VNNI set (module doc); `t`'s pointers cover `m` tokens and the group.
pub(crate) unsafe fn tile(ty: GgmlType, m: usize, t: &Tile) {
    macro_rules! by_m {
        ($f:ident $(, $c:expr)?) => {
            // SAFETY: forwarded from the caller.
            unsafe {
                match m {
                    1 => $f::<1 $(, $c)?>(t),
                    2 => $f::<2 $(, $c)?>(t),
                    3 => $f::<3 $(, $c)?>(t),
                    4 => $f::<4 $(, $c)?>(t),
                    5 => $f::<5 $(, $c)?>(t),
                    6 => $f::<6 $(, $c)?>(t),
                    7 => $f::<7 $(, $c)?>(t),
                    _ => $f::<TILE $(, $c)?>(t),
                }
            }
        };
    }
    match ty {
        GgmlType::Q8_0 => by_m!(legacy, Q8_0),
        GgmlType::Q4_0 => by_m!(legacy, Q4_0),
        GgmlType::Q5_0 => by_m!(legacy, Q5_0),
        GgmlType::MXFP4 => by_m!(legacy, MXFP4),
        GgmlType::Q4_K => by_m!(k45, false),
        GgmlType::Q5_K => by_m!(k45, true),
        GgmlType::Q6_K => by_m!(q6_k),
        _ => {}
    }
}

use crate::x86::packed256::{MXFP4, Q4_0, Q5_0, Q8_0};

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn load512(p: *const u8) -> __m512i {
    // SAFETY: caller guarantees 64 readable bytes at p.
    unsafe { _mm512_loadu_si512(p as *const _) }
}

/// Four activation bytes at `p`, broadcast to every lane.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn bcast4(p: *const u8) -> __m512i {
    // SAFETY: caller guarantees 4 readable bytes at p.
    _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

/// Sixteen f16 scales at `p` as f32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn scales16(p: *const u8) -> __m512 {
    // SAFETY: caller guarantees 32 readable bytes at p.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p as *const __m256i) })
}

/// Sixteen bytes at `p` widened to i32 lanes (unsigned, or signed for `SIGNED`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn bytes16<const SIGNED: bool>(p: *const u8) -> __m512i {
    // SAFETY: caller guarantees 16 readable bytes at p.
    let v = unsafe { _mm_loadu_si128(p as *const __m128i) };
    if SIGNED {
        _mm512_cvtepi8_epi32(v)
    } else {
        _mm512_cvtepu8_epi32(v)
    }
}

/// ggml's `GGML_E8M0_TO_FP32_HALF` of sixteen exponent bytes at `p`: `(e − 1) << 23`,
/// or the subnormals `0x0020_0000 << e` for e < 2. Exact, as `portable::e8m0_half`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn e8m0_half16(p: *const u8) -> __m512 {
    // SAFETY: caller guarantees 16 readable bytes at p.
    let e = unsafe { bytes16::<false>(p) };
    let normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
    let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub))
}

/// The unsigned weights of quad `k` (elements 4k..4k+3 of each row) of block `b`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn legacy_quad<const F: u8>(w: *const u8, bits_at: usize, b: usize, k: usize) -> __m512i {
    let m4 = _mm512_set1_epi8(0xF);
    // SAFETY: block b of the group; `bits_at` is Q5_0's fifth-bit section (`packed::sections`).
    unsafe {
        if F == Q8_0 {
            return load512(w.add(b * 512 + k * 64));
        }
        let v = load512(w.add(b * 256 + (k % 4) * 64));
        let q = if k < 4 {
            _mm512_and_si512(v, m4)
        } else {
            _mm512_and_si512(_mm512_srli_epi16(v, 4), m4)
        };
        if F == Q5_0 {
            let bits = (w.add(bits_at + b * 64 + k * 8) as *const u64).read_unaligned();
            return _mm512_mask_add_epi8(q, bits, q, _mm512_set1_epi8(16));
        }
        if F == MXFP4 {
            let t = _mm_loadu_si128(MXFP4_UNSIGNED.as_ptr() as *const __m128i);
            return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), q);
        }
        q
    }
}

/// Q8_0 / Q4_0 / Q5_0 / MXFP4 weights against Q8_0 activations: per block
/// `acc += (dw · dy) · Σ (q_w − off) q_a`, ggml's order (MXFP4: `dw` from the exponent
/// byte, `dw · dy = dy · dw` exactly).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn legacy<const T: usize, const F: u8>(p: &Tile) {
    let mut facc = [_mm512_setzero_ps(); T];
    // SAFETY: every pointer below stays inside the group (nb blocks) and the T tokens'
    // activation rows and prep entries (the caller's contract).
    unsafe {
        for b in 0..p.nb {
            let mut iacc = [_mm512_setzero_si512(); T];
            for (t, acc) in iacc.iter_mut().enumerate() {
                *acc = _mm512_set1_epi32(*p.aux.add(t * p.prep_stride + b));
            }
            for k in 0..8 {
                // One token streams the matrix from memory: ask for its lines ahead
                // (see `packed256::PREFETCH`).
                if T == 1 {
                    prefetch_legacy::<F>(p, b, k);
                }
                let w = legacy_quad::<F>(p.w, p.sec[1], b, k);
                for (t, acc) in iacc.iter_mut().enumerate() {
                    let av = bcast4(p.a.add(t * p.a_stride + b * 34 + 2 + 4 * k));
                    *acc = _mm512_dpbusd_epi32(*acc, w, av);
                }
            }
            let d = if F == MXFP4 {
                e8m0_half16(p.w.add(p.sec[1] + b * 16))
            } else {
                scales16(p.w.add(p.sec[if F == Q5_0 { 2 } else { 1 }] + b * 32))
            };
            for (t, acc) in facc.iter_mut().enumerate() {
                let s = _mm512_mul_ps(d, _mm512_set1_ps(*p.dy.add(t * p.prep_stride + b)));
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(s, _mm512_cvtepi32_ps(iacc[t])));
            }
        }
        for (t, acc) in facc.iter().enumerate() {
            _mm512_storeu_ps(p.out.add(t * p.out_stride), *acc);
        }
    }
}

/// Q4_K (and Q5_K with `Q5`: a fifth bit per weight) against Q8_K:
/// `acc = (acc + (d·dy)·Σ_j sc_j Σ q a) − (dmin·dy)·Σ_j m_j bsum_j`, as
/// `portable::dot_q4_k` / `dot_q5_k` and `kq_acc`, bit for bit.
///
/// The sub-block products `sc_j · Σ q a` are summed in f32, not with `vpmulld` (which
/// issues at half the rate of an add here, on the ports `vpdpbusd` needs). That
/// is exact: each integer sum converts exactly (below 2²⁴), each product is an integer
/// below 2²² (Q4_K: 63 · 32 · 15 · 128) and four of them sum below 2²⁴, so Q4_K keeps
/// two exact halves whose one f32 addition rounds as the portable `sumi as f32` does.
/// Q5_K's products reach 2²³, so pairs of them are turned back into integers (exact)
/// and summed as such. Q4_K's high nibbles are used as `16 q` (masked, not shifted),
/// their scale divided by 16 (exact). The running sums live in the output rows
/// (registers hold the halves).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn k45<const T: usize, const Q5: bool>(p: &Tile) {
    let nb = p.nb;
    // SAFETY: as in `legacy`.
    unsafe {
        for t in 0..T {
            _mm512_storeu_ps(p.out.add(t * p.out_stride), _mm512_setzero_ps());
        }
        for b in 0..nb {
            // Q4_K: the first half's f32 sum; Q5_K: the integer sum of the pairs so far.
            let mut kept = [_mm512_setzero_ps(); T];
            let mut part = [_mm512_setzero_ps(); T];
            for c in 0..4 {
                k45_sub::<T, Q5, false>(p, b, 2 * c, &mut part);
                k45_sub::<T, Q5, true>(p, b, 2 * c + 1, &mut part);
                if Q5 {
                    for (k, pt) in kept.iter_mut().zip(part.iter_mut()) {
                        let sum =
                            _mm512_add_epi32(_mm512_castps_si512(*k), _mm512_cvtps_epi32(*pt));
                        *k = _mm512_castsi512_ps(sum);
                        *pt = _mm512_setzero_ps();
                    }
                } else if c == 1 {
                    kept = part;
                    part = [_mm512_setzero_ps(); T];
                }
            }
            let end = k45_end_of::<Q5>(p, b);
            for t in 0..T {
                let sumi = if Q5 {
                    _mm512_cvtepi32_ps(_mm512_castps_si512(kept[t]))
                } else {
                    _mm512_add_ps(kept[t], part[t])
                };
                k45_end(p, &end, b, t, sumi);
            }
        }
    }
}

/// What the block end of `k45` needs of block `b` besides the sums: the mins as i16
/// pairs (m_2q, m_2q+1) per lane, d and dmin.
pub(crate) struct K45End {
    mpair: [__m512i; 4],
    d: __m512,
    dmin: __m512,
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn k45_end_of<const Q5: bool>(p: &Tile, b: usize) -> K45End {
    let [_, _, mn_sec, d_sec, dmin_sec] = k45_sections::<Q5>(p);
    // SAFETY: block b's mins, d and dmin lie inside the group (the caller's contract).
    unsafe {
        let mpair = core::array::from_fn(|q| {
            let m0 = bytes16::<false>(p.w.add(mn_sec + b * 128 + (2 * q) * 16));
            let m1 = bytes16::<false>(p.w.add(mn_sec + b * 128 + (2 * q + 1) * 16));
            _mm512_or_si512(m0, _mm512_slli_epi32(m1, 16))
        });
        K45End {
            mpair,
            d: scales16(p.w.add(d_sec + b * 32)),
            dmin: scales16(p.w.add(dmin_sec + b * 32)),
        }
    }
}

/// Token `t`'s end of block `b` (`sumi` = Σ_j sc_j Σ q a, exact in f32):
/// `out = (out + (d·dy)·sumi) − (dmin·dy)·Σ_j m_j bsum_j`, as `portable::kq_acc`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn k45_end(p: &Tile, e: &K45End, b: usize, t: usize, sumi: __m512) {
    // SAFETY: token t's prep entries and output row (the caller's contract).
    unsafe {
        let aux = p.aux.add((t * p.prep_stride + b) * 4);
        let mut summs = _mm512_setzero_si512();
        for (q, mp) in e.mpair.iter().enumerate() {
            summs = dpwssd(summs, *mp, _mm512_set1_epi32(*aux.add(q)));
        }
        let summs = _mm512_cvtepi32_ps(summs);
        let dy = _mm512_set1_ps(*p.dy.add(t * p.prep_stride + b));
        let out = p.out.add(t * p.out_stride);
        let x = _mm512_add_ps(
            _mm512_loadu_ps(out),
            _mm512_mul_ps(_mm512_mul_ps(e.d, dy), sumi),
        );
        let acc = _mm512_sub_ps(x, _mm512_mul_ps(_mm512_mul_ps(e.dmin, dy), summs));
        _mm512_storeu_ps(out, acc);
    }
}

/// Q4_K/Q5_K sections after the nibbles: fifth bits (Q5_K only), scales, mins, d, dmin.
#[inline(always)]
pub(crate) fn k45_sections<const Q5: bool>(p: &Tile) -> [usize; 5] {
    if Q5 {
        [p.sec[1], p.sec[2], p.sec[3], p.sec[4], p.sec[5]]
    } else {
        [0, p.sec[1], p.sec[2], p.sec[3], p.sec[4]]
    }
}

/// Sub-block `j` of block `b` (`ODD` = `j` is odd: the high nibbles) of `k45`: its
/// integer sums per token, times its scale, added to `part` in f32. With the nibble
/// fixed at compile time the loop carries no branches.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn k45_sub<const T: usize, const Q5: bool, const ODD: bool>(
    p: &Tile,
    b: usize,
    j: usize,
    part: &mut [__m512; T],
) {
    let m4 = _mm512_set1_epi8(0xF);
    let [hi_sec, sc_sec, ..] = k45_sections::<Q5>(p);
    // Q4_K's high nibbles are used as 16 q (masked, not shifted), their scale / 16.
    let scaled_high = !Q5 && ODD;
    // SAFETY: as in `k45`.
    unsafe {
        let mut iacc = [_mm512_setzero_si512(); T];
        for kk in 0..8 {
            if T == 1 && !ODD {
                k45_prefetch::<Q5>(p, b, j / 2, kk);
            }
            let v = load512(p.w.add(b * 2048 + ((j / 2) * 8 + kk) * 64));
            let mut w = if !ODD {
                _mm512_and_si512(v, m4)
            } else if scaled_high {
                _mm512_andnot_si512(m4, v)
            } else {
                _mm512_and_si512(_mm512_srli_epi16(v, 4), m4)
            };
            if Q5 {
                let at = hi_sec + b * 512 + (8 * j + kk) * 8;
                let bits = (p.w.add(at) as *const u64).read_unaligned();
                w = _mm512_mask_add_epi8(w, bits, w, _mm512_set1_epi8(16));
            }
            for (t, acc) in iacc.iter_mut().enumerate() {
                let av = bcast4(p.a.add(t * p.a_stride + b * 292 + 4 + 32 * j + 4 * kk));
                *acc = _mm512_dpbusd_epi32(*acc, w, av);
            }
        }
        let mut sc = _mm512_cvtepi32_ps(bytes16::<false>(p.w.add(sc_sec + b * 128 + j * 16)));
        if scaled_high {
            sc = _mm512_mul_ps(sc, _mm512_set1_ps(1.0 / 16.0));
        }
        for (acc, pt) in iacc.iter().zip(part.iter_mut()) {
            *pt = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(*acc), *pt);
        }
    }
}

/// Quad `q` (elements 4q..4q+3 of each of the 16 rows, in quarter `M = q / 16`) of
/// Q6_K block `b`, as unsigned six-bit values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn q6_k_quad<const M: usize>(p: &Tile, b: usize, q: usize) -> __m512i {
    let m4 = _mm512_set1_epi8(0xF);
    let m30 = _mm512_set1_epi8(0x30);
    let hi_sec = p.sec[1];
    // SAFETY: block b's low nibbles and high bits lie inside the group.
    unsafe {
        let lo = load512(p.w.add(b * 2048 + (q % 32) * 64));
        let lo = if M < 2 { lo } else { _mm512_srli_epi16(lo, 4) };
        // Quad q's two high bits sit at bits 2M..2M+1 of each byte: move them to
        // bits 4..5 (16-bit shifts: what crosses a byte is masked).
        let hi = load512(p.w.add(hi_sec + b * 1024 + (q % 16) * 64));
        let hi = match M {
            0 => _mm512_slli_epi16(hi, 4),
            1 => _mm512_slli_epi16(hi, 2),
            2 => hi,
            _ => _mm512_srli_epi16(hi, 2),
        };
        let hi = _mm512_and_si512(hi, m30);
        // (lo & 0x0F) | hi in one op: ternary-logic table 0xEC.
        _mm512_ternarylogic_epi32(lo, hi, m4, 0xEC)
    }
}

/// `acc + a·b` over i16 pairs (`vpdpwssd`), written as the instruction: LLVM otherwise
/// splits the intrinsic into `vpmaddwd` + `vpaddd` for generic x86-64 tuning, two uops on
/// the ports the dot products need.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: AVX-512 VNNI is enabled for this function; registers only.
    unsafe {
        core::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack),
        );
    }
    acc
}

/// Q6_K against Q8_K: `acc += (d·dy)·Σ_s sc_s Σ (q − 32) a`, as `portable::dot_q6_k`,
/// bit for bit. As in `k45`, the scale products are formed in f32 (exact integers up
/// to 2²³), a pair of them summed in f32 (at most 2²⁴, exact) and the pairs summed as
/// integers; the running sums live in the output rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k<const T: usize>(p: &Tile) {
    let d_sec = p.sec[3];
    // SAFETY: as in `legacy`.
    unsafe {
        for t in 0..T {
            _mm512_storeu_ps(p.out.add(t * p.out_stride), _mm512_setzero_ps());
        }
        for b in 0..p.nb {
            let mut sumi = [_mm512_setzero_si512(); T];
            q6_k_quarter::<T, 0>(p, b, &mut sumi);
            q6_k_quarter::<T, 1>(p, b, &mut sumi);
            q6_k_quarter::<T, 2>(p, b, &mut sumi);
            q6_k_quarter::<T, 3>(p, b, &mut sumi);
            let d = scales16(p.w.add(d_sec + b * 32));
            for (t, sm) in sumi.iter().enumerate() {
                q6_k_end(p, d, b, t, *sm);
            }
        }
    }
}

/// Token `t`'s end of Q6_K block `b`: `out += (d·dy)·sumi`, as `portable::kq_acc`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn q6_k_end(p: &Tile, d: __m512, b: usize, t: usize, sumi: __m512i) {
    // SAFETY: token t's prep entry and output row (the caller's contract).
    unsafe {
        let dy = _mm512_set1_ps(*p.dy.add(t * p.prep_stride + b));
        let out = p.out.add(t * p.out_stride);
        let acc = _mm512_add_ps(
            _mm512_loadu_ps(out),
            _mm512_mul_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(sumi)),
        );
        _mm512_storeu_ps(out, acc);
    }
}

/// Sub-blocks `4M..4M+4` of block `b` (quads `16M..16M+16`) into `sumi`: pairs of
/// sub-blocks summed in f32 (exact, see `q6_k`), then as integers.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q6_k_quarter<const T: usize, const M: usize>(
    p: &Tile,
    b: usize,
    sumi: &mut [__m512i; T],
) {
    // SAFETY: as in `q6_k`.
    unsafe {
        // A loop the compiler cannot unroll: unrolled, it unpacks every quad of the
        // quarter ahead of the dot products and spills them (measured with llvm-mca:
        // twice the cycles).
        for pair in 0..core::hint::black_box(2) {
            let mut part = [_mm512_setzero_ps(); T];
            q6_k_sub::<T, M>(p, b, 4 * M + 2 * pair, &mut part);
            q6_k_sub::<T, M>(p, b, 4 * M + 2 * pair + 1, &mut part);
            for (sm, pt) in sumi.iter_mut().zip(&part) {
                *sm = _mm512_add_epi32(*sm, _mm512_cvtps_epi32(*pt));
            }
        }
    }
}

/// Sub-block `s` (in quarter `M`) of block `b`: its integer sums per token, times its
/// scale, added to `part` in f32. With `M` known at compile time, which nibble and which
/// two high bits a quad takes are fixed: the loop carries no branches.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q6_k_sub<const T: usize, const M: usize>(
    p: &Tile,
    b: usize,
    s: usize,
    part: &mut [__m512; T],
) {
    let sc_sec = p.sec[2];
    // SAFETY: as in `q6_k`.
    unsafe {
        let mut iacc = [_mm512_setzero_si512(); T];
        for (t, acc) in iacc.iter_mut().enumerate() {
            *acc = _mm512_set1_epi32(*p.aux.add((t * p.prep_stride + b) * 16 + s));
        }
        for qq in 0..4 {
            let q = 4 * s + qq;
            if T == 1 && M < 2 {
                // Quarters 0 and 1 (sub-blocks 0..8) take steps 4s + qq = 0..32 of
                // `prefetch_linear` once each; quarters 2 and 3 reread their lines.
                q6_k_prefetch(p, b, s, qq);
            }
            let w = q6_k_quad::<M>(p, b, q);
            for (t, acc) in iacc.iter_mut().enumerate() {
                let av = bcast4(p.a.add(t * p.a_stride + b * 292 + 4 + 4 * q));
                *acc = _mm512_dpbusd_epi32(*acc, w, av);
            }
        }
        let sc = _mm512_cvtepi32_ps(bytes16::<true>(p.w.add(sc_sec + b * 256 + s * 16)));
        for (acc, pt) in iacc.iter().zip(part.iter_mut()) {
            *pt = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(*acc), *pt);
        }
    }
}
