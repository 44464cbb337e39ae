//! The real Gemma 3 270M Q4_K_M file against llama.cpp b11434's greedy continuations
//! (crates/engine/tests/data/gemma/greedy.json, from llama-completion --temp 0 and our
//! libllama harness). Teacher-forced: the prompt and llama.cpp's 64 generated tokens go
//! through our engine as one batch, and at every generated position our top-1 must be
//! llama.cpp's token, unless the two are within a near-tie margin in our own logits
//! (Gemma 270M has many near-ties; llama.cpp's own f16- and f32-cache runs part ways on
//! 4 of these 5 prompts for that reason).
//!
//! Needs the model: `LLAMAY_GEMMA=$(scripts/fetch-models)` (scripts/test sets it).

use llamay_engine::{BatchToken, ContextParams, KvPrecision, Model, Threads};
use llamay_gguf::MappedModel;
use serde_json::Value;
use std::path::Path;

/// Largest gap (in logits) between our top-1 and llama.cpp's token that still counts
/// as a near-tie. llama.cpp's own default run (f16 cache, flash attention) and its
/// f32-cache run differ by up to 0.93 logits on this model's first positions (measured
/// with scripts/ref-logits); half of that is the bound here.
const NEAR_TIE: f32 = 0.5;
/// At least this share of the 320 generated positions must agree exactly on top-1.
const MIN_EXACT: usize = 304;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// `None` when the model is absent outside scripts/test (skipped, saying why).
fn check(precision: KvPrecision, tokens_key: &str) -> Option<(usize, usize, f32)> {
    let path =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")?;
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gemma/greedy.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mapped = MappedModel::open(&path).unwrap();
    let gguf = mapped.parse().unwrap();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = Model::load(&gguf, Threads(threads)).unwrap();
    let (mut exact, mut ties, mut worst_tie) = (0, 0, 0f32);
    for p in doc["prompts"].as_array().unwrap() {
        let prompt = ids(&p["prompt_tokens"]);
        let generated = ids(&p[tokens_key]);
        let all: Vec<u32> = prompt.iter().chain(&generated).copied().collect();
        let mut ctx = model
            .context(ContextParams::new(Threads(2), precision, all.len() + 1))
            .unwrap();
        let s0 = ctx.new_sequence();
        let batch: Vec<BatchToken> = all
            .iter()
            .enumerate()
            .map(|(i, &t)| BatchToken {
                seq: s0,
                token: t,
                pos: i,
                logits: i + 1 >= prompt.len() && i + 1 < all.len(),
            })
            .collect();
        let logits = ctx.decode(&batch).unwrap();
        for (r, want) in generated.iter().enumerate() {
            let row = logits.row(r);
            let ours = llamay_engine::sample::argmax(row);
            if ours == *want {
                exact += 1;
                continue;
            }
            let gap = row[ours as usize] - row[*want as usize];
            assert!(
                gap <= NEAR_TIE,
                "{} ({precision:?}): generated token {r}: llama.cpp chose {want}, we prefer {ours} by {gap:.3} logits",
                p["name"]
            );
            ties += 1;
            worst_tie = worst_tie.max(gap);
        }
    }
    eprintln!(
        "{precision:?} vs {tokens_key}: {exact} exact top-1, {ties} near-ties (largest gap {worst_tie:.3})"
    );
    Some((exact, ties, worst_tie))
}

#[test]
fn greedy_agrees_with_llama_cpp_f32_cache() {
    let Some((exact, ties, _)) = check(KvPrecision::F32, "tokens_f32_kv") else {
        return;
    };
    assert_eq!(exact + ties, 5 * 64);
    assert!(exact >= MIN_EXACT, "{exact} of 320 exact");
}

#[test]
fn greedy_agrees_with_llama_completion_defaults() {
    let Some((exact, ties, _)) = check(KvPrecision::F16, "tokens") else {
        return;
    };
    assert_eq!(exact + ties, 5 * 64);
    assert!(exact >= MIN_EXACT, "{exact} of 320 exact");
}
