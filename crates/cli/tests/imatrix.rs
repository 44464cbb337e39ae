//! `llamay imatrix` and `quantize --imatrix` against llama.cpp b11434's tools, through
//! what `scripts/check-quantize-vs-llamacpp --imatrix-cases` recorded in
//! crates/quantize/tests/data/imatrix/: llama-imatrix's files for seven architecture
//! fixtures (over the reference tree's tools/completion/README.md, -c 64, 4 chunks) and
//! the sha256 of llama-imatrix's merges of them. Here llamay's own run on the same file
//! and text must sum the same rows (counts equal, Σx² equal up to float order), its
//! merges must be llama-imatrix's bytes, and bad importance matrices are refused by
//! name with nothing written.

mod common;

use common::{TempPath, fixture, llamay};
use llamay_gguf::GgufFile;
use serde_json::Value as Json;
use sha2::Digest;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../quantize/tests/data/imatrix")
}

fn recorded() -> Json {
    serde_json::from_str(&std::fs::read_to_string(data().join("presets.json")).unwrap()).unwrap()
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn error_line(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure");
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!e.contains("panicked"), "{e}");
    e
}

/// Every tensor of an imatrix file as f32s.
fn tensors(path: &Path) -> BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    (f.tensors.iter())
        .map(|t| {
            let v = (t.data.chunks_exact(4)).map(|b| f32::from_le_bytes(b.try_into().unwrap()));
            (t.name.to_string(), v.collect())
        })
        .collect()
}

#[test]
fn imatrix_sums_the_rows_llama_imatrix_sums() {
    let Some(tree) =
        llamay_synth::reference::path("LLAMAY_REF_TREE", "LLAMAY_REF_TREE=$(scripts/fetch-ref)")
    else {
        return;
    };
    let text = tree.join("tools/completion/README.md");
    // Dense rows, fused QKV and stacked up/gate, Gemma 3's: the routing of the mixtures
    // flips on near-ties between two engines, so their counts are not compared here.
    for base in ["llama", "phi3", "falcon", "gemma3"] {
        let out = TempPath::new(&format!("imatrix-{base}.gguf"));
        let model = fixture(&format!("{base}-F32.gguf"));
        let o = llamay(&[
            "imatrix",
            "-m",
            model.to_str().unwrap(),
            "-f",
            text.to_str().unwrap(),
            "-c",
            "64",
            "--chunks",
            "4",
            "-o",
            out.to_str().unwrap(),
        ]);
        ok(&o, base);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            stdout.contains("[4]") && stdout.contains("Final estimate: PPL = "),
            "{stdout}"
        );
        let (ours, theirs) = (tensors(&out), tensors(&data().join(format!("{base}.gguf"))));
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>(),
            "{base}: not llama-imatrix's matrices"
        );
        let mut worst = (0f32, String::new());
        for (name, want) in &theirs {
            let got = &ours[name];
            if name.ends_with(".counts") {
                assert_eq!(got, want, "{base} {name}: rows counted differently");
            } else if name.ends_with(".in_sum2") {
                for (g, w) in got.iter().zip(want) {
                    let rel = (g - w).abs() / w.abs().max(1e-30);
                    if rel > worst.0 {
                        worst = (rel, name.clone());
                    }
                }
            }
        }
        // Measured: at most 1.1e-3 (gemma3), median 3e-5: the two engines' float order.
        assert!(
            worst.0 < 1e-2,
            "{base}: in_sum2 differs by {} in {}",
            worst.0,
            worst.1
        );
    }
}

#[test]
fn merged_files_are_llama_imatrixs_bytes() {
    let doc = recorded();
    let mut checked = 0;
    for m in doc["merges"].as_array().unwrap() {
        let (base, format) = (
            m["fixture"].as_str().unwrap(),
            m["format"].as_str().unwrap(),
        );
        let input = data().join(format!("{base}.gguf"));
        let out = TempPath::new(&format!("imatrix-merge-{base}.{format}"));
        let i = input.to_str().unwrap();
        let o = llamay(&[
            "imatrix",
            "--in-file",
            i,
            "--in-file",
            i,
            "--output-format",
            format,
            "-o",
            out.to_str().unwrap(),
        ]);
        ok(&o, base);
        let got = format!("{:x}", sha2::Sha256::digest(std::fs::read(&out).unwrap()));
        assert_eq!(
            got,
            m["sha256"].as_str().unwrap(),
            "{base} merged to {format}"
        );
        checked += 1;
    }
    assert_eq!(checked, 14);
    // A legacy file read back and written as GGUF again keeps its sums (as means
    // scaled by the chunk size) and names.
    let dat = TempPath::new("imatrix-legacy.dat");
    let back = TempPath::new("imatrix-legacy.gguf");
    let i = data().join("llama.gguf");
    let (i, d, b) = (
        i.to_str().unwrap(),
        dat.to_str().unwrap(),
        back.to_str().unwrap(),
    );
    ok(
        &llamay(&["imatrix", "--in-file", i, "--output-format", "dat", "-o", d]),
        "to dat",
    );
    ok(&llamay(&["imatrix", "--in-file", d, "-o", b]), "back");
    let (a, z) = (tensors(&data().join("llama.gguf")), tensors(back.as_ref()));
    let sums = |t: &BTreeMap<String, Vec<f32>>| -> Vec<String> {
        t.keys()
            .filter(|k| k.ends_with(".in_sum2"))
            .cloned()
            .collect()
    };
    assert_eq!(sums(&a), sums(&z));
}

#[test]
fn bad_importance_matrices_are_refused_by_name_and_nothing_is_written() {
    let out = TempPath::new("imatrix-bad-out.gguf");
    let o_path = out.to_str().unwrap();
    let gemma3 = fixture("gemma3-F32.gguf");
    let g = gemma3.to_str().unwrap();
    let quantize = |imatrix: &Path, preset: &str| {
        llamay(&[
            "quantize",
            "--imatrix",
            imatrix.to_str().unwrap(),
            g,
            o_path,
            preset,
        ])
    };
    // Another model's importance matrix: the sizes do not fit.
    let e = error_line(&quantize(&data().join("llama.gguf"), "Q4_K_M"));
    assert!(
        e.contains("imatrix size") && e.contains("another model"),
        "{e}"
    );
    assert!(!out.exists());
    // A truncated file, GGUF or legacy.
    let whole = std::fs::read(data().join("gemma3.gguf")).unwrap();
    let cut = TempPath::new("imatrix-cut.gguf");
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let e = error_line(&quantize(cut.as_ref(), "Q4_K_M"));
    assert!(e.contains("imatrix-cut.gguf") && e.contains("GGUF"), "{e}");
    let dat = TempPath::new("imatrix-cut.dat");
    let i = data().join("gemma3.gguf");
    ok(
        &llamay(&[
            "imatrix",
            "--in-file",
            i.to_str().unwrap(),
            "--output-format",
            "dat",
            "-o",
            dat.to_str().unwrap(),
        ]),
        "dat",
    );
    let legacy = std::fs::read(&dat).unwrap();
    std::fs::write(&dat, &legacy[..legacy.len() / 3]).unwrap();
    let e = error_line(&quantize(dat.as_ref(), "Q4_K_M"));
    assert!(e.contains("truncated or malformed legacy imatrix"), "{e}");
    // A model file given as the importance matrix.
    let e = error_line(&quantize(&gemma3, "Q4_K_M"));
    assert!(e.contains("not an importance matrix"), "{e}");
    assert!(!out.exists());
    // A preset that needs one, without one.
    let e = error_line(&llamay(&["quantize", g, o_path, "Q2_K_S"]));
    assert!(
        e.contains("requires an importance matrix") && e.contains("--imatrix"),
        "{e}"
    );
    assert!(!out.exists());
    // With it, Q2_K_S is made.
    ok(
        &quantize(&data().join("gemma3.gguf"), "Q2_K_S"),
        "Q2_K_S with an imatrix",
    );
    std::fs::remove_file(&out).unwrap();
    // An output path that is a directory, for both commands.
    let dir = TempPath::dir("imatrix-dir");
    let e = error_line(&llamay(&[
        "quantize",
        "--imatrix",
        i.to_str().unwrap(),
        g,
        dir.to_str().unwrap(),
        "Q4_K_M",
    ]));
    assert!(e.contains("is a directory"), "{e}");
    let e = error_line(&llamay(&[
        "imatrix",
        "--in-file",
        i.to_str().unwrap(),
        "-o",
        dir.to_str().unwrap(),
    ]));
    assert!(e.contains("is a directory"), "{e}");
    // No text and nothing to merge.
    let e = error_line(&llamay(&["imatrix", "-m", g, "-o", o_path]));
    assert!(e.contains("no text"), "{e}");
    assert!(!out.exists());
}
