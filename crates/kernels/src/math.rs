//! Transcendental functions with the same bits on every target.
//!
//! `f32::tanh` is the C library's `tanhf`, and its last bit depends on the target:
//! glibc builds it with fused multiply-adds where the CPU has them (s390x, ppc64le,
//! aarch64) and without on x86-64, so Gemma 2's soft-capped logits differed between
//! an s390x and an x86-64 portable run (measured: the 6 gemma2 fixtures, all others
//! equal). Here the work is done in f64 with only `+ - * /`, which Rust never fuses,
//! then rounded once to f32: the result is the correctly rounded tanh except where the
//! exact value lies within about 1e-16 of a rounding boundary, and it is the same on
//! every target.

/// `tanh(x)`, rounded to f32 (within half an ulp but for near-ties; see the module).
pub fn tanh(x: f32) -> f32 {
    let a = f64::from(x).abs();
    if x.is_nan() {
        return x;
    }
    if a >= 10.0 {
        // From 9.02 on, tanh rounds to ±1 in f32.
        return 1f32.copysign(x);
    }
    let e = expm1(2.0 * a);
    ((e / (e + 2.0)) as f32).copysign(x)
}

/// `e^y - 1` for `0 <= y <= 20`, relative error a few f64 ulps.
fn expm1(y: f64) -> f64 {
    if y < 0.5 {
        // Taylor series: the 18th term is below 2^-60 of the first.
        let mut term = y;
        let mut sum = y;
        for n in 2..=18 {
            term = term * y / f64::from(n);
            sum += term;
        }
        return sum;
    }
    // e^y = 2^k e^r with |r| <= ln2/2; ln 2 split so that k·LN2_HI is exact.
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    let k = (y / std::f64::consts::LN_2).round();
    let r = (y - k * LN2_HI) - k * LN2_LO;
    let mut term = 1.0;
    let mut sum = 1.0;
    for n in 1..=16 {
        term = term * r / f64::from(n);
        sum += term;
    }
    // k <= 29: 2^k is exact and normal.
    sum * f64::from_bits(((k as i64 + 1023) as u64) << 52) - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tanh_is_within_an_ulp_of_the_libraries() {
        let mut worst = 0u32;
        let mut x = -12.0f32;
        while x < 12.0 {
            let (ours, theirs) = (tanh(x), f64::from(x).tanh() as f32);
            let ulps = (ours.to_bits() as i64 - theirs.to_bits() as i64).unsigned_abs() as u32;
            worst = worst.max(ulps);
            x += 1.0e-4 * (1.0 + x.abs());
        }
        assert!(worst <= 1, "{worst} ulps from f64 tanh rounded to f32");
        for tiny in [0.0f32, -0.0, 1e-30, -1e-8, f32::MIN_POSITIVE] {
            assert_eq!(tanh(tiny).to_bits(), tiny.to_bits(), "{tiny:e}");
        }
        assert!(tanh(f32::NAN).is_nan());
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(-50.0), -1.0);
        assert_eq!(tanh(9.5), 1.0);
    }
}
