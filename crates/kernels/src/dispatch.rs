//! The one runtime dispatch point: which kernel set this CPU (and the environment)
//! allows, and which function computes a weight type's dot product under it.
//!
//! `LLAMAY_BACKEND=portable` forces the portable reference; `LLAMAY_CPU=avx2` (or
//! `portable`) caps the SIMD level below what the CPU offers. Detection runs once.

use crate::{DotFn, KernelSet, portable};
use llamay_formats::GgmlType;
use std::sync::OnceLock;

type SimdDotFn = unsafe fn(&[u8], &[u8], usize) -> f32;

/// What the hardware offers, ignoring the environment.
pub(crate) fn hardware() -> KernelSet {
    static HW: OnceLock<KernelSet> = OnceLock::new();
    *HW.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c");
            let vnni = avx2
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni");
            if vnni {
                return KernelSet::Avx512Vnni;
            }
            if avx2 {
                return KernelSet::Avx2;
            }
        }
        KernelSet::Portable
    })
}

/// The set in use: the hardware's, capped by `LLAMAY_BACKEND` / `LLAMAY_CPU`.
pub(crate) fn active() -> KernelSet {
    static ACTIVE: OnceLock<KernelSet> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let hw = hardware();
        let backend = std::env::var("LLAMAY_BACKEND").unwrap_or_default();
        if backend.eq_ignore_ascii_case("portable") {
            return KernelSet::Portable;
        }
        let cap = match std::env::var("LLAMAY_CPU")
            .unwrap_or_default()
            .to_ascii_lowercase()
            .as_str()
        {
            "portable" | "generic" => KernelSet::Portable,
            "avx2" => KernelSet::Avx2,
            _ => KernelSet::Avx512Vnni,
        };
        hw.min(cap)
    })
}

/// A dot-product kernel chosen for a weight type under an available kernel set.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    f: Imp,
    w_block: usize,
    a_block: usize,
    block: usize,
}

#[derive(Clone, Copy)]
enum Imp {
    Portable(DotFn),
    /// Only constructed by `kernel` for a set that `hardware()` reported.
    Simd(SimdDotFn),
}

impl Kernel {
    /// The dot product of one weight row and one activation row of `n` values; NaN
    /// when `n` is not a whole number of blocks or a row is shorter than `n` needs.
    #[inline]
    pub(crate) fn call(&self, w: &[u8], a: &[u8], n: usize) -> f32 {
        let nb = n / self.block;
        if !n.is_multiple_of(self.block)
            || w.len() < nb * self.w_block
            || a.len() < nb * self.a_block
        {
            return f32::NAN;
        }
        match self.f {
            Imp::Portable(f) => f(w, a, n),
            // SAFETY: `Imp::Simd` is built only in `kernel` below, for a set no higher
            // than `hardware()` (the is_x86_feature_detected checks for avx2+fma+f16c,
            // and avx512f+bw+vl+vnni for the AVX-512 set); the lengths were checked above.
            Imp::Simd(f) => unsafe { f(w, a, n) },
        }
    }
}

/// The kernel for `wty` under `set` (capped to what the hardware has), falling back to
/// the portable one where the set has no SIMD version; `None` for types llamay does not
/// compute on.
pub(crate) fn kernel(set: KernelSet, wty: GgmlType) -> Option<Kernel> {
    let set = set.min(hardware());
    let p = portable::dot_fn(wty)?;
    let f = simd_fn(set, wty).map_or(Imp::Portable(p), Imp::Simd);
    Some(Kernel {
        f,
        w_block: wty.type_size() as usize,
        a_block: wty.vec_dot_type().type_size() as usize,
        block: wty.block_size() as usize,
    })
}

/// Whether `set` has its own (non-portable) kernel for `wty` on this machine.
pub(crate) fn has_simd(set: KernelSet, wty: GgmlType) -> bool {
    simd_fn(set.min(hardware()), wty).is_some()
}

#[cfg(target_arch = "x86_64")]
fn simd_fn(set: KernelSet, wty: GgmlType) -> Option<SimdDotFn> {
    use crate::x86::{avx2, avx512};
    use GgmlType::*;
    let avx2_fn = |t: GgmlType| -> Option<SimdDotFn> {
        Some(match t {
            F32 => avx2::dot_f32,
            F16 => avx2::dot_f16,
            BF16 => avx2::dot_bf16,
            Q4_0 => avx2::dot_q4_0,
            Q4_1 => avx2::dot_q4_1,
            Q5_0 => avx2::dot_q5_0,
            Q5_1 => avx2::dot_q5_1,
            Q8_0 => avx2::dot_q8_0,
            Q2_K => avx2::dot_q2_k,
            Q3_K => avx2::dot_q3_k,
            Q4_K => avx2::dot_q4_k,
            Q5_K => avx2::dot_q5_k,
            Q6_K => avx2::dot_q6_k,
            _ => return None,
        })
    };
    match set {
        KernelSet::Portable => None,
        KernelSet::Avx2 => avx2_fn(wty),
        KernelSet::Avx512Vnni => avx512::dot_fn(wty).or_else(|| avx2_fn(wty)),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn simd_fn(_set: KernelSet, _wty: GgmlType) -> Option<SimdDotFn> {
    None
}
