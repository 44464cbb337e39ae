//! Speculation (issue 18), `--draft-lookup N` and `--draft-model FILE`: the output is
//! token for token the output without it — greedy and sampled (the same seed), on every
//! architecture fixture and on the real Gemma file — while drafts are really proposed
//! and accepted.

mod common;

use common::{fixture, llamay};
use std::path::Path;

/// (stdout, drafts accepted, drafts proposed) of one greedy run.
fn run(model: &str, prompt_args: &[&str], n: &str, draft: usize) -> (Vec<u8>, usize, usize) {
    let d = draft.to_string();
    run_with(
        model,
        prompt_args,
        &["--temp", "0", "-n", n, "--draft-lookup", &d],
    )
}

/// (stdout, drafts accepted, drafts proposed) of one run with these flags.
fn run_with(model: &str, prompt_args: &[&str], flags: &[&str]) -> (Vec<u8>, usize, usize) {
    let mut args = vec!["run", model];
    args.extend_from_slice(prompt_args);
    args.extend_from_slice(flags);
    args.extend_from_slice(&["-c", "512"]);
    let o = llamay(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{args:?}: {err}");
    let (a, p) = err
        .rsplit_once("| draft ")
        .map(|(_, r)| {
            let w: Vec<&str> = r.split_whitespace().collect();
            (w[0].parse().unwrap(), w[2].parse().unwrap())
        })
        .unwrap_or((0, 0));
    (o.stdout, a, p)
}

#[test]
fn speculation_changes_no_token_on_any_architecture_fixture() {
    let fixtures = architecture_fixtures();
    let (mut accepted, mut proposed) = (0, 0);
    for m in &fixtures {
        let m = m.to_str().unwrap();
        let (plain, _, _) = run(m, &REPEATING, "48", 0);
        let (spec, a, p) = run(m, &REPEATING, "48", 6);
        assert_eq!(plain, spec, "{m}: --draft-lookup changed the greedy output");
        accepted += a;
        proposed += p;
    }
    eprintln!(
        "{} fixtures: {accepted} of {proposed} drafted tokens accepted",
        fixtures.len()
    );
    assert!(
        accepted > 100 && proposed > accepted,
        "{accepted} of {proposed}"
    );
}

#[test]
fn speculation_on_gemma_repeats_the_context_faster_and_unchanged() {
    let Some(g) =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
    else {
        return;
    };
    let prompt = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/speculate/code-edit.txt");
    let args = ["-f", prompt.to_str().unwrap(), "--chat-template", "gemma"];
    let (plain, _, _) = run(g.to_str().unwrap(), &args, "64", 0);
    let (spec, a, p) = run(g.to_str().unwrap(), &args, "64", 8);
    assert_eq!(
        String::from_utf8_lossy(&plain),
        String::from_utf8_lossy(&spec)
    );
    eprintln!("gemma: {a} of {p} drafted tokens accepted");
    assert!(
        a >= 32,
        "the answer repeats the prompt's code; only {a} of {p} drafts were accepted"
    );
}

/// Fixtures of every architecture, in F32 and Q4_K.
fn architecture_fixtures() -> Vec<std::path::PathBuf> {
    let dir = fixture("llama-F32.gguf").parent().unwrap().to_path_buf();
    // The generator's manifest: every decoder fixture (encoders generate no text).
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let mut names: Vec<String> = (manifest.as_array().unwrap().iter())
        .filter(|m| m["encoder"] != true)
        .filter_map(|m| m["file"].as_str().map(str::to_string))
        .filter(|n| n.ends_with("-F32.gguf") || n.ends_with("-Q4_K.gguf"))
        .collect();
    names.sort();
    assert!(names.len() >= 20, "{names:?}");
    names.iter().map(|n| dir.join(n)).collect()
}

const REPEATING: [&str; 3] = [
    "--raw",
    "-p",
    "one two three four one two three four one two three four one two",
];

/// Sampled speculation keeps the output: the sampler is asked once per token, in order,
/// so the same seed gives the same tokens, with or without drafts. Low temperature and
/// a repeating prompt, so that drafts are accepted often enough for the test to bite.
#[test]
fn sampled_speculation_changes_no_token_on_any_architecture_fixture() {
    let (mut accepted, mut proposed) = (0, 0);
    for m in architecture_fixtures() {
        let m = m.to_str().unwrap();
        for seed in ["1", "2"] {
            let flags = |d: &'static str| {
                [
                    "--temp",
                    "0.3",
                    "--seed",
                    seed,
                    "-n",
                    "40",
                    "--top-k",
                    "0",
                    "--top-p",
                    "1",
                    "--min-p",
                    "0",
                    "--draft-lookup",
                    d,
                ]
            };
            let (plain, _, _) = run_with(m, &REPEATING, &flags("0"));
            let (spec, a, p) = run_with(m, &REPEATING, &flags("6"));
            assert_eq!(
                plain, spec,
                "{m} seed {seed}: --draft-lookup changed the sampled output"
            );
            accepted += a;
            proposed += p;
        }
    }
    eprintln!("sampled: {accepted} of {proposed} drafted tokens accepted");
    assert!(
        accepted > 50 && proposed > accepted,
        "{accepted} of {proposed}"
    );
}

/// Under a grammar the draft is checked by the constrained sampler like any token.
#[test]
fn constrained_speculation_changes_no_token() {
    // Thirty of the prompt's words: long enough for the prompt's n-grams to be drafted.
    let grammar = std::env::temp_dir().join(format!("llamay-spec-{}.gbnf", std::process::id()));
    std::fs::write(
        &grammar,
        "root ::= ((\"one\" | \"two\" | \"three\" | \"four\") \" \"){30}\n",
    )
    .unwrap();
    let g = grammar.to_str().unwrap();
    let (mut accepted, mut proposed) = (0, 0);
    for name in ["llama-F32.gguf", "qwen2-Q4_K.gguf", "gemma3-F32.gguf"] {
        let m = fixture(name);
        let m = m.to_str().unwrap();
        for temp in ["0", "0.7"] {
            let flags = |d: &'static str| {
                [
                    "--grammar",
                    g,
                    "--temp",
                    temp,
                    "--seed",
                    "3",
                    "-n",
                    "80",
                    "--draft-lookup",
                    d,
                ]
            };
            let (plain, _, _) = run_with(m, &REPEATING, &flags("0"));
            let (spec, a, p) = run_with(m, &REPEATING, &flags("6"));
            assert_eq!(
                plain, spec,
                "{name} --temp {temp}: --draft-lookup changed the constrained output"
            );
            accepted += a;
            proposed += p;
        }
    }
    let _ = std::fs::remove_file(&grammar);
    eprintln!("constrained: {accepted} of {proposed} drafted tokens accepted");
    assert!(
        accepted > 20 && proposed > accepted,
        "{accepted} of {proposed}"
    );
}

/// A draft model of the same vocabulary: the target itself (every greedy guess is
/// right, so whole drafts are kept) and its Q4_0 copy (random-weight logits are close
/// together, so quantising moves many guesses: the rejection path). Greedy and sampled
/// output unchanged.
#[test]
fn a_draft_model_changes_no_token() {
    let prompt = ["--raw", "-p", "The quick brown fox"];
    for arch in ["llama", "qwen2", "gemma3", "phi3"] {
        let target = fixture(&format!("{arch}-F32.gguf"));
        let t = target.to_str().unwrap();
        for draft_type in ["F32", "Q4_0"] {
            let draft = fixture(&format!("{arch}-{draft_type}.gguf"));
            let d = draft.to_str().unwrap();
            for (temp, seed) in [("0", "0"), ("0.8", "5")] {
                let base = ["--temp", temp, "--seed", seed, "-n", "48", "--ignore-eos"];
                let (plain, _, _) = run_with(t, &prompt, &base);
                let mut with = base.to_vec();
                with.extend_from_slice(&["--draft-model", d, "--draft-max", "5"]);
                let (spec, a, p) = run_with(t, &prompt, &with);
                assert_eq!(
                    String::from_utf8_lossy(&plain),
                    String::from_utf8_lossy(&spec),
                    "{arch} draft {draft_type} --temp {temp}: --draft-model changed the output"
                );
                eprintln!(
                    "{arch} draft {draft_type} --temp {temp}: {a} of {p} drafted tokens accepted"
                );
                assert!(
                    p > 0 && a > 0,
                    "{arch} {draft_type} --temp {temp}: {a} of {p}"
                );
                if temp == "0" && draft_type == "F32" {
                    assert_eq!(a, p, "{arch}: the model guessing itself is always right");
                }
            }
        }
    }
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused_by_name() {
    let t = fixture("llama-F32.gguf");
    let o = llamay(&["run", t.to_str().unwrap(), "-p", "hi", "--draft-max", "4"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--draft-model"), "--draft-max alone: {err}");
    let Some(g) =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
    else {
        return;
    };
    let o = llamay(&[
        "run",
        t.to_str().unwrap(),
        "-p",
        "hi",
        "--draft-model",
        g.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--draft-model")
            && err.contains("vocabulary")
            && err.contains("320 tokens against 262144"),
        "{err}"
    );
}
