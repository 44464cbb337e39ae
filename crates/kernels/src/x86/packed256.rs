//! 256-bit kernels over the same packed layout as `packed512`, for two sets: AVX-VNNI
//! (`vpdpbusd` at 256 bits, VEX-encoded: Alder Lake and later cores without AVX-512) and
//! plain AVX2 (the same four-byte dot as `vpmaddubsw` + `vpmaddwd`, exact while a pair
//! of products fits i16: weights of at most 6 bits, so not Q8_0). A 64-byte line holds
//! four weights of each of 16 rows; a ymm register takes half of it, 8 rows, so one group
//! runs as two 8-row passes, each over up to `TILE` tokens (the 16 ymm registers hold
//! TILE × three accumulators plus the unpacking temporaries).
//!
//! The kernel bodies are written once, generic over [`Dot`], and inlined into one entry
//! per set compiled with that set's features (`vnni::tile`, `avx2::tile`).
//!
//! Float steps follow `portable` exactly, per lane (separate multiply and add, no FMA),
//! so the results are bit-identical to the portable kernels.
//!
//! An entry may only be called when `dispatch` found its set's features (avx2, fma,
//! f16c, and avxvnni for `vnni`), which `packed::packable_with` guarantees.

use crate::packed::Tile;
use core::arch::x86_64::*;
use llamay_formats::GgmlType;

/// Tokens per register tile.
pub(crate) const TILE: usize = 4;

/// The four-byte dot products of a set: `acc + Σ4 u8·i8` and `acc + Σ2 i16·i16` per lane.
pub(crate) trait Dot {
    /// # Safety
    /// The set's features.
    unsafe fn dot4(acc: __m256i, w: __m256i, a: __m256i) -> __m256i;
    /// # Safety
    /// The set's features.
    unsafe fn dot2_i16(acc: __m256i, x: __m256i, y: __m256i) -> __m256i;
}

/// AVX-VNNI: one instruction each.
pub(crate) struct Vnni;

impl Dot for Vnni {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: the caller runs with avxvnni.
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, a) }
    }
    #[inline(always)]
    unsafe fn dot2_i16(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: the caller runs with avxvnni.
        unsafe { _mm256_dpwssd_avx_epi32(acc, x, y) }
    }
}

/// AVX2: `vpmaddubsw` (exact: weights ≤ 63, so |pair| ≤ 2·63·127 < 2^15), `vpmaddwd`
/// by ones, `vpaddd`.
pub(crate) struct Avx2Dot;

impl Dot for Avx2Dot {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: the caller runs with avx2.
        unsafe {
            let pairs = _mm256_maddubs_epi16(w, a);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn dot2_i16(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: the caller runs with avx2.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(x, y)) }
    }
}

/// The entry of each set: its features enabled, the generic bodies inlined.
macro_rules! entry {
    ($name:ident, $dot:ty, $features:literal, $doc:literal) => {
        pub(crate) mod $name {
            use super::*;
            #[doc = $doc]
            ///
            /// # Safety
            /// The set's features (module doc); `t`'s pointers cover `m` tokens and the
            /// group.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn tile(ty: GgmlType, m: usize, t: &Tile) {
                // SAFETY: forwarded from the caller.
                unsafe { tile_with::<$dot>(ty, m, t) }
            }
        }
    };
}
entry!(vnni, Vnni, "avx2,fma,f16c,avxvnni", "The AVX-VNNI kernels.");
entry!(
    avx2,
    Avx2Dot,
    "avx2,fma,f16c",
    "The AVX2 kernels (not Q8_0)."
);

/// Runs the kernel for `ty` on `m` tokens (1..=TILE), both halves of the group.
///
/// # Safety
/// `D`'s set's features, enabled in the (inlining) caller; `t`'s pointers cover `m`
/// tokens and the group.
#[inline(always)]
unsafe fn tile_with<D: Dot>(ty: GgmlType, m: usize, t: &Tile) {
    macro_rules! by_m {
        ($f:ident $(, $c:expr)?) => {
            for h in 0..2 {
                // SAFETY: forwarded from the caller.
                unsafe {
                    match m {
                        1 => $f::<D, 1 $(, $c)?>(t, h),
                        2 => $f::<D, 2 $(, $c)?>(t, h),
                        3 => $f::<D, 3 $(, $c)?>(t, h),
                        _ => $f::<D, TILE $(, $c)?>(t, h),
                    }
                }
            }
        };
    }
    match ty {
        GgmlType::Q8_0 => by_m!(legacy, Q8_0),
        GgmlType::Q4_0 => by_m!(legacy, Q4_0),
        GgmlType::Q5_0 => by_m!(legacy, Q5_0),
        GgmlType::Q4_K => by_m!(k45, false),
        GgmlType::Q5_K => by_m!(k45, true),
        GgmlType::Q6_K => by_m!(q6_k),
        _ => {}
    }
}

const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q5_0: u8 = 2;

/// Half `h` (rows 8h..8h+7) of the 64-byte line at `p`.
#[inline(always)]
unsafe fn load_half(p: *const u8, h: usize) -> __m256i {
    // SAFETY: caller guarantees a 64-byte line at p.
    unsafe { _mm256_loadu_si256(p.add(32 * h) as *const __m256i) }
}

/// Four activation bytes at `p`, broadcast to every lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 4 readable bytes at p, and the set's features.
    unsafe { _mm256_set1_epi32((p as *const i32).read_unaligned()) }
}

/// Half `h` of the sixteen f16 scales at `p`, as f32.
#[inline(always)]
unsafe fn scales8(p: *const u8, h: usize) -> __m256 {
    // SAFETY: caller guarantees 32 readable bytes at p, and the set's features.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h) as *const __m128i)) }
}

/// Half `h` of the sixteen bytes at `p`, widened to i32 lanes (unsigned, or signed for
/// `SIGNED`).
#[inline(always)]
unsafe fn bytes8<const SIGNED: bool>(p: *const u8, h: usize) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes at p, and the set's features.
    unsafe {
        let v = _mm_loadl_epi64(p.add(8 * h) as *const __m128i);
        if SIGNED {
            _mm256_cvtepi8_epi32(v)
        } else {
            _mm256_cvtepu8_epi32(v)
        }
    }
}

/// `w + 16` in every byte whose bit is set in half `h` of the 64-bit mask at `p` (bit i
/// ↔ byte i of the line), the fifth bit of Q5_0 / Q5_K.
#[inline(always)]
unsafe fn add_fifth_bit(w: __m256i, p: *const u8, h: usize) -> __m256i {
    // SAFETY: caller guarantees 8 readable bytes at p, and the set's features.
    unsafe {
        let bits = (p.add(4 * h) as *const i32).read_unaligned();
        // Byte i takes mask byte i / 8 (vpshufb works per 128-bit half: the low half needs
        // mask bytes 0-1, the high half 2-3), then tests its own bit.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits),
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            ),
        );
        let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
        _mm256_add_epi8(w, _mm256_and_si256(set, _mm256_set1_epi8(16)))
    }
}

/// Token `t`'s eight outputs of half `h`.
#[inline(always)]
fn out_at(p: &Tile, t: usize, h: usize) -> *mut f32 {
    p.out.wrapping_add(t * p.out_stride + 8 * h)
}

/// The unsigned weights of quad `k` of block `b`, half `h`.
#[inline(always)]
unsafe fn legacy_quad<const F: u8>(
    w: *const u8,
    bits_at: usize,
    b: usize,
    k: usize,
    h: usize,
) -> __m256i {
    // SAFETY: block b of the group; `bits_at` is Q5_0's fifth-bit section
    // (`packed::sections`); the set's features.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        if F == Q8_0 {
            return load_half(w.add(b * 512 + k * 64), h);
        }
        let v = load_half(w.add(b * 256 + (k % 4) * 64), h);
        let q = if k < 4 {
            _mm256_and_si256(v, m4)
        } else {
            _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)
        };
        if F == Q5_0 {
            return add_fifth_bit(q, w.add(bits_at + b * 64 + k * 8), h);
        }
        q
    }
}

/// Q8_0 / Q4_0 / Q5_0 against Q8_0 activations, as `packed512::legacy`.
#[inline(always)]
unsafe fn legacy<D: Dot, const T: usize, const F: u8>(p: &Tile, h: usize) {
    // SAFETY: every pointer below stays inside the group (nb blocks) and the T tokens'
    // activation rows and prep entries; the set's features (the caller's contract).
    unsafe {
        let mut facc = [_mm256_setzero_ps(); T];
        for b in 0..p.nb {
            let mut iacc = [_mm256_setzero_si256(); T];
            for (t, acc) in iacc.iter_mut().enumerate() {
                *acc = _mm256_set1_epi32(*p.aux.add(t * p.prep_stride + b));
            }
            for k in 0..8 {
                let w = legacy_quad::<F>(p.w, p.sec[1], b, k, h);
                for (t, acc) in iacc.iter_mut().enumerate() {
                    let av = bcast4(p.a.add(t * p.a_stride + b * 34 + 2 + 4 * k));
                    *acc = D::dot4(*acc, w, av);
                }
            }
            let d = scales8(p.w.add(p.sec[if F == Q5_0 { 2 } else { 1 }] + b * 32), h);
            for (t, acc) in facc.iter_mut().enumerate() {
                let s = _mm256_mul_ps(d, _mm256_set1_ps(*p.dy.add(t * p.prep_stride + b)));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(s, _mm256_cvtepi32_ps(iacc[t])));
            }
        }
        for (t, acc) in facc.iter().enumerate() {
            _mm256_storeu_ps(p.out.add(t * p.out_stride + 8 * h), *acc);
        }
    }
}

/// Q4_K (and Q5_K with `Q5`) against Q8_K, as `packed512::k45`.
#[inline(always)]
unsafe fn k45<D: Dot, const T: usize, const Q5: bool>(p: &Tile, h: usize) {
    let nb = p.nb;
    // Sections after the nibbles (Q5_K has its fifth bits first).
    let [hi_sec, sc_sec, mn_sec, d_sec, dmin_sec] = if Q5 {
        [p.sec[1], p.sec[2], p.sec[3], p.sec[4], p.sec[5]]
    } else {
        [0, p.sec[1], p.sec[2], p.sec[3], p.sec[4]]
    };
    // SAFETY: as in `legacy`.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        // The running sums live in `out`, not in registers: with the block sums and the
        // sub-block sums, 16 ymm are too few (measured: faster than the spills).
        for t in 0..T {
            _mm256_storeu_ps(out_at(p, t, h), _mm256_setzero_ps());
        }
        for b in 0..nb {
            let mut sumi = [_mm256_setzero_si256(); T];
            for j in 0..8 {
                let mut iacc = [_mm256_setzero_si256(); T];
                for kk in 0..8 {
                    let v = load_half(p.w.add(b * 2048 + ((j / 2) * 8 + kk) * 64), h);
                    let mut w = if j % 2 == 0 {
                        _mm256_and_si256(v, m4)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)
                    };
                    if Q5 {
                        w = add_fifth_bit(w, p.w.add(hi_sec + b * 512 + (8 * j + kk) * 8), h);
                    }
                    for (t, acc) in iacc.iter_mut().enumerate() {
                        let av = bcast4(p.a.add(t * p.a_stride + b * 292 + 4 + 32 * j + 4 * kk));
                        *acc = D::dot4(*acc, w, av);
                    }
                }
                let sc = bytes8::<false>(p.w.add(sc_sec + b * 128 + j * 16), h);
                for (s, acc) in sumi.iter_mut().zip(&iacc) {
                    *s = _mm256_add_epi32(*s, _mm256_mullo_epi32(*acc, sc));
                }
            }
            // The mins, as i16 pairs (m_2q, m_2q+1) per lane.
            let mut mpair = [_mm256_setzero_si256(); 4];
            for (q, mp) in mpair.iter_mut().enumerate() {
                let m0 = bytes8::<false>(p.w.add(mn_sec + b * 128 + (2 * q) * 16), h);
                let m1 = bytes8::<false>(p.w.add(mn_sec + b * 128 + (2 * q + 1) * 16), h);
                *mp = _mm256_or_si256(m0, _mm256_slli_epi32(m1, 16));
            }
            let d = scales8(p.w.add(d_sec + b * 32), h);
            let dmin = scales8(p.w.add(dmin_sec + b * 32), h);
            for (t, si) in sumi.iter().enumerate() {
                let o = out_at(p, t, h);
                let aux = p.aux.add((t * p.prep_stride + b) * 4);
                let mut summs = _mm256_setzero_si256();
                for (q, mp) in mpair.iter().enumerate() {
                    summs = D::dot2_i16(summs, *mp, _mm256_set1_epi32(*aux.add(q)));
                }
                let dy = _mm256_set1_ps(*p.dy.add(t * p.prep_stride + b));
                let x = _mm256_add_ps(
                    _mm256_loadu_ps(o),
                    _mm256_mul_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(*si)),
                );
                let acc = _mm256_sub_ps(
                    x,
                    _mm256_mul_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(summs)),
                );
                _mm256_storeu_ps(o, acc);
            }
        }
    }
}

/// Q6_K against Q8_K, as `packed512::q6_k`.
#[inline(always)]
unsafe fn q6_k<D: Dot, const T: usize>(p: &Tile, h: usize) {
    let nb = p.nb;
    let [_, hi_sec, sc_sec, d_sec, ..] = p.sec;
    // SAFETY: as in `legacy`.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let m30 = _mm256_set1_epi8(0x30);
        let mut facc = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let mut sumi = [_mm256_setzero_si256(); T];
            for s in 0..16 {
                let mut iacc = [_mm256_setzero_si256(); T];
                for (t, acc) in iacc.iter_mut().enumerate() {
                    *acc = _mm256_set1_epi32(*p.aux.add((t * p.prep_stride + b) * 16 + s));
                }
                for qq in 0..4 {
                    let q = 4 * s + qq;
                    let lo = load_half(p.w.add(b * 2048 + (q % 32) * 64), h);
                    let lo = if q < 32 { lo } else { _mm256_srli_epi16(lo, 4) };
                    // The quad's two high bits (bits 2(s/4)..+1 of each byte) to 4..5.
                    let hi = load_half(p.w.add(hi_sec + b * 1024 + (q % 16) * 64), h);
                    let hi = match s / 4 {
                        0 => _mm256_slli_epi16(hi, 4),
                        1 => _mm256_slli_epi16(hi, 2),
                        2 => hi,
                        _ => _mm256_srli_epi16(hi, 2),
                    };
                    let w = _mm256_or_si256(_mm256_and_si256(lo, m4), _mm256_and_si256(hi, m30));
                    for (t, acc) in iacc.iter_mut().enumerate() {
                        let av = bcast4(p.a.add(t * p.a_stride + b * 292 + 4 + 4 * q));
                        *acc = D::dot4(*acc, w, av);
                    }
                }
                let sc = bytes8::<true>(p.w.add(sc_sec + b * 256 + s * 16), h);
                for (sm, acc) in sumi.iter_mut().zip(&iacc) {
                    *sm = _mm256_add_epi32(*sm, _mm256_mullo_epi32(*acc, sc));
                }
            }
            let d = scales8(p.w.add(d_sec + b * 32), h);
            for (t, acc) in facc.iter_mut().enumerate() {
                let dy = _mm256_set1_ps(*p.dy.add(t * p.prep_stride + b));
                *acc = _mm256_add_ps(
                    *acc,
                    _mm256_mul_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(sumi[t])),
                );
            }
        }
        for (t, acc) in facc.iter().enumerate() {
            _mm256_storeu_ps(p.out.add(t * p.out_stride + 8 * h), *acc);
        }
    }
}
