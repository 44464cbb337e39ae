//! ggml's own half-precision conversions (Maratyszcza's FP16 algorithm, as in
//! `ggml-impl.h`). Written out rather than taken from `half` so that every bit, NaN
//! payloads included, is what llama.cpp's reference quantisers store.

/// `GGML_FP16_TO_FP32`: exact for every finite half, and maps NaN payloads as ggml does.
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    if h & 0x7C00 == 0x7C00 {
        // Infinity and NaN without float arithmetic: x86 keeps a NaN's payload through
        // the multiply below (and sets the quiet bit), RISC-V returns its canonical NaN
        // instead. These are the x86 bits, on every target.
        let mantissa = u32::from(h & 0x03FF) << 13;
        let quiet = if mantissa != 0 { 0x0040_0000 } else { 0 };
        return f32::from_bits((u32::from(h & 0x8000) << 16) | 0x7F80_0000 | mantissa | quiet);
    }
    let w = (h as u32) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    let exp_offset: u32 = 0xE0 << 23;
    let exp_scale = f32::from_bits(0x0780_0000); // 2^-112
    let normalized = f32::from_bits((two_w >> 4) + exp_offset) * exp_scale;
    let magic_mask: u32 = 126 << 23;
    let denormalized = f32::from_bits((two_w >> 17) | magic_mask) - 0.5;
    let cutoff: u32 = 1 << 27;
    let bits = if two_w < cutoff {
        denormalized.to_bits()
    } else {
        normalized.to_bits()
    };
    f32::from_bits(sign | bits)
}

/// `GGML_FP32_TO_FP16`: round to nearest even, overflow to infinity, NaN to 0x7E00.
pub(crate) fn f32_to_f16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// Reads the little-endian half at byte `at` of a block.
pub(crate) fn read_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Writes `v` as a little-endian half at byte `at`.
pub(crate) fn write_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arithmetic path, as ggml writes it, for every half (on x86-64, where it keeps
    /// NaN payloads, this is the reference for the explicit infinity/NaN branch).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn infinities_and_nans_are_the_arithmetic_paths_bits_on_x86() {
        for h in 0x7C00..=0x7FFFu16 {
            for h in [h, h | 0x8000] {
                let w = (h as u32) << 16;
                let two_w = w.wrapping_add(w);
                let arith =
                    f32::from_bits((two_w >> 4) + (0xE0 << 23)) * f32::from_bits(0x0780_0000);
                let want = (w & 0x8000_0000) | arith.to_bits();
                assert_eq!(f16_to_f32(h).to_bits(), want, "{h:#x}");
            }
        }
    }

    #[test]
    fn agrees_with_half_on_every_non_nan_half() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h);
            if want.is_nan() {
                assert!(f16_to_f32(h).is_nan());
                continue;
            }
            assert_eq!(f16_to_f32(h).to_bits(), want.to_f32().to_bits(), "{h:#x}");
            assert_eq!(f32_to_f16(want.to_f32()), h);
        }
        for bits in (0..u32::MAX).step_by(65_521) {
            let f = f32::from_bits(bits);
            if !f.is_nan() {
                assert_eq!(f32_to_f16(f), half::f16::from_f32(f).to_bits(), "{bits:#x}");
            }
        }
    }
}
