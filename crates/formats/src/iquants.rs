//! Read-only i-quant formats: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (codebook lattices
//! with sign tables) and IQ4_NL, IQ4_XS (a non-linear 16-value table). llamay never
//! writes these, so only llama.cpp's `dequantize_row_*` is mirrored here.

use crate::fp16::read_f16;
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
