//! NEON kernels over the packed layout of `crate::packed` (16 rows interleaved four
//! bytes at a time): a 16-byte register holds four weights of each of 4 rows, so one
//! `sdot` / `usdot` against four broadcast activation bytes accumulates 4 rows in its 4
//! lanes, as `vpdpbusd` does on x86. A group runs as four 4-row passes ("quarters"),
//! each over up to `TILE` tokens.
//!
//! Two sets share the bodies (generic over [`Dot4`]): `dotprod` (`sdot`, signed × signed:
//! the unsigned weights fit i8 up to 6 bits and MXFP4's 0..=24, so not Q8_0) and `i8mm` (`usdot`,
//! unsigned × signed, FEAT_I8MM: every packed format).
//!
//! Float steps follow `portable` exactly, per lane (separate multiply and add), so the
//! results are bit-identical to the portable kernels. An entry may only be called when
//! `dispatch` found its set's features, which `packed::packable_with` guarantees.

use super::kernels::{bits16, cvt_lo};
use crate::packed::{MXFP4_UNSIGNED, Tile};
use crate::portable::e8m0_half;
use core::arch::aarch64::*;
use core::arch::asm;
use llamay_formats::GgmlType;

/// Tokens per register tile.
pub(crate) const TILE: usize = 8;

/// `acc + Σ4 w·a` per lane: lane r takes bytes 4r..4r+3 of `w` and of `a`.
pub(crate) trait Dot4 {
    /// # Safety
    /// The set's features (the caller is a `#[target_feature]` entry that enables them).
    unsafe fn dot4(acc: int32x4_t, w: uint8x16_t, a: int8x16_t) -> int32x4_t;
}

/// `sdot` (ARMv8.2 dotprod, the row kernels' `dot::Sdot`, whose lane i is bytes 4i..4i+3
/// as the instruction defines): the weights (≤ 63) read as signed bytes.
pub(crate) struct Sdot;

impl Dot4 for Sdot {
    #[inline(always)]
    unsafe fn dot4(acc: int32x4_t, w: uint8x16_t, a: int8x16_t) -> int32x4_t {
        // SAFETY: the caller guarantees `dotprod`; registers only.
        unsafe { <super::dot::Sdot as super::dot::I8Dot>::dot(acc, vreinterpretq_s8_u8(w), a) }
    }
}

/// `usdot` (FEAT_I8MM): unsigned weights × signed activations.
pub(crate) struct Usdot;

impl Dot4 for Usdot {
    #[inline(always)]
    unsafe fn dot4(mut acc: int32x4_t, w: uint8x16_t, a: int8x16_t) -> int32x4_t {
        // SAFETY: registers only; the caller guarantees `i8mm`.
        unsafe {
            asm!(
                ".arch_extension i8mm",
                "usdot {acc:v}.4s, {w:v}.16b, {a:v}.16b",
                acc = inout(vreg) acc,
                w = in(vreg) w,
                a = in(vreg) a,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
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
entry!(
    dotprod,
    Sdot,
    "neon,dotprod",
    "The `sdot` kernels (not Q8_0)."
);
entry!(i8mm, Usdot, "neon,dotprod,i8mm", "The `usdot` kernels.");

/// Runs the kernel for `ty` on `m` tokens (1..=TILE), the group's four quarters.
///
/// # Safety
/// `D`'s set's features, enabled in the (inlining) caller; `t`'s pointers cover `m`
/// tokens and the group.
#[inline(always)]
unsafe fn tile_with<D: Dot4>(ty: GgmlType, m: usize, t: &Tile) {
    macro_rules! by_m {
        ($f:ident $(, $c:expr)?) => {
            for h in 0..4 {
                // SAFETY: forwarded from the caller.
                unsafe {
                    match m {
                        1 => $f::<D, 1 $(, $c)?>(t, h),
                        2 => $f::<D, 2 $(, $c)?>(t, h),
                        3 => $f::<D, 3 $(, $c)?>(t, h),
                        4 => $f::<D, 4 $(, $c)?>(t, h),
                        5 => $f::<D, 5 $(, $c)?>(t, h),
                        6 => $f::<D, 6 $(, $c)?>(t, h),
                        7 => $f::<D, 7 $(, $c)?>(t, h),
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
        GgmlType::MXFP4 => by_m!(legacy, MXFP4),
        GgmlType::Q4_K => by_m!(k45, false),
        GgmlType::Q5_K => by_m!(k45, true),
        GgmlType::Q6_K => by_m!(q6_k),
        _ => {}
    }
}

const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q5_0: u8 = 2;
const MXFP4: u8 = 3;

/// Quarter `h` (rows 4h..4h+3) of the 64-byte line at `p`.
#[inline(always)]
unsafe fn load_quarter(p: *const u8, h: usize) -> uint8x16_t {
    // SAFETY: caller guarantees a 64-byte line at p.
    unsafe { vld1q_u8(p.add(16 * h)) }
}

/// Four activation bytes at `p`, repeated in every lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> int8x16_t {
    // SAFETY: caller guarantees 4 readable bytes at p.
    unsafe { vreinterpretq_s8_s32(vdupq_n_s32((p as *const i32).read_unaligned())) }
}

/// Quarter `h` of the sixteen f16 scales at `p`, as f32.
#[inline(always)]
unsafe fn scales4(p: *const u8, h: usize) -> float32x4_t {
    // SAFETY: caller guarantees 32 readable bytes at p (this reads 8 of them).
    unsafe {
        cvt_lo(vreinterpretq_u16_u8(vcombine_u8(
            vld1_u8(p.add(8 * h)),
            vdup_n_u8(0),
        )))
    }
}

/// Quarter `h` of the sixteen bytes at `p`, as i32 lanes (unsigned, or signed for
/// `SIGNED`).
#[inline(always)]
unsafe fn bytes4<const SIGNED: bool>(p: *const u8, h: usize) -> int32x4_t {
    // SAFETY: caller guarantees 16 readable bytes at p.
    let b = unsafe { std::ptr::read_unaligned(p.add(4 * h) as *const [u8; 4]) };
    let v = b.map(|x| if SIGNED { x as i8 as i32 } else { x as i32 });
    // SAFETY: NEON, the caller's.
    unsafe { vld1q_s32(v.as_ptr()) }
}

/// `w + 16` in every byte whose bit is set in quarter `h` of the 64-bit mask at `p`
/// (bit i ↔ byte i of the line): the fifth bit of Q5_0 / Q5_K.
#[inline(always)]
unsafe fn add_fifth_bit(w: uint8x16_t, p: *const u8, h: usize) -> uint8x16_t {
    // SAFETY: caller guarantees 8 readable bytes at p; NEON.
    unsafe {
        let set = bits16(*p.add(2 * h), *p.add(2 * h + 1));
        vaddq_u8(w, vandq_u8(set, vdupq_n_u8(16)))
    }
}

/// Token `t`'s four outputs of quarter `h`.
#[inline(always)]
fn out_at(p: &Tile, t: usize, h: usize) -> *mut f32 {
    p.out.wrapping_add(t * p.out_stride + 4 * h)
}

/// The unsigned weights of quad `k` of block `b`, quarter `h`.
#[inline(always)]
unsafe fn legacy_quad<const F: u8>(
    w: *const u8,
    bits_at: usize,
    b: usize,
    k: usize,
    h: usize,
) -> uint8x16_t {
    // SAFETY: block b of the group; `bits_at` is Q5_0's fifth-bit section
    // (`packed::sections`); NEON.
    unsafe {
        if F == Q8_0 {
            return load_quarter(w.add(b * 512 + k * 64), h);
        }
        let v = load_quarter(w.add(b * 256 + (k % 4) * 64), h);
        let q = if k < 4 {
            vandq_u8(v, vdupq_n_u8(0xF))
        } else {
            vshrq_n_u8::<4>(v)
        };
        if F == Q5_0 {
            return add_fifth_bit(q, w.add(bits_at + b * 64 + k * 8), h);
        }
        if F == MXFP4 {
            return vqtbl1q_u8(vld1q_u8(MXFP4_UNSIGNED.as_ptr()), q);
        }
        q
    }
}

/// Q8_0 / Q4_0 / Q5_0 / MXFP4 against Q8_0 activations: per block
/// `acc += (dw · dy) · Σ (q_w − off) q_a`, ggml's order (MXFP4: `dw` from the exponent
/// byte, `dw · dy = dy · dw` exactly).
#[inline(always)]
unsafe fn legacy<D: Dot4, const T: usize, const F: u8>(p: &Tile, h: usize) {
    // SAFETY: every pointer below stays inside the group (nb blocks) and the T tokens'
    // activation rows and prep entries; the set's features (the caller's contract).
    unsafe {
        let mut facc = [vdupq_n_f32(0.0); T];
        for b in 0..p.nb {
            let mut iacc = [vdupq_n_s32(0); T];
            for (t, acc) in iacc.iter_mut().enumerate() {
                *acc = vdupq_n_s32(*p.aux.add(t * p.prep_stride + b));
            }
            for k in 0..8 {
                let w = legacy_quad::<F>(p.w, p.sec[1], b, k, h);
                for (t, acc) in iacc.iter_mut().enumerate() {
                    let av = bcast4(p.a.add(t * p.a_stride + b * 34 + 2 + 4 * k));
                    *acc = D::dot4(*acc, w, av);
                }
            }
            let d = if F == MXFP4 {
                // Quarter h of the sixteen exponent bytes, as ggml's scales (exact).
                let e =
                    std::ptr::read_unaligned(p.w.add(p.sec[1] + b * 16 + 4 * h) as *const [u8; 4]);
                vld1q_f32(e.map(e8m0_half).as_ptr())
            } else {
                scales4(p.w.add(p.sec[if F == Q5_0 { 2 } else { 1 }] + b * 32), h)
            };
            for (t, acc) in facc.iter_mut().enumerate() {
                let s = vmulq_f32(d, vdupq_n_f32(*p.dy.add(t * p.prep_stride + b)));
                *acc = vaddq_f32(*acc, vmulq_f32(s, vcvtq_f32_s32(iacc[t])));
            }
        }
        for (t, acc) in facc.iter().enumerate() {
            vst1q_f32(out_at(p, t, h), *acc);
        }
    }
}

/// Q4_K (and Q5_K with `Q5`) against Q8_K:
/// `acc = (acc + (d·dy)·Σ_j sc_j Σ q a) − (dmin·dy)·Σ_j m_j bsum_j`, as `x86::packed512`.
#[inline(always)]
unsafe fn k45<D: Dot4, const T: usize, const Q5: bool>(p: &Tile, h: usize) {
    let nb = p.nb;
    // Sections after the nibbles (Q5_K has its fifth bits first).
    let [hi_sec, sc_sec, mn_sec, d_sec, dmin_sec] = if Q5 {
        [p.sec[1], p.sec[2], p.sec[3], p.sec[4], p.sec[5]]
    } else {
        [0, p.sec[1], p.sec[2], p.sec[3], p.sec[4]]
    };
    // SAFETY: as in `legacy`.
    unsafe {
        let m4 = vdupq_n_u8(0xF);
        let mut facc = [vdupq_n_f32(0.0); T];
        for b in 0..nb {
            let mut sumi = [vdupq_n_s32(0); T];
            for j in 0..8 {
                let mut iacc = [vdupq_n_s32(0); T];
                for kk in 0..8 {
                    let v = load_quarter(p.w.add(b * 2048 + ((j / 2) * 8 + kk) * 64), h);
                    let mut w = if j % 2 == 0 {
                        vandq_u8(v, m4)
                    } else {
                        vshrq_n_u8::<4>(v)
                    };
                    if Q5 {
                        w = add_fifth_bit(w, p.w.add(hi_sec + b * 512 + (8 * j + kk) * 8), h);
                    }
                    for (t, acc) in iacc.iter_mut().enumerate() {
                        let av = bcast4(p.a.add(t * p.a_stride + b * 292 + 4 + 32 * j + 4 * kk));
                        *acc = D::dot4(*acc, w, av);
                    }
                }
                let sc = bytes4::<false>(p.w.add(sc_sec + b * 128 + j * 16), h);
                for (s, acc) in sumi.iter_mut().zip(&iacc) {
                    *s = vmlaq_s32(*s, *acc, sc);
                }
            }
            let d = scales4(p.w.add(d_sec + b * 32), h);
            let dmin = scales4(p.w.add(dmin_sec + b * 32), h);
            for (t, acc) in facc.iter_mut().enumerate() {
                // Σ_j m_j · (sub-block sum j): the sums as i16 pairs in `aux` (see ActPrep).
                let aux = p.aux.add((t * p.prep_stride + b) * 4);
                let mut summs = vdupq_n_s32(0);
                for q in 0..4 {
                    let pair = *aux.add(q);
                    for (half, sum) in [(0, pair as i16), (1, (pair >> 16) as i16)] {
                        let m = bytes4::<false>(p.w.add(mn_sec + b * 128 + (2 * q + half) * 16), h);
                        summs = vmlaq_s32(summs, m, vdupq_n_s32(i32::from(sum)));
                    }
                }
                let dy = vdupq_n_f32(*p.dy.add(t * p.prep_stride + b));
                let x = vaddq_f32(*acc, vmulq_f32(vmulq_f32(d, dy), vcvtq_f32_s32(sumi[t])));
                *acc = vsubq_f32(x, vmulq_f32(vmulq_f32(dmin, dy), vcvtq_f32_s32(summs)));
            }
        }
        for (t, acc) in facc.iter().enumerate() {
            vst1q_f32(out_at(p, t, h), *acc);
        }
    }
}

/// Q6_K against Q8_K: `acc += (d·dy)·Σ_s sc_s Σ (q − 32) a`, as `x86::packed512`.
#[inline(always)]
unsafe fn q6_k<D: Dot4, const T: usize>(p: &Tile, h: usize) {
    let nb = p.nb;
    let [_, hi_sec, sc_sec, d_sec, ..] = p.sec;
    // SAFETY: as in `legacy`.
    unsafe {
        let m4 = vdupq_n_u8(0xF);
        let m30 = vdupq_n_u8(0x30);
        let mut facc = [vdupq_n_f32(0.0); T];
        for b in 0..nb {
            let mut sumi = [vdupq_n_s32(0); T];
            for s in 0..16 {
                let mut iacc = [vdupq_n_s32(0); T];
                for (t, acc) in iacc.iter_mut().enumerate() {
                    *acc = vdupq_n_s32(*p.aux.add((t * p.prep_stride + b) * 16 + s));
                }
                for qq in 0..4 {
                    let q = 4 * s + qq;
                    let lo = load_quarter(p.w.add(b * 2048 + (q % 32) * 64), h);
                    let lo = if q < 32 {
                        vandq_u8(lo, m4)
                    } else {
                        vshrq_n_u8::<4>(lo)
                    };
                    // The quad's two high bits (bits 2(s/4)..+1 of each byte) to 4..5.
                    let hi = load_quarter(p.w.add(hi_sec + b * 1024 + (q % 16) * 64), h);
                    let hi = match s / 4 {
                        0 => vshlq_n_u8::<4>(hi),
                        1 => vshlq_n_u8::<2>(hi),
                        2 => hi,
                        _ => vshrq_n_u8::<2>(hi),
                    };
                    let w = vorrq_u8(lo, vandq_u8(hi, m30));
                    for (t, acc) in iacc.iter_mut().enumerate() {
                        let av = bcast4(p.a.add(t * p.a_stride + b * 292 + 4 + 4 * q));
                        *acc = D::dot4(*acc, w, av);
                    }
                }
                let sc = bytes4::<true>(p.w.add(sc_sec + b * 256 + s * 16), h);
                for (sm, acc) in sumi.iter_mut().zip(&iacc) {
                    *sm = vmlaq_s32(*sm, *acc, sc);
                }
            }
            let d = scales4(p.w.add(d_sec + b * 32), h);
            for (t, acc) in facc.iter_mut().enumerate() {
                let dy = vdupq_n_f32(*p.dy.add(t * p.prep_stride + b));
                *acc = vaddq_f32(*acc, vmulq_f32(vmulq_f32(d, dy), vcvtq_f32_s32(sumi[t])));
            }
        }
        for (t, acc) in facc.iter().enumerate() {
            vst1q_f32(out_at(p, t, h), *acc);
        }
    }
}
