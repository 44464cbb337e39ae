//! The per-matrix statistics llama-imatrix stores beside the sums (`<name>.stats`, in
//! the order `imatrix.stats_schema` names): moments and the entropy of each matrix's
//! mean squares, and how they compare with the same matrix one layer down. The
//! arithmetic is llama-imatrix's (`compute_vector_statistics`,
//! `compute_tensor_statistics`), f32 and f64 where it has them, so that a merged file
//! is its file byte for byte.

use crate::Stats;
use std::collections::{BTreeMap, HashMap};

pub(crate) const SCHEMA: [&str; 12] = [
    "sum_sq",
    "mean",
    "elements",
    "std_deviation",
    "skewness",
    "kurtosis",
    "gain",
    "h_norm",
    "l2_dist",
    "cossim",
    "pearson",
    "covariance",
];

pub(crate) struct TensorStats {
    legacy: bool,
    sum: f64,
    mean: f32,
    elements: i64,
    std_deviation: f32,
    skewness: f32,
    kurtosis: f32,
    gain: f32,
    entropy: f32,
    l2_dist: f32,
    cossim: f32,
    pearson: f32,
    covariance: f32,
}

impl TensorStats {
    /// The stored row, in SCHEMA's order.
    pub(crate) fn row(&self) -> [f32; 12] {
        let h_norm = if self.elements > 1 {
            100.0f32 * (self.entropy / (self.elements as f32).log2())
        } else {
            f32::NAN
        };
        [
            self.sum as f32,
            self.mean,
            self.elements as f32,
            self.std_deviation,
            self.skewness,
            self.kurtosis,
            self.gain,
            h_norm,
            self.l2_dist,
            self.cossim,
            self.pearson,
            self.covariance,
        ]
    }
}

/// Every matrix's statistics (none for one whose sums are empty or do not split).
pub(crate) fn tensor_stats(
    all: &BTreeMap<String, Stats>,
    n_layer_nextn: u32,
) -> HashMap<&str, TensorStats> {
    let mut out: HashMap<&str, TensorStats> = (all.iter())
        .filter_map(|(name, s)| vector_stats(s).map(|t| (name.as_str(), t)))
        .collect();
    if out.is_empty() {
        return out;
    }
    let nextn_start = nextn_layer_start(out.keys().copied(), n_layer_nextn);
    // What each matrix is compared with: the same matrix in the nearest layer below.
    let mut against: Vec<(&str, &str)> = Vec::new();
    for &name in out.keys() {
        let (layer, _) = tensor_name_parts(name);
        let Some(blk) = stoi(&layer) else { continue };
        if blk <= 0 || blk == nextn_start {
            continue;
        }
        let blk_first = if blk > nextn_start { nextn_start } else { 0 };
        let pattern = format!("blk.{layer}");
        let Some(at) = name.find(&pattern) else {
            continue;
        };
        let prev = (blk_first..blk).rev().find_map(|p| {
            let candidate = format!("{}blk.{p}{}", &name[..at], &name[at + pattern.len()..]);
            out.get_key_value(candidate.as_str()).map(|(k, _)| *k)
        });
        if let Some(prev) = prev {
            against.push((name, prev));
        }
    }
    for (name, prev) in against {
        let (cur, prv) = (&out[name], &out[prev]);
        let use_activations = !cur.legacy && !prv.legacy;
        let compared = compare(&all[name], &all[prev], use_activations);
        let (prev_sum, prev_elements) = (prv.sum, prv.elements);
        let t = out.get_mut(name).expect("present");
        if let Some(c) = compared {
            t.l2_dist = c.l2_dist;
            t.cossim = c.cossim;
            t.pearson = c.pearson;
            t.covariance = c.covariance;
            t.gain = if prev_sum > 1e-10f32 as f64 {
                ((t.sum / t.elements as f64).sqrt() / (prev_sum / prev_elements as f64).sqrt())
                    as f32
            } else if t.sum <= 1e-10f32 as f64 {
                1.0
            } else {
                f32::NAN
            };
        }
    }
    out
}

/// compute_vector_statistics: moments of the per-column means (of Σx where the data
/// has it, else of Σx²), the total and the entropy of Σx².
fn vector_stats(e: &Stats) -> Option<TensorStats> {
    let legacy = e.activations.is_empty();
    let n_mat = e.counts.len();
    let len = if legacy {
        e.values.len()
    } else {
        e.activations.len()
    };
    if n_mat == 0 || len == 0 || !len.is_multiple_of(n_mat) {
        return None;
    }
    if !legacy && e.values.len() != len {
        return None;
    }
    let row = len / n_mat;
    let (mut sum, mut mean, mut energy) = (0f64, 0f64, 0f64);
    let mut valid_n = 0usize;
    let each = |f: &mut dyn FnMut(f64, f64)| {
        for (i, &count) in e.counts.iter().enumerate() {
            let c = count as f32;
            if c <= 0.0 {
                continue;
            }
            let inv_c = 1.0 / c as f64;
            for j in i * row..(i + 1) * row {
                let v_act = if legacy {
                    0.0
                } else {
                    e.activations[j] as f64 * inv_c
                };
                let v_val = e.values[j] as f64 * inv_c;
                let v = if legacy { v_val } else { v_act };
                if v.is_finite() && v_val.is_finite() {
                    f(v, v_val);
                }
            }
        }
    };
    each(&mut |v, v_val| {
        sum += v_val;
        valid_n += 1;
        mean += (v - mean) / valid_n as f64;
        if v_val > 0.0 {
            energy += v_val;
        }
    });
    if valid_n == 0 {
        return None;
    }
    let inv_energy = if energy > 0.0 { 1.0 / energy } else { 0.0 };
    let log2_inv = 1.0 / 2f64.ln();
    let (mut sq, mut cu, mut qd, mut entropy) = (0f64, 0f64, 0f64, 0f64);
    each(&mut |v, v_val| {
        let diff = v - mean;
        sq += diff * diff;
        cu += diff * diff * diff;
        qd += diff * diff * diff * diff;
        if inv_energy > 0.0 {
            let p = v_val.max(0.0) * inv_energy;
            if p > 1e-10 {
                entropy -= p * p.ln() * log2_inv;
            }
        }
    });
    let n = valid_n as f64;
    let variance = if valid_n > 1 { sq / n } else { 0.0 };
    let std_deviation = (variance.max(0.0) as f32).sqrt();
    let (mut skewness, mut kurtosis) = (0f32, 0f32);
    if std_deviation > 1e-10 {
        let m2 = sq / n;
        skewness = (cu / n / (m2 * m2.sqrt())) as f32;
        kurtosis = (qd / n / (m2 * m2) - 3.0) as f32;
    }
    Some(TensorStats {
        legacy,
        sum,
        mean: mean as f32,
        elements: valid_n as i64,
        std_deviation,
        skewness,
        kurtosis,
        gain: f32::NAN,
        entropy: entropy as f32,
        l2_dist: f32::NAN,
        cossim: f32::NAN,
        pearson: f32::NAN,
        covariance: f32::NAN,
    })
}

struct Comparison {
    l2_dist: f32,
    cossim: f32,
    pearson: f32,
    covariance: f32,
}

/// compute_tensor_averages: per-column means (NaN for an expert with no row).
fn averages(s: &Stats, use_activations: bool) -> Option<Vec<f32>> {
    let n_mat = s.counts.len();
    let src = if use_activations {
        &s.activations
    } else {
        &s.values
    };
    let len = src.len();
    if n_mat == 0 || len == 0 || !len.is_multiple_of(n_mat) {
        return None;
    }
    let row = len / n_mat;
    let mut out = vec![f32::NAN; len];
    let mut any = false;
    for (m, &count) in s.counts.iter().enumerate() {
        let c = count as f32;
        if c <= 0.0 {
            continue;
        }
        any = true;
        let scale = 1.0f32 / c;
        for j in m * row..(m + 1) * row {
            out[j] = src[j] * scale;
        }
    }
    any.then_some(out)
}

fn compare(cur: &Stats, prev: &Stats, use_activations: bool) -> Option<Comparison> {
    let c = averages(cur, use_activations)?;
    let p = averages(prev, use_activations)?;
    if c.len() != p.len() {
        return None;
    }
    let pairs = || {
        (c.iter().zip(&p))
            .map(|(&a, &b)| (a as f64, b as f64))
            .filter(|(a, b)| a.is_finite() && b.is_finite())
    };
    let (mut sum_c, mut sum_p, mut n) = (0f64, 0f64, 0usize);
    for (a, b) in pairs() {
        sum_c += a;
        sum_p += b;
        n += 1;
    }
    if n == 0 {
        return None;
    }
    let (mean_c, mean_p) = (sum_c / n as f64, sum_p / n as f64);
    let (mut dot, mut n1, mut n2, mut l2) = (0f64, 0f64, 0f64, 0f64);
    let (mut cov, mut var_c, mut var_p) = (0f64, 0f64, 0f64);
    for (a, b) in pairs() {
        dot += a * b;
        n1 += a * a;
        n2 += b * b;
        let d = a - b;
        l2 += d * d;
        let (dc, dp) = (a - mean_c, b - mean_p);
        cov += dc * dp;
        var_c += dc * dc;
        var_p += dp * dp;
    }
    let covariance = if n > 1 {
        (cov / n as f64) as f32
    } else {
        f32::NAN
    };
    let cossim = if n1 > 0.0 && n2 > 0.0 {
        ((dot / (n1.sqrt() * n2.sqrt())) as f32).clamp(-1.0, 1.0)
    } else if n1 == 0.0 && n2 == 0.0 {
        f32::NAN
    } else {
        0.0
    };
    let pearson = if var_c > 0.0 && var_p > 0.0 {
        ((cov / (var_c.sqrt() * var_p.sqrt())) as f32).clamp(-1.0, 1.0)
    } else if var_c == 0.0 && var_p == 0.0 {
        f32::NAN
    } else {
        0.0
    };
    Some(Comparison {
        l2_dist: l2.sqrt() as f32,
        cossim,
        pearson,
        covariance,
    })
}

/// process_tensor_name: the layer number's text ("-" where there is none) and the
/// matrix's name without it.
fn tensor_name_parts(input: &str) -> (String, String) {
    let name: Vec<&str> = input.split('.').collect();
    let layer = (0..name.len())
        .find(|&i| name[i] == "blk" && i + 1 < name.len())
        .map_or("-".to_string(), |i| name[i + 1].to_string());
    let mut tensor = String::new();
    if let Some(i) = (1..name.len()).find(|&i| name[i] == "weight") {
        let mut j = 0;
        while j < name.len() {
            if name[j] == "blk" {
                j += if name.len() > 4 { 2 } else { 3 };
                continue;
            }
            if j == i {
                break;
            }
            if !tensor.is_empty() {
                tensor.push('.');
            }
            tensor.push_str(name[j]);
            j += 1;
        }
    }
    if tensor.is_empty() {
        tensor = input.to_string();
    }
    (layer, tensor)
}

/// `std::stoi`: optional space and sign, then at least one digit.
fn stoi(s: &str) -> Option<i32> {
    let t = s.trim_start();
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let end = digits.bytes().take_while(u8::is_ascii_digit).count();
    let v: i64 = digits[..end].parse().ok()?;
    let v = if neg { -v } else { v };
    i32::try_from(v).ok()
}

/// nextn_layer_start: the first multi-token-prediction layer (`i32::MAX`: none).
fn nextn_layer_start<'a>(names: impl Iterator<Item = &'a str>, n_layer_nextn: u32) -> i32 {
    let (mut max_blk, mut first) = (-1i32, i32::MAX);
    for name in names {
        let (layer, tensor) = tensor_name_parts(name);
        let Some(blk) = stoi(&layer) else { continue };
        max_blk = max_blk.max(blk);
        if tensor.starts_with("nextn.") {
            first = first.min(blk);
        }
    }
    if n_layer_nextn > 0 && max_blk >= 0 {
        return (max_blk + 1 - n_layer_nextn as i32).max(0);
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_as_llama_imatrix_splits_them() {
        assert_eq!(tensor_name_parts("blk.3.attn_k.weight").0, "3");
        // Four parts: the matrix name is the input (llama.cpp's quirk).
        assert_eq!(
            tensor_name_parts("blk.3.attn_k.weight").1,
            "blk.3.attn_k.weight"
        );
        assert_eq!(
            tensor_name_parts("blk.3.nextn.eh_proj.weight").1,
            "nextn.eh_proj"
        );
        assert_eq!(tensor_name_parts("output.weight").0, "-");
        assert_eq!(stoi("12"), Some(12));
        assert_eq!(stoi("-"), None);
    }
}
