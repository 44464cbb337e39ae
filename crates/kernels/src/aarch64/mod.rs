//! aarch64 NEON kernels; reached only through `crate::dispatch`.
//!
//! Two integer sets share one body per format (`kernels`, generic over `dot::I8Dot`):
//! `neon` (baseline ARMv8-A: `smull` + `sadalp`) and `dotprod` (ARMv8.2 `sdot`). The
//! float types (F32, F16, BF16) have one version, used by both. The i8mm set
//! (`KernelSet::NeonI8mm`) runs the `dotprod` kernels: `smmla` computes a 2×2 tile
//! (two weight rows × two activation rows), which the one-row `vec_dot` interface has
//! no place for yet; the i-quants stay portable, as on x86.
//!
//! Each `unsafe fn` here may only be called when `dispatch::hardware()` found what its
//! set needs (`neon`; `neon` + `dotprod`) and with whole blocks of both types for `n`
//! (checked by `dispatch::Kernel::call`).

mod dot;
mod kernels;
pub(crate) mod packed;

use crate::KernelSet;
use llamay_formats::GgmlType;

type SimdDotFn = unsafe fn(&[u8], &[u8], usize) -> f32;

/// The float kernels, the same under every NEON set.
mod float {
    /// # Safety
    /// NEON; `w`, `a` hold `n` f32.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
        // SAFETY: the caller's contract is the body's.
        unsafe { super::kernels::dot_f32(w, a, n) }
    }

    /// # Safety
    /// NEON; `w`, `a` hold `n` f16.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
        // SAFETY: the caller's contract is the body's.
        unsafe { super::kernels::dot_f16(w, a, n) }
    }

    /// # Safety
    /// NEON; `w`, `a` hold `n` bf16.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
        // SAFETY: the caller's contract is the body's.
        unsafe { super::kernels::dot_bf16(w, a, n) }
    }
}

/// One module of `#[target_feature]` wrappers per integer set, each instantiating the
/// generic body with that set's `I8Dot`.
macro_rules! integer_set {
    ($(#[$doc:meta])* $set:ident, $feature:literal, $dot:ty) => {
        $(#[$doc])*
        mod $set {
            integer_set!(@wrap $feature, $dot, dot_q4_0, dot_q4_1, dot_q5_0, dot_q5_1,
                dot_q8_0, dot_mxfp4, dot_q2_k, dot_q3_k, dot_q4_k, dot_q5_k, dot_q6_k);
        }
    };
    (@wrap $feature:literal, $dot:ty, $($name:ident),*) => {
        $(
            /// # Safety
            /// The CPU has this set's features; whole blocks of both types for `n`.
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn $name(w: &[u8], a: &[u8], n: usize) -> f32 {
                // SAFETY: the caller's contract is the body's.
                unsafe { super::kernels::$name::<$dot>(w, a, n) }
            }
        )*
    };
}

integer_set!(
    /// Baseline NEON.
    neon,
    "neon",
    super::dot::Mull
);
integer_set!(
    /// NEON + dotprod.
    dotprod,
    "neon,dotprod",
    super::dot::Sdot
);

/// The kernel of `wty` under `set` (already capped to the hardware), `None` where the
/// set has none (portable is used).
pub(crate) fn dot_fn(set: KernelSet, wty: GgmlType) -> Option<SimdDotFn> {
    use GgmlType::*;
    macro_rules! table {
        ($m:ident) => {
            match wty {
                F32 => float::dot_f32 as SimdDotFn,
                F16 => float::dot_f16,
                BF16 => float::dot_bf16,
                Q4_0 => $m::dot_q4_0,
                Q4_1 => $m::dot_q4_1,
                Q5_0 => $m::dot_q5_0,
                Q5_1 => $m::dot_q5_1,
                Q8_0 => $m::dot_q8_0,
                MXFP4 => $m::dot_mxfp4,
                Q2_K => $m::dot_q2_k,
                Q3_K => $m::dot_q3_k,
                Q4_K => $m::dot_q4_k,
                Q5_K => $m::dot_q5_k,
                Q6_K => $m::dot_q6_k,
                _ => return None,
            }
        };
    }
    Some(match set {
        KernelSet::Neon => table!(neon),
        KernelSet::NeonDotprod | KernelSet::NeonI8mm => table!(dotprod),
        _ => return None,
    })
}
