//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and MXFP4.
//! Each dequantiser repeats llama.cpp's `dequantize_row_*` arithmetic in the same order,
//! and each quantiser its `quantize_row_*_ref` (or, with importance weights, its
//! `quantize_row_*_impl`), so results are bit-identical.

use crate::fp16::{read_f16, write_f16};
use crate::kquants::{QKX3, make_qkx_quants, make_qx_quants};
use crate::num::c_trunc;
use crate::tables::KVALUES_MXFP4;

pub(crate) const QK: usize = 32;

pub(crate) fn dequant_q4_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for j in 0..QK / 2 {
        let q = b[2 + j];
        y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
        y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

pub(crate) fn dequant_q4_1(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    for j in 0..QK / 2 {
        let q = b[4 + j];
        y[j] = (q & 0x0F) as f32 * d + m;
        y[j + QK / 2] = (q >> 4) as f32 * d + m;
    }
}

/// The 32 fifth bits of Q5_0/Q5_1, one per element.
fn q5_high(qh: &[u8]) -> u32 {
    u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]])
}

pub(crate) fn dequant_q5_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qh = q5_high(&b[2..6]);
    for j in 0..QK / 2 {
        let q = b[6 + j] as u32;
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((q & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + QK / 2] = (((q >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

pub(crate) fn dequant_q5_1(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    let qh = q5_high(&b[4..8]);
    for j in 0..QK / 2 {
        let q = b[8 + j] as u32;
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((q & 0x0F) | h0) as f32 * d + m;
        y[j + QK / 2] = ((q >> 4) | h1) as f32 * d + m;
    }
}

pub(crate) fn dequant_q8_0(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..2 + QK]) {
        *o = (q as i8) as f32 * d;
    }
}

/// Q8_1 has no `dequantize_row` in ggml (it is an activation format); by definition
/// each value is `d * q`, the sum field `s` being redundant.
pub(crate) fn dequant_q8_1(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[4..4 + QK]) {
        *o = (q as i8) as f32 * d;
    }
}

/// `GGML_E8M0_TO_FP32_HALF`: half the power of two an E8M0 exponent byte encodes
/// (the MXFP4 values are stored doubled).
fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

pub(crate) fn dequant_mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_to_f32_half(b[0]);
    for j in 0..QK / 2 {
        let q = b[1 + j];
        y[j] = KVALUES_MXFP4[(q & 0x0F) as usize] as f32 * d;
        y[j + QK / 2] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
    }
}

/// The value with the largest magnitude (the first one on ties), as Q4_0/Q5_0 pick it.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

pub(crate) fn quant_q4_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse_or_zero(d);
    write_f16(b, 0, d);
    for j in 0..QK / 2 {
        let x0 = (c_trunc(x[j] * id + 8.5) as i8).min(15) as u8;
        let x1 = (c_trunc(x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = x0 | (x1 << 4);
    }
}

pub(crate) fn quant_q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse_or_zero(d);
    write_f16(b, 0, d);
    write_f16(b, 2, min);
    for j in 0..QK / 2 {
        let x0 = (c_trunc((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let x1 = (c_trunc((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
        b[4 + j] = x0 | (x1 << 4);
    }
}

pub(crate) fn quant_q5_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse_or_zero(d);
    write_f16(b, 0, d);
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let x0 = (c_trunc(x[j] * id + 16.5) as i8).min(31) as u8;
        let x1 = (c_trunc(x[j + QK / 2] * id + 16.5) as i8).min(31) as u8;
        b[6 + j] = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
        qh |= (((x0 & 0x10) >> 4) as u32) << j;
        qh |= (((x1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

pub(crate) fn quant_q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse_or_zero(d);
    write_f16(b, 0, d);
    write_f16(b, 2, min);
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let x0 = c_trunc((x[j] - min) * id + 0.5) as u8;
        let x1 = c_trunc((x[j + QK / 2] - min) * id + 0.5) as u8;
        b[8 + j] = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
        qh |= (((x0 & 0x10) >> 4) as u32) << j;
        qh |= (((x1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

/// The mean square of a whole row, `sigma2` of the legacy `quantize_row_*_impl`s
/// (over the row, not the block).
pub(crate) fn row_sigma2(row: &[f32]) -> f32 {
    let mut sum_x2 = 0.0f32;
    for &v in row {
        sum_x2 += v * v;
    }
    sum_x2 / row.len() as f32
}

/// One block's importance weights as the legacy `_impl`s form them.
fn block_weights(x: &[f32], qw: &[f32], sigma2: f32) -> [f32; QK] {
    let mut w = [0.0f32; QK];
    for ((o, &q), &v) in w.iter_mut().zip(qw).zip(x) {
        *o = q * (sigma2 + v * v).sqrt();
    }
    w
}

/// `quantize_row_q4_0_impl` for one block: a weighted `make_qx_quants` search.
pub(crate) fn quant_q4_0_w(x: &[f32], b: &mut [u8], qw: &[f32], sigma2: f32) {
    let weight = block_weights(x, qw, sigma2);
    let mut l = [0i8; QK];
    let d = make_qx_quants(8, x, &mut l, Some(&weight));
    write_f16(b, 0, d);
    for j in 0..QK / 2 {
        b[2 + j] = (l[j] as u8) | ((l[j + 16] as u8) << 4);
    }
}

/// `quantize_row_q4_1_impl` for one block: a weighted `make_qkx3_quants` search.
pub(crate) fn quant_q4_1_w(x: &[f32], b: &mut [u8], qw: &[f32], sigma2: f32) {
    let weight = block_weights(x, qw, sigma2);
    let mut l = [0u8; QK];
    let (d, min) = make_qkx_quants(15, x, &weight, &mut l, QKX3);
    write_f16(b, 0, d);
    write_f16(b, 2, -min);
    for j in 0..QK / 2 {
        b[4 + j] = l[j] | (l[j + 16] << 4);
    }
}

/// The low nibbles and the 32 fifth bits of Q5_0/Q5_1 levels.
fn pack_q5(l: &[u8; QK], qs: &mut [u8]) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (x0, x1) = (l[j], l[j + 16]);
        qs[j] = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
        qh |= (((x0 & 0x10) >> 4) as u32) << j;
        qh |= (((x1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    qh.to_le_bytes()
}

/// `quantize_row_q5_0_impl` for one block.
pub(crate) fn quant_q5_0_w(x: &[f32], b: &mut [u8], qw: &[f32], sigma2: f32) {
    let weight = block_weights(x, qw, sigma2);
    let mut l = [0i8; QK];
    let d = make_qx_quants(16, x, &mut l, Some(&weight));
    write_f16(b, 0, d);
    let qh = pack_q5(&l.map(|v| v as u8), &mut b[6..22]);
    b[2..6].copy_from_slice(&qh);
}

/// `quantize_row_q5_1_impl` for one block.
pub(crate) fn quant_q5_1_w(x: &[f32], b: &mut [u8], qw: &[f32], sigma2: f32) {
    let weight = block_weights(x, qw, sigma2);
    let mut l = [0u8; QK];
    let (d, min) = make_qkx_quants(31, x, &weight, &mut l, QKX3);
    write_f16(b, 0, d);
    write_f16(b, 2, -min);
    let qh = pack_q5(&l, &mut b[8..24]);
    b[4..8].copy_from_slice(&qh);
}

fn absmax(x: &[f32]) -> f32 {
    // C's MAX(amax, fabsf(v)) is `amax > |v| ? amax : |v|`.
    x.iter().fold(
        0.0f32,
        |amax, v| if amax > v.abs() { amax } else { v.abs() },
    )
}

pub(crate) fn quant_q8_0(x: &[f32], b: &mut [u8]) {
    let d = absmax(x) / 127.0;
    let id = inverse_or_zero(d);
    write_f16(b, 0, d);
    for j in 0..QK {
        b[2 + j] = c_trunc((x[j] * id).round()) as u8;
    }
}

pub(crate) fn quant_q8_1(x: &[f32], b: &mut [u8]) {
    let d = absmax(x) / 127.0;
    let id = inverse_or_zero(d);
    write_f16(b, 0, d);
    let mut sum = 0i32;
    for j in 0..QK / 2 {
        let q0 = c_trunc((x[j] * id).round()) as i8;
        let q1 = c_trunc((x[j + QK / 2] * id).round()) as i8;
        b[4 + j] = q0 as u8;
        b[4 + j + QK / 2] = q1 as u8;
        sum += q0 as i32 + q1 as i32;
    }
    write_f16(b, 2, sum as f32 * d);
}

fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * e - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * e - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

pub(crate) fn quant_mxfp4(x: &[f32], b: &mut [u8]) {
    let amax = x
        .iter()
        .fold(0.0f32, |a, v| if a < v.abs() { v.abs() } else { a });
    let e = if amax > 0.0 {
        c_trunc(amax.log2().floor() - 2.0 + 127.0) as u8
    } else {
        0
    };
    let d = e8m0_to_f32_half(e);
    b[0] = e;
    for j in 0..QK / 2 {
        b[1 + j] = best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[j + QK / 2], d) << 4);
    }
}
