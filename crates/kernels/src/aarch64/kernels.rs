//! The NEON dot-product bodies. The integer ones are generic over the i8 dot
//! instruction (`I8Dot`) and `#[inline(always)]`: they are only ever compiled inside
//! the `#[target_feature]` wrappers of `super` (one per kernel set), never on their own.
//!
//! Every function here is `unsafe` with one contract, which `dispatch::Kernel::call`
//! checks before calling a wrapper: `w` and `a` hold at least `n / block_size` whole
//! blocks of the weight type and of its vec_dot type (`n` values for the float types),
//! and the CPU has what the wrapper's `I8Dot` needs.
//!
//! K-quants form the same exact i32 super-block sums as `portable` (integer lanes wrap,
//! and the true total fits in i32, so the lane order does not matter) and finish with
//! the shared `kq_acc`: bit-identical. So is MXFP4 (exact block sums, portable's float
//! steps in block order). The other 32-blocks and the float types accumulate in f32
//! vector lanes (FMA), so they agree with `portable` within the tests' float bound.

use super::dot::I8Dot;
use crate::portable::{
    KVALUES_MXFP4, Q8K, e8m0_half, f16_at, f32_at, kq_acc, q3k_scales, scales_mins_k4,
};
use core::arch::aarch64::*;
use core::arch::asm;

// ------------------------------------------------------------------ helpers

/// 16 bytes at `p`.
///
/// # Safety
/// 16 readable bytes at `p`.
#[inline(always)]
unsafe fn ld_u8(p: *const u8) -> uint8x16_t {
    // SAFETY: the caller's.
    unsafe { vld1q_u8(p) }
}

/// 16 signed bytes at `p`.
///
/// # Safety
/// 16 readable bytes at `p`.
#[inline(always)]
unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    // SAFETY: the caller's.
    unsafe { vld1q_s8(p as *const i8) }
}

/// Eight little-endian i16 at `p` (any alignment).
///
/// # Safety
/// 16 readable bytes at `p`.
#[inline(always)]
unsafe fn ld_i16x8(p: *const u8) -> int16x8_t {
    // SAFETY: the caller's.
    unsafe { vreinterpretq_s16_u8(vld1q_u8(p)) }
}

/// Four f16 lanes (the low half of `h`) to f32, exactly. `fcvtl` from half precision is
/// base ARMv8 FP (no FEAT_FP16); inline assembly because `vcvt_f32_f16` is newer than
/// the workspace's rust-version.
///
/// # Safety
/// NEON.
#[inline(always)]
pub(super) unsafe fn cvt_lo(h: uint16x8_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: registers only.
    unsafe {
        asm!(
            "fcvtl {o:v}.4s, {h:v}.4h",
            h = in(vreg) h,
            o = lateout(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// The high four f16 lanes of `h` to f32, exactly (`fcvtl2`).
///
/// # Safety
/// NEON.
#[inline(always)]
unsafe fn cvt_hi(h: uint16x8_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: registers only.
    unsafe {
        asm!(
            "fcvtl2 {o:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            o = lateout(vreg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// One little-endian f16 at `p` to f32 (exact, like `portable::f16_at`).
///
/// # Safety
/// 2 readable bytes at `p`.
#[inline(always)]
unsafe fn f16p(p: *const u8) -> f32 {
    // SAFETY: the caller's.
    unsafe {
        let h = (p as *const u16).read_unaligned();
        vgetq_lane_f32::<0>(cvt_lo(vdupq_n_u16(h)))
    }
}

/// Lane i is 0xFF when bit i of `lo | hi << 8` is set, else 0.
///
/// # Safety
/// NEON (as every function here: the intrinsics need a `neon` context).
#[inline(always)]
pub(super) unsafe fn bits16(lo: u8, hi: u8) -> uint8x16_t {
    // SAFETY: NEON, the caller's.
    unsafe {
        let v = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi));
        let mask = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        vtstq_u8(v, mask)
    }
}

/// Σ bsums[j]·m[j] over a Q8_K block's 16 bsums (at 260), `m` as two i16x8.
///
/// # Safety
/// A whole Q8_K block at `y`.
#[inline(always)]
unsafe fn bsums_dot(y: *const u8, m_lo: int16x8_t, m_hi: int16x8_t) -> i32 {
    // SAFETY: NEON, and the bsums are bytes 260..292 of the block.
    unsafe {
        let (b0, b1) = (ld_i16x8(y.add(260)), ld_i16x8(y.add(276)));
        let p = vmull_s16(vget_low_s16(b0), vget_low_s16(m_lo));
        let p = vmlal_high_s16(p, b0, m_lo);
        let p = vmlal_s16(p, vget_low_s16(b1), vget_low_s16(m_hi));
        vaddvq_s32(vmlal_high_s16(p, b1, m_hi))
    }
}

/// Σ bsums[j]·mn[j/2] (Q4_K / Q5_K: one min per 32, two bsums per 32).
///
/// # Safety
/// A whole Q8_K block at `y`.
#[inline(always)]
unsafe fn bsums_dot_pairs(y: *const u8, mn: &[u8; 8]) -> i32 {
    // SAFETY: NEON; the bsums are bytes 260..292 of the block; `mn` has 8 bytes.
    unsafe {
        let (b0, b1) = (ld_i16x8(y.add(260)), ld_i16x8(y.add(276)));
        // Pair sums fit in i16 (|bsum| ≤ 16·128).
        let pairs = vpaddq_s16(b0, b1);
        let m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn.as_ptr())));
        let p = vmull_s16(vget_low_s16(pairs), vget_low_s16(m));
        vaddvq_s32(vmlal_high_s16(p, pairs, m))
    }
}

// ------------------------------------------------------------------ floats

/// Four f32 at `p` (any alignment).
///
/// # Safety
/// 16 readable bytes at `p`.
#[inline(always)]
unsafe fn ld_f32x4(p: *const u8) -> float32x4_t {
    // SAFETY: the caller's.
    unsafe { vreinterpretq_f32_u8(vld1q_u8(p)) }
}

/// Eight f16 or bf16 at `p` (any alignment).
///
/// # Safety
/// 16 readable bytes at `p`.
#[inline(always)]
unsafe fn ld_u16x8(p: *const u8) -> uint16x8_t {
    // SAFETY: the caller's.
    unsafe { vreinterpretq_u16_u8(vld1q_u8(p)) }
}

/// # Safety
/// `w`, `a` hold `n` f32.
#[inline(always)]
pub(super) unsafe fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let (x, y) = (w.as_ptr(), a.as_ptr());
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                let p = 4 * (i + 4 * k);
                *acc = vfmaq_f32(*acc, ld_f32x4(x.add(p)), ld_f32x4(y.add(p)));
            }
            i += 16;
        }
        while i + 4 <= n {
            acc[0] = vfmaq_f32(acc[0], ld_f32x4(x.add(4 * i)), ld_f32x4(y.add(4 * i)));
            i += 4;
        }
        let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
        let mut s = vaddvq_f32(v);
        while i < n {
            s += f32_at(w, 4 * i) * f32_at(a, 4 * i);
            i += 1;
        }
        s
    }
}

/// # Safety
/// `w`, `a` hold `n` f16.
#[inline(always)]
pub(super) unsafe fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let (x, y) = (w.as_ptr(), a.as_ptr());
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            let (x0, y0) = (ld_u16x8(x.add(2 * i)), ld_u16x8(y.add(2 * i)));
            let (x1, y1) = (ld_u16x8(x.add(2 * i + 16)), ld_u16x8(y.add(2 * i + 16)));
            acc[0] = vfmaq_f32(acc[0], cvt_lo(x0), cvt_lo(y0));
            acc[1] = vfmaq_f32(acc[1], cvt_hi(x0), cvt_hi(y0));
            acc[2] = vfmaq_f32(acc[2], cvt_lo(x1), cvt_lo(y1));
            acc[3] = vfmaq_f32(acc[3], cvt_hi(x1), cvt_hi(y1));
            i += 16;
        }
        if i + 8 <= n {
            let (x0, y0) = (ld_u16x8(x.add(2 * i)), ld_u16x8(y.add(2 * i)));
            acc[0] = vfmaq_f32(acc[0], cvt_lo(x0), cvt_lo(y0));
            acc[1] = vfmaq_f32(acc[1], cvt_hi(x0), cvt_hi(y0));
            i += 8;
        }
        let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
        let mut s = vaddvq_f32(v);
        while i < n {
            s += f16_at(w, 2 * i) * f16_at(a, 2 * i);
            i += 1;
        }
        s
    }
}

/// # Safety
/// `w`, `a` hold `n` bf16.
#[inline(always)]
pub(super) unsafe fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let (x, y) = (w.as_ptr(), a.as_ptr());
        let z = vdupq_n_u16(0);
        // bf16 → f32 is a 16-bit left shift: interleave zeros below each value.
        let lo = |h: uint16x8_t| vreinterpretq_f32_u16(vzip1q_u16(z, h));
        let hi = |h: uint16x8_t| vreinterpretq_f32_u16(vzip2q_u16(z, h));
        let mut acc = [vdupq_n_f32(0.0); 2];
        let mut i = 0;
        while i + 8 <= n {
            let (xv, yv) = (ld_u16x8(x.add(2 * i)), ld_u16x8(y.add(2 * i)));
            acc[0] = vfmaq_f32(acc[0], lo(xv), lo(yv));
            acc[1] = vfmaq_f32(acc[1], hi(xv), hi(yv));
            i += 8;
        }
        let mut s = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
        let bf = |b: &[u8], at: usize| {
            f32::from_bits((u16::from_le_bytes([b[at], b[at + 1]]) as u32) << 16)
        };
        while i < n {
            s += bf(w, 2 * i) * bf(a, 2 * i);
            i += 1;
        }
        s
    }
}

// ------------------------------------------------------------------ 32-blocks

/// The loop of the 32-blocks against Q8_0 (`{f16 d, i8 qs[32]}`, 34 bytes): `$qx` gives
/// a block's 32 signed weights as two i8x16 (elements 0..16, 16..32) from its pointer
/// `$p`; the scale is the f16 at `$p`. Two f32x4 accumulators, blocks alternating.
macro_rules! legacy_q8_0 {
    ($D:ty, $w:expr, $a:expr, $n:expr, $ts:expr, |$p:ident| $qx:expr) => {{
        let (xs, ys) = ($w.as_ptr(), $a.as_ptr());
        let block = |i: usize, acc: float32x4_t| -> float32x4_t {
            let $p = xs.add($ts * i);
            let y = ys.add(34 * i);
            let (q0, q1): (int8x16_t, int8x16_t) = $qx;
            let s = <$D>::dot(vdupq_n_s32(0), q0, ld_s8(y.add(2)));
            let s = <$D>::dot(s, q1, ld_s8(y.add(18)));
            vfmaq_n_f32(acc, vcvtq_f32_s32(s), f16p($p) * f16p(y))
        };
        let nb = $n / 32;
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut i = 0;
        while i + 2 <= nb {
            acc0 = block(i, acc0);
            acc1 = block(i + 1, acc1);
            i += 2;
        }
        if i < nb {
            acc0 = block(i, acc0);
        }
        vaddvq_f32(vaddq_f32(acc0, acc1))
    }};
}

/// The loop of the 32-blocks with a min against Q8_1 (`{f16 d, f16 s, i8 qs[32]}`):
/// as `legacy_q8_0`, plus `m·s` (the f16 at `$p + 2` times Q8_1's `s`) summed apart.
macro_rules! legacy_q8_1 {
    ($D:ty, $w:expr, $a:expr, $n:expr, $ts:expr, |$p:ident| $qx:expr) => {{
        let (xs, ys) = ($w.as_ptr(), $a.as_ptr());
        let mut summs = 0.0f32;
        let mut block = |i: usize, acc: float32x4_t| -> float32x4_t {
            let $p = xs.add($ts * i);
            let y = ys.add(36 * i);
            let (q0, q1): (int8x16_t, int8x16_t) = $qx;
            let s = <$D>::dot(vdupq_n_s32(0), q0, ld_s8(y.add(4)));
            let s = <$D>::dot(s, q1, ld_s8(y.add(20)));
            summs += f16p($p.add(2)) * f16p(y.add(2));
            vfmaq_n_f32(acc, vcvtq_f32_s32(s), f16p($p) * f16p(y))
        };
        let nb = $n / 32;
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut i = 0;
        while i + 2 <= nb {
            acc0 = block(i, acc0);
            acc1 = block(i + 1, acc1);
            i += 2;
        }
        if i < nb {
            acc0 = block(i, acc0);
        }
        vaddvq_f32(vaddq_f32(acc0, acc1)) + summs
    }};
}

/// The 32 nibbles of a 16-byte run at `p`: low nibbles (elements 0..16), high (16..32).
///
/// # Safety
/// 16 readable bytes at `p`.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the caller's.
    unsafe {
        let v = ld_u8(p);
        (vandq_u8(v, vdupq_n_u8(0xF)), vshrq_n_u8::<4>(v))
    }
}

/// Q5's fifth bits (u32 little-endian at `p`) as 0x10 / 0 per element, 0..16 and 16..32.
///
/// # Safety
/// 4 readable bytes at `p`.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the caller's.
    unsafe {
        let h = (p as *const u32).read_unaligned().to_le_bytes();
        let b = vdupq_n_u8(0x10);
        (
            vandq_u8(bits16(h[0], h[1]), b),
            vandq_u8(bits16(h[2], h[3]), b),
        )
    }
}

/// # Safety
/// Whole Q4_0 / Q8_0 blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q4_0<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let s8 = vdupq_n_s8(8);
        legacy_q8_0!(D, w, a, n, 18, |p| {
            let (lo, hi) = nibbles(p.add(2));
            (
                vsubq_s8(vreinterpretq_s8_u8(lo), s8),
                vsubq_s8(vreinterpretq_s8_u8(hi), s8),
            )
        })
    }
}

/// # Safety
/// Whole Q5_0 / Q8_0 blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q5_0<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let s16 = vdupq_n_s8(16);
        legacy_q8_0!(D, w, a, n, 22, |p| {
            let (lo, hi) = nibbles(p.add(6));
            let (hb0, hb1) = fifth_bits(p.add(2));
            (
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hb0)), s16),
                vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, hb1)), s16),
            )
        })
    }
}

/// # Safety
/// Whole Q8_0 / Q8_0 blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q8_0<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe { legacy_q8_0!(D, w, a, n, 34, |p| (ld_s8(p.add(2)), ld_s8(p.add(18)))) }
}

/// # Safety
/// Whole MXFP4 / Q8_0 blocks for `n`.
///
/// Bit-identical to `portable::dot_mxfp4`: each block's exact integer sum (the nibbles
/// looked up in `kvalues_mxfp4` with `tbl`), then `acc += (dy · e8m0_half(e)) · sumi`,
/// the same f32 steps in block order.
#[inline(always)]
pub(super) unsafe fn dot_mxfp4<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let table = vld1q_s8(KVALUES_MXFP4.as_ptr());
        let (xs, ys) = (w.as_ptr(), a.as_ptr());
        let mut acc = 0.0f32;
        for i in 0..n / 32 {
            let (x, y) = (xs.add(17 * i), ys.add(34 * i));
            let (lo, hi) = nibbles(x.add(1));
            let s = D::dot(vdupq_n_s32(0), vqtbl1q_s8(table, lo), ld_s8(y.add(2)));
            let s = D::dot(s, vqtbl1q_s8(table, hi), ld_s8(y.add(18)));
            acc += (f16p(y) * e8m0_half(*x)) * vaddvq_s32(s) as f32;
        }
        acc
    }
}

/// # Safety
/// Whole Q4_1 / Q8_1 blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q4_1<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        legacy_q8_1!(D, w, a, n, 20, |p| {
            let (lo, hi) = nibbles(p.add(4));
            (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
        })
    }
}

/// # Safety
/// Whole Q5_1 / Q8_1 blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q5_1<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        legacy_q8_1!(D, w, a, n, 24, |p| {
            let (lo, hi) = nibbles(p.add(8));
            let (hb0, hb1) = fifth_bits(p.add(4));
            (
                vreinterpretq_s8_u8(vorrq_u8(lo, hb0)),
                vreinterpretq_s8_u8(vorrq_u8(hi, hb1)),
            )
        })
    }
}

// ------------------------------------------------------------------ K-quants

/// `v >> s` per byte for a run-time `s`.
///
/// # Safety
/// NEON.
#[inline(always)]
unsafe fn shr(v: uint8x16_t, s: usize) -> uint8x16_t {
    // SAFETY: NEON, the caller's.
    unsafe { vshlq_u8(v, vdupq_n_s8(-(s as i8))) }
}

/// # Safety
/// Whole Q2_K / Q8_K blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q2_k<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let m3 = vdupq_n_u8(3);
        let zero = vdupq_n_s32(0);
        let mut acc = 0.0f32;
        for i in 0..n / 256 {
            let x = w.as_ptr().add(84 * i);
            let y = a.as_ptr().add(Q8K * i);
            let scb = &w[84 * i..84 * i + 16];
            let mins = vshrq_n_u8::<4>(ld_u8(x));
            let summs = bsums_dot(
                y,
                vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins))),
                vreinterpretq_s16_u16(vmovl_high_u8(mins)),
            );
            let mut isum = zero;
            for h in 0..2 {
                let (qa, qb) = (ld_u8(x.add(16 + 32 * h)), ld_u8(x.add(32 + 32 * h)));
                for k in 0..4 {
                    let q0 = vreinterpretq_s8_u8(vandq_u8(shr(qa, 2 * k), m3));
                    let q1 = vreinterpretq_s8_u8(vandq_u8(shr(qb, 2 * k), m3));
                    let yp = y.add(4 + 128 * h + 32 * k);
                    let s = 8 * h + 2 * k;
                    isum = vmlaq_n_s32(isum, D::dot(zero, q0, ld_s8(yp)), (scb[s] & 0xF) as i32);
                    isum = vmlaq_n_s32(
                        isum,
                        D::dot(zero, q1, ld_s8(yp.add(16))),
                        (scb[s + 1] & 0xF) as i32,
                    );
                }
            }
            let dy = f32_at(a, Q8K * i);
            acc = kq_acc(
                acc,
                dy * f16p(x.add(80)),
                vaddvq_s32(isum),
                dy * f16p(x.add(82)),
                summs,
            );
        }
        acc
    }
}

/// # Safety
/// Whole Q3_K / Q8_K blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q3_k<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let (m3, one, four) = (vdupq_n_u8(3), vdupq_n_u8(1), vdupq_n_s8(4));
        let zero = vdupq_n_s32(0);
        let mut acc = 0.0f32;
        for i in 0..n / 256 {
            let x = w.as_ptr().add(110 * i);
            let y = a.as_ptr().add(Q8K * i);
            let sc = q3k_scales(&w[110 * i + 96..110 * i + 108]);
            let (hm0, hm1) = (ld_u8(x), ld_u8(x.add(16)));
            let mut isum = zero;
            for h in 0..2 {
                let (qa, qb) = (ld_u8(x.add(32 + 32 * h)), ld_u8(x.add(48 + 32 * h)));
                for k in 0..4 {
                    let g = 4 * h + k;
                    // q = low - (hbit ? 0 : 4) = (low | hbit << 2) - 4, low < 4.
                    let q = |qv: uint8x16_t, hm: uint8x16_t| {
                        let low = vandq_u8(shr(qv, 2 * k), m3);
                        let hb = vshlq_n_u8::<2>(vandq_u8(shr(hm, g), one));
                        vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, hb)), four)
                    };
                    let yp = y.add(4 + 32 * g);
                    isum = vmlaq_n_s32(isum, D::dot(zero, q(qa, hm0), ld_s8(yp)), sc[2 * g] as i32);
                    isum = vmlaq_n_s32(
                        isum,
                        D::dot(zero, q(qb, hm1), ld_s8(yp.add(16))),
                        sc[2 * g + 1] as i32,
                    );
                }
            }
            acc = kq_acc(
                acc,
                f16p(x.add(108)) * f32_at(a, Q8K * i),
                vaddvq_s32(isum),
                0.0,
                0,
            );
        }
        acc
    }
}

/// # Safety
/// Whole Q4_K / Q8_K blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q4_k<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let m4 = vdupq_n_u8(0xF);
        let zero = vdupq_n_s32(0);
        let mut acc = 0.0f32;
        for i in 0..n / 256 {
            let x = w.as_ptr().add(144 * i);
            let y = a.as_ptr().add(Q8K * i);
            let (sc, mn) = scales_mins_k4(&w[144 * i + 4..144 * i + 16]);
            let summs = bsums_dot_pairs(y, &mn);
            let mut isum = zero;
            for j in 0..4 {
                let (qa, qb) = (ld_u8(x.add(16 + 32 * j)), ld_u8(x.add(32 + 32 * j)));
                let yp = y.add(4 + 64 * j);
                let lo = D::dot(zero, vreinterpretq_s8_u8(vandq_u8(qa, m4)), ld_s8(yp));
                let lo = D::dot(lo, vreinterpretq_s8_u8(vandq_u8(qb, m4)), ld_s8(yp.add(16)));
                let hi = D::dot(
                    zero,
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(qa)),
                    ld_s8(yp.add(32)),
                );
                let hi = D::dot(
                    hi,
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(qb)),
                    ld_s8(yp.add(48)),
                );
                isum = vmlaq_n_s32(isum, lo, sc[2 * j] as i32);
                isum = vmlaq_n_s32(isum, hi, sc[2 * j + 1] as i32);
            }
            let dy = f32_at(a, Q8K * i);
            acc = kq_acc(
                acc,
                f16p(x) * dy,
                vaddvq_s32(isum),
                f16p(x.add(2)) * dy,
                summs,
            );
        }
        acc
    }
}

/// # Safety
/// Whole Q5_K / Q8_K blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q5_k<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let (m4, one) = (vdupq_n_u8(0xF), vdupq_n_u8(1));
        let zero = vdupq_n_s32(0);
        let mut acc = 0.0f32;
        for i in 0..n / 256 {
            let x = w.as_ptr().add(176 * i);
            let y = a.as_ptr().add(Q8K * i);
            let (sc, mn) = scales_mins_k4(&w[176 * i + 4..176 * i + 16]);
            let summs = bsums_dot_pairs(y, &mn);
            let (qh0, qh1) = (ld_u8(x.add(16)), ld_u8(x.add(32)));
            // The fifth bit of group g (elements 32g..32g+32) as 16 / 0.
            let high = |qh: uint8x16_t, g: usize| vshlq_n_u8::<4>(vandq_u8(shr(qh, g), one));
            let mut isum = zero;
            for j in 0..4 {
                let (qa, qb) = (ld_u8(x.add(48 + 32 * j)), ld_u8(x.add(64 + 32 * j)));
                let yp = y.add(4 + 64 * j);
                let (g0, g1) = (2 * j, 2 * j + 1);
                let la = vorrq_u8(vandq_u8(qa, m4), high(qh0, g0));
                let lb = vorrq_u8(vandq_u8(qb, m4), high(qh1, g0));
                let ha = vorrq_u8(vshrq_n_u8::<4>(qa), high(qh0, g1));
                let hb = vorrq_u8(vshrq_n_u8::<4>(qb), high(qh1, g1));
                let lo = D::dot(zero, vreinterpretq_s8_u8(la), ld_s8(yp));
                let lo = D::dot(lo, vreinterpretq_s8_u8(lb), ld_s8(yp.add(16)));
                let hi = D::dot(zero, vreinterpretq_s8_u8(ha), ld_s8(yp.add(32)));
                let hi = D::dot(hi, vreinterpretq_s8_u8(hb), ld_s8(yp.add(48)));
                isum = vmlaq_n_s32(isum, lo, sc[g0] as i32);
                isum = vmlaq_n_s32(isum, hi, sc[g1] as i32);
            }
            let dy = f32_at(a, Q8K * i);
            acc = kq_acc(
                acc,
                f16p(x) * dy,
                vaddvq_s32(isum),
                f16p(x.add(2)) * dy,
                summs,
            );
        }
        acc
    }
}

/// # Safety
/// Whole Q6_K / Q8_K blocks for `n`.
#[inline(always)]
pub(super) unsafe fn dot_q6_k<D: I8Dot>(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: NEON and whole blocks for `n` (the module contract, which the
    // `#[target_feature]` wrappers and `dispatch::Kernel::call` establish).
    unsafe {
        let (m4, m3, k32) = (vdupq_n_u8(0xF), vdupq_n_u8(3), vdupq_n_s8(32));
        let zero = vdupq_n_s32(0);
        let mut acc = 0.0f32;
        for i in 0..n / 256 {
            let x = w.as_ptr().add(210 * i);
            let y = a.as_ptr().add(Q8K * i);
            let sc = &w[210 * i + 192..210 * i + 208];
            let mut isum = zero;
            for h in 0..2 {
                let ql = |o: usize| ld_u8(x.add(64 * h + o));
                let (ql0a, ql0b, ql1a, ql1b) = (ql(0), ql(16), ql(32), ql(48));
                let (qha, qhb) = (ld_u8(x.add(128 + 32 * h)), ld_u8(x.add(144 + 32 * h)));
                // Element 128h + 32k + l: low nibble of ql[64h + 32(k&1) + l] (k < 2) or
                // its high nibble (k ≥ 2), high bits 2k..2k+2 of qh[32h + l], minus 32.
                let q = |low: uint8x16_t, qh: uint8x16_t, k: usize| {
                    let hb = vshlq_n_u8::<4>(vandq_u8(shr(qh, 2 * k), m3));
                    vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, hb)), k32)
                };
                let groups = [
                    (vandq_u8(ql0a, m4), vandq_u8(ql0b, m4)),
                    (vandq_u8(ql1a, m4), vandq_u8(ql1b, m4)),
                    (vshrq_n_u8::<4>(ql0a), vshrq_n_u8::<4>(ql0b)),
                    (vshrq_n_u8::<4>(ql1a), vshrq_n_u8::<4>(ql1b)),
                ];
                for (k, &(la, lb)) in groups.iter().enumerate() {
                    let yp = y.add(4 + 128 * h + 32 * k);
                    let s = 8 * h + 2 * k;
                    let p0 = D::dot(zero, q(la, qha, k), ld_s8(yp));
                    let p1 = D::dot(zero, q(lb, qhb, k), ld_s8(yp.add(16)));
                    isum = vmlaq_n_s32(isum, p0, sc[s] as i8 as i32);
                    isum = vmlaq_n_s32(isum, p1, sc[s + 1] as i8 as i32);
                }
            }
            acc = kq_acc(
                acc,
                f16p(x.add(208)) * f32_at(a, Q8K * i),
                vaddvq_s32(isum),
                0.0,
                0,
            );
        }
        acc
    }
}
