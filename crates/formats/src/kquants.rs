//! The 256-element super-block K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K.
//! Dequantisers follow llama.cpp's `dequantize_row_*`; quantisers follow
//! `quantize_row_*_ref` with the scale searches they call (`make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants`), float operation for float operation.

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

/// ggml's `make_qx_quants` with `rmse_type == 1` and no importance weights (the only
/// way the reference quantisers call it): symmetric levels in `[0, 2*nmax)` and the
/// scale that minimises x²-weighted error over 19 trial scales.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (l_o, &v) in l_out.iter_mut().zip(x) {
        let l = level(iscale, v);
        *l_o = (l + nmax) as i8;
        let w = v * v;
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
        for &v in x {
            let l = level(iscale, v);
            let w = v * v;
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

/// ggml's `make_qkx2_quants`: asymmetric levels in `[0, nmax]` with a (non-positive)
/// offset, searching `nstep + 1` trial scales by weighted least squares. Returns
/// `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
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
    if max == min {
        l_out.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        best_error += weights[i] * err(scale * l_out[i] as f32 + min - x[i]);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
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
        (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, lv, -0.5, 0.1, 15, true);
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
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &weights, lv, rmin, 0.1, nstep, false);
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

pub(crate) fn quant_q4_k(x: &[f32], b: &mut [u8]) {
    let levels = quant_k4_levels(x, b, 15, -1.0, 20);
    for (n, q) in b[16..144].chunks_exact_mut(32).enumerate() {
        for l in 0..32 {
            q[l] = levels[64 * n + l] | (levels[64 * n + l + 32] << 4);
        }
    }
}

pub(crate) fn quant_q5_k(x: &[f32], b: &mut [u8]) {
    let levels = quant_k4_levels(x, b, 31, -0.5, 15);
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
    let mut levels = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let lv = &mut levels[16 * ib..16 * ib + 16];
        scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], lv);
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
