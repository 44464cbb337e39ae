//! A mixture of experts in place of the dense feed-forward network, as llama.cpp's
//! `build_moe_ffn` computes it: router logits, softmax, the top k experts per token,
//! their weights (normalised to sum 1 where the row says), each expert run once over
//! the tokens that picked it (a matmul over those rows in a prefill; a decode touches
//! only its k experts), outputs weighted and summed in the order the experts were
//! picked, plus a shared expert scaled by its sigmoid gate where the row has one.

use crate::arch::{FfnKind, Gating};
use crate::config::MoeConfig;
use crate::cpu::{FfnBuffers, MatmulInput, dense_ffn, linear};
use crate::weights::MoeFfn;
use llamay_kernels::ThreadPool;

/// Buffers a mixture reuses from layer to layer and call to call.
#[derive(Default)]
pub(crate) struct MoeScratch {
    /// Router logits, [n_tokens][n_expert].
    logits: Vec<f32>,
    /// The rows of `h` routed to the expert at hand.
    rows: Vec<f32>,
    expert: FfnBuffers,
    /// Each token's weighted expert outputs, [n_tokens][k][n_embd], in pick order.
    picked: Vec<f32>,
}

/// One layer's mixture, ready to run.
pub(crate) struct Mixture<'w, 'a> {
    pub weights: &'w MoeFfn<'a>,
    /// What each expert computes (the row's dense kind).
    pub kind: FfnKind,
    pub n_embd: usize,
}

/// The experts token rows pick, with their weights: `k` per token, in pick order
/// (highest probability first).
#[derive(Debug, PartialEq)]
pub(crate) struct Routes {
    pub k: usize,
    pub expert: Vec<usize>,
    pub weight: Vec<f32>,
}

/// llama.cpp clamps the weight sum to the smallest normal f16 before dividing.
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// Routes every row of `logits` ([n][n_expert]).
pub(crate) fn route(logits: &[f32], cfg: &MoeConfig) -> Routes {
    let (n_expert, k) = (cfg.n_expert, cfg.n_expert_used);
    let n = logits.len() / n_expert;
    let mut routes = Routes {
        k,
        expert: Vec::with_capacity(n * k),
        weight: Vec::with_capacity(n * k),
    };
    let mut probs = vec![0f32; n_expert];
    let mut order: Vec<usize> = Vec::with_capacity(n_expert);
    let mut w = vec![0f32; k];
    for row in logits.chunks_exact(n_expert) {
        // What the top k is taken of: probabilities, or (SoftmaxOfTopK) the logits.
        match cfg.spec.gating {
            Gating::Softmax => softmax(row, &mut probs),
            Gating::SoftmaxOfTopK => probs.copy_from_slice(row),
        }
        order.clear();
        order.extend(0..n_expert);
        // Highest first; equal values keep the lower index first.
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let picked = &order[..k];
        match cfg.spec.gating {
            Gating::Softmax => w.iter_mut().zip(picked).for_each(|(w, &e)| *w = probs[e]),
            Gating::SoftmaxOfTopK => {
                let top: Vec<f32> = picked.iter().map(|&e| row[e]).collect();
                softmax(&top, &mut w);
            }
        }
        if cfg.spec.normalize_weights {
            let sum = w.iter().sum::<f32>().max(MIN_WEIGHT_SUM);
            w.iter_mut().for_each(|x| *x /= sum);
        }
        routes.expert.extend_from_slice(picked);
        routes.weight.extend_from_slice(&w);
    }
    routes
}

fn softmax(x: &[f32], out: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o;
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
}

impl Mixture<'_, '_> {
    /// `out = moe(h)` for every `n_embd`-long row of `h`.
    pub fn forward(
        &self,
        h: &[f32],
        s: &mut MoeScratch,
        out: &mut Vec<f32>,
        act: &mut MatmulInput,
        threads: &ThreadPool,
    ) {
        let (w, e) = (self.weights, self.n_embd);
        let n = h.len() / e;
        linear(&w.router, h, act, &mut s.logits, threads);
        let routes = route(&s.logits, &w.config);
        let k = routes.k;
        s.picked.resize(n * k * e, 0.0);
        // Each expert once, over the rows that picked it.
        let mut users: Vec<usize> = Vec::new();
        for (expert, ffn) in w.experts.iter().enumerate() {
            users.clear();
            users.extend((0..n * k).filter(|&i| routes.expert[i] == expert));
            if users.is_empty() {
                continue;
            }
            s.rows.clear();
            for &i in &users {
                let t = i / k;
                s.rows.extend_from_slice(&h[t * e..(t + 1) * e]);
            }
            dense_ffn(self.kind, ffn, &s.rows, &mut s.expert, act, threads);
            for (r, &i) in users.iter().enumerate() {
                let y = &s.expert.down[r * e..(r + 1) * e];
                let weight = routes.weight[i];
                let dst = &mut s.picked[i * e..(i + 1) * e];
                dst.iter_mut().zip(y).for_each(|(d, &v)| *d = v * weight);
            }
        }
        // Sum in pick order, as llama.cpp adds its expert views.
        out.clear();
        out.resize(n * e, 0.0);
        for (t, o) in out.chunks_exact_mut(e).enumerate() {
            o.copy_from_slice(&s.picked[t * k * e..(t * k + 1) * e]);
            for j in 1..k {
                let p = &s.picked[(t * k + j) * e..(t * k + j + 1) * e];
                o.iter_mut().zip(p).for_each(|(a, &b)| *a += b);
            }
        }
        if let Some(shared) = &w.shared {
            // The gate is a one-row matrix product here, computed on the host.
            if let Some(o) = act.observer.as_mut() {
                o.matmul_input(&shared.gate_inp_name, None, h, e);
            }
            dense_ffn(self.kind, &shared.ffn, h, &mut s.expert, act, threads);
            for (t, o) in out.chunks_exact_mut(e).enumerate() {
                let x = &h[t * e..(t + 1) * e];
                let g: f32 = x.iter().zip(&shared.gate_inp).map(|(a, b)| a * b).sum();
                let gate = 1.0 / (1.0 + (-g).exp());
                let y = &s.expert.down[t * e..(t + 1) * e];
                o.iter_mut().zip(y).for_each(|(a, &b)| *a += b * gate);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::MoeSpec;

    fn cfg(normalize: bool) -> MoeConfig {
        MoeConfig {
            spec: MoeSpec {
                gating: Gating::Softmax,
                normalize_weights: normalize,
                width_key: true,
                shared_expert: false,
                biases: false,
            },
            n_expert: 4,
            n_expert_used: 2,
            n_ff_exp: 8,
            n_ff_shexp: 8,
        }
    }

    #[test]
    fn routes_pick_the_top_k_by_probability_in_order() {
        // Token 0: experts 2 then 0; token 1: experts 3 then 1.
        let logits = [1.0, -2.0, 3.0, 0.5, -1.0, 2.0, 0.0, 4.0];
        let r = route(&logits, &cfg(false));
        assert_eq!(r.expert, [2, 0, 3, 1]);
        let p = |row: &[f32], i: usize| {
            let z: f32 = row.iter().map(|v| v.exp()).sum();
            row[i].exp() / z
        };
        let want = [
            p(&logits[..4], 2),
            p(&logits[..4], 0),
            p(&logits[4..], 3),
            p(&logits[4..], 1),
        ];
        for (g, w) in r.weight.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    #[test]
    fn softmax_of_top_k_picks_by_logit_and_weighs_the_picked_alone() {
        let mut c = cfg(false);
        c.spec.gating = Gating::SoftmaxOfTopK;
        let logits = [1.0, -2.0, 3.0, 0.5, -1.0, 2.0, 0.0, 4.0];
        let r = route(&logits, &c);
        assert_eq!(r.expert, [2, 0, 3, 1]);
        // softmax over (3, 1) and over (4, 2): the others take no weight.
        let hi = 1.0 / (1.0 + (-2.0f32).exp());
        for (g, w) in r.weight.iter().zip([hi, 1.0 - hi, hi, 1.0 - hi]) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    #[test]
    fn normalised_weights_sum_to_one_and_keep_their_ratio() {
        let logits = [1.0, -2.0, 3.0, 0.5];
        let plain = route(&logits, &cfg(false));
        let norm = route(&logits, &cfg(true));
        assert_eq!(plain.expert, norm.expert);
        assert!((norm.weight.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let ratio = |w: &[f32]| w[0] / w[1];
        assert!((ratio(&plain.weight) - ratio(&norm.weight)).abs() < 1e-4);
        // Top-2 of a softmax, normalised, is the softmax over those two logits.
        let want = 1.0 / (1.0 + (1.0f32 - 3.0).exp());
        assert!((norm.weight[0] - want).abs() < 1e-6);
    }
}
