//! The 256-element super-block K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K.
//! Dequantisers follow llama.cpp's `dequantize_row_*`; quantisers follow
//! `quantize_row_*_ref` with the scale searches they call (`make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants`), float operation for float operation, and the
//! importance-weighted `quantize_row_*_impl` (`make_qkx3_quants`, `make_qp_quants`,
//! weighted `make_qx_quants`) that `llama-quantize --imatrix` runs.

use crate::fp16::{read_f16, write_f16};
use crate::num::nearest_int;

pub(crate) const QK_K: usize = 256;

/// Below this a group counts as all zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

// ---------------------------------------------------------------- dequantisation

pub(crate) fn dequant_q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let d = read_f16(b, 80);
    let min = read_f16(b, 82);
    let mut out = 0;
    let mut is = 0;
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0xF) as f32;
                let ml = min * (sc >> 4) as f32;
                for l in 0..16 {
                    y[out] = dl * ((q[16 * part + l] >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

/// The sixteen 6-bit Q3_K scales, unpacked from their 12 bytes and re-centred.
fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

pub(crate) fn dequant_q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let scales = q3_k_scales(&b[96..108]);
    let d_all = read_f16(b, 108);
    let mut out = 0;
    let mut is = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let dl = d_all * scales[is] as f32;
                is += 1;
                for l in 16 * part..16 * part + 16 {
                    let low = ((q[l] >> shift) & 3) as i32;
                    let q3 = low - if hmask[l] & m != 0 { 0 } else { 4 };
                    y[out] = dl * q3 as f32;
                    out += 1;
                }
            }
            m = m.wrapping_shl(1);
        }
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of Q4_K/Q5_K.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub(crate) fn dequant_q4_k(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let min = read_f16(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (n, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * n, scales);
        let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let y = &mut y[64 * n..64 * n + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

pub(crate) fn dequant_q5_k(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    let min = read_f16(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (n, ql) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * n, scales);
        let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * n), 2u8 << (2 * n));
        let y = &mut y[64 * n..64 * n + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0xF) as i32 + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) as i32 + h2) as f32 - m2;
        }
    }
}

pub(crate) fn dequant_q6_k(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 208);
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

pub(crate) fn dequant_q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *o = d * (q as i8) as f32;
    }
}

// ---------------------------------------------------------------- scale searches

/// The element of largest magnitude (first on ties) and that magnitude.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// ggml's `make_qx_quants` with `rmse_type == 1`: symmetric levels in `[0, 2*nmax)` and
/// the scale that minimises the weighted error over 19 trial scales. The weights are
/// `qw` when given (the importance-weighted paths), else x² (the reference quantisers).
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let weight = |i: usize, v: f32| match qw {
        Some(qw) => qw[i],
        None => v * v,
    };
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, (l_o, &v)) in l_out.iter_mut().zip(x).enumerate() {
        let l = level(iscale, v);
        *l_o = (l + nmax) as i8;
        let w = weight(i, v);
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &v) in x.iter().enumerate() {
            let l = level(iscale, v);
            let w = weight(i, v);
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l_o, &v) in l_out.iter_mut().zip(x) {
                *l_o = (nmax + level(iscale, v)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: start from the max-based levels, then up to
/// five passes of coordinate descent on the x²-weighted error.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    let mut levels = [0i32; 16];
    for (lv, &v) in levels.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *lv = l;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (lv, &v) in levels.iter_mut().zip(x) {
            let w = v * v;
            let mut slx = sumlx - w * v * *lv as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * *lv as f32 * *lv as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *lv {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *lv = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for (l_o, lv) in l_out.iter_mut().zip(levels) {
        *l_o = (lv + nmax) as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// The trial-scale search that ggml's `make_qkx2_quants` and `make_qkx3_quants` run:
/// asymmetric levels in `[0, nmax]` with a (non-positive) offset, `nstep + 1` trial
/// scales `(rmin + rdelta * is + nmax) / (max - min)` each refit by weighted least
/// squares, the best by weighted squared (or, `use_mad`, absolute) error kept.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScaleSearch {
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
    /// `make_qkx3_quants`: a trial level is clamped before it is rounded
    /// (`v > 0 ? nearest_int(MIN(v, nmax)) : 0`, so a huge or NaN value gives a level in
    /// range), where `make_qkx2_quants` rounds, then clamps.
    clamp_first: bool,
}

/// `make_qkx2_quants`' search (every caller passes `rdelta` 0.1).
pub(crate) const fn qkx2(rmin: f32, nstep: i32, use_mad: bool) -> ScaleSearch {
    ScaleSearch {
        rmin,
        rdelta: 0.1,
        nstep,
        use_mad,
        clamp_first: false,
    }
}

/// `make_qkx3_quants` as every importance-weighted path calls it (weights given,
/// `rmin` -0.9, `rdelta` 0.05, 37 trial scales, squared error).
pub(crate) const QKX3: ScaleSearch = ScaleSearch {
    rmin: -0.9,
    rdelta: 0.05,
    nstep: 36,
    use_mad: false,
    clamp_first: true,
};

/// ggml's `make_qkx2_quants` / `make_qkx3_quants` (which `search` says), float operation
/// for float operation. Returns `(scale, -min)`.
pub(crate) fn make_qkx_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    search: ScaleSearch,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    // qkx2 tests `max == min`, qkx3 `max <= min`: the same, as min <= max here.
    if max <= min {
        l_out.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let err = |diff: f32| {
        if search.use_mad {
            diff.abs()
        } else {
            diff * diff
        }
    };
    let nmax_f = nmax as f32;
    let level = |v: f32| {
        if !search.clamp_first {
            nearest_int(v).clamp(0, nmax)
        } else if v > 0.0 {
            nearest_int(if v < nmax_f { v } else { nmax_f })
        } else {
            0 // NaN too, as C's comparison gives
        }
    };
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        best_error += weights[i] * err(scale * l_out[i] as f32 + min - x[i]);
    }
    let mut laux = [0u8; 32];
    for is in 0..=search.nstep {
        iscale = (search.rmin + search.rdelta * is as f32 + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = level(iscale * (x[i] - min));
            laux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qp_quants`: non-negative levels in `[0, nmax]` for non-negative values
/// (the sub-block scales and mins), a scale search over 8 trial scales, then five passes
/// of weighted coordinate descent. Levels are stored as C stores them in `uint8_t`: a
/// negative level (only reachable from negative inputs) wraps.
pub(crate) fn make_qp_quants(nmax: i32, x: &[f32], l_out: &mut [u8], quant_weights: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    for &v in x {
        // C: MAX(max, x[i])
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / max;
    for i in 0..n {
        l_out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l_out[i] as f32;
        let w = quant_weights[i];
        best_mse += w * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax_f) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            let w = quant_weights[i];
            mse += w * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        let w = quant_weights[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = quant_weights[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l_out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// The importance weights of one group as the K-quant `_impl`s form them:
/// `qw[l] * sqrt(sigma2 + x[l]²)`.
fn imatrix_weights(qw: &[f32], x: &[f32], sigma2: f32, out: &mut [f32]) {
    for ((o, &q), &v) in out.iter_mut().zip(qw).zip(x) {
        *o = q * (sigma2 + v * v).sqrt();
    }
}

fn sum_squares(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// Packs 2-bit levels as Q2_K/Q3_K store them: byte `l` of each 32-byte half holds
/// elements `l`, `l+32`, `l+64`, `l+96` of that half's 128.
fn pack_2bit(levels: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for l in 0..32 {
            qs[j / 4 + l] = levels[j + l]
                | (levels[j + l + 32] << 2)
                | (levels[j + l + 64] << 4)
                | (levels[j + l + 96] << 6);
        }
    }
}

// ---------------------------------------------------------------- quantisation

pub(crate) fn quant_q2_k(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let mut weights = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    let mut scales = [0.0f32; 16];
    let q4scale = 15.0f32;
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let lv = &mut levels[16 * j..16 * j + 16];
        (scales[j], mins[j]) = make_qkx_quants(3, xs, &weights, lv, qkx2(-0.5, 15, true));
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    b.fill(0);
    if max_scale > 0.0 {
        let iscale = q4scale / max_scale;
        for j in 0..16 {
            b[j] = nearest_int(iscale * scales[j]) as u8;
        }
        write_f16(b, 80, max_scale / q4scale);
    } else {
        write_f16(b, 80, 0.0);
    }
    if max_min > 0.0 {
        let iscale = q4scale / max_min;
        for j in 0..16 {
            b[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        write_f16(b, 82, max_min / q4scale);
    } else {
        write_f16(b, 82, 0.0);
    }
    let d_all = read_f16(b, 80);
    let dmin_all = read_f16(b, 82);
    for j in 0..16 {
        let d = d_all * (b[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (b[j] >> 4) as f32;
        for ii in 0..16 {
            let l = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3);
            levels[16 * j + ii] = l as u8;
        }
    }
    pack_2bit(&levels, &mut b[16..80]);
}

/// `quantize_row_q2_K_impl`: one super-block with its 256 importance weights.
pub(crate) fn quant_q2_k_w(x: &[f32], b: &mut [u8], qw: &[f32]) {
    let mut levels = [0u8; QK_K];
    let mut weight = [0.0f32; 16];
    let mut sw = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    let mut scales = [0.0f32; 16];
    let sigma2 = sum_squares(&x[..QK_K]) / QK_K as f32;
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        imatrix_weights(&qw[16 * j..16 * j + 16], xs, sigma2, &mut weight);
        for &w in &weight {
            sw[j] += w;
        }
        let lv = &mut levels[16 * j..16 * j + 16];
        (scales[j], mins[j]) = make_qkx_quants(3, xs, &weight, lv, QKX3);
    }
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    let dm = make_qp_quants(15, &scales, &mut ls, &sw);
    let mm = make_qp_quants(15, &mins, &mut lm, &sw);
    write_f16(b, 80, dm);
    write_f16(b, 82, mm);
    let dm = read_f16(b, 80);
    let mm = read_f16(b, 82);
    for j in 0..16 {
        b[j] = ls[j] | (lm[j] << 4);
    }
    for j in 0..16 {
        let d = dm * (b[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let m = mm * (b[j] >> 4) as f32;
        for ii in 0..16 {
            let l = nearest_int((x[16 * j + ii] + m) / d).clamp(0, 3);
            levels[16 * j + ii] = l as u8;
        }
    }
    pack_2bit(&levels, &mut b[16..80]);
}

pub(crate) fn quant_q3_k(x: &[f32], b: &mut [u8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }
    b.fill(0);
    let (sc, rest) = b[96..].split_at_mut(12);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            let l = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
            if j < 8 {
                sc[j] = (l & 0xF) as u8;
            } else {
                sc[j - 8] |= ((l & 0xF) << 4) as u8;
            }
            sc[j % 4 + 8] |= ((l >> 4) << (2 * (j / 4))) as u8;
        }
        write_f16(rest, 0, 1.0 / iscale);
    } else {
        write_f16(rest, 0, 0.0);
    }
    let d_all = read_f16(rest, 0);
    let unpacked = q3_k_scales(sc);
    for j in 0..16 {
        let d = d_all * unpacked[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            levels[16 * j + ii] = (l + 4) as i8;
        }
    }
    let (hmask, qs) = b[..96].split_at_mut(32);
    let mut low = [0u8; QK_K];
    for j in 0..QK_K {
        let mut l = levels[j] as u8;
        if l > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            l -= 4;
        }
        low[j] = l;
    }
    pack_2bit(&low, qs);
}

/// `quantize_row_q3_K_impl` with importance weights: one super-block with its 256
/// weights. The sub-block scales are themselves quantised by a weighted
/// `make_qx_quants`, and `d` is that search's scale (not `max_scale / -32`).
pub(crate) fn quant_q3_k_w(x: &[f32], b: &mut [u8], qw: &[f32]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut weight = [0.0f32; 16];
    let mut sw = [0.0f32; 16];
    let sigma2 = 2.0 * sum_squares(&x[..QK_K]) / QK_K as f32;
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        imatrix_weights(&qw[16 * j..16 * j + 16], xs, sigma2, &mut weight);
        let mut sumw = 0.0f32;
        for &w in &weight {
            sumw += w;
        }
        sw[j] = sumw;
        scales[j] = make_qx_quants(4, xs, &mut levels[16 * j..16 * j + 16], Some(&weight));
    }
    b.fill(0);
    let mut ls = [0i8; 16];
    let d_block = make_qx_quants(32, &scales, &mut ls, Some(&sw));
    let (sc, rest) = b[96..].split_at_mut(12);
    for j in 0..16 {
        let l = ls[j] as i32;
        if j < 8 {
            sc[j] = (l & 0xF) as u8;
        } else {
            sc[j - 8] |= ((l & 0xF) << 4) as u8;
        }
        sc[j % 4 + 8] |= ((l >> 4) << (2 * (j / 4))) as u8;
    }
    write_f16(rest, 0, d_block);
    let d_all = read_f16(rest, 0);
    let unpacked = q3_k_scales(sc);
    for j in 0..16 {
        let d = d_all * unpacked[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            levels[16 * j + ii] = (l + 4) as i8;
        }
    }
    let (hmask, qs) = b[..96].split_at_mut(32);
    let mut low = [0u8; QK_K];
    for j in 0..QK_K {
        let mut l = levels[j] as u8;
        if l > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            l -= 4;
        }
        low[j] = l;
    }
    pack_2bit(&low, qs);
}

/// Sub-block scales and mins of Q4_K/Q5_K, quantised to 6 bits and packed into 12
/// bytes, followed by `d`/`dmin` (the first four bytes of the block).
fn pack_k4_scales(scales: &[f32; 8], mins: &[f32; 8], b: &mut [u8]) {
    let max_scale = scales
        .iter()
        .fold(0.0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0.0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut b[4..16];
    sc.fill(0);
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    write_f16(b, 0, max_scale / 63.0);
    write_f16(b, 2, max_min / 63.0);
}

/// The shared body of Q4_K and Q5_K: per-32 scale search, scale packing, then the
/// final levels in `[0, nmax]` against the stored (rounded) scales.
fn quant_k4_levels(x: &[f32], b: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut levels = [0u8; QK_K];
    let mut weights = [0.0f32; 32];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let lv = &mut levels[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx_quants(nmax, xs, &weights, lv, qkx2(rmin, nstep, false));
    }
    pack_k4_scales(&scales, &mins, b);
    let d_all = read_f16(b, 0);
    let dmin_all = read_f16(b, 2);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax);
            levels[32 * j + ii] = l as u8;
        }
    }
    levels
}

/// The shared body of `quantize_row_q4_K_impl` and `quantize_row_q5_K_impl` with
/// importance weights: per-32 `make_qkx3_quants`, the scales and mins quantised by
/// `make_qp_quants` (Q5_K caps the levels at 63 before packing, Q4_K does not), then the
/// final levels in `[0, nmax]` against the stored scales.
fn quant_k4_levels_w(x: &[f32], b: &mut [u8], qw: &[f32], nmax: i32) -> [u8; QK_K] {
    let mut levels = [0u8; QK_K];
    let mut weights = [0.0f32; 32];
    let mut sw = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let sigma2 = 2.0 * sum_squares(&x[..QK_K]) / QK_K as f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        imatrix_weights(&qw[32 * j..32 * j + 32], xs, sigma2, &mut weights);
        let mut sumw = 0.0f32;
        for &w in &weights {
            sumw += w;
        }
        sw[j] = sumw;
        let lv = &mut levels[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx_quants(nmax, xs, &weights, lv, QKX3);
    }
    let (mut ls_all, mut lm_all) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls_all, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm_all, &sw);
    let sc = &mut b[4..16];
    for j in 0..8 {
        let (mut ls, mut lm) = (ls_all[j], lm_all[j]);
        if nmax == 31 {
            ls = ls.min(63);
            lm = lm.min(63);
        }
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    write_f16(b, 0, d_block);
    write_f16(b, 2, m_block);
    let d_all = read_f16(b, 0);
    let dmin_all = read_f16(b, 2);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax);
            levels[32 * j + ii] = l as u8;
        }
    }
    levels
}

pub(crate) fn quant_q4_k(x: &[f32], b: &mut [u8]) {
    let levels = quant_k4_levels(x, b, 15, -1.0, 20);
    pack_q4_k(&levels, b);
}

/// `quantize_row_q4_K_impl`: one super-block with its 256 importance weights.
pub(crate) fn quant_q4_k_w(x: &[f32], b: &mut [u8], qw: &[f32]) {
    let levels = quant_k4_levels_w(x, b, qw, 15);
    pack_q4_k(&levels, b);
}

fn pack_q4_k(levels: &[u8; QK_K], b: &mut [u8]) {
    for (n, q) in b[16..144].chunks_exact_mut(32).enumerate() {
        for l in 0..32 {
            q[l] = levels[64 * n + l] | (levels[64 * n + l + 32] << 4);
        }
    }
}

pub(crate) fn quant_q5_k(x: &[f32], b: &mut [u8]) {
    let levels = quant_k4_levels(x, b, 31, -0.5, 15);
    pack_q5_k(&levels, b);
}

/// `quantize_row_q5_K_impl`: one super-block with its 256 importance weights.
pub(crate) fn quant_q5_k_w(x: &[f32], b: &mut [u8], qw: &[f32]) {
    let levels = quant_k4_levels_w(x, b, qw, 31);
    pack_q5_k(&levels, b);
}

fn pack_q5_k(levels: &[u8; QK_K], b: &mut [u8]) {
    let (qh, ql) = b[16..176].split_at_mut(32);
    qh.fill(0);
    for (n, ql) in ql.chunks_exact_mut(32).enumerate() {
        let (m1, m2) = (1u8 << (2 * n), 2u8 << (2 * n));
        for j in 0..32 {
            let mut l1 = levels[64 * n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = levels[64 * n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[j] = l1 | (l2 << 4);
        }
    }
}

pub(crate) fn quant_q6_k(x: &[f32], b: &mut [u8]) {
    quant_q6_k_impl(x, b, None);
}

/// `quantize_row_q6_K_impl` with importance weights: the reference search with `qw` in
/// place of x² (the imatrix values as they are, unlike the other K-quants).
pub(crate) fn quant_q6_k_w(x: &[f32], b: &mut [u8], qw: &[f32]) {
    quant_q6_k_impl(x, b, Some(qw));
}

fn quant_q6_k_impl(x: &[f32], b: &mut [u8], qw: Option<&[f32]>) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let lv = &mut levels[16 * ib..16 * ib + 16];
        let qw = qw.map(|qw| &qw[16 * ib..16 * ib + 16]);
        scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], lv, qw);
        let abs_scale = scales[ib].abs();
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = scales[ib];
        }
    }
    b.fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        write_f16(b, 208, 0.0);
        return;
    }
    let iscale = -128.0 / max_scale;
    write_f16(b, 208, 1.0 / iscale);
    for ib in 0..16 {
        b[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as u8;
    }
    let d_all = read_f16(b, 208);
    for j in 0..16 {
        let d = d_all * (b[192 + j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            levels[16 * j + ii] = (l + 32) as i8;
        }
    }
    for n in 0..2 {
        let lv = &levels[128 * n..128 * n + 128];
        for l in 0..32 {
            let q = |k: usize| lv[l + 32 * k] as u8;
            b[64 * n + l] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
            b[64 * n + l + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
            b[128 + 32 * n + l] =
                (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

pub(crate) fn quant_q8_k(x: &[f32], b: &mut [u8]) {
    let (max, amax) = signed_absmax(x);
    b.fill(0);
    if amax == 0.0 {
        return;
    }
    let iscale = -127.0 / max;
    for j in 0..QK_K {
        b[4 + j] = nearest_int(iscale * x[j]).min(127) as u8;
    }
    for j in 0..16 {
        let sum: i32 = b[4 + 16 * j..4 + 16 * j + 16]
            .iter()
            .map(|&q| q as i8 as i32)
            .sum();
        b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(sum as i16).to_le_bytes());
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}
