//! Transcendental functions with the same bits on every target.
//!
//! `f32::tanh` and `f32::sin_cos` are the C library's, and their last bit depends on
//! the target: glibc builds `tanhf` with fused multiply-adds where the CPU has them
//! (s390x, aarch64) and without on x86-64, and wasm32-wasip1's libc (musl's code) has
//! another `sinf`/`cosf` than glibc. Measured through the portable kernels: Gemma 2's
//! soft-capped logits differed between s390x and x86-64 (6 fixtures), and every
//! rope architecture's between wasm32 and x86-64 (40 fixtures). Here the work is done
//! in f64 with only `+ - * /`, which Rust never fuses, then rounded once to f32: the
//! correctly rounded value except where the exact one lies within about 1e-16 of a
//! rounding boundary, and the same on every target. (`expf`, `powf` and `logf` are
//! one implementation in glibc and musl, and agreed on every fixture.) Measured on
//! x86-64 over 354,510 sin and cos values of angles 0.001..50000: these equal the f64
//! result rounded to f32 in every case, glibc's `sinf`/`cosf` in all but 3,586 (1%,
//! one ulp each) — which llama.cpp uses, so rope differs from it there by that ulp.

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

/// `(sin x, cos x)`, each rounded to f32 (within half an ulp but for near-ties, for
/// |x| < 2^27·π/2; beyond, where an f32 angle is a multiple of 16 rad, less accurate
/// but still the same on every target).
pub fn sin_cos(x: f32) -> (f32, f32) {
    if !x.is_finite() {
        return (f32::NAN, f32::NAN);
    }
    // π/2 in four pieces: the first three of 26 bits, so that k times each is exact
    // for |k| < 2^27, and the remainder.
    const PIO2: [f64; 4] = [
        1.570_796_340_703_964_2,
        -1.390_906_767_539_945_6e-8,
        6.123_233_932_053_594e-17,
        6.368_317_163_510_95e-25,
    ];
    let x = f64::from(x);
    let k = (x * std::f64::consts::FRAC_2_PI).round();
    let r = PIO2.iter().fold(x, |r, p| r - k * p);
    // Taylor series on |r| <= π/4 (terms after r^21/21! are below 2^-70), by Horner with
    // constant coefficients: rope calls this for every pair of every token's angles, so
    // no division on the way.
    const SIN: [f64; 10] = [
        -1.0 / 6.0,
        1.0 / 120.0,
        -1.0 / 5040.0,
        1.0 / 362880.0,
        -1.0 / 39916800.0,
        1.0 / 6227020800.0,
        -1.0 / 1307674368000.0,
        1.0 / 355687428096000.0,
        -1.0 / 121645100408832000.0,
        1.0 / 51090942171709440000.0,
    ];
    const COS: [f64; 10] = [
        -1.0 / 2.0,
        1.0 / 24.0,
        -1.0 / 720.0,
        1.0 / 40320.0,
        -1.0 / 3628800.0,
        1.0 / 479001600.0,
        -1.0 / 87178291200.0,
        1.0 / 20922789888000.0,
        -1.0 / 6402373705728000.0,
        1.0 / 2432902008176640000.0,
    ];
    let r2 = r * r;
    let horner = |k: &[f64; 10]| k.iter().rev().fold(0.0, |acc, &c| acc * r2 + c);
    let s = r + r * r2 * horner(&SIN);
    let c = 1.0 + r2 * horner(&COS);
    let (s, c) = (s as f32, c as f32);
    match (k as i64).rem_euclid(4) {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
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

    #[test]
    fn sin_cos_is_within_an_ulp_of_the_libraries() {
        let mut worst = 0u32;
        let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs();
        let mut x = -2.0e6f32;
        while x < 2.0e6 {
            for x in [x, x * 1e-6, x * 1e-3] {
                let (s, c) = sin_cos(x);
                let (ws, wc) = f64::from(x).sin_cos();
                // Near a zero of sin or cos an ulp is tiny: compare absolutely there.
                for (ours, want) in [(s, ws), (c, wc)] {
                    if want.abs() > 1e-3 {
                        worst = worst.max(ulps(ours, want as f32) as u32);
                    } else {
                        assert!((f64::from(ours) - want).abs() < 1e-10, "{x}");
                    }
                }
            }
            x += 0.37 + x.abs() * 1e-4;
        }
        assert!(worst <= 1, "{worst} ulps from f64 sin/cos rounded to f32");
        assert_eq!(sin_cos(0.0), (0.0, 1.0));
        assert!(sin_cos(f32::INFINITY).0.is_nan() && sin_cos(f32::NAN).1.is_nan());
    }
}
