//! The one runtime dispatch point: which kernel set this CPU (and the environment)
//! allows, and which function computes a weight type's dot product under it.
//!
//! `LLAMAY_BACKEND=portable` forces the portable reference; `LLAMAY_CPU=<set name>`
//! (`avx2`, `neon`, `neon-dotprod`, ..., or `portable`) caps the SIMD level below what
//! the CPU offers; a set of another architecture caps to portable. Detection runs once.

use crate::{DotFn, KernelSet, portable};
use llamay_formats::GgmlType;
use std::sync::OnceLock;

type SimdDotFn = unsafe fn(&[u8], &[u8], usize) -> f32;

/// Whether this CPU has the features of `set` (detected once per set).
fn supported(set: KernelSet) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = || has!("avx2") && has!("fma") && has!("f16c");
        let avx512vnni = || {
            avx2() && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni")
        };
        match set {
            KernelSet::Avx2 => return avx2(),
            KernelSet::AvxVnni => return avx2() && has!("avxvnni"),
            KernelSet::Avx512Vnni => return avx512vnni(),
            KernelSet::Avx512Amx => return avx512vnni() && crate::x86::amx::tile_data_granted(),
            _ => {}
        }
    }
    #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
    {
        use std::arch::is_aarch64_feature_detected as has;
        match set {
            KernelSet::Neon => return has!("neon"),
            KernelSet::NeonDotprod => return has!("neon") && has!("dotprod"),
            KernelSet::NeonI8mm => return has!("neon") && has!("dotprod") && has!("i8mm"),
            _ => {}
        }
    }
    set == KernelSet::Portable
}

/// What the hardware offers, ignoring the environment: its highest supported set.
pub(crate) fn hardware() -> KernelSet {
    static HW: OnceLock<KernelSet> = OnceLock::new();
    *HW.get_or_init(|| {
        (KernelSet::ALL.into_iter().rev())
            .find(|&s| supported(s))
            .unwrap_or(KernelSet::Portable)
    })
}

/// The architecture a set runs on (0 for portable, which runs anywhere).
fn arch_of(set: KernelSet) -> u8 {
    match set {
        KernelSet::Portable => 0,
        KernelSet::Avx2 | KernelSet::AvxVnni | KernelSet::Avx512Vnni | KernelSet::Avx512Amx => 1,
        KernelSet::Neon | KernelSet::NeonDotprod | KernelSet::NeonI8mm => 2,
    }
}

/// `set` capped to `hw` (what a CPU offers): the lower of the two when both are of one
/// architecture, else portable.
pub(crate) fn cap(set: KernelSet, hw: KernelSet) -> KernelSet {
    if arch_of(set) == arch_of(hw) {
        set.min(hw)
    } else {
        KernelSet::Portable
    }
}

/// `set` capped to this CPU: as `cap`, then down to the highest set at or below it whose
/// features the CPU has (an AVX-512 VNNI CPU need not have AVX-VNNI).
pub(crate) fn cap_to_hardware(set: KernelSet) -> KernelSet {
    let c = cap(set, hardware());
    (KernelSet::ALL.into_iter().rev())
        .find(|&s| s <= c && arch_of(s) == arch_of(c) && supported(s))
        .unwrap_or(KernelSet::Portable)
}

/// The set in use: the hardware's, capped by `LLAMAY_BACKEND` / `LLAMAY_CPU`.
pub(crate) fn active() -> KernelSet {
    static ACTIVE: OnceLock<KernelSet> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let backend = std::env::var("LLAMAY_BACKEND").unwrap_or_default();
        if backend.eq_ignore_ascii_case("portable") {
            return KernelSet::Portable;
        }
        let cpu = std::env::var("LLAMAY_CPU").unwrap_or_default();
        match env_cap(&cpu) {
            Some(c) => cap_to_hardware(c),
            None => hardware(),
        }
    })
}

/// The cap `LLAMAY_CPU` names: a set's name (or `generic` for portable); `None` (no
/// cap) for anything else, including empty.
fn env_cap(v: &str) -> Option<KernelSet> {
    if v.eq_ignore_ascii_case("generic") {
        return Some(KernelSet::Portable);
    }
    KernelSet::from_name(v)
}

/// Whether the active set includes AVX2 + FMA + F16C (every x86-64 set): the one check
/// behind every x86 SIMD helper outside the dot-product table.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_active() -> bool {
    arch_of(active()) == arch_of(KernelSet::Avx2)
}

/// Whether the active set includes AVX-512 (F, BW, VL, VNNI).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_active() -> bool {
    matches!(active(), KernelSet::Avx512Vnni | KernelSet::Avx512Amx)
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
            // SAFETY: `Imp::Simd` is built only in `kernel` below, for a set that
            // `cap_to_hardware` found supported (the is_x86_feature_detected checks for
            // avx2+fma+f16c, plus avxvnni or avx512f+bw+vl+vnni for those sets;
            // is_aarch64_feature_detected for neon, and dotprod for the dotprod/i8mm
            // sets); the lengths were checked above.
            Imp::Simd(f) => unsafe { f(w, a, n) },
        }
    }
}

/// The kernel for `wty` under `set` (capped to what the hardware has), falling back to
/// the portable one where the set has no SIMD version; `None` for types llamay does not
/// compute on.
pub(crate) fn kernel(set: KernelSet, wty: GgmlType) -> Option<Kernel> {
    let set = cap_to_hardware(set);
    let p = portable::dot_fn(wty)?;
    let f = simd_fn(set, wty).map_or(Imp::Portable(p), Imp::Simd);
    Some(Kernel {
        f,
        w_block: wty.type_size() as usize,
        a_block: wty.vec_dot_type().type_size() as usize,
        block: wty.block_size() as usize,
    })
}

/// How `matmul` runs F16 weights under `set` (capped to this machine) on x86: every x86
/// set has AVX2, FMA and F16C for the 8-lane tiled kernel; the AVX-512 sets run their
/// 16-lane one (their `dot_f16` is its 1 × 1 case).
#[cfg(target_arch = "x86_64")]
pub(crate) fn f16_tiles(set: KernelSet) -> Option<F16Tiles> {
    let set = cap_to_hardware(set);
    if arch_of(set) != arch_of(KernelSet::Avx2) {
        return None;
    }
    Some(match set {
        KernelSet::Avx512Vnni | KernelSet::Avx512Amx => F16Tiles::Wide,
        _ => F16Tiles::Avx2,
    })
}

/// The x86 F16 tile widths (see `f16_tiles`).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum F16Tiles {
    Avx2,
    Wide,
}

/// Whether `set` has its own (non-portable) kernel for `wty` on this machine.
pub(crate) fn has_simd(set: KernelSet, wty: GgmlType) -> bool {
    simd_fn(cap_to_hardware(set), wty).is_some()
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
            MXFP4 => avx2::dot_mxfp4,
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
        KernelSet::Avx2 | KernelSet::AvxVnni => avx2_fn(wty),
        // AMX adds prefill tiles only (`packed`); its row kernels are AVX-512's.
        KernelSet::Avx512Vnni | KernelSet::Avx512Amx => {
            avx512::dot_fn(wty).or_else(|| avx2_fn(wty))
        }
        KernelSet::Neon | KernelSet::NeonDotprod | KernelSet::NeonI8mm => None,
    }
}

#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
fn simd_fn(set: KernelSet, wty: GgmlType) -> Option<SimdDotFn> {
    crate::aarch64::dot_fn(set, wty)
}

#[cfg(not(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_endian = "little")
)))]
fn simd_fn(_set: KernelSet, _wty: GgmlType) -> Option<SimdDotFn> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use KernelSet::*;

    #[test]
    fn caps_stay_within_an_architecture() {
        assert_eq!(cap(Avx2, Avx512Vnni), Avx2);
        assert_eq!(cap(AvxVnni, Avx512Vnni), AvxVnni);
        assert_eq!(cap(Avx512Vnni, AvxVnni), AvxVnni);
        assert_eq!(cap(Avx512Amx, Avx512Vnni), Avx512Vnni);
        assert_eq!(cap(Avx512Vnni, Avx512Amx), Avx512Vnni);
        // Whatever the CPU, the cap to it is a set it supports, never above the request.
        for s in KernelSet::ALL {
            let c = cap_to_hardware(s);
            assert!(supported(c) && (c <= s || c == Portable), "{s:?} -> {c:?}");
        }
        assert_eq!(cap(Avx512Vnni, Avx2), Avx2);
        assert_eq!(cap(Neon, NeonI8mm), Neon);
        assert_eq!(cap(NeonI8mm, NeonDotprod), NeonDotprod);
        assert_eq!(cap(NeonDotprod, Neon), Neon);
        assert_eq!(cap(Avx2, NeonDotprod), Portable);
        assert_eq!(cap(Neon, Avx512Vnni), Portable);
        assert_eq!(cap(Portable, NeonI8mm), Portable);
        assert_eq!(cap(Neon, Portable), Portable);
        for s in KernelSet::ALL {
            assert_eq!(KernelSet::from_name(s.name()), Some(s));
            assert_eq!(env_cap(&s.name().to_ascii_uppercase()), Some(s));
        }
        assert_eq!(env_cap("generic"), Some(Portable));
        assert_eq!(env_cap(""), None);
        assert_eq!(env_cap("sve"), None);
    }
}
