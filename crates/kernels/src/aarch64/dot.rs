//! The one instruction the two integer kernel sets differ in: a signed 8-bit dot
//! product of 16 byte pairs into four i32 lanes.
//!
//! `Mull` is baseline NEON (`smull` / `smull2` into i16, pairwise-accumulated into i32);
//! `Sdot` is the ARMv8.2 `dotprod` extension's `sdot`. Both give exact lane sums (an i8·i8
//! product fits in i16, ±16384); they differ in which products land in which lane, which
//! no caller depends on: every caller sums all four lanes (or scales them all alike).

use core::arch::aarch64::*;
use core::arch::asm;

pub(crate) trait I8Dot {
    /// `acc` plus the 16 products `a[i]·b[i]`, summed into the four i32 lanes (each
    /// lane gets four products; which four is the implementation's choice).
    ///
    /// # Safety
    /// The CPU must have what the implementation needs: NEON for `Mull`, NEON and
    /// `dotprod` for `Sdot`. Callers are `#[target_feature]` functions that enable it.
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// Baseline NEON: `smull`, `smull2`, `sadalp`.
pub(crate) struct Mull;

impl I8Dot for Mull {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: NEON, the caller's.
        unsafe {
            let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let hi = vmull_high_s8(a, b);
            vpadalq_s16(vpadalq_s16(acc, lo), hi)
        }
    }
}

/// ARMv8.2 `dotprod`: one `sdot`. Written as inline assembly because the `vdotq_s32`
/// intrinsic is not stable Rust; the instruction is the one that intrinsic emits.
pub(crate) struct Sdot;

impl I8Dot for Sdot {
    #[inline(always)]
    unsafe fn dot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: registers only, no memory or flags; the caller guarantees `dotprod`
        // (this is only inlined into `#[target_feature(enable = "neon,dotprod")]` fns).
        unsafe {
            asm!(
                // LLVM assembles inline asm against the crate's baseline features,
                // not the enclosing function's: name the extension for the assembler.
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }
}
