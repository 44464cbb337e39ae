//! Every preset llamay writes, on the architecture fixtures, gives llama-quantize
//! b11434's file byte for byte: the sha256 of llama-quantize's output for each
//! (fixture, source F32/F16, preset) is recorded in `data/presets.json` by
//! `scripts/check-quantize-vs-llamacpp --record` (which runs both tools side by side);
//! here llamay's output must hash the same, and a preset llama-quantize refuses must be
//! refused. The fixtures are generated (scripts/gen-arch-fixtures, sha256-pinned by the
//! engine's parity test) into `$LLAMAY_FIXTURES`.

use llamay_quantize::{ImportanceMatrix, Request, quantize_file};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::PathBuf;

fn fixtures_dir() -> PathBuf {
    std::env::var_os("LLAMAY_FIXTURES").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/llamay/fixtures"),
        PathBuf::from,
    )
}

/// The fixtures, or `None` (a printed skip; a failure under scripts/test).
fn fixtures() -> Option<PathBuf> {
    let dir = fixtures_dir();
    if dir.join("llama-F32.gguf").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("LLAMAY_REQUIRE_REFERENCE").is_none(),
        "fixtures missing in {}: scripts/gen-arch-fixtures",
        dir.display()
    );
    eprintln!(
        "skipped: no fixtures in {} (scripts/gen-arch-fixtures)",
        dir.display()
    );
    None
}

/// Runs every recorded (fixture, source, preset) case through `quantize_file`, the
/// request completed by `prepare`; the outputs must hash as llama-quantize's did, and
/// what it refused must be refused. Returns how many were written alike.
fn check_cases(tag: &str, cases: &[Value], prepare: impl Fn(&Value, &mut Request)) -> usize {
    let dir = fixtures_dir();
    let out =
        std::env::temp_dir().join(format!("llamay-presets-{tag}-{}.gguf", std::process::id()));
    let (mut same, mut refused) = (0, 0);
    let mut differ = Vec::new();
    for o in cases {
        let (fixture, source, preset) = (
            o["fixture"].as_str().unwrap(),
            o["source"].as_str().unwrap(),
            o["preset"].as_str().unwrap(),
        );
        let input = dir.join(format!("{fixture}-{source}.gguf"));
        let mut request = Request::named(preset).unwrap();
        prepare(o, &mut request);
        let result = quantize_file(&input, &out, &request, 2, |_| {});
        let what = format!("{fixture}-{source} {preset}");
        match (result, o["sha256"].as_str()) {
            (Ok(_), Some(want)) => {
                let got = format!("{:x}", Sha256::digest(std::fs::read(&out).unwrap()));
                if got == want {
                    same += 1;
                } else {
                    differ.push(format!("{what}: {got} vs llama-quantize's {want}"));
                }
            }
            (Err(_), None) => refused += 1,
            (Ok(_), None) => differ.push(format!(
                "{what}: llama-quantize refused it, llamay wrote it"
            )),
            (Err(e), Some(_)) => differ.push(format!("{what}: llamay refused: {e}")),
        }
    }
    let _ = std::fs::remove_file(&out);
    eprintln!("{same} outputs byte-identical to llama-quantize's, {refused} refused by both");
    assert!(
        differ.is_empty(),
        "{} differ:\n{}",
        differ.len(),
        differ.join("\n")
    );
    same
}

#[test]
fn every_preset_is_llama_quantizes_file_byte_for_byte() {
    let recorded: Value =
        serde_json::from_str(include_str!("data/presets.json")).expect("presets.json");
    if fixtures().is_none() {
        return;
    }
    // Every fixture from its F32 file; from its F16 file only the fixtures the imatrix
    // check also runs (the same quantisers on inputs rounded to F16 first; the script
    // compares all of them against llama-quantize, and CI time is bounded).
    let f16_too = [
        "llama",
        "phi3",
        "falcon",
        "llama-moe",
        "qwen2moe",
        "qwen3moe",
        "gemma3",
    ];
    let cases: Vec<Value> = (recorded["outputs"].as_array().unwrap().iter())
        .filter(|o| o["source"] == "F32" || f16_too.contains(&o["fixture"].as_str().unwrap()))
        .cloned()
        .collect();
    let same = check_cases("plain", &cases, |_, _| {});
    assert!(same > 0);
}

/// The same with llama-imatrix's importance matrices (data/imatrix/, recorded by
/// `scripts/check-quantize-vs-llamacpp --imatrix-cases`): every preset from the F32
/// files of seven fixtures, the weighted quantisers and the imatrix rules.
#[test]
fn every_preset_with_an_importance_matrix_is_llama_quantizes_file() {
    let recorded: Value =
        serde_json::from_str(include_str!("data/imatrix/presets.json")).expect("presets.json");
    if fixtures().is_none() {
        return;
    }
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/imatrix");
    // From the F32 files (the script also compares the F16 ones; CI time is bounded).
    let cases: Vec<Value> = (recorded["cases"].as_array().unwrap().iter())
        .filter(|o| o["source"] == "F32")
        .cloned()
        .collect();
    let same = check_cases("imatrix", &cases, |o, request| {
        let fixture = o["fixture"].as_str().unwrap();
        let mut m = ImportanceMatrix::load(&data.join(format!("{fixture}.gguf")), &[], &[])
            .unwrap()
            .unwrap();
        // The path llama-quantize was given (it records it in quantize.imatrix.file).
        m.file = format!("crates/quantize/tests/data/imatrix/{fixture}.gguf");
        request.imatrix = Some(m);
    });
    assert!(same > 0);
}
