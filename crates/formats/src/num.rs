//! Integer conversions exactly as llama.cpp's C performs them, so that quantisers give
//! the same bytes even on inputs where the C behaviour is an accident of the platform.

/// ggml's `nearest_int`: round to nearest even through the 1.5·2^23 magic-number trick.
/// Exact for |v| ≤ 2^22; beyond that (or for NaN) it returns the same garbage C returns.
pub fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// C's float-to-integer conversion as x86-64 executes it (`cvttss2si`): truncation toward
/// zero, and `INT_MIN` for NaN or anything out of `i32` range. llama.cpp converts straight
/// to `int8_t`/`uint8_t`, which compilers lower to this followed by keeping the low byte.
pub(crate) fn c_trunc(v: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
    }

    #[test]
    fn c_trunc_mimics_cvttss2si() {
        assert_eq!(c_trunc(8.9), 8);
        assert_eq!(c_trunc(-0.9), 0);
        assert_eq!(c_trunc(f32::NAN), i32::MIN);
        assert_eq!(c_trunc(f32::INFINITY), i32::MIN);
        assert_eq!(c_trunc(-3e9), i32::MIN);
    }
}
