//! The i-quant formats: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (codebook lattices with
//! sign tables; read only, so only llama.cpp's `dequantize_row_*` is mirrored) and
//! IQ4_NL, IQ4_XS (a non-linear 16-value table), which llamay also writes with
//! `quantize_row_iq4_nl_impl` as `ggml_quantize_chunk` runs it (`ntry = 7`, with or
//! without importance weights).

use crate::fp16::{read_f16, write_f16};
use crate::num::nearest_int;
use crate::tables::{
    IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
};

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Eight grid magnitudes times `db`, negated where `signs` has the bit.
fn put8(y: &mut [f32], db: f32, grid: u64, signs: u8) {
    for (j, (o, g)) in y.iter_mut().zip(grid.to_le_bytes()).enumerate() {
        *o = db
            * g as f32
            * if signs & KMASK_IQ2XS[j] != 0 {
                -1.0
            } else {
                1.0
            };
    }
}

/// Four grid magnitudes of a 3-bit grid entry, with sign bits `mask_from..mask_from+4`.
fn put4(y: &mut [f32], db: f32, grid: u32, signs: u8, mask_from: usize) {
    for (j, (o, g)) in y.iter_mut().zip(grid.to_le_bytes()).enumerate() {
        *o = db
            * g as f32
            * if signs & KMASK_IQ2XS[mask_from + j] != 0 {
                -1.0
            } else {
                1.0
            };
    }
}

pub(crate) fn dequant_iq2_xxs(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for ib32 in 0..8 {
        let q = &b[2 + 8 * ib32..2 + 8 * ib32 + 8];
        let aux1 = u32_at(q, 4);
        let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
        for l in 0..4 {
            let grid = IQ2XXS_GRID[q[l] as usize];
            let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
            put8(
                &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8],
                db,
                grid,
                signs,
            );
        }
    }
}

pub(crate) fn dequant_iq2_xs(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let scales = &b[66..74];
    for ib32 in 0..8 {
        let db = [
            d * (0.5 + (scales[ib32] & 0xF) as f32) * 0.25,
            d * (0.5 + (scales[ib32] >> 4) as f32) * 0.25,
        ];
        for l in 0..4 {
            let q = u16_at(b, 2 + 2 * (4 * ib32 + l));
            let grid = IQ2XS_GRID[(q & 511) as usize];
            let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
            put8(
                &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8],
                db[l / 2],
                grid,
                signs,
            );
        }
    }
}

pub(crate) fn dequant_iq2_s(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qs = &b[2..34];
    let signs = &b[34..66];
    let qh = &b[66..74];
    let scales = &b[74..82];
    for ib32 in 0..8 {
        let db = [
            d * (0.5 + (scales[ib32] & 0xF) as f32) * 0.25,
            d * (0.5 + (scales[ib32] >> 4) as f32) * 0.25,
        ];
        for l in 0..4 {
            let high = ((qh[ib32] as usize) << (8 - 2 * l)) & 0x300;
            let grid = IQ2S_GRID[qs[4 * ib32 + l] as usize | high];
            let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
            put8(y, db[l / 2], grid, signs[4 * ib32 + l]);
        }
    }
}

pub(crate) fn dequant_iq3_xxs(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qs = &b[2..66];
    for ib32 in 0..8 {
        let aux = u32_at(b, 66 + 4 * ib32);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let g1 = IQ3XXS_GRID[qs[8 * ib32 + 2 * l] as usize];
            let g2 = IQ3XXS_GRID[qs[8 * ib32 + 2 * l + 1] as usize];
            let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
            put4(&mut y[..4], db, g1, signs, 0);
            put4(&mut y[4..], db, g2, signs, 4);
        }
    }
}

pub(crate) fn dequant_iq3_s(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let qs = &b[2..66];
    let qh = &b[66..74];
    let signs = &b[74..106];
    let scales = &b[106..110];
    // Each 32-element sub-block: 8 grid bytes, one high-bit byte, 4 sign bytes.
    for ib32 in 0..8 {
        let sc = scales[ib32 / 2];
        let nibble = if ib32 % 2 == 0 { sc & 0xF } else { sc >> 4 };
        let db = d * (1 + 2 * nibble as i32) as f32;
        let h = qh[ib32] as usize;
        for l in 0..4 {
            let g1 = IQ3S_GRID[qs[8 * ib32 + 2 * l] as usize | ((h << (8 - 2 * l)) & 256)];
            let g2 = IQ3S_GRID[qs[8 * ib32 + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256)];
            let s = signs[4 * ib32 + l];
            let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
            put4(&mut y[..4], db, g1, s, 0);
            put4(&mut y[4..], db, g2, s, 4);
        }
    }
}

pub(crate) fn dequant_iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = d * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

pub(crate) fn dequant_iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let scales_h = u16_at(b, 2) as u32;
    let scales_l = &b[4..8];
    for ib in 0..8 {
        let low = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) as i32;
        let ls = low | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
        let dl = d * (ls - 32) as f32;
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        let y = &mut y[32 * ib..32 * ib + 32];
        for j in 0..16 {
            y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
            y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}

/// Below this a 32-value block counts as all zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

/// The half-width of the scale search `quantize_iq4_nl`/`quantize_iq4_xs` pass to
/// `quantize_row_iq4_nl_impl` (`quantize_row_iq4_nl_ref`'s -1 is not on llamay's path).
const NTRY: i32 = 7;

/// ggml's `best_index_int8` over `kvalues_iq4nl`: the index of the nearest table value,
/// by bisection (ties go up; NaN gives the last index, as in C).
fn best_index_int8(x: f32) -> usize {
    let val = &KVALUES_IQ4NL;
    let n = val.len();
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[n - 1] as f32 {
        return n - 1;
    }
    let (mut ml, mut mu) = (0usize, n - 1);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < val[mu] as f32 - x {
        mu - 1
    } else {
        mu
    }
}

/// The first half of `quantize_row_iq4_nl_impl` (with `ntry > 0`): per 32-value block
/// the weighted best scale over `2*NTRY + 1` trials and first levels. Returns the scale
/// of largest magnitude. `x` is one super-block; `qw` its weights.
fn iq4_block_scales(x: &[f32], qw: Option<&[f32]>, scales: &mut [f32], l: &mut [u8]) -> f32 {
    let values = &KVALUES_IQ4NL;
    let v0 = values[0] as f32;
    let mut sigma2 = 0.0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / x.len() as f32;
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    let mut weight = [0.0f32; 32];
    for (ib, xb) in x.chunks_exact(32).enumerate() {
        let lb = &mut l[32 * ib..32 * ib + 32];
        match qw {
            Some(qw) => {
                for ((w, &q), &v) in weight.iter_mut().zip(&qw[32 * ib..]).zip(xb) {
                    *w = q * (sigma2 + v * v).sqrt();
                }
            }
            None => {
                for (w, &v) in weight.iter_mut().zip(xb) {
                    *w = v * v;
                }
            }
        }
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = -max / v0;
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for j in 0..32 {
            let al = id * xb[j];
            let k = best_index_int8(al);
            lb[j] = k as u8;
            let q = values[k] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -NTRY..=NTRY {
            id = (itry + values[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let al = id * xb[j];
                let q = values[best_index_int8(al)] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        let abs_d = d.abs();
        if abs_d > amax_scale {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    max_scale
}

/// Two 4-bit indices per byte: `q[j]` holds elements `j` and `j + 16` of each 32.
fn pack_iq4(l: &[u8], q: &mut [u8]) {
    for (lb, qb) in l.chunks_exact(32).zip(q.chunks_exact_mut(16)) {
        for j in 0..16 {
            qb[j] = lb[j] | (lb[16 + j] << 4);
        }
    }
}

/// `quantize_iq4_nl` for one block (`quantize_row_iq4_nl_impl(32, 32, ..., 7)`): the
/// block's own scale in f16, the indices redone against it.
pub(crate) fn quant_iq4_nl(x: &[f32], b: &mut [u8], qw: Option<&[f32]>) {
    let mut l = [0u8; 32];
    let mut scales = [0.0f32; 1];
    iq4_block_scales(x, qw, &mut scales, &mut l);
    write_f16(b, 0, scales[0]);
    let id = if scales[0] != 0.0 {
        1.0 / scales[0]
    } else {
        0.0
    };
    for (lj, &v) in l.iter_mut().zip(x) {
        *lj = best_index_int8(id * v) as u8;
    }
    pack_iq4(&l, &mut b[2..18]);
}

/// `quantize_iq4_xs` for one super-block (`quantize_row_iq4_nl_impl(256, 32, ..., 7)`):
/// eight block scales as 6-bit multiples of `d = -max_scale/32` (the unrounded `d`, not
/// its f16), the indices redone against each.
pub(crate) fn quant_iq4_xs(x: &[f32], b: &mut [u8], qw: Option<&[f32]>) {
    let mut l = [0u8; 256];
    let mut scales = [0.0f32; 8];
    let max_scale = iq4_block_scales(x, qw, &mut scales, &mut l);
    let d = -max_scale / 32.0;
    write_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    let mut scales_l = [0u8; 4];
    for (ib, xb) in x.chunks_exact(32).enumerate() {
        let mut ls = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * ls as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for (lj, &v) in l[32 * ib..32 * ib + 32].iter_mut().zip(xb) {
            *lj = best_index_int8(idl * v) as u8;
        }
        ls += 32;
        let (l_l, l_h) = ((ls & 0xF) as u8, (ls >> 4) as u16);
        if ib % 2 == 0 {
            scales_l[ib / 2] = l_l;
        } else {
            scales_l[ib / 2] |= l_l << 4;
        }
        scales_h |= l_h << (2 * (ib % 8));
    }
    b[2..4].copy_from_slice(&scales_h.to_le_bytes());
    b[4..8].copy_from_slice(&scales_l);
    pack_iq4(&l, &mut b[8..136]);
}
