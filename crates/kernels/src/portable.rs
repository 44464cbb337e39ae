//! Portable dot products: the reference every SIMD kernel is tested against.
//!
//! Semantics (ggml's, with one fixed float order that the SIMD kernels reproduce):
//! - 32-blocks (Q4_0 Q5_0 Q8_0 IQ4_NL MXFP4 against Q8_0; Q4_1 Q5_1 against Q8_1): the
//!   integer sum of the block is exact (i32); then `acc += (dx * dy) * sumi as f32`
//!   (`+ mx * sy` for the `_1` formats, `sy` being Q8_1's stored `s = d·Σq`), f32.
//! - K-quants against Q8_K: the whole super-block's `Σ scale_j · Σ q·q8` is one exact i32
//!   `isum`; the min term (Q2_K, Q4_K, Q5_K) is one exact i32 `summs = Σ bsum·min`; then
//!   `acc += (dx * dy) * isum as f32; acc -= (dmin * dy) * summs as f32`, f32.
//! - i-quants: ggml's integer sums per 32-sub-block times the sub-block scale (exact i32
//!   per super-block), `acc += (dx * dy) * bsum as f32`, and the final constant factor
//!   (0.125 for IQ2_*, 0.25 for IQ3_XXS) applied once at the end; IQ4_XS applies its
//!   per-32 float scale as ggml does.
//! - F32 / F16 / BF16: products in f32, accumulated in f64 (ggml's generic `ggml_float`).

use llamay_formats::GgmlType;

pub(crate) const QK: usize = 32;
pub(crate) const QK_K: usize = 256;

#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[inline]
pub(crate) fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
fn bf16_at(b: &[u8], at: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[at], b[at + 1]]) as u32) << 16)
}

/// The signed values of IQ4_NL / IQ4_XS (ggml's `kvalues_iq4nl`); checked against
/// `llamay_formats::dequantize` by a test.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// MXFP4's doubled E2M1 values (ggml's `kvalues_mxfp4`); checked by a test.
pub(crate) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The Q8 activation bytes of a 32-block as signed values.
#[inline]
fn q8(a: &[u8]) -> impl Iterator<Item = i32> + '_ {
    a.iter().map(|&v| v as i8 as i32)
}

pub(crate) fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut s = 0.0f64;
    for i in 0..n {
        s += (f32_at(w, 4 * i) * f32_at(a, 4 * i)) as f64;
    }
    s as f32
}

pub(crate) fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut s = 0.0f64;
    for i in 0..n {
        s += (f16_at(w, 2 * i) * f16_at(a, 2 * i)) as f64;
    }
    s as f32
}

pub(crate) fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut s = 0.0f64;
    for i in 0..n {
        s += (bf16_at(w, 2 * i) * bf16_at(a, 2 * i)) as f64;
    }
    s as f32
}

/// Shared loop of the 32-blocks paired with Q8_0: `vals(block, j)` gives the signed
/// integer weight of element j.
#[inline]
fn legacy_q8_0(
    w: &[u8],
    a: &[u8],
    n: usize,
    ts: usize,
    scale: impl Fn(&[u8]) -> f32,
    vals: impl Fn(&[u8], usize) -> i32,
) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(ts).zip(a.chunks_exact(34)).take(n / QK) {
        let yq = &y[2..34];
        let mut sumi = 0i32;
        for (j, q) in q8(yq).enumerate() {
            sumi += vals(x, j) * q;
        }
        acc += (scale(x) * f16_at(y, 0)) * sumi as f32;
    }
    acc
}

#[inline]
fn nib(qs: &[u8], j: usize) -> u8 {
    if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 }
}

pub(crate) fn dot_q4_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_q8_0(
        w,
        a,
        n,
        18,
        |x| f16_at(x, 0),
        |x, j| nib(&x[2..], j) as i32 - 8,
    )
}

#[inline]
fn q5_high(qh: &[u8], j: usize) -> i32 {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    (((h >> j) & 1) << 4) as i32
}

pub(crate) fn dot_q5_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_q8_0(
        w,
        a,
        n,
        22,
        |x| f16_at(x, 0),
        |x, j| (nib(&x[6..], j) as i32 | q5_high(&x[2..6], j)) - 16,
    )
}

pub(crate) fn dot_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_q8_0(w, a, n, 34, |x| f16_at(x, 0), |x, j| x[2 + j] as i8 as i32)
}

pub(crate) fn dot_iq4_nl(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_q8_0(
        w,
        a,
        n,
        18,
        |x| f16_at(x, 0),
        |x, j| KVALUES_IQ4NL[nib(&x[2..], j) as usize] as i32,
    )
}

/// ggml's `GGML_E8M0_TO_FP32_HALF`.
#[inline]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

pub(crate) fn dot_mxfp4(w: &[u8], a: &[u8], n: usize) -> f32 {
    // ggml: d = dy * e8m0_half(e); the order (dy first) is kept.
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(17).zip(a.chunks_exact(34)).take(n / QK) {
        let mut sumi = 0i32;
        for (j, q) in q8(&y[2..34]).enumerate() {
            sumi += KVALUES_MXFP4[nib(&x[1..], j) as usize] as i32 * q;
        }
        acc += (f16_at(y, 0) * e8m0_half(x[0])) * sumi as f32;
    }
    acc
}

/// The 32-blocks with a min, against Q8_1 (`{f16 d, f16 s, i8 qs[32]}`).
#[inline]
fn legacy_q8_1(w: &[u8], a: &[u8], n: usize, ts: usize, vals: impl Fn(&[u8], usize) -> i32) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(ts).zip(a.chunks_exact(36)).take(n / QK) {
        let mut sumi = 0i32;
        for (j, q) in q8(&y[4..36]).enumerate() {
            sumi += vals(x, j) * q;
        }
        acc += (f16_at(x, 0) * f16_at(y, 0)) * sumi as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    acc
}

pub(crate) fn dot_q4_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_q8_1(w, a, n, 20, |x, j| nib(&x[4..], j) as i32)
}

pub(crate) fn dot_q5_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_q8_1(w, a, n, 24, |x, j| {
        nib(&x[8..], j) as i32 | q5_high(&x[4..8], j)
    })
}

// ------------------------------------------------------------------ K-quants

/// Q8_K block: `{f32 d; i8 qs[256]; i16 bsums[16]}` = 292 bytes.
pub(crate) const Q8K: usize = 292;

#[inline]
pub(crate) fn q8k_bsum(y: &[u8], j: usize) -> i32 {
    i16_at(y, 260 + 2 * j) as i32
}

/// Final per-super-block float step shared by every K-quant kernel (portable and SIMD).
#[inline(always)]
pub(crate) fn kq_acc(acc: f32, d: f32, isum: i32, dmin: f32, summs: i32) -> f32 {
    let acc = acc + d * isum as f32;
    acc - dmin * summs as f32
}

/// ggml's `get_scale_min_k4` for all eight sub-blocks: (scales, mins).
#[inline]
pub(crate) fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        if j < 4 {
            sc[j] = q[j] & 63;
            mn[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    (sc, mn)
}

/// The sixteen Q3_K scales, re-centred (−32..31).
#[inline]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

fn q8k_qs(y: &[u8]) -> &[u8] {
    &y[4..260]
}

pub(crate) fn dot_q2_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(84).zip(a.chunks_exact(Q8K)).take(n / QK_K) {
        let sc = &x[0..16];
        let qs = &x[16..80];
        let yq = q8k_qs(y);
        let summs: i32 = (0..16).map(|j| q8k_bsum(y, j) * (sc[j] >> 4) as i32).sum();
        let mut isum = 0i32;
        // element e: half h = e/128, shift = 2*((e%128)/32), byte = 32h + e%32, sub-block e/16
        for e in 0..QK_K {
            let (h, r) = (e / 128, e % 128);
            let q = ((qs[32 * h + r % 32] >> (2 * (r / 32))) & 3) as i32;
            isum += (sc[e / 16] & 0xF) as i32 * q * yq[e] as i8 as i32;
        }
        let dy = f32_at(y, 0);
        acc = kq_acc(acc, dy * f16_at(x, 80), isum, dy * f16_at(x, 82), summs);
    }
    acc
}

pub(crate) fn dot_q3_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(110).zip(a.chunks_exact(Q8K)).take(n / QK_K) {
        let hm = &x[0..32];
        let qs = &x[32..96];
        let sc = q3k_scales(&x[96..108]);
        let yq = q8k_qs(y);
        let mut isum = 0i32;
        for e in 0..QK_K {
            let (h, r) = (e / 128, e % 128);
            let l = r % 32;
            let low = ((qs[32 * h + l] >> (2 * (r / 32))) & 3) as i32;
            let m = 1u8 << (e / 32);
            let q = low - if hm[l] & m != 0 { 0 } else { 4 };
            isum += sc[e / 16] as i32 * q * yq[e] as i8 as i32;
        }
        acc = kq_acc(acc, f16_at(x, 108) * f32_at(y, 0), isum, 0.0, 0);
    }
    acc
}

pub(crate) fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(144).zip(a.chunks_exact(Q8K)).take(n / QK_K) {
        let (sc, mn) = scales_mins_k4(&x[4..16]);
        let qs = &x[16..144];
        let yq = q8k_qs(y);
        let summs: i32 = (0..16).map(|j| q8k_bsum(y, j) * mn[j / 2] as i32).sum();
        let mut isum = 0i32;
        for e in 0..QK_K {
            let (c, r) = (e / 64, e % 64);
            let b = qs[32 * c + r % 32];
            let q = if r < 32 { b & 0xF } else { b >> 4 } as i32;
            isum += sc[e / 32] as i32 * q * yq[e] as i8 as i32;
        }
        let dy = f32_at(y, 0);
        acc = kq_acc(acc, f16_at(x, 0) * dy, isum, f16_at(x, 2) * dy, summs);
    }
    acc
}

pub(crate) fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(176).zip(a.chunks_exact(Q8K)).take(n / QK_K) {
        let (sc, mn) = scales_mins_k4(&x[4..16]);
        let qh = &x[16..48];
        let qs = &x[48..176];
        let yq = q8k_qs(y);
        let summs: i32 = (0..16).map(|j| q8k_bsum(y, j) * mn[j / 2] as i32).sum();
        let mut isum = 0i32;
        for e in 0..QK_K {
            let (c, r) = (e / 64, e % 64);
            let l = r % 32;
            let b = qs[32 * c + l];
            let low = if r < 32 { b & 0xF } else { b >> 4 } as i32;
            let high = if qh[l] & (1u8 << (e / 32)) != 0 {
                16
            } else {
                0
            };
            isum += sc[e / 32] as i32 * (low + high) * yq[e] as i8 as i32;
        }
        let dy = f32_at(y, 0);
        acc = kq_acc(acc, f16_at(x, 0) * dy, isum, f16_at(x, 2) * dy, summs);
    }
    acc
}

pub(crate) fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(210).zip(a.chunks_exact(Q8K)).take(n / QK_K) {
        let yq = q8k_qs(y);
        let mut isum = 0i32;
        for e in 0..QK_K {
            let (h, r) = (e / 128, e % 128);
            let (k, l) = (r / 32, r % 32);
            let ql = x[64 * h + l + 32 * (k & 1)];
            let low = if k < 2 { ql & 0xF } else { ql >> 4 };
            let high = (x[128 + 32 * h + l] >> (2 * k)) & 3;
            let q = (low | (high << 4)) as i32 - 32;
            let sc = x[192 + e / 16] as i8 as i32;
            isum += sc * q * yq[e] as i8 as i32;
        }
        acc = kq_acc(acc, f16_at(x, 208) * f32_at(y, 0), isum, 0.0, 0);
    }
    acc
}

// ------------------------------------------------------------------ i-quants

/// The i-quant super-blocks: ggml's integer `bsum = Σ_sub ls · Σ grid·sign·q8` per
/// super-block. The grid/sign lattices live in `llamay_formats`; this recovers each
/// element's exact integer `ls·grid·sign` by dequantising a copy of the block with its
/// f16 scale set to 1.0: the format's per-sub-block factor is `ls / unit` (unit 8 for
/// IQ2_*, 4 for IQ3_XXS, 1 for IQ3_S), so `value · unit` is that integer, exactly in f32.
fn iquant_dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize, unit: f32) -> f32 {
    let ts = ty.type_size() as usize;
    let mut blk = [0u8; 128];
    let mut vals = [0f32; QK_K];
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(ts).zip(a.chunks_exact(Q8K)).take(n / QK_K) {
        blk[..ts].copy_from_slice(x);
        blk[0..2].copy_from_slice(&0x3C00u16.to_le_bytes());
        if llamay_formats::dequantize(ty, &blk[..ts], &mut vals).is_err() {
            return f32::NAN;
        }
        let yq = q8k_qs(y);
        let mut bsum = 0i32;
        for (v, &q) in vals.iter().zip(yq) {
            bsum += (v * unit) as i32 * q as i8 as i32;
        }
        acc += (f16_at(x, 0) * f32_at(y, 0)) * bsum as f32;
    }
    acc / unit
}

pub(crate) fn dot_iq2_xxs(w: &[u8], a: &[u8], n: usize) -> f32 {
    iquant_dot(GgmlType::IQ2_XXS, w, a, n, 8.0)
}
pub(crate) fn dot_iq2_xs(w: &[u8], a: &[u8], n: usize) -> f32 {
    iquant_dot(GgmlType::IQ2_XS, w, a, n, 8.0)
}
pub(crate) fn dot_iq2_s(w: &[u8], a: &[u8], n: usize) -> f32 {
    iquant_dot(GgmlType::IQ2_S, w, a, n, 8.0)
}
pub(crate) fn dot_iq3_xxs(w: &[u8], a: &[u8], n: usize) -> f32 {
    iquant_dot(GgmlType::IQ3_XXS, w, a, n, 4.0)
}
pub(crate) fn dot_iq3_s(w: &[u8], a: &[u8], n: usize) -> f32 {
    iquant_dot(GgmlType::IQ3_S, w, a, n, 1.0)
}

pub(crate) fn dot_iq4_xs(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in w.chunks_exact(136).zip(a.chunks_exact(Q8K)).take(n / QK_K) {
        let d4d8 = f16_at(x, 0) * f32_at(y, 0);
        let h = u16::from_le_bytes([x[2], x[3]]) as u32;
        let yq = q8k_qs(y);
        for ib in 0..8 {
            let low = ((x[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) as i32;
            let ls = low | ((((h >> (2 * ib)) & 3) as i32) << 4);
            let qs = &x[8 + 16 * ib..8 + 16 * ib + 16];
            let mut sumi = 0i32;
            for (j, q) in q8(&yq[32 * ib..32 * ib + 32]).enumerate() {
                sumi += KVALUES_IQ4NL[nib(qs, j) as usize] as i32 * q;
            }
            acc += (d4d8 * (ls - 32) as f32) * sumi as f32;
        }
    }
    acc
}

/// The portable dot of a weight type, `None` for types llamay does not compute on.
pub(crate) fn dot_fn(ty: GgmlType) -> Option<crate::DotFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => dot_f32,
        F16 => dot_f16,
        BF16 => dot_bf16,
        Q4_0 => dot_q4_0,
        Q4_1 => dot_q4_1,
        Q5_0 => dot_q5_0,
        Q5_1 => dot_q5_1,
        Q8_0 => dot_q8_0,
        MXFP4 => dot_mxfp4,
        IQ4_NL => dot_iq4_nl,
        Q2_K => dot_q2_k,
        Q3_K => dot_q3_k,
        Q4_K => dot_q4_k,
        Q5_K => dot_q5_k,
        Q6_K => dot_q6_k,
        IQ2_XXS => dot_iq2_xxs,
        IQ2_XS => dot_iq2_xs,
        IQ2_S => dot_iq2_s,
        IQ3_XXS => dot_iq3_xxs,
        IQ3_S => dot_iq3_s,
        IQ4_XS => dot_iq4_xs,
        _ => return None,
    })
}
