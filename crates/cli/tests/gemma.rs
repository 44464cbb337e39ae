//! The real Gemma 3 270M file against llama-perplexity b11434: same text, same chunks
//! (crates/engine/tests/data/gemma/perplexity.json), final PPL within 0.5%.
//! Needs `LLAMAY_GEMMA=$(scripts/fetch-models)` and `LLAMAY_REF_TREE=$(scripts/fetch-ref)`
//! (scripts/test sets both).

mod common;

use common::stat;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Gemma file, the reference tree and llama-perplexity's recorded run, or `None`
/// (a printed skip; a failure under scripts/test) when the first two are not given.
fn reference() -> Option<(PathBuf, PathBuf, Value)> {
    use llamay_synth::reference::path;
    let model = path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")?;
    let tree = path("LLAMAY_REF_TREE", "LLAMAY_REF_TREE=$(scripts/fetch-ref)")?;
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/gemma/perplexity.json");
    let want: Value = serde_json::from_str(&std::fs::read_to_string(data).unwrap()).unwrap();
    Some((model, tree, want))
}

/// `llamay perplexity` on the reference text's chunks with cache `kv`: the final PPL.
fn ppl(model: &Path, tree: &Path, want: &Value, kv: &str) -> f64 {
    let text = tree.join(want["text_file"].as_str().unwrap());
    let chunks = want["chunks"].as_u64().unwrap().to_string();
    let c = want["c"].as_u64().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args([
            "perplexity",
            model.to_str().unwrap(),
            "-f",
            text.to_str().unwrap(),
        ])
        .args(["-c", &c, "--chunks", &chunks, "--kv", kv])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    last.strip_prefix("Final estimate: PPL = ")
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no final estimate in: {stdout}"))
}

/// The KV-cache issue's bar: int8 values (keys exact) cost under 0.5% of perplexity.
#[test]
fn vq8_perplexity_within_half_a_percent_of_f32() {
    let Some((model, tree, want)) = reference() else {
        return;
    };
    let exact = ppl(&model, &tree, &want, "f32");
    let vq8 = ppl(&model, &tree, &want, "vq8");
    let rel = (vq8 - exact) / exact;
    eprintln!("PPL f32 {exact:.4}, vq8 {vq8:.4}: {:+.3}%", rel * 100.0);
    assert!(
        rel.abs() < 0.005,
        "vq8 PPL {vq8} vs f32 {exact}: {:+.3}%",
        rel * 100.0
    );
}

/// `llamay verify` on the real file: vq8 clears the 5% bound, the 1-bit row fails it.
#[test]
fn verify_on_gemma_passes_vq8_and_the_teeth_row_fails() {
    let Some(model) =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
    else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args(["verify", model.to_str().unwrap(), "-c", "256"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    eprintln!("{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("| vq8 |") && l.ends_with("| PASS |")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("| 1-bit (teeth) |") && l.contains("FAIL")),
        "{stdout}"
    );
    assert_eq!(
        stdout.lines().last(),
        Some("recommended: --kv vq8 (vq8 clears the bound at about 2/3 of f32's memory)")
    );
}

#[test]
fn perplexity_within_half_a_percent_of_llama_perplexity() {
    let Some((model, tree, want)) = reference() else {
        return;
    };
    // llama-perplexity's defaults: f16 cache (and flash attention); our f16 precision.
    let ppl = ppl(&model, &tree, &want, "f16");
    let reference = want["ppl"].as_f64().unwrap();
    let rel = (ppl - reference) / reference;
    eprintln!(
        "llamay PPL {ppl:.4}, llama-perplexity {reference:.4}, difference {:+.3}%",
        rel * 100.0
    );
    assert!(
        rel.abs() < 0.005,
        "PPL {ppl} vs llama-perplexity {reference}: {:+.3}%",
        rel * 100.0
    );
}

/// The real file with its forward pass on a Vulkan device (Mesa's lavapipe under the
/// test command: every matrix of this Q4_K_M file is a format the device runs), on the
/// reference text's first two 128-token chunks with an f16 cache: the CPU writes its
/// log-probabilities as a base file (llama.cpp's `--kl-divergence-base` format), and the
/// device's KL divergence from it is no more than twice the CPU's own portable kernels'
/// (the same arithmetic in another float order: what "as close as the CPU is to itself"
/// means on this file, whose activation outliers turn last-bit differences into rounding
/// flips). Measured: device 0.0064 (same top 95.2%, PPL ratio 0.983 ± 0.010), portable
/// 0.0055 (93.7%, 0.996 ± 0.008). lavapipe is the CPU pretending: two short chunks take
/// two minutes, so CI runs no more.
#[test]
fn vulkan_perplexity_is_as_close_to_the_cpu_as_its_own_kernel_sets() {
    let Some((model, tree, want)) = reference() else {
        return;
    };
    let text = tree.join(want["text_file"].as_str().unwrap());
    let base = std::env::temp_dir().join(format!("llamay-gemma-base-{}.kld", std::process::id()));
    let run = |args: &[&str], env: Option<(&str, &str)>| -> String {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_llamay"));
        cmd.args([
            "perplexity",
            model.to_str().unwrap(),
            "--kv",
            "f16",
            "--kl-divergence-base",
        ])
        .arg(&base)
        .args(args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run(
        &["-f", text.to_str().unwrap(), "-c", "128", "--chunks", "2"],
        None,
    );
    let kld = |report: &str| (stat(report, "Mean    KLD"), stat(report, "Same top p"));
    let portable = kld(&run(
        &["--kl-divergence"],
        Some(("LLAMAY_BACKEND", "portable")),
    ));
    let device = kld(&run(&["--kl-divergence", "--device", "vulkan"], None));
    let _ = std::fs::remove_file(&base);
    eprintln!(
        "KL divergence from the CPU: device {:.6} (same top {}%), portable kernels {:.6} (same top {}%)",
        device.0, device.1, portable.0, portable.1
    );
    assert!(
        device.0 <= 2.0 * portable.0,
        "device {device:?} vs portable {portable:?}"
    );
    assert!(
        device.1 >= portable.1 - 5.0,
        "device {device:?} vs portable {portable:?}"
    );
}

/// The Gemma file's `</s>` is control-looking but not control-typed; the loader
/// corrects it as llama.cpp does. `info` says so; `run` does not repeat it every time.
#[test]
fn the_control_token_correction_is_said_by_info_not_by_run() {
    let Some(model) =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
    else {
        return;
    };
    let m = model.to_str().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_llamay"))
            .args(args)
            .output()
            .unwrap()
    };
    let info = run(&["info", m]);
    assert!(info.status.success());
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        text.contains("control-looking token 212 \"</s>\""),
        "{text}"
    );
    let generated = run(&["run", m, "-p", "Hi", "-n", "2", "--temp", "0"]);
    let err = String::from_utf8_lossy(&generated.stderr);
    assert!(generated.status.success(), "{err}");
    assert!(!err.contains("control-looking"), "{err}");
}
