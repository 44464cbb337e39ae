//! The command-line contract (docs/cli.md) for info, dump and quantize: output
//! shapes, exit codes, one `error:` line on failure, never a panic.

mod common;

use llamay_formats::GgmlType;
use llamay_gguf::{GgufWriter, Value};
use llamay_synth::TempPath;
use serde_json::Value as Json;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gguf/tests/data")
        .join(name)
}

fn llamay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args(args)
        .output()
        .expect("run llamay")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Exit 1, and exactly one stderr line, starting `error:`.
fn assert_error(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
}

fn temp(name: &str) -> TempPath {
    TempPath::new(&format!("cli-{name}"))
}

/// A small model file: F32 matrices and a norm, with whatever architecture is given.
fn write_model(path: &Path, arch: &str, tensors: &[(&str, GgmlType, Vec<u64>, Vec<u8>)]) {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String(arch.into()))
        .unwrap();
    w.add_kv("general.file_type", Value::U32(0)).unwrap();
    for (name, ty, shape, _) in tensors {
        w.add_tensor(name, *ty, shape).unwrap();
    }
    let mut f = std::fs::File::create(path).unwrap();
    w.write(&mut f, |i| Ok(Cow::Owned(tensors[i].3.clone())))
        .unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The dumped values, read back as f32 (the text is the f32's shortest form).
fn dump(path: &Path, tensor: &str, count: Option<&str>) -> Vec<f32> {
    let p = path.to_str().unwrap();
    let mut args = vec!["dump", "-m", p, "--tensor", tensor];
    if let Some(c) = count {
        args.extend(["--count", c]);
    }
    let o = llamay(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice::<Vec<f64>>(&o.stdout)
        .unwrap()
        .into_iter()
        .map(|v| v as f32)
        .collect()
}

#[test]
fn info_text() {
    let o = llamay(&[
        "info",
        fixture("gguf-py-le.gguf").to_str().unwrap(),
        "--tensors",
    ]);
    assert!(o.status.success());
    let s = stdout(&o);
    assert!(s.contains("architecture    testarch"), "{s}");
    assert!(
        s.contains("runnable        no: unknown architecture 'testarch'"),
        "{s}"
    );
    assert!(s.contains("t.q4_k") && s.contains("Q4_K"), "{s}");
    assert!(o.stderr.is_empty());
}

#[test]
fn info_json_contract() {
    let o = llamay(&[
        "info",
        "-m",
        fixture("gguf-py-le.gguf").to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success());
    let j: Json = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["gguf_version"], 3);
    assert_eq!(j["architecture"], "testarch");
    assert_eq!(j["metadata"]["test.u32"], 4000000000u64);
    assert_eq!(j["metadata"]["test.string"], "héllo wörld ✓ 日本語 😀");
    assert_eq!(j["metadata_types"]["test.array.i16"], "array of 2 i16");
    assert_eq!(j["runnable"], false);
    assert!(j["refusal"].as_str().unwrap().contains("testarch"));
    assert!(j["unread"].as_array().unwrap().is_empty());
    assert!(j["tokenizer"].is_null(), "the file has no tokenizer");
    let tensors = j["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 5);
    let q8 = &tensors[3];
    assert_eq!(q8["name"], "t.q8_0");
    assert_eq!(q8["type"], "Q8_0");
    assert_eq!(q8["shape"], serde_json::json!([64, 2]));
    assert_eq!(q8["n_bytes"], 136);
    assert!(q8["offset"].is_u64());
}

#[test]
fn info_json_shortens_long_arrays_unless_asked() {
    let path = temp("long-array.gguf");
    let mut w = GgufWriter::new();
    let vals: Vec<u32> = (0..1000).collect();
    w.add_kv("a.long", Value::Array(llamay_gguf::Array::from_u32s(&vals)))
        .unwrap();
    let mut f = std::fs::File::create(&path).unwrap();
    w.write(&mut f, |_| unreachable!()).unwrap();
    let p = path.to_str().unwrap();
    let short: Json = serde_json::from_slice(&llamay(&["info", p, "--json"]).stdout).unwrap();
    assert_eq!(short["metadata"]["a.long"]["len"], 1000);
    assert_eq!(
        short["metadata"]["a.long"]["head"]
            .as_array()
            .unwrap()
            .len(),
        64
    );
    let full: Json =
        serde_json::from_slice(&llamay(&["info", p, "--json", "--full-arrays"]).stdout).unwrap();
    assert_eq!(full["metadata"]["a.long"].as_array().unwrap().len(), 1000);
    assert_eq!(
        full["refusal"],
        "the file holds no tensors and no general.architecture (a vocabulary-only file)"
    );
}

/// A vocabulary-only file: byte-level BPE with `model` and `pre`.
fn write_vocab(path: &Path, model: &str, pre: &str) {
    let mut w = GgufWriter::new();
    w.add_kv("tokenizer.ggml.model", Value::String(model.into()))
        .unwrap();
    w.add_kv("tokenizer.ggml.pre", Value::String(pre.into()))
        .unwrap();
    let tokens = ["a", "b", "ab"].map(Into::into).to_vec();
    w.add_kv(
        "tokenizer.ggml.tokens",
        Value::Array(llamay_gguf::Array::strings(tokens)),
    )
    .unwrap();
    w.add_kv(
        "tokenizer.ggml.merges",
        Value::Array(llamay_gguf::Array::strings(vec!["a b".into()])),
    )
    .unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    w.write(&mut f, |_| unreachable!()).unwrap();
}

#[test]
fn info_reports_the_loaded_tokenizer() {
    let path = temp("vocab-guessed.gguf");
    write_vocab(&path, "gpt2", "no-such-pre");
    let p = path.to_str().unwrap();
    let o = llamay(&["info", p]);
    assert!(o.status.success());
    let s = stdout(&o);
    assert!(
        s.contains("tokenizer       gpt2, 3 tokens, pre no-such-pre (llama3; GUESSED), 1 merges, chat template: no"),
        "{s}"
    );
    let j: Json = serde_json::from_slice(&llamay(&["info", p, "--json"]).stdout).unwrap();
    assert_eq!(
        j["tokenizer"],
        serde_json::json!({
            "model": "gpt2",
            "pre": "no-such-pre",
            "pre_known": false,
            "rule_set": "llama3",
            "n_tokens": 3,
            "notes": ["tokenizer.ggml.pre = \"no-such-pre\" names no pre-tokenizer rule set this build implements; tokenising under a guess (llama3); ids may differ from the model's training"],
        })
    );
    assert_eq!(j["runnable"], false);

    // a tokenizer that does not load: null, and the text line shows the metadata
    let bad = temp("vocab-bad.gguf");
    write_vocab(&bad, "no-such-model", "x");
    let b = bad.to_str().unwrap();
    let s = stdout(&llamay(&["info", b]));
    assert!(
        s.contains("tokenizer       no-such-model, 3 tokens, pre x, 1 merges"),
        "{s}"
    );
    let j: Json = serde_json::from_slice(&llamay(&["info", b, "--json"]).stdout).unwrap();
    assert!(j["tokenizer"].is_null());
}

#[test]
fn info_refuses_unreadable_types_by_name() {
    let path = temp("iq1s.gguf");
    write_model(
        &path,
        "llama",
        &[(
            "blk.0.attn_q.weight",
            GgmlType::IQ1_S,
            vec![256, 1],
            vec![0; 50],
        )],
    );
    let o = llamay(&["info", path.to_str().unwrap(), "--json"]);
    assert!(
        o.status.success(),
        "a well-formed file exits 0 even when not runnable"
    );
    let j: Json = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["runnable"], false);
    let why = j["refusal"].as_str().unwrap();
    assert!(
        why.contains("IQ1_S") && why.contains("blk.0.attn_q.weight") && why.contains("Q4_K"),
        "{why}"
    );
}

#[test]
fn malformed_files_are_one_error_line_naming_the_offset() {
    let bytes = std::fs::read(fixture("gguf-py-le.gguf")).unwrap();
    let path = temp("truncated.gguf");
    // The last 16 bytes are padding after the last tensor: cut into its data instead.
    for len in [
        0usize,
        3,
        4,
        10,
        24,
        40,
        100,
        500,
        1000,
        1500,
        bytes.len() - 17,
    ] {
        std::fs::write(&path, &bytes[..len]).unwrap();
        let o = llamay(&["info", path.to_str().unwrap()]);
        assert_error(&o, if len == 0 { "file is empty" } else { "at byte" });
        let o = llamay(&["dump", path.to_str().unwrap(), "--tensor", "t.f32"]);
        assert_eq!(o.status.code(), Some(1));
    }
    let o = llamay(&["info", "/nonexistent/model.gguf"]);
    assert_error(&o, "No such file");
}

#[test]
fn dump_f32_f16_in_both_byte_orders() {
    let le = fixture("gguf-py-le.gguf");
    let be = fixture("gguf-py-be.gguf");
    let bytes = std::fs::read(&le).unwrap();
    let file = llamay_gguf::GgufFile::parse(&bytes).unwrap();
    let want: Vec<f32> = file
        .tensor("t.f32")
        .unwrap()
        .data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(dump(&le, "t.f32", None), want);
    assert_eq!(dump(&be, "t.f32", None), want);
    assert_eq!(dump(&le, "t.f32", Some("3")), want[..3]);
    assert_eq!(dump(&le, "t.f16", None).len(), 32);
    assert_eq!(dump(&le, "t.f16", None), dump(&be, "t.f16", None));
}

#[test]
fn dump_q8_0_is_scale_times_quant() {
    let le = fixture("gguf-py-le.gguf");
    let bytes = std::fs::read(&le).unwrap();
    let file = llamay_gguf::GgufFile::parse(&bytes).unwrap();
    let data = file.tensor("t.q8_0").unwrap().data;
    let mut want = Vec::new();
    for block in data.chunks(34) {
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        want.extend(block[2..].iter().map(|&q| d * f32::from(q as i8)));
    }
    assert_eq!(dump(&le, "t.q8_0", None), want);
    // --count cuts inside a block.
    assert_eq!(dump(&le, "t.q8_0", Some("40")), want[..40]);
}

#[test]
fn dump_errors() {
    let le = fixture("gguf-py-le.gguf");
    let p = le.to_str().unwrap();
    assert_error(
        &llamay(&["dump", p, "--tensor", "nope"]),
        "no tensor named 'nope'",
    );
    assert_error(&llamay(&["dump", p]), "--tensor");
    assert_error(
        &llamay(&["dump", p, "--tensor", "t.f32", "--count", "-1"]),
        "error",
    );
    // A big-endian file's float tensors read as its little-endian twin's (rewritten at
    // open). Its quantised ones were written by gguf-py's GGUFWriter, which swaps
    // numpy arrays only, so their f16 scales are stored little-endian — not the layout
    // gguf_convert_endian writes and llama.cpp on a big-endian host reads, which is
    // the one llamay reads (engine test portable_bits runs such files whole).
    let be = fixture("gguf-py-be.gguf");
    for t in ["t.f32", "t.f16", "t.1d"] {
        let (a, b) = (
            llamay(&["dump", p, "--tensor", t]),
            llamay(&["dump", be.to_str().unwrap(), "--tensor", t]),
        );
        assert!(
            a.status.success() && b.status.success(),
            "{t}: {}",
            String::from_utf8_lossy(&b.stderr)
        );
        assert_eq!(a.stdout, b.stdout, "{t}");
    }
}

/// `version` lists the Vulkan devices, or says in one line why there are none; the
/// binary starts either way (the loader is opened at run time, never linked).
#[test]
fn version_reports_vulkan_with_and_without_a_loader() {
    let hidden = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .arg("version")
        .env("LLAMAY_VULKAN_LOADER", "/nonexistent/libvulkan.so.1")
        .output()
        .unwrap();
    assert!(hidden.status.success());
    let text = stdout(&hidden);
    let line = text
        .lines()
        .find(|l| l.starts_with("vulkan:"))
        .expect(&text);
    assert!(
        line.contains("no Vulkan loader: /nonexistent/libvulkan.so.1 not found"),
        "{line}"
    );
    let j: Json = serde_json::from_slice(&llamay(&["version", "--json"]).stdout).unwrap();
    assert_eq!(j["gpu_backends"]["compiled"][0], "vulkan");
    // The whole target triple, its byte order, the kernel sets built in and the one used.
    let target = j["target"].as_str().unwrap();
    assert!(
        target.starts_with(std::env::consts::ARCH) && target.matches('-').count() >= 2,
        "{target}"
    );
    let endian = if cfg!(target_endian = "big") {
        "big"
    } else {
        "little"
    };
    assert_eq!(j["endianness"], endian);
    let sets = j["kernel_sets_compiled"].as_array().unwrap();
    assert!(
        sets.contains(&Json::from("portable")) && sets.contains(&j["kernels"]),
        "{j}"
    );
    // Under the test command lavapipe is installed: it must be listed, as a CPU device.
    if std::env::var_os("LLAMAY_REQUIRE_REFERENCE").is_some() {
        let devices = j["gpu_backends"]["vulkan"]["devices"]
            .as_array()
            .expect("devices");
        assert!(
            (devices.iter())
                .any(|d| d["type"] == "CPU" && d["name"].as_str().unwrap().contains("llvmpipe")),
            "{j}"
        );
    }
}

#[test]
fn usage_errors_are_one_line_exit_1() {
    assert_error(&llamay(&["info", "--bogus"]), "--bogus");
    assert_error(&llamay(&["no-such-command"]), "no-such-command");
    assert_error(&llamay(&["info"]), "no model given");
    assert_error(&llamay(&[]), "no command given");
    let p = fixture("gguf-py-le.gguf");
    let p = p.to_str().unwrap();
    assert_error(&llamay(&["info", p, "-m", p]), "given twice");
    assert!(llamay(&["--help"]).status.success());
    assert!(llamay(&["--version"]).status.success());
}

#[test]
fn quantize_plain_types() {
    let input = temp("f32-model.gguf");
    let q: Vec<f32> = (0..64 * 4)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let norm: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 / 64.0).collect();
    write_model(
        &input,
        "llama",
        &[
            (
                "blk.0.attn_q.weight",
                GgmlType::F32,
                vec![64, 4],
                f32_bytes(&q),
            ),
            (
                "blk.0.attn_norm.weight",
                GgmlType::F32,
                vec![64],
                f32_bytes(&norm),
            ),
        ],
    );
    let cases = [
        ("Q8_0", "Q8_0", 7, 0.02),
        ("q4_k", "Q5_0", 15, 0.126),
        ("F16", "F16", 1, 0.002),
    ];
    for (target, got_type, file_type, tol) in cases {
        let out = temp(&format!("out-{target}.gguf"));
        let o = llamay(&[
            "quantize",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            target,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(o.stdout.is_empty(), "logs go to stderr");
        let j: Json =
            serde_json::from_slice(&llamay(&["info", out.to_str().unwrap(), "--json"]).stdout)
                .unwrap();
        assert_eq!(j["metadata"]["general.file_type"], file_type);
        assert_eq!(j["metadata"]["general.quantization_version"], 2);
        let type_of = |name: &str| {
            j["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == name)
                .unwrap()["type"]
                .clone()
        };
        assert_eq!(type_of("blk.0.attn_q.weight"), got_type, "{target}");
        assert_eq!(type_of("blk.0.attn_norm.weight"), "F32", "norms stay F32");
        // llama-quantize's order: by layer, then name.
        assert_eq!(j["tensors"][0]["name"], "blk.0.attn_norm.weight");
        let back = dump(&out, "blk.0.attn_q.weight", None);
        for (a, b) in back.iter().zip(&q) {
            assert!((a - b).abs() <= tol, "{target}: {a} vs {b}");
        }
        assert_eq!(
            dump(&out, "blk.0.attn_norm.weight", None),
            dump(&input, "blk.0.attn_norm.weight", None)
        );
    }
}

#[test]
fn quantize_refusals_leave_no_output() {
    let input = temp("q-refuse.gguf");
    write_model(
        &input,
        "llama",
        &[(
            "w.weight",
            GgmlType::F32,
            vec![32, 2],
            f32_bytes(&[f32::NAN; 64]),
        )],
    );
    let i = input.to_str().unwrap();
    let out = temp("q-refuse-out.gguf");
    let o = out.to_str().unwrap();
    // A row of 256 (a short one falls back to Q4_0, which needs no importance matrix).
    let wide = temp("q-refuse-wide.gguf");
    write_model(
        &wide,
        "llama",
        &[(
            "w.weight",
            GgmlType::F32,
            vec![256, 2],
            f32_bytes(&[0.5; 512]),
        )],
    );
    assert_error(
        &llamay(&["quantize", wide.to_str().unwrap(), o, "Q2_K_S"]),
        "requires an importance matrix",
    );
    assert_error(
        &llamay(&["quantize", i, o, "TQ2_0"]),
        "does not write the 1-bit i-quants, ternary",
    );
    assert_error(&llamay(&["quantize", i, "/", "Q8_0"]), "is a directory");
    assert_error(
        &llamay(&["quantize", i, o, "Q8_0", "--tensor-type", "attn(=Q4_K"]),
        "not a regex",
    );
    assert_error(
        &llamay(&["quantize", i, o, "Q8_0", "--override-kv", "a.b=int:x"]),
        "not an integer",
    );
    assert_error(
        &llamay(&["quantize", i, o, "Q8_0", "--imatrix", "x.dat"]),
        "--imatrix",
    );
    assert_error(&llamay(&["quantize", i, o, "Q8_0"]), "NaN");
    assert_error(&llamay(&["quantize", i, i, "Q8_0"]), "same file");
    assert_error(
        &llamay(&["quantize", "/nonexistent.gguf", o, "Q8_0"]),
        "No such file",
    );
    assert!(!out.exists(), "no partial output");
    let leftovers: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        // This file's temporaries only: other tests write beside it at the same time.
        .filter(|e| (e.file_name().to_string_lossy()).starts_with(".q-refuse-out.gguf.partial-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files removed");
}

/// `info` on a file of every table row with every optional tensor (GPT-2, GPT-NeoX and
/// Phi-2 with their fused QKV bias exited 101 with a backtrace before), then with each
/// matrix given a zero dimension: runnable, or an `error:`-free refusal naming the
/// tensor, never a panic.
#[test]
fn info_on_every_row_with_every_optional_tensor_and_zero_dimensions() {
    use llamay_synth::{Dims, ModelFile, RopeFactors, Spec};
    for arch in llamay_engine::ARCHITECTURES {
        let spec = Spec {
            dims: Dims::TINY,
            all_optional: true,
            rope_factors: RopeFactors::None,
            ..Spec::new(arch)
        };
        // `info --json` on `file`, written as `<arch>-<name>.gguf`: exit 0, its JSON.
        let info = |file: &ModelFile, name: &str| -> Json {
            let path = temp(&format!("{}-{name}.gguf", arch.name));
            std::fs::write(&path, file.write().unwrap()).unwrap();
            let o = llamay(&["info", "--json", "-m", path.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(0), "{}: {err}", arch.name);
            serde_json::from_str(&stdout(&o)).unwrap()
        };
        let full = ModelFile::new(&spec);
        let j = info(&full, "full");
        assert_eq!(
            j["runnable"],
            Json::Bool(true),
            "{}: {}",
            arch.name,
            j["refusal"]
        );

        let i = full
            .tensors
            .iter()
            .position(|t| t.shape.len() == 2)
            .unwrap();
        let mut zero = full.clone();
        zero.tensors[i].shape[1] = 0;
        let j = info(&zero, "zero");
        assert_eq!(j["runnable"], Json::Bool(false), "{}", arch.name);
        let why = j["refusal"].as_str().unwrap_or_default();
        assert!(why.contains(&zero.tensors[i].name), "{}: {why}", arch.name);
    }
}

/// `detokenize` gives back exactly the text `tokenize` was given, on a BPE vocabulary
/// whose llama.cpp detokenizer cleans up spaces (" ," becomes ","); `--clean-spaces`
/// asks for that clean-up.
#[test]
fn detokenize_is_exact_unless_asked_to_clean_spaces() {
    let Some(tree) =
        llamay_synth::reference::path("LLAMAY_REF_TREE", "LLAMAY_REF_TREE=$(scripts/fetch-ref)")
    else {
        return;
    };
    let vocab = tree.join("models/ggml-vocab-gpt-2.gguf");
    let vocab = vocab.to_str().unwrap();
    let text = "Hello , world . It 's here !";
    let ids = stdout(&llamay(&[
        "tokenize", "-m", vocab, "--ids", "--no-bos", "-p", text,
    ]));
    let detok = |extra: &[&str]| {
        let mut args = vec!["detokenize", "-m", vocab];
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_llamay"))
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(ids.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0));
        stdout(&o)
    };
    assert_eq!(detok(&[]), text);
    assert_eq!(detok(&["--clean-spaces"]), "Hello, world. It's here!");
}

/// llama-quantize's flags (`--pure`, `--leave-output-tensor`, `--output-tensor-type`,
/// `--token-embedding-type`, `--tensor-type`, `--override-kv`, `--prune-layers`) give its
/// file byte for byte: the sha256 of llama-quantize b11434's output for each case is
/// recorded in `data/quantize-flags.json` by `scripts/check-quantize-vs-llamacpp
/// --flag-cases`, which runs both tools; here the same command line must hash the same.
/// `--keep-split` on split sets (scripts/split-gguf: gguf-py's writer, 5 tensors per
/// shard) gives llama-quantize's shards, every one byte for byte
/// (data/quantize-keep-split.json, recorded by scripts/check-quantize-vs-llamacpp
/// --keep-split-cases; the cases where llama-quantize itself crashes are not compared).
#[test]
fn quantize_keep_split_gives_llama_quantizes_shards() {
    use sha2::Digest;
    let Some(tree) =
        llamay_synth::reference::path("LLAMAY_REF_TREE", "LLAMAY_REF_TREE=$(scripts/fetch-ref)")
    else {
        return;
    };
    let doc: Json = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quantize-keep-split.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let dir = TempPath::dir("cli-keep-split");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/split-gguf");
    let mut split = std::collections::HashMap::new();
    let mut checked = 0;
    for case in doc["cases"].as_array().unwrap() {
        if case.get("llama_quantize_crashed").is_some() {
            continue;
        }
        let base = case["fixture"].as_str().unwrap();
        let first = split.entry(base.to_string()).or_insert_with(|| {
            let out = dir.join(format!("{base}.gguf"));
            let made = Command::new(&script)
                .arg(common::fixture(&format!("{base}-F32.gguf")))
                .arg(&out)
                .arg("5")
                .env("LLAMAY_REF_TREE", &tree)
                .output()
                .unwrap();
            assert!(
                made.status.success(),
                "{}",
                String::from_utf8_lossy(&made.stderr)
            );
            let mut shards: Vec<_> = std::fs::read_dir(&*dir)
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(&format!("{base}-0"))
                })
                .collect();
            shards.sort();
            shards[0].clone()
        });
        let outdir = TempPath::dir(&format!("cli-keep-split-out-{checked}"));
        let flags: Vec<&str> = (case["flags"].as_array().unwrap().iter())
            .map(|f| f.as_str().unwrap())
            .collect();
        let out = outdir.join("ours.gguf");
        let mut args = vec!["quantize", "--keep-split"];
        args.extend(&flags);
        let preset = case["preset"].as_str().unwrap();
        args.extend([first.to_str().unwrap(), out.to_str().unwrap(), preset, "1"]);
        let o = llamay(&args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let want = case["shards"].as_object().unwrap();
        let written = std::fs::read_dir(&*outdir).unwrap().count();
        assert_eq!(written, want.len(), "{args:?}: shard count");
        for (name, sha) in want {
            let got = std::fs::read(outdir.join(format!("ours-{name}"))).unwrap();
            let got = format!("{:x}", sha2::Sha256::digest(got));
            assert_eq!(got, sha.as_str().unwrap(), "{args:?}: shard {name}");
        }
        checked += 1;
    }
    assert_eq!(checked, 16);
}

#[test]
fn quantize_flags_give_llama_quantizes_file() {
    use sha2::Digest;
    let doc: Json = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quantize-flags.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let out = temp("quantize-flags-out.gguf");
    let mut checked = 0;
    for case in doc["cases"].as_array().unwrap() {
        let input = common::fixture(&format!("{}-F32.gguf", case["fixture"].as_str().unwrap()));
        let flags: Vec<&str> = (case["flags"].as_array().unwrap().iter())
            .map(|f| f.as_str().unwrap())
            .collect();
        let preset = case["preset"].as_str().unwrap();
        let mut args = vec!["quantize"];
        args.extend(&flags);
        args.extend([input.to_str().unwrap(), out.to_str().unwrap(), preset, "1"]);
        let o = llamay(&args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got = format!("{:x}", sha2::Sha256::digest(std::fs::read(&out).unwrap()));
        assert_eq!(
            got,
            case["sha256"].as_str().unwrap(),
            "{args:?}: not llama-quantize's file"
        );
        checked += 1;
    }
    assert_eq!(checked, 60);

    // --dry-run: the same plan and sizes, nothing written.
    let input = common::fixture("llama-F32.gguf");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let _ = std::fs::remove_file(&out);
    let dry = llamay(&["quantize", "--dry-run", i, o, "Q4_K_M"]);
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(!out.exists(), "a dry run writes nothing");
    let real = llamay(&["quantize", i, o, "Q4_K_M"]);
    let lines = |o: &Output| -> Vec<String> {
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .filter(|l| l.contains(" -> "))
            .map(|l| {
                l.split(" in ")
                    .next()
                    .unwrap()
                    .replace("dry run: ", "")
                    .replace("quantized ", "")
            })
            .map(|l| l.split("; ").next().unwrap().to_string())
            .collect()
    };
    assert_eq!(lines(&dry), lines(&real));
}
