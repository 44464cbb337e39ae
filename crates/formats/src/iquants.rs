//! The i-quant formats: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (codebook lattices with
//! sign tables) and IQ4_NL, IQ4_XS (a non-linear 16-value table). Dequantisation mirrors
//! llama.cpp's `dequantize_row_*`; quantisation its `quantize_row_*_impl`s as
//! `ggml_quantize_chunk` runs them: IQ4_NL/IQ4_XS `quantize_row_iq4_nl_impl` (`ntry = 7`),
//! the lattice types ggml's grid searches over the tables of `lattice.rs` (IQ2_XXS and
//! IQ2_XS only with importance weights, as ggml requires).

use crate::fp16::{read_f16, write_f16};
use crate::kquants::make_qp_quants;
use crate::lattice::{self, Lattice};
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

// ---- the lattice i-quants: IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S ----------------------

/// Where ggml's quantiser aborts (`GGML_ASSERT`/`GGML_ABORT`) instead of writing bytes:
/// no neighbour with a finite error, a level vector off the grid, a NaN scale. Reachable
/// only with extreme values or negative/huge importance weights.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Abort(pub(crate) &'static str);

const NO_NEIGHBOUR: Abort = Abort("no grid neighbour with a finite error");
const OFF_GRID: Abort = Abort("a block's levels are not on the grid");
/// ggml's `GGML_ASSERT(scale >= 0)`, after a negative scale was flipped: a NaN scale.
const NAN_SCALE: Abort = Abort("a block scale is not a number");

/// Below these a block counts as all zeros (ggml's `GROUP_MAX_EPS_*`).
const GROUP_MAX_EPS_IQ3_XXS: f32 = 1e-8;
const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;

/// Which groups the search's final pass re-quantises at the chosen scale.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Redo {
    /// Those whose best trial was off the grid, if any (IQ3_XXS, IQ2_XS, IQ2_S).
    OffGrid,
    /// All, if any group of the best trial was off the grid; with no accepted trial
    /// every group counts as off (IQ3_S).
    AllIfAnyOff,
    /// All, whenever the scale is positive (IQ2_XXS).
    Always,
}

/// The scale search the lattice quantisers share: trial inverse scales
/// `(2*kmaxq - 1 + is*step)/smax` for `is` in `-nis..=nis`, each group's levels rounded
/// and clamped, then moved to the best neighbour when off the grid; the trial with the
/// best weighted fit wins; then a final pass at the winning scale (see [`Redo`]). `l`
/// holds the starting levels and gets the chosen ones (all on the grid unless ggml
/// would abort later). Returns the scale.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn lattice_search<const D: usize>(
    lat: &Lattice<D>,
    (kmaxq, nis, step, redo): (i32, i32, f32, Redo),
    xval: &[f32],
    weight: &[f32],
    waux: &[f32],
    smax: f32,
    mut scale: f32,
    l: &mut [i8],
) -> Result<f32, Abort> {
    let n = xval.len();
    let groups = n / D;
    let mut laux = [0i8; 32];
    let laux = &mut laux[..n];
    let mut on_grid = [redo != Redo::AllIfAnyOff; 8];
    let mut on_grid_aux = [true; 8];
    let fit = |lv: &[i8]| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for i in 0..n {
            let w = weight[i];
            let q = (2 * lv[i] as i32 + 1) as f32;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let mut best = 0.0f32;
    for is in -nis..=nis {
        let id = ((2 * kmaxq - 1) as f32 + is as f32 * step) / smax;
        let this_scale = 1.0 / id;
        for k in 0..groups {
            let g = D * k..D * k + D;
            for (o, &v) in laux[g.clone()].iter_mut().zip(&xval[g.clone()]) {
                *o = nearest_int(0.5 * (id * v - 1.0)).clamp(0, kmaxq - 1) as i8;
            }
            on_grid_aux[k] = true;
            if let Err(nb) = lat.lookup(lat.pack(&laux[g.clone()])) {
                on_grid_aux[k] = false;
                lat.best_neighbour(
                    nb,
                    &xval[g.clone()],
                    &waux[g.clone()],
                    this_scale,
                    &mut laux[g],
                )
                .ok_or(NO_NEIGHBOUR)?;
            }
        }
        let (sumqx, sumq2) = fit(laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l.copy_from_slice(laux);
            on_grid = on_grid_aux;
        }
    }
    let any_off = on_grid[..groups].iter().any(|&o| !o);
    let again = match redo {
        Redo::OffGrid | Redo::AllIfAnyOff => any_off && scale > 0.0,
        Redo::Always => scale > 0.0,
    };
    if again {
        let id = 1.0 / scale;
        for k in 0..groups {
            if redo == Redo::OffGrid && on_grid[k] {
                continue;
            }
            let g = D * k..D * k + D;
            for (o, &v) in l[g.clone()].iter_mut().zip(&xval[g.clone()]) {
                *o = nearest_int(0.5 * (id * v - 1.0)).clamp(0, kmaxq - 1) as i8;
            }
            if let Err(nb) = lat.lookup(lat.pack(&l[g.clone()])) {
                lat.best_neighbour(nb, &xval[g.clone()], &waux[g.clone()], scale, &mut l[g])
                    .ok_or(NO_NEIGHBOUR)?;
            }
        }
        let (sumqx, sumq2) = fit(l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    Ok(scale)
}

/// The grid index of each group of `l`, into `out`.
fn grid_indices<const D: usize>(
    lat: &Lattice<D>,
    l: &[i8],
    out: &mut [usize],
) -> Result<(), Abort> {
    for (o, g) in out.iter_mut().zip(l.chunks_exact(D)) {
        *o = lat.index_of(lat.pack(g)).ok_or(OFF_GRID)?;
    }
    Ok(())
}

/// The blocks' importance: `qw*sqrt(sigma2 + x²)` with weights, `x²` without (IQ3), and
/// `sqrt` of that for the neighbour search.
fn block_weights(
    xb: &[f32],
    qw: Option<&[f32]>,
    sigma2: f32,
    weight: &mut [f32],
    waux: &mut [f32],
) {
    for i in 0..xb.len() {
        weight[i] = match qw {
            Some(qw) => qw[i] * (sigma2 + xb[i] * xb[i]).sqrt(),
            None => xb[i] * xb[i],
        };
        waux[i] = weight[i].sqrt();
    }
}

/// Magnitudes and sign bits of 8 values; with `even`, an odd number of negatives is
/// made even by flipping the least important value (the 7-bit sign tables of
/// IQ2_XXS, IQ2_XS, IQ3_XXS keep only even-parity patterns).
fn signs8(xb: &[f32], weight: &[f32], xval: &mut [f32], even: bool) -> u8 {
    let mut s = 0u8;
    let mut nflip = 0;
    for i in 0..8 {
        if xb[i] >= 0.0 {
            xval[i] = xb[i];
        } else {
            xval[i] = -xb[i];
            nflip += 1;
            s |= 1 << i;
        }
    }
    if even && nflip % 2 == 1 {
        let mut imin = 0;
        let mut min = weight[0] * xb[0] * xb[0];
        for i in 1..8 {
            let ax = weight[i] * xb[i] * xb[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    if even { s & 127 } else { s }
}

/// C's `MAX(a, b)`: `a > b ? a : b`.
fn c_max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

fn c_max_all(v: &[f32]) -> f32 {
    v[1..].iter().fold(v[0], |m, &x| c_max(m, x))
}

fn sum_x2(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// The 4-bit sub-block scale `l` with `d*(2l + 1)` nearest `scale` (`0..=15`).
fn scale_nibble(id: f32, scale: f32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u8
}

/// `quantize_row_iq3_xxs_impl(256, ...)` for one super-block (98 bytes).
pub(crate) fn quant_iq3_xxs(x: &[f32], b: &mut [u8], qw: Option<&[f32]>) -> Result<(), Abort> {
    let lat = lattice::iq3xxs();
    b.fill(0);
    let sigma2 = 2.0 * sum_x2(x) / 256.0;
    let mut grid = [0u8; 64];
    let mut sas = [0u32; 8];
    let mut scales = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let (mut weight, mut waux, mut xval) = ([0.0f32; 32], [0.0f32; 32], [0.0f32; 32]);
    for ib in 0..8 {
        let xb = &x[32 * ib..32 * ib + 32];
        block_weights(
            xb,
            qw.map(|q| &q[32 * ib..]),
            sigma2,
            &mut weight,
            &mut waux,
        );
        let mut signs = [0u8; 4];
        for (k, s) in signs.iter_mut().enumerate() {
            let g = 8 * k..8 * k + 8;
            *s = signs8(&xb[g.clone()], &weight[g.clone()], &mut xval[g], true);
        }
        let max = c_max_all(&xval);
        let mut l = [0i8; 32];
        if max < GROUP_MAX_EPS_IQ3_XXS {
            scales[ib] = 0.0;
            continue;
        }
        let search = (8, 15, 0.2, Redo::OffGrid);
        let mut scale =
            lattice_search(lat, search, &xval, &weight, &waux, max, max / 15.0, &mut l)?;
        if scale < 0.0 {
            scale = -scale;
            signs.iter_mut().for_each(|s| *s = !*s & 127);
        }
        let mut index = [0usize; 8];
        grid_indices(lat, &l, &mut index)?;
        for (o, &k) in grid[8 * ib..8 * ib + 8].iter_mut().zip(&index) {
            *o = k as u8;
        }
        sas[ib] = signs[0] as u32
            | (signs[1] as u32) << 7
            | (signs[2] as u32) << 14
            | (signs[3] as u32) << 21;
        if scale.is_nan() {
            return Err(NAN_SCALE);
        }
        scales[ib] = scale;
        max_scale = c_max(max_scale, scale);
    }
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(b, 0, d * 1.0125);
    let id = 1.0 / d;
    for ib in 0..8 {
        sas[ib] |= (scale_nibble(id, scales[ib]) as u32) << 28;
    }
    b[2..66].copy_from_slice(&grid);
    for (o, s) in b[66..98].chunks_exact_mut(4).zip(&sas) {
        o.copy_from_slice(&s.to_le_bytes());
    }
    Ok(())
}

/// `quantize_row_iq3_s_impl(32, ...)` for one super-block (110 bytes). As in ggml, a
/// block skipped as all zeros does not advance the grid-byte and sign cursors, so the
/// blocks after it land one slot early (and the last slots stay zero).
pub(crate) fn quant_iq3_s(x: &[f32], b: &mut [u8], qw: Option<&[f32]>) -> Result<(), Abort> {
    let lat = lattice::iq3s();
    b.fill(0);
    let sigma2 = 2.0 * sum_x2(x) / 256.0;
    let (mut qs_at, mut signs_at) = (2usize, 74usize);
    let mut scales = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let (mut weight, mut waux, mut xval) = ([0.0f32; 32], [0.0f32; 32], [0.0f32; 32]);
    for ib in 0..8 {
        let xb = &x[32 * ib..32 * ib + 32];
        block_weights(
            xb,
            qw.map(|q| &q[32 * ib..]),
            sigma2,
            &mut weight,
            &mut waux,
        );
        let mut signs = [0u8; 4];
        for (k, s) in signs.iter_mut().enumerate() {
            let g = 8 * k..8 * k + 8;
            *s = signs8(&xb[g.clone()], &weight[g.clone()], &mut xval[g], false);
        }
        let max = c_max_all(&xval);
        let mut l = [0i8; 32];
        if max == 0.0 {
            scales[ib] = 0.0;
            continue;
        }
        let search = (8, 9, 0.2, Redo::AllIfAnyOff);
        let mut scale =
            lattice_search(lat, search, &xval, &weight, &waux, max, max / 15.0, &mut l)?;
        if scale < 0.0 {
            scale = -scale;
            signs.iter_mut().for_each(|s| *s = !*s);
        }
        let mut index = [0usize; 8];
        grid_indices(lat, &l, &mut index)?;
        for (k, &g) in index.iter().enumerate() {
            b[qs_at + k] = g as u8;
            b[66 + ib] |= ((g >> 8) << k) as u8;
        }
        qs_at += 8;
        b[signs_at..signs_at + 4].copy_from_slice(&signs);
        signs_at += 4;
        if scale.is_nan() {
            return Err(NAN_SCALE);
        }
        scales[ib] = scale;
        max_scale = c_max(max_scale, scale);
    }
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(b, 0, d * 1.033);
    let id = 1.0 / d;
    for ib in (0..8).step_by(2) {
        b[106 + ib / 2] = scale_nibble(id, scales[ib]) | scale_nibble(id, scales[ib + 1]) << 4;
    }
    Ok(())
}

/// The three IQ2 types' sub-blocks of 16 (IQ2_XS, IQ2_S): signs, search, grid indices.
/// Returns the scale (`None` for a block skipped as all zeros) and writes the two
/// groups' indices and sign bytes.
fn iq2_block16(
    lat: &Lattice<8>,
    xb: &[f32],
    weight: &[f32],
    waux: &[f32],
    (even, eps): (bool, f32),
    index: &mut [usize; 2],
    signs: &mut [u8; 2],
) -> Result<Option<f32>, Abort> {
    let mut xval = [0.0f32; 16];
    for (k, s) in signs.iter_mut().enumerate() {
        let g = 8 * k..8 * k + 8;
        *s = signs8(&xb[g.clone()], &weight[g.clone()], &mut xval[g], even);
    }
    let max = c_max_all(&xval);
    let mut l = [0i8; 16];
    if max < eps {
        return Ok(None);
    }
    let search = (3, 9, 0.1, Redo::OffGrid);
    let mut scale = lattice_search(lat, search, &xval, weight, waux, max, max / 5.0, &mut l)?;
    if scale < 0.0 {
        scale = -scale;
        for s in signs.iter_mut() {
            *s = if even { !*s & 127 } else { !*s };
        }
    }
    grid_indices(lat, &l, index)?;
    if scale.is_nan() {
        return Err(NAN_SCALE);
    }
    Ok(Some(scale))
}

/// `quantize_row_iq2_xs_impl` for one super-block (74 bytes); weights required.
pub(crate) fn quant_iq2_xs(x: &[f32], b: &mut [u8], qw: &[f32]) -> Result<(), Abort> {
    let lat = lattice::iq2xs();
    b.fill(0);
    let sigma2 = sum_x2(x) / 256.0;
    let mut q2 = [0u16; 32];
    let mut scales = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    let (mut weight, mut waux) = ([0.0f32; 16], [0.0f32; 16]);
    for ib in 0..16 {
        let xb = &x[16 * ib..16 * ib + 16];
        block_weights(xb, Some(&qw[16 * ib..]), sigma2, &mut weight, &mut waux);
        let (mut index, mut signs) = ([0usize; 2], [0u8; 2]);
        let params = (true, GROUP_MAX_EPS);
        let Some(scale) = iq2_block16(lat, xb, &weight, &waux, params, &mut index, &mut signs)?
        else {
            continue;
        };
        scales[ib] = scale;
        for k in 0..2 {
            q2[2 * ib + k] = index[k] as u16 | (signs[k] as u16) << 9;
        }
        max_scale = c_max(max_scale, scale);
    }
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(b, 0, d);
    let id = 1.0 / d;
    for ib in 0..16 {
        b[66 + ib / 2] |= scale_nibble(id, scales[ib]) << (4 * (ib % 2));
    }
    for (o, q) in b[2..66].chunks_exact_mut(2).zip(&q2) {
        o.copy_from_slice(&q.to_le_bytes());
    }
    Ok(())
}

/// `quantize_row_iq2_s_impl` for one super-block (82 bytes); without weights the
/// importance is `sigma2/4 + x²`.
pub(crate) fn quant_iq2_s(x: &[f32], b: &mut [u8], qw: Option<&[f32]>) -> Result<(), Abort> {
    let lat = lattice::iq2s();
    b.fill(0);
    let sigma2 = 2.0 * sum_x2(x) / 256.0;
    let mut scales = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    let (mut weight, mut waux) = ([0.0f32; 16], [0.0f32; 16]);
    for ib in 0..16 {
        let xb = &x[16 * ib..16 * ib + 16];
        match qw {
            Some(qw) => block_weights(xb, Some(&qw[16 * ib..]), sigma2, &mut weight, &mut waux),
            None => {
                for i in 0..16 {
                    weight[i] = 0.25 * sigma2 + xb[i] * xb[i];
                    waux[i] = weight[i].sqrt();
                }
            }
        }
        let (mut index, mut signs) = ([0usize; 2], [0u8; 2]);
        let params = (false, GROUP_MAX_EPS_IQ2_S);
        let Some(scale) = iq2_block16(lat, xb, &weight, &waux, params, &mut index, &mut signs)?
        else {
            continue;
        };
        for k in 0..2 {
            let i8 = 2 * ib + k;
            b[2 + i8] = index[k] as u8;
            b[66 + i8 / 4] |= ((index[k] >> 8) << (2 * (i8 % 4))) as u8;
            b[2 + 32 + i8] = signs[k];
        }
        scales[ib] = scale;
        max_scale = c_max(max_scale, scale);
    }
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(b, 0, d * 0.9875);
    let id = 1.0 / d;
    for ib in 0..16 {
        b[74 + ib / 2] |= scale_nibble(id, scales[ib]) << (4 * (ib % 2));
    }
    Ok(())
}

/// `quantize_row_iq2_xxs_impl` for one super-block (66 bytes); weights required. The
/// search starts from `make_qp_quants`' levels and scale.
pub(crate) fn quant_iq2_xxs(x: &[f32], b: &mut [u8], qw: &[f32]) -> Result<(), Abort> {
    let lat = lattice::iq2xxs();
    b.fill(0);
    let sigma2 = sum_x2(x) / 256.0;
    let mut q2 = [0u32; 16];
    let mut scales = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let (mut weight, mut waux, mut xval) = ([0.0f32; 32], [0.0f32; 32], [0.0f32; 32]);
    for ib in 0..8 {
        let xb = &x[32 * ib..32 * ib + 32];
        block_weights(xb, Some(&qw[32 * ib..]), sigma2, &mut weight, &mut waux);
        let mut signs = [0u8; 4];
        for (k, s) in signs.iter_mut().enumerate() {
            let g = 8 * k..8 * k + 8;
            *s = signs8(&xb[g.clone()], &weight[g.clone()], &mut xval[g], true);
        }
        let max = c_max_all(&xval);
        if max < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut lq = [0u8; 32];
        let scale = make_qp_quants(4, &xval, &mut lq, &weight);
        let eff_max = scale * 3.0;
        if eff_max <= 0.0 {
            scales[ib] = 0.0;
            continue;
        }
        let mut l = lq.map(|v| v as i8);
        let search = (3, 6, 0.1, Redo::Always);
        let mut scale = lattice_search(lat, search, &xval, &weight, &waux, eff_max, scale, &mut l)?;
        if scale < 0.0 {
            scale = -scale;
            signs.iter_mut().for_each(|s| *s = !*s & 127);
        }
        let mut index = [0usize; 4];
        grid_indices(lat, &l, &mut index)?;
        for k in 0..4 {
            q2[2 * ib] |= (index[k] as u32) << (8 * k);
            q2[2 * ib + 1] |= (signs[k] as u32) << (7 * k);
        }
        if scale.is_nan() {
            return Err(NAN_SCALE);
        }
        scales[ib] = scale;
        max_scale = c_max(max_scale, scale);
    }
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(b, 0, d);
    let id = 1.0 / d;
    for ib in 0..8 {
        q2[2 * ib + 1] |= (scale_nibble(id, scales[ib]) as u32) << 28;
    }
    for (o, q) in b[2..66].chunks_exact_mut(4).zip(&q2) {
        o.copy_from_slice(&q.to_le_bytes());
    }
    Ok(())
}
