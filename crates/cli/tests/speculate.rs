//! `--draft-lookup N` (prompt-lookup speculation, issue 18): at temperature 0 the output
//! is token for token the output without it — on every architecture fixture and on the
//! real Gemma file — while drafts are really proposed and accepted.

mod common;

use common::{fixture, llamay};
use std::path::Path;

/// (stdout, drafts accepted, drafts proposed) of one greedy run.
fn run(model: &str, prompt_args: &[&str], n: &str, draft: usize) -> (Vec<u8>, usize, usize) {
    let d = draft.to_string();
    let mut args = vec!["run", model];
    args.extend_from_slice(prompt_args);
    args.extend_from_slice(&["--temp", "0", "-n", n, "--draft-lookup", &d, "-c", "512"]);
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
    let dir = fixture("llama-F32.gguf").parent().unwrap().to_path_buf();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with("-F32.gguf") || n.ends_with("-Q4_K.gguf"))
        .collect();
    names.sort();
    assert!(names.len() >= 20, "{names:?}");
    let prompt = [
        "--raw",
        "-p",
        "one two three four one two three four one two three four one two",
    ];
    let (mut accepted, mut proposed) = (0, 0);
    for name in &names {
        let m = dir.join(name);
        let m = m.to_str().unwrap();
        let (plain, _, _) = run(m, &prompt, "48", 0);
        let (spec, a, p) = run(m, &prompt, "48", 6);
        assert_eq!(
            plain, spec,
            "{name}: --draft-lookup changed the greedy output"
        );
        accepted += a;
        proposed += p;
    }
    eprintln!(
        "{} fixtures: {accepted} of {proposed} drafted tokens accepted",
        names.len()
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

#[test]
fn sampled_speculation_is_refused_by_name() {
    let m = fixture("llama-F32.gguf");
    let o = llamay(&[
        "run",
        m.to_str().unwrap(),
        "-p",
        "hi",
        "--temp",
        "0.8",
        "--draft-lookup",
        "4",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--draft-lookup") && err.contains("--temp 0"),
        "{err}"
    );
}
