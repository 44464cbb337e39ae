//! `llamay perplexity --kl-divergence-base / --kl-divergence` against llama.cpp's own
//! base-logits file (data/kld/llama-F32.kld, written by llama-perplexity b11434 with an
//! exact cache: scripts/gen-kld-expected): llamay scores llama.cpp's file, and the file
//! llamay writes is llama.cpp's, byte for byte in its header and within one
//! quantisation step in every log-probability.

mod common;

use common::{fixture, stat, vulkan_device};
use std::path::{Path, PathBuf};
use std::process::Command;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kld")
        .join(name)
}

fn llamay(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `perplexity --kl-divergence` of the `llama-F32` fixture against llama.cpp's base
/// file, `extra` added (a device): the report, and its (mean KLD, max KLD, same top).
fn score_llama_cpp_s_base(extra: &[&str]) -> (String, f64, f64, f64) {
    let model = fixture("llama-F32.gguf");
    let base = data("llama-F32.kld");
    let mut args = vec![
        "perplexity",
        model.to_str().unwrap(),
        "--kv",
        "f32",
        "--kl-divergence-base",
        base.to_str().unwrap(),
        "--kl-divergence",
    ];
    args.extend_from_slice(extra);
    let out = llamay(&args);
    let kld = stat(&out, "Mean    KLD");
    let max = stat(&out, "Maximum KLD");
    let top = stat(&out, "Same top p");
    eprintln!("{extra:?}: mean KLD {kld:e}, max {max:e}, same top {top}%");
    (out, kld, max, top)
}

#[test]
fn llamay_scores_llama_cpp_s_base_file() {
    let (out, kld, max, top) = score_llama_cpp_s_base(&[]);
    for section in [
        "====== Perplexity statistics ======",
        "====== KL divergence statistics ======",
        "====== Token probability statistics ======",
    ] {
        assert!(out.contains(section), "{out}");
    }
    // The fixture agrees with llama.cpp to ~1e-5 in its logits; what is left is the
    // base file's 16-bit quantisation of the log-probabilities.
    assert!(kld.abs() < 1e-5 && max < 1e-4, "{out}");
    assert_eq!(top, 100.0, "{out}");
    let ppl = stat(&out, "Mean PPL(Q)   ");
    let base_ppl = stat(&out, "Mean PPL(base)");
    assert!((ppl / base_ppl - 1.0).abs() < 1e-3, "{ppl} vs {base_ppl}");
}

#[test]
fn the_base_file_llamay_writes_is_llama_cpp_s() {
    let model = fixture("llama-F32.gguf");
    let ours = std::env::temp_dir().join(format!("llamay-kld-{}.kld", std::process::id()));
    let out = llamay(&[
        "perplexity",
        model.to_str().unwrap(),
        "-f",
        data("text.txt").to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "4",
        "--kv",
        "f32",
        "--kl-divergence-base",
        ours.to_str().unwrap(),
    ]);
    assert!(out.contains("Final estimate"), "{out}");
    let a = std::fs::read(&ours).unwrap();
    let b = std::fs::read(data("llama-F32.kld")).unwrap();
    let _ = std::fs::remove_file(&ours);
    assert_eq!(a.len(), b.len(), "file sizes");
    // Magic, n_ctx, n_vocab, n_chunk and every token: identical bytes.
    let head = 20 + 4 * 128 * 4;
    assert_eq!(a[..head], b[..head], "header and tokens");
    let nv = 2 * 320usize.div_ceil(2) + 4;
    let (mut worst_q, mut worst_f) = (0i32, 0f32);
    for (ra, rb) in a[head..].chunks(nv * 2).zip(b[head..].chunks(nv * 2)) {
        let f = |r: &[u8], i: usize| f32::from_le_bytes(r[4 * i..4 * i + 4].try_into().unwrap());
        for i in 0..2 {
            worst_f = worst_f.max((f(ra, i) - f(rb, i)).abs() / f(rb, i).abs().max(1e-6));
        }
        for i in 4..nv {
            let q = |r: &[u8]| u16::from_le_bytes([r[2 * i], r[2 * i + 1]]) as i32;
            worst_q = worst_q.max((q(ra) - q(rb)).abs());
        }
    }
    eprintln!("worst relative scale/min difference {worst_f:e}, worst quantised step {worst_q}");
    assert!(
        worst_f < 1e-4 && worst_q <= 1,
        "scale/min {worst_f}, steps {worst_q}"
    );
    // And the file reads back: scored against its own model, nothing diverges.
    let ours2 = std::env::temp_dir().join(format!("llamay-kld2-{}.kld", std::process::id()));
    llamay(&[
        "perplexity",
        model.to_str().unwrap(),
        "-f",
        data("text.txt").to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "4",
        "--kv",
        "f32",
        "--kl-divergence-base",
        ours2.to_str().unwrap(),
    ]);
    let back = llamay(&[
        "perplexity",
        model.to_str().unwrap(),
        "--kv",
        "f32",
        "--kl-divergence-base",
        ours2.to_str().unwrap(),
        "--kl-divergence",
    ]);
    let _ = std::fs::remove_file(&ours2);
    assert!(stat(&back, "Mean    KLD").abs() < 1e-5, "{back}");
}

/// The command as llama-perplexity users type it: `-f TEXT` beside `--kl-divergence`.
/// The base file's tokens are scored; a text that is not the base file's is said.
#[test]
fn kl_divergence_takes_the_text_file_as_llama_perplexity_does() {
    let model = fixture("llama-F32.gguf");
    let base = data("llama-F32.kld");
    let other = common::temp_file("kld-other.txt", "A different text altogether, short.");
    for (text, warned) in [(data("text.txt"), false), (other.to_path_buf(), true)] {
        let o = Command::new(env!("CARGO_BIN_EXE_llamay"))
            .args([
                "perplexity",
                model.to_str().unwrap(),
                "-f",
                text.to_str().unwrap(),
            ])
            .args([
                "--kv",
                "f32",
                "--chunks",
                "2",
                "--kl-divergence-base",
                base.to_str().unwrap(),
                "--kl-divergence",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(stat(&out, "Mean    KLD").abs() < 1e-5, "{out}");
        assert_eq!(err.contains("is not the text"), warned, "{err}");
    }
}

#[test]
fn a_damaged_base_file_is_refused_by_name() {
    let model = fixture("llama-F32.gguf");
    let b = std::fs::read(data("llama-F32.kld")).unwrap();
    let cut = std::env::temp_dir().join(format!("llamay-kld-cut-{}.kld", std::process::id()));
    std::fs::write(&cut, &b[..b.len() - 10]).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args([
            "perplexity",
            model.to_str().unwrap(),
            "--kl-divergence-base",
            cut.to_str().unwrap(),
            "--kl-divergence",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&cut);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("error:") && err.contains("truncated"),
        "{err}"
    );
    // A well-formed file for another vocabulary (330 tokens, this model has 320).
    let mut other = b"_logits_".to_vec();
    for v in [128u32, 330, 1] {
        other.extend(v.to_le_bytes());
    }
    other.extend(vec![0u8; 128 * 4 + 63 * (2 * 165 + 4) * 2]);
    let wrong = std::env::temp_dir().join(format!("llamay-kld-vocab-{}.kld", std::process::id()));
    std::fs::write(&wrong, &other).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args([
            "perplexity",
            model.to_str().unwrap(),
            "--kl-divergence-base",
            wrong.to_str().unwrap(),
            "--kl-divergence",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&wrong);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("vocabulary"), "{err}");
}

/// The same base file scored with the forward pass on a Vulkan device (lavapipe under
/// the test command; F32 matrices run on the CPU, the rest of the block on the device):
/// as close to llama.cpp as the CPU path is, within the base file's quantisation.
#[test]
fn the_device_path_scores_llama_cpp_s_base_file_as_closely() {
    if !vulkan_device() {
        return;
    }
    let (out, kld, max, top) = score_llama_cpp_s_base(&["--device", "vulkan"]);
    assert!(kld.abs() < 1e-5 && max < 1e-4, "{out}");
    assert_eq!(top, 100.0, "{out}");
}
