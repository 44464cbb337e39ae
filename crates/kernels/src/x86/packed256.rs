//! 256-bit kernels over the same packed layout as `packed512`, for two sets: AVX-VNNI
//! (`vpdpbusd` at 256 bits, VEX-encoded: Alder Lake and later cores without AVX-512) and
//! plain AVX2 (the four-byte dot as `vpmaddubsw`, whose i16 pair sums are added while
//! they stay exact and then widened by `vpmaddwd` with the sub-block scale; Q8_0's
//! signed weights through `vpsignb`, as llama.cpp's AVX2 dot product does). A 64-byte
//! line holds four weights of each of 16 rows; a ymm register takes half of it, 8 rows,
//! so one group runs as two 8-row passes, each over up to `TILE` tokens (the 16 ymm
//! registers hold TILE × three accumulators plus the unpacking temporaries).
//!
//! The kernel bodies are written once, generic over [`Dot`], and inlined into one entry
//! per set compiled with that set's features (`vnni::tile`, `avx2::tile`).
//!
//! Float steps follow `portable` exactly, per lane (separate multiply and add, no FMA),
//! and the integer sums are exact, so the results are bit-identical to the portable
//! kernels.
//!
//! An entry may only be called when `dispatch` found its set's features (avx2, fma,
//! f16c, and avxvnni for `vnni`), which `packed::packable_with` guarantees.

use crate::packed::{MXFP4_UNSIGNED, Tile, block_bytes};
use core::arch::x86_64::*;
use llamay_formats::GgmlType;

/// Tokens per register tile.
pub(crate) const TILE: usize = 4;

/// The four-byte dot products of a set.
///
/// A *partial* sums the products of a few quads (four weight bytes of a row against
/// four activation bytes, per lane) in whatever width the set multiplies in; `widen`
/// and `widen_scaled` turn it into i32 per row. AVX2's `vpmaddubsw` leaves i16 pairs, so
/// its partials hold only as many quads as stay below 2^15 (`quads`), and the widening
/// `vpmaddwd` then takes the sub-block scale for free (instead of a `vpmulld`).
pub(crate) trait Dot {
    /// Whether partials are already i32 (`widen` is the identity): then a kernel adds
    /// quads straight into its i32 sums.
    const WIDE: bool;
    /// Quads one partial holds exactly for unsigned weights of `bits` bits against i8
    /// activations (|a| ≤ 128).
    fn quads(bits: u32) -> usize;
    /// `acc + Σ4 w·a` per lane, weights unsigned.
    ///
    /// # Safety
    /// The set's features.
    unsafe fn partial(acc: __m256i, w: __m256i, a: __m256i) -> __m256i;
    /// A partial as i32 per row.
    ///
    /// # Safety
    /// The set's features.
    unsafe fn widen(acc: __m256i) -> __m256i;
    /// A partial times each row's scale (from `scale`), as i32 per row.
    ///
    /// # Safety
    /// The set's features.
    unsafe fn widen_scaled(acc: __m256i, sc: __m256i) -> __m256i;
    /// Half `h` of the sixteen byte scales at `p` (one per row, unsigned or signed for
    /// `SIGNED`) as `widen_scaled` takes them.
    ///
    /// # Safety
    /// 16 readable bytes at p; the set's features.
    unsafe fn scale<const SIGNED: bool>(p: *const u8, h: usize) -> __m256i;
    /// Whether `partial_q8` computes `Σ u·a` of Q8_0's stored bytes `u = w + 128`, leaving
    /// the `-128 Σ a` correction to the prepared aux value (else it is exact).
    const Q8_OFFSET_IN_AUX: bool;
    /// One quad of Q8_0's stored bytes `u = w + 128` into an i32 partial (see
    /// `Q8_OFFSET_IN_AUX`).
    ///
    /// # Safety
    /// The set's features.
    unsafe fn partial_q8(acc: __m256i, u: __m256i, a: __m256i) -> __m256i;
    /// `acc + Σ2 i16·i16` per lane.
    ///
    /// # Safety
    /// The set's features.
    unsafe fn dot2_i16(acc: __m256i, x: __m256i, y: __m256i) -> __m256i;
}

/// AVX-VNNI: `vpdpbusd` sums into i32, so a partial holds any number of quads.
pub(crate) struct Vnni;

impl Dot for Vnni {
    const WIDE: bool = true;
    #[inline(always)]
    fn quads(_: u32) -> usize {
        usize::MAX
    }
    #[inline(always)]
    unsafe fn partial(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: the caller runs with avxvnni.
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, a) }
    }
    #[inline(always)]
    unsafe fn widen(acc: __m256i) -> __m256i {
        acc
    }
    #[inline(always)]
    unsafe fn widen_scaled(acc: __m256i, sc: __m256i) -> __m256i {
        // SAFETY: the caller runs with avxvnni.
        unsafe { _mm256_mullo_epi32(acc, sc) }
    }
    #[inline(always)]
    unsafe fn scale<const SIGNED: bool>(p: *const u8, h: usize) -> __m256i {
        // SAFETY: forwarded from the caller.
        unsafe { bytes8::<SIGNED>(p, h) }
    }
    const Q8_OFFSET_IN_AUX: bool = true;
    #[inline(always)]
    unsafe fn partial_q8(acc: __m256i, u: __m256i, a: __m256i) -> __m256i {
        // SAFETY: the caller runs with avxvnni.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, a) }
    }
    #[inline(always)]
    unsafe fn dot2_i16(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: the caller runs with avxvnni.
        unsafe { _mm256_dpwssd_avx_epi32(acc, x, y) }
    }
}

/// AVX2: `vpmaddubsw` into i16 pairs, summed with `vpaddw` while exact, widened by
/// `vpmaddwd` (by ones, or by the scale).
pub(crate) struct Avx2Dot;

impl Dot for Avx2Dot {
    const WIDE: bool = false;
    #[inline(always)]
    fn quads(bits: u32) -> usize {
        // A pair is at most 2 · (2^bits − 1) · 128; the i16 sum must stay below 2^15.
        (32767 / (2 * ((1 << bits) - 1) * 128)) as usize
    }
    #[inline(always)]
    unsafe fn partial(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: the caller runs with avx2.
        unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, a)) }
    }
    #[inline(always)]
    unsafe fn widen(acc: __m256i) -> __m256i {
        // SAFETY: the caller runs with avx2.
        unsafe { _mm256_madd_epi16(acc, _mm256_set1_epi16(1)) }
    }
    #[inline(always)]
    unsafe fn widen_scaled(acc: __m256i, sc: __m256i) -> __m256i {
        // SAFETY: the caller runs with avx2.
        unsafe { _mm256_madd_epi16(acc, sc) }
    }
    #[inline(always)]
    unsafe fn scale<const SIGNED: bool>(p: *const u8, h: usize) -> __m256i {
        // SAFETY: 16 bytes at p (the caller's contract); the caller runs with avx2.
        unsafe {
            // Row r's scale in both i16 halves of lane r.
            let v = _mm_loadl_epi64(p.add(8 * h) as *const __m128i);
            let twice = _mm_unpacklo_epi8(v, v);
            if SIGNED {
                _mm256_cvtepi8_epi16(twice)
            } else {
                _mm256_cvtepu8_epi16(twice)
            }
        }
    }
    const Q8_OFFSET_IN_AUX: bool = false;
    #[inline(always)]
    unsafe fn partial_q8(acc: __m256i, u: __m256i, a: __m256i) -> __m256i {
        // SAFETY: the caller runs with avx2.
        unsafe {
            // |w| · (a with w's sign): a pair is at most 2 · 128 · 127 < 2^15 (Q8_0
            // activations are within ±127), so `vpmaddubsw` is exact.
            let w = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
            let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
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
entry!(avx2, Avx2Dot, "avx2,fma,f16c", "The AVX2 kernels.");

/// Runs the kernel for `ty` on `m` tokens (1..=TILE), both halves of the group.
///
/// # Safety
/// `D`'s set's features, enabled in the (inlining) caller; `t`'s pointers cover `m`
/// tokens and the group.
#[inline(always)]
unsafe fn tile_with<D: Dot>(ty: GgmlType, m: usize, t: &Tile) {
    // One token (`$hs` 2): both 8-row halves in one pass, so that each line is used
    // whole as it arrives (with a pass per half the memory stream idled through the
    // second; Zen 3, Gemma's 262144 × 640 Q8_0 matrix from DRAM: 8.2 → 12.0 GiB/s).
    // The K-quants do too since they take sub-blocks in pairs (`k45_pairs`,
    // `q6_k_pairs`). More tokens: one half per pass, so that the tile stays in registers.
    macro_rules! by_m {
        ($hs:literal; $f:ident $(, $c:expr)?) => {
            // SAFETY: forwarded from the caller.
            // Loops, not closures: the generic bodies carry no target features of
            // their own, so a closure LLVM declines to inline runs without the set's,
            // every intrinsic in it a call (75× slower, seen once).
            unsafe {
                match m {
                    1 if $hs == 2 => $f::<D, 1 $(, $c)?, 2>(t, 0),
                    1 => for h in 0..2 { $f::<D, 1 $(, $c)?, 1>(t, h) },
                    2 => for h in 0..2 { $f::<D, 2 $(, $c)?, 1>(t, h) },
                    3 => for h in 0..2 { $f::<D, 3 $(, $c)?, 1>(t, h) },
                    _ => for h in 0..2 { $f::<D, TILE $(, $c)?, 1>(t, h) },
                }
            }
        };
    }
    match ty {
        GgmlType::Q8_0 => by_m!(2; legacy, Q8_0),
        GgmlType::Q4_0 => by_m!(2; legacy, Q4_0),
        GgmlType::Q5_0 => by_m!(2; legacy, Q5_0),
        GgmlType::MXFP4 => by_m!(2; legacy, MXFP4),
        GgmlType::Q4_K => by_m!(2; k45_pairs, false),
        GgmlType::Q5_K => by_m!(2; k45_pairs, true),
        GgmlType::Q6_K => by_m!(2; q6_k_pairs),
        _ => {}
    }
}

pub(crate) const Q8_0: u8 = 0;
pub(crate) const Q4_0: u8 = 1;
pub(crate) const Q5_0: u8 = 2;
pub(crate) const MXFP4: u8 = 3;

/// Half `h` (rows 8h..8h+7) of the 64-byte line at `p`.
#[inline(always)]
unsafe fn load_half(p: *const u8, h: usize) -> __m256i {
    // SAFETY: caller guarantees a 64-byte line at p.
    unsafe { _mm256_loadu_si256(p.add(32 * h) as *const __m256i) }
}

/// How far past the next group a one-token pass asks for its weight lines
/// (`prefetch_linear`). From DRAM the out-of-order window alone keeps too few lines in
/// flight: it holds the dozen instructions each line costs for only ~20 lines (Zen 3,
/// Gemma's 262144 × 640 Q8_0 matrix, 2 threads: 9.9 → 13.5 GiB/s, one thread 5.5 →
/// 7.8, at 16–64 KiB alike; the 1B shape's Q6_K output 7.6 → 10.0, a 72 MiB Q4_K
/// matrix 9.6 → 11.0).
pub(crate) const PREFETCH: usize = 16 << 10;

/// Prefetches the line `dist` bytes after `p` (the address may lie past the group or
/// the matrix: a prefetch never faults).
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, dist: usize) {
    // SAFETY: `prefetcht0` reads nothing architecturally and cannot fault; SSE is
    // part of x86-64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(dist) as *const i8) }
}

/// A one-token pass's prefetches at step `k` of the `K` it takes over block `b`: the
/// group's bytes read as one stream at the pass's pace (`PB` bytes a block, the sum of
/// its sections; `PB / K` a step), one group and `PREFETCH` bytes ahead, so the
/// prefetches run in address order whatever order the pass reads its group in.
///
/// Why: the pass reads every section of a group at once (a block's quants beside its
/// high bits and scales). Asking for each section's line the same distance ahead made
/// the prefetches jump between sections as the reads do, and on AMD Zen 5 a read stream
/// of that shape (a C loop with the Q6_K pass's order and no arithmetic) ran 15–20%
/// below a plain one, one thread or two; prefetching it linearly one group ahead
/// brought it level.
#[inline(always)]
pub(crate) fn prefetch_linear<const PB: usize, const K: usize>(p: &Tile, b: usize, k: usize) {
    // A step covers 34 to 105 bytes: the line at its start, and the next when a step
    // covers more than one (a line asked for twice costs an instruction). Straight-line
    // on purpose: a loop over the step's line starts ran the passes 20–45% slower.
    const {
        assert!(
            PB.is_multiple_of(K) && PB / K <= 128,
            "a step covers whole bytes, at most two lines"
        )
    };
    let at = p.group_bytes + PREFETCH + b * PB + k * (PB / K);
    prefetch_ahead(p.w, at);
    if PB / K > 64 {
        prefetch_ahead(p.w, at + 64);
    }
}

/// A one-token pass's prefetch for quad `k` of block `b` of the 32-blocks (`legacy`).
#[inline(always)]
pub(crate) fn prefetch_legacy<const F: u8>(p: &Tile, b: usize, k: usize) {
    match F {
        Q8_0 => prefetch_linear::<{ block_bytes(GgmlType::Q8_0) }, 8>(p, b, k),
        Q4_0 => prefetch_linear::<{ block_bytes(GgmlType::Q4_0) }, 8>(p, b, k),
        Q5_0 => prefetch_linear::<{ block_bytes(GgmlType::Q5_0) }, 8>(p, b, k),
        _ /* MXFP4 */ => prefetch_linear::<{ block_bytes(GgmlType::MXFP4) }, 8>(p, b, k),
    }
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
        if F == MXFP4 {
            let t = _mm_loadu_si128(MXFP4_UNSIGNED.as_ptr() as *const __m128i);
            return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), q);
        }
        q
    }
}

/// Q8_0 / Q4_0 / Q5_0 / MXFP4 against Q8_0 activations, as `packed512::legacy`;
/// halves `h0..h0 + HS` of the group in one pass.
#[inline(always)]
unsafe fn legacy<D: Dot, const T: usize, const F: u8, const HS: usize>(p: &Tile, h0: usize) {
    // Quads per partial: a block's eight when the set sums in i32. (MXFP4's unsigned
    // weights reach 24: within five bits.)
    let fold = if D::WIDE {
        8
    } else {
        D::quads(if F == Q4_0 { 4 } else { 5 })
    };
    // SAFETY: every pointer below stays inside the group (nb blocks) and the T tokens'
    // activation rows and prep entries; the set's features (the caller's contract).
    unsafe {
        let mut facc = [[_mm256_setzero_ps(); T]; HS];
        for b in 0..p.nb {
            let mut iacc = [[_mm256_setzero_si256(); T]; HS];
            if F != Q8_0 || D::Q8_OFFSET_IN_AUX {
                for ia in iacc.iter_mut() {
                    for (t, acc) in ia.iter_mut().enumerate() {
                        *acc = _mm256_set1_epi32(*p.aux.add(t * p.prep_stride + b));
                    }
                }
            }
            let mut part = [[_mm256_setzero_si256(); T]; HS];
            for k in 0..8 {
                if T == 1 {
                    prefetch_legacy::<F>(p, b, k);
                }
                for hh in 0..HS {
                    let w = legacy_quad::<F>(p.w, p.sec[1], b, k, h0 + hh);
                    for t in 0..T {
                        let av = bcast4(p.a.add(t * p.a_stride + b * 34 + 2 + 4 * k));
                        if F == Q8_0 {
                            iacc[hh][t] = D::partial_q8(iacc[hh][t], w, av);
                        } else if D::WIDE {
                            iacc[hh][t] = D::partial(iacc[hh][t], w, av);
                        } else {
                            part[hh][t] = D::partial(part[hh][t], w, av);
                        }
                    }
                    if F != Q8_0 && !D::WIDE && (k + 1) % fold == 0 {
                        for (acc, pt) in iacc[hh].iter_mut().zip(part[hh].iter_mut()) {
                            *acc = _mm256_add_epi32(*acc, D::widen(*pt));
                            *pt = _mm256_setzero_si256();
                        }
                    }
                }
            }
            for hh in 0..HS {
                let d = if F == MXFP4 {
                    let e = bytes8::<false>(p.w.add(p.sec[1] + b * 16), h0 + hh);
                    super::avx2::e8m0_half8(e)
                } else {
                    scales8(
                        p.w.add(p.sec[if F == Q5_0 { 2 } else { 1 }] + b * 32),
                        h0 + hh,
                    )
                };
                for (t, acc) in facc[hh].iter_mut().enumerate() {
                    let s = _mm256_mul_ps(d, _mm256_set1_ps(*p.dy.add(t * p.prep_stride + b)));
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(s, _mm256_cvtepi32_ps(iacc[hh][t])));
                }
            }
        }
        for (hh, fa) in facc.iter().enumerate() {
            for (t, acc) in fa.iter().enumerate() {
                _mm256_storeu_ps(out_at(p, t, h0 + hh), *acc);
            }
        }
    }
}

/// Sections of a packed Q4_K or Q5_K group after the nibbles: fifth bits (Q5_K), scales,
/// mins, d, dmin.
#[inline(always)]
fn k45_sections<const Q5: bool>(p: &Tile) -> [usize; 5] {
    if Q5 {
        [p.sec[1], p.sec[2], p.sec[3], p.sec[4], p.sec[5]]
    } else {
        [0, p.sec[1], p.sec[2], p.sec[3], p.sec[4]]
    }
}

/// Zeroes the outputs of tokens `..T`, halves `h0..h0 + hs` (the block loop adds to them).
#[inline(always)]
unsafe fn zero_out<const T: usize>(p: &Tile, h0: usize, hs: usize) {
    // SAFETY: the caller's contract (the tile's outputs).
    unsafe {
        for h in h0..h0 + hs {
            for t in 0..T {
                _mm256_storeu_ps(out_at(p, t, h), _mm256_setzero_ps());
            }
        }
    }
}

/// The end of block `b` of a Q4_K/Q5_K tile, half `h`: each token's scaled sub-block
/// sums `sumi` times `d · dy`, less the mins against the activations' sub-block sums
/// times `dmin · dy`, added to its outputs.
#[inline(always)]
unsafe fn k45_block_end<D: Dot, const T: usize, const Q5: bool>(
    p: &Tile,
    b: usize,
    h: usize,
    sumi: &[__m256i; T],
) {
    let [_, _, mn_sec, d_sec, dmin_sec] = k45_sections::<Q5>(p);
    // SAFETY: as in `legacy`.
    unsafe {
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

/// A one-token Q4_K/Q5_K pass's prefetches at line `kk` of pair `jp` of block `b`
/// (`prefetch_linear`).
#[inline(always)]
pub(crate) fn k45_prefetch<const Q5: bool>(p: &Tile, b: usize, jp: usize, kk: usize) {
    if Q5 {
        prefetch_linear::<{ block_bytes(GgmlType::Q5_K) }, 32>(p, b, jp * 8 + kk);
    } else {
        prefetch_linear::<{ block_bytes(GgmlType::Q4_K) }, 32>(p, b, jp * 8 + kk);
    }
}

/// Q4_K (and Q5_K with `Q5`) against Q8_K, halves `h0..h0 + HS`: sub-blocks in
/// pairs (2i, 2i + 1), whose weights are the low and high nibbles of the same lines, so
/// each line is loaded once for both and the two sub-blocks' sums run as independent
/// chains (a `vpdpbusd` waits five cycles for its accumulator; four tokens alone left
/// AVX-VNNI latency-bound).
#[inline(always)]
unsafe fn k45_pairs<D: Dot, const T: usize, const Q5: bool, const HS: usize>(p: &Tile, h0: usize) {
    let [hi_sec, sc_sec, ..] = k45_sections::<Q5>(p);
    let fold = D::quads(if Q5 { 5 } else { 4 });
    // SAFETY: as in `legacy`.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        zero_out::<T>(p, h0, HS);
        for b in 0..p.nb {
            let mut sumi = [[_mm256_setzero_si256(); T]; HS];
            for jp in 0..4 {
                let (j0, j1) = (2 * jp, 2 * jp + 1);
                let mut lo = [[_mm256_setzero_si256(); T]; HS];
                let mut hi = [[_mm256_setzero_si256(); T]; HS];
                for kk in 0..8 {
                    let line = p.w.add(b * 2048 + (jp * 8 + kk) * 64);
                    if T == 1 && h0 == 0 {
                        k45_prefetch::<Q5>(p, b, jp, kk);
                    }
                    for hh in 0..HS {
                        let h = h0 + hh;
                        let v = load_half(line, h);
                        let mut w0 = _mm256_and_si256(v, m4);
                        let mut w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                        if Q5 {
                            let fifth = |j: usize| p.w.add(hi_sec + b * 512 + (8 * j + kk) * 8);
                            w0 = add_fifth_bit(w0, fifth(j0), h);
                            w1 = add_fifth_bit(w1, fifth(j1), h);
                        }
                        for t in 0..T {
                            let at = t * p.a_stride + b * 292 + 4 + 4 * kk;
                            let (l, u) = (&mut lo[hh][t], &mut hi[hh][t]);
                            *l = D::partial(*l, w0, bcast4(p.a.add(at + 32 * j0)));
                            *u = D::partial(*u, w1, bcast4(p.a.add(at + 32 * j1)));
                        }
                        if (kk + 1) % fold == 0 || kk == 7 {
                            let sc_at = p.w.add(sc_sec + b * 128);
                            let s0 = D::scale::<false>(sc_at.add(j0 * 16), h);
                            let s1 = D::scale::<false>(sc_at.add(j1 * 16), h);
                            for t in 0..T {
                                let both = _mm256_add_epi32(
                                    D::widen_scaled(lo[hh][t], s0),
                                    D::widen_scaled(hi[hh][t], s1),
                                );
                                sumi[hh][t] = _mm256_add_epi32(sumi[hh][t], both);
                                lo[hh][t] = _mm256_setzero_si256();
                                hi[hh][t] = _mm256_setzero_si256();
                            }
                        }
                    }
                }
            }
            for (hh, si) in sumi.iter().enumerate() {
                k45_block_end::<D, T, Q5>(p, b, h0 + hh, si);
            }
        }
    }
}

/// Q6_K against Q8_K, halves `h0..h0 + HS`: sub-blocks in pairs (s, s + 8), whose
/// quads (q, q + 32) are the low and high nibbles of one line and whose high bits are
/// two shifts of another, so each line is loaded once for both and the pair's sums run
/// as independent chains (see `k45_pairs`).
#[inline(always)]
unsafe fn q6_k_pairs<D: Dot, const T: usize, const HS: usize>(p: &Tile, h0: usize) {
    let d_sec = p.sec[3];
    // SAFETY: as in `legacy`.
    unsafe {
        zero_out::<T>(p, h0, HS);
        for b in 0..p.nb {
            let mut sumi = [[_mm256_setzero_si256(); T]; HS];
            // Pairs 0..4 take their high bits from bits 0..1 and 4..5 of the high lines,
            // pairs 4..8 from bits 2..3 and 6..7: two loops, so that which shifts apply
            // is known at compile time (a branch per pair made LLVM spill the merged
            // values to the stack).
            for s0 in 0..4 {
                q6_k_pair::<D, T, HS, false>(p, b, s0, h0, &mut sumi);
            }
            for s0 in 4..8 {
                q6_k_pair::<D, T, HS, true>(p, b, s0, h0, &mut sumi);
            }
            for (hh, si) in sumi.iter().enumerate() {
                let h = h0 + hh;
                let d = scales8(p.w.add(d_sec + b * 32), h);
                for (t, si) in si.iter().enumerate() {
                    let o = out_at(p, t, h);
                    let dy = _mm256_set1_ps(*p.dy.add(t * p.prep_stride + b));
                    let x = _mm256_mul_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(*si));
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), x));
                }
            }
        }
    }
}

/// A one-token Q6_K pass's prefetches at quad `qq` of pair `s0` (< 8) of block `b`
/// (`prefetch_linear`).
#[inline(always)]
pub(crate) fn q6_k_prefetch(p: &Tile, b: usize, s0: usize, qq: usize) {
    prefetch_linear::<{ block_bytes(GgmlType::Q6_K) }, 32>(p, b, 4 * s0 + qq);
}

/// Sub-blocks (s0, s0 + 8) of block `b` of a Q6_K tile (`q6_k_pairs`), halves
/// `h0..h0 + HS`, their scaled sums added to `sumi`. `UPPER`: s0 ≥ 4, whose high bits
/// are bits 2..3 and 6..7 of the high line (else 0..1 and 4..5).
#[inline(always)]
unsafe fn q6_k_pair<D: Dot, const T: usize, const HS: usize, const UPPER: bool>(
    p: &Tile,
    b: usize,
    s0: usize,
    h0: usize,
    sumi: &mut [[__m256i; T]; HS],
) {
    let [_, hi_sec, sc_sec, ..] = p.sec;
    let s1 = s0 + 8;
    // SAFETY: as in `legacy`.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let m30 = _mm256_set1_epi8(0x30);
        let fold = D::quads(6);
        let mut acc0 = [[_mm256_setzero_si256(); T]; HS];
        let mut acc1 = [[_mm256_setzero_si256(); T]; HS];
        for t in 0..T {
            let aux = p.aux.add((t * p.prep_stride + b) * 16);
            for hh in 0..HS {
                acc0[hh][t] = _mm256_set1_epi32(*aux.add(s0));
                acc1[hh][t] = _mm256_set1_epi32(*aux.add(s1));
            }
        }
        let mut part0 = [[_mm256_setzero_si256(); T]; HS];
        let mut part1 = [[_mm256_setzero_si256(); T]; HS];
        for qq in 0..4 {
            let q = 4 * s0 + qq;
            let (lo_line, hi_line) = (b * 2048 + q * 64, hi_sec + b * 1024 + (q % 16) * 64);
            if T == 1 && h0 == 0 {
                q6_k_prefetch(p, b, s0, qq);
            }
            for hh in 0..HS {
                let h = h0 + hh;
                let lo = load_half(p.w.add(lo_line), h);
                let hi = load_half(p.w.add(hi_line), h);
                // Sub-block s takes bits 2(s/4)..+1 of the high byte to bits 4..5.
                let (hi0, hi1) = if UPPER {
                    (_mm256_slli_epi16(hi, 2), _mm256_srli_epi16(hi, 2))
                } else {
                    (_mm256_slli_epi16(hi, 4), hi)
                };
                let w0 = _mm256_or_si256(_mm256_and_si256(lo, m4), _mm256_and_si256(hi0, m30));
                let w1 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4),
                    _mm256_and_si256(hi1, m30),
                );
                for t in 0..T {
                    let at = t * p.a_stride + b * 292 + 4 + 4 * q;
                    let (a0, a1) = (bcast4(p.a.add(at)), bcast4(p.a.add(at + 128)));
                    if D::WIDE {
                        acc0[hh][t] = D::partial(acc0[hh][t], w0, a0);
                        acc1[hh][t] = D::partial(acc1[hh][t], w1, a1);
                    } else {
                        part0[hh][t] = D::partial(part0[hh][t], w0, a0);
                        part1[hh][t] = D::partial(part1[hh][t], w1, a1);
                    }
                }
                if !D::WIDE && (qq + 1) % fold == 0 {
                    for t in 0..T {
                        let (a0, a1) = (&mut acc0[hh][t], &mut acc1[hh][t]);
                        *a0 = _mm256_add_epi32(*a0, D::widen(part0[hh][t]));
                        *a1 = _mm256_add_epi32(*a1, D::widen(part1[hh][t]));
                        part0[hh][t] = _mm256_setzero_si256();
                        part1[hh][t] = _mm256_setzero_si256();
                    }
                }
            }
        }
        for hh in 0..HS {
            let sc0 = bytes8::<true>(p.w.add(sc_sec + b * 256 + s0 * 16), h0 + hh);
            let sc1 = bytes8::<true>(p.w.add(sc_sec + b * 256 + s1 * 16), h0 + hh);
            for t in 0..T {
                let both = _mm256_add_epi32(
                    _mm256_mullo_epi32(acc0[hh][t], sc0),
                    _mm256_mullo_epi32(acc1[hh][t], sc1),
                );
                sumi[hh][t] = _mm256_add_epi32(sumi[hh][t], both);
            }
        }
    }
}
