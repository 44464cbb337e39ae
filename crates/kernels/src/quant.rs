//! Activation quantisers: f32 rows to the vec_dot types, as llama.cpp's CPU backend
//! computes them (its `from_float`): Q8_K, F16, BF16 are the reference quantisers
//! (byte-identical to `llamay_formats::quantize`); Q8_0 and Q8_1 follow ggml-cpu's x86
//! versions, which differ from the reference in the multiplier and the rounding. No
//! allocation, no finiteness check (a non-finite activation gives the same garbage C
//! gives; it does not panic).

/// C's float-to-int conversion as x86-64 does it (`INT_MIN` for NaN / out of range).
#[inline]
fn c_trunc(v: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

/// An i32 as x86's saturating packs (`packs_epi32` then `packs_epi16`) make it a byte:
/// a non-finite product, converted to `INT_MIN`, becomes -128.
#[inline]
fn packed_i8(q: i32) -> i8 {
    q.clamp(-128, 127) as i8
}

/// ggml's `nearest_int` (round half to even through the magic number).
#[inline]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

#[inline]
pub(crate) fn f16_bits(v: f32) -> [u8; 2] {
    if v.is_nan() {
        0x7E00u16.to_le_bytes()
    } else {
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }
}

#[inline]
fn absmax(x: &[f32]) -> f32 {
    x.iter()
        .fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() })
}

/// Q8_0 as ggml-cpu's x86 `quantize_row_q8_0` computes it (what llama.cpp's CPU
/// backend feeds its dot products), not the reference quantiser: the multiplier is
/// 127/amax rather than 1/(amax/127), and values round half to even.
pub(crate) fn q8_0(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let max = absmax(x);
        let d = max / 127.0;
        let id = if max != 0.0 { 127.0 / max } else { 0.0 };
        b[0..2].copy_from_slice(&f16_bits(d));
        for (o, &v) in b[2..].iter_mut().zip(x) {
            *o = packed_i8(c_trunc((v * id).round_ties_even())) as u8;
        }
    }
}

/// Q8_1 as ggml-cpu's x86 `quantize_row_q8_1` computes it (see [`q8_0`]); `s` is
/// f16(d · Σq).
pub(crate) fn q8_1(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
        let max = absmax(x);
        let d = max / 127.0;
        let id = if max != 0.0 { 127.0 / max } else { 0.0 };
        b[0..2].copy_from_slice(&f16_bits(d));
        let mut sum = 0i32;
        for (o, &v) in b[4..].iter_mut().zip(x) {
            // ggml sums the 32-bit values before they are packed (wrapping).
            let q = c_trunc((v * id).round_ties_even());
            *o = packed_i8(q) as u8;
            sum = sum.wrapping_add(q);
        }
        b[2..4].copy_from_slice(&f16_bits(d * sum as f32));
    }
}

pub(crate) fn q8_k(x: &[f32], out: &mut [u8]) {
    for (x, b) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (o, &v) in b[4..260].iter_mut().zip(x) {
            *o = nearest_int(iscale * v).min(127) as u8;
        }
        for j in 0..16 {
            let s: i32 = b[4 + 16 * j..20 + 16 * j]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

pub(crate) fn f16(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f16_bits(v));
    }
}

pub(crate) fn bf16(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(2).zip(x) {
        let u = v.to_bits();
        let h = (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16;
        o.copy_from_slice(&h.to_le_bytes());
    }
}

pub(crate) fn f32(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}
