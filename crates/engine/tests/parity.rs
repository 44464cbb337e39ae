//! Parity with llama.cpp b11434 on the per-architecture fixtures: every table row, six
//! weight formats, logits at every position of a 24-token sequence decoded as one
//! batch, against logits recorded from the reference build
//! (crates/engine/tests/data/README.md says how they were made).
//!
//! The fixture GGUFs are generated, not committed: `scripts/gen-arch-fixtures` writes
//! them (deterministically; their sha256 is checked here) into `$LLAMAY_FIXTURES`
//! (default `~/.cache/llamay/fixtures`). scripts/test does that before cargo test.

mod common;

use common::fixtures_dir;
use llamay_engine::{BatchToken, ContextParams, KvPrecision, Model, Threads};
use llamay_gguf::MappedModel;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Bounds on |ours - llama.cpp| per logit (max, mean), by weight type; logits here
/// span about ±11. The quantised formats round the activation too (to Q8_0/Q8_K), so a
/// last-bit difference upstream can flip one rounding step and move the logits by a
/// few hundredths; llama.cpp's own batch and one-by-one paths differ by up to the
/// recorded `max_abs_diff_batch_vs_incremental` (0.2) for the same reason.
fn tolerance(ty: &str) -> (f32, f32) {
    match ty {
        "F32" => (2e-3, 2e-4),
        "F16" => (1e-2, 1e-3),
        // Mean bound: a single rounding flip in an early layer moves every later logit a
        // little; measured means stay under 0.021 (qwen3-Q4_K, whose own llama.cpp
        // batch-vs-incremental drift is 0.2 at the max).
        _ => (0.25, 0.03),
    }
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(0, |b, (i, &x)| if x > v[b] { i } else { b })
}

#[test]
fn every_fixture_matches_llama_cpp() {
    fixtures_match_through(KvPrecision::F32);
}

/// Each fixture also has logits recorded through llama.cpp's own F16 KV cache
/// (`scripts/gen-arch-expected --kv f16`: keys, values and the Q·K query as f16). Ours
/// rounds the same three but keeps the softmax weights and the weighted sum of values
/// in f32, where llama.cpp rounds the weights to f16 (no flash attention; with it, the
/// sum is accumulated in f16). Those extra roundings are independent of ours, so the
/// two f16 caches differ by about as much as either differs from the exact cache:
/// measured max 5.1e-3 / mean 7.3e-4 (F32 weights), 9.1e-3 / 1.5e-3 (F16), 0.245 /
/// 0.044 (quantised: activation-rounding flips amplify it) — hence `f16_tolerance`.
/// What shows ours is the better f16 cache and not a broken one: on every fixture its
/// mean distance to the exact-cache logits is at most 1.15× llama.cpp's f16 cache's
/// (measured: at most 0.92× on F32 weights, 19 of 19 closer; at most 1.055× overall).
fn f16_tolerance(ty: &str) -> (f32, f32) {
    match ty {
        "F32" => (8e-3, 1.2e-3),
        "F16" => (1.4e-2, 2.2e-3),
        _ => (0.32, 0.055),
    }
}

/// A mixture's router amplifies the two f16 caches' independent roundings: its logits
/// are wide (std 3-6, so that no routing decision is near a tie) and each expert's
/// weight moves by w(1-w) per unit of router logit. Measured on the MoE fixtures
/// through f16 (their exact-cache parity is as tight as the dense rows'): max 9.1e-3 /
/// mean 9.1e-4 (F32 weights), 1.75e-2 / 2.0e-3 (F16), 0.67 / 0.052 (quantised); mean
/// distance to the exact cache 0.83-0.89× llama.cpp's f16 cache's on F32 weights, up
/// to 1.21× on quantised ones; the same under every kernel set. Bounds: three times
/// the dense max, twice the dense mean, and 1.35× for the ratio.
fn f16_moe_tolerance(ty: &str) -> ((f32, f32), f64) {
    let (max, mean) = f16_tolerance(ty);
    ((3.0 * max, 2.0 * mean), 1.35)
}

#[test]
fn every_fixture_matches_llama_cpp_through_an_f16_cache() {
    fixtures_match_through(KvPrecision::F16);
}

fn fixtures_match_through(precision: KvPrecision) {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(data().join("arch-fixtures.json")).unwrap())
            .unwrap();
    let dir = fixtures_dir();
    let mut failures = Vec::new();
    let mut checked = 0;
    for f in doc["fixtures"].as_array().unwrap() {
        let name = f["file"].as_str().unwrap();
        let ty = f["type"].as_str().unwrap();
        let path = dir.join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; generate the fixtures with scripts/gen-arch-fixtures",
                path.display()
            )
        });
        assert_eq!(
            format!("{:x}", Sha256::digest(&bytes)),
            f["sha256"].as_str().unwrap(),
            "{name}: fixture bytes differ from the ones llama.cpp ran"
        );
        drop(bytes);
        let tokens: Vec<u32> = f["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let n_vocab = f["n_vocab"].as_u64().unwrap() as usize;
        let logits = |key: &str| -> Vec<f32> {
            let v: Vec<f32> = std::fs::read(data().join(f[key].as_str().unwrap()))
                .unwrap()
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(v.len(), tokens.len() * n_vocab, "{name}: {key}");
            v
        };
        let exact = logits("logits");
        let want = match precision {
            KvPrecision::F16 => logits("logits_f16"),
            _ => exact.clone(),
        };

        let mapped = MappedModel::open(&path).unwrap();
        let gguf = mapped.parse().unwrap();
        let model = Model::load(&gguf, Threads(2)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(model.config().arch.name, f["arch"].as_str().unwrap());
        let mut ctx = model
            .context(ContextParams::new(Threads(2), precision, 64))
            .unwrap();
        let s0 = ctx.new_sequence();
        let batch: Vec<BatchToken> = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| BatchToken {
                seq: s0,
                token: t,
                pos: i,
                logits: true,
            })
            .collect();
        let got = ctx.decode(&batch).unwrap();
        let mixture = f.get("router_margin").is_some();
        let ((tol, mean_tol), f16_ratio) = match precision {
            KvPrecision::F16 if mixture => f16_moe_tolerance(ty),
            KvPrecision::F16 => (f16_tolerance(ty), 1.15),
            _ => (tolerance(ty), 1.15),
        };
        let mut max_diff = 0f32;
        let mut sum_diff = 0f64;
        let mut top1_miss = Vec::new();
        for p in 0..tokens.len() {
            let (g, w) = (got.row(p), &want[p * n_vocab..(p + 1) * n_vocab]);
            for (a, b) in g.iter().zip(w) {
                max_diff = max_diff.max((a - b).abs());
                sum_diff += f64::from((a - b).abs());
            }
            let (ga, wa) = (argmax(g), argmax(w));
            // A different top-1 is only acceptable when the reference itself has a
            // near-tie within the tolerance.
            if ga != wa && (w[wa] - w[ga]) > tol {
                top1_miss.push(p);
            }
        }
        let mean_diff = (sum_diff / want.len() as f64) as f32;
        eprintln!(
            "{name:<24} {} max |diff| {max_diff:.2e} (bound {tol:.0e}) mean {mean_diff:.2e} (bound {mean_tol:.0e}) top-1 misses {top1_miss:?}",
            precision.name()
        );
        if max_diff > tol || mean_diff > mean_tol || !top1_miss.is_empty() {
            failures.push(format!(
                "{name}: max |diff| {max_diff:.3e} (bound {tol:.0e}), mean {mean_diff:.3e} (bound {mean_tol:.0e}), top-1 differs at {top1_miss:?}"
            ));
        }
        if precision == KvPrecision::F16 {
            let mean_dist = |a: &[f32]| {
                a.iter()
                    .zip(&exact)
                    .map(|(x, y)| f64::from((x - y).abs()))
                    .sum::<f64>()
                    / exact.len() as f64
            };
            let (ours, theirs) = (mean_dist(&got.values), mean_dist(&want));
            if ours > f16_ratio * theirs {
                failures.push(format!(
                    "{name}: through f16, mean distance to the exact-cache logits {ours:.3e} > {f16_ratio} × llama.cpp's f16 cache's {theirs:.3e}"
                ));
            }
        }
        checked += 1;
    }
    assert_eq!(
        checked, 149,
        "every fixture checked (103 rows × types: gpt-oss's MXFP4_MOE file besides the six; 10 rope variants, 6 of Mixtral-shaped llama, 30 of the optional-tensor block variants)"
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} fixtures disagree with llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
