//! The portable kernels give the same bits on every target: each architecture
//! fixture's logits (every position of its 24-token batch, f32 KV cache), hashed as
//! little-endian f32s, equal the hashes committed in `data/portable-logits.json`,
//! which an x86-64 run wrote (`LLAMAY_BLESS=1` rewrites it). scripts/test runs this
//! natively and scripts/test-cross runs it under qemu on s390x (big-endian), riscv64
//! and ppc64le: a byte-order slip in a block decoder, or a kernel that depends on the
//! host, shows here as a different hash.
//!
//! One test in its own binary, so that forcing `LLAMAY_BACKEND=portable` before the
//! kernels pick their set affects nothing else.

mod common;

use common::fixtures_dir;
use llamay_engine::{BatchToken, ContextParams, KvPrecision, Model, Threads};
use llamay_gguf::MappedModel;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn logits_sha256(path: &Path, tokens: &[u32]) -> String {
    let mapped = MappedModel::open(path).unwrap();
    let gguf = mapped.parse().unwrap();
    let model =
        Model::load(&gguf, Threads(2)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut ctx = model
        .context(ContextParams::new(Threads(2), KvPrecision::F32, 64))
        .unwrap();
    let s0 = ctx.new_sequence();
    let batch: Vec<BatchToken> = (tokens.iter().enumerate())
        .map(|(i, &token)| BatchToken {
            seq: s0,
            token,
            pos: i,
            logits: true,
        })
        .collect();
    let got = ctx.decode(&batch).unwrap();
    let mut h = Sha256::new();
    for p in 0..tokens.len() {
        for v in got.row(p) {
            h.update(v.to_le_bytes());
        }
    }
    format!("{:x}", h.finalize())
}

#[test]
fn portable_logits_are_the_same_bits_on_every_target() {
    // SAFETY: the only test in this binary, run before anything reads the environment.
    unsafe { std::env::set_var("LLAMAY_BACKEND", "portable") };
    assert_eq!(llamay_kernels::active_kernel_set().name(), "portable");

    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(data().join("arch-fixtures.json")).unwrap())
            .unwrap();
    let committed_path = data().join("portable-logits.json");
    let bless = std::env::var_os("LLAMAY_BLESS").is_some();
    let committed: Value = if bless {
        Value::Null
    } else {
        serde_json::from_str(&std::fs::read_to_string(&committed_path).unwrap()).unwrap()
    };
    let dir = fixtures_dir();
    let mut hashes = Map::new();
    let mut differ = Vec::new();
    for f in doc["fixtures"].as_array().unwrap() {
        let name = f["file"].as_str().unwrap();
        let tokens: Vec<u32> = (f["tokens"].as_array().unwrap().iter())
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let got = logits_sha256(&dir.join(name), &tokens);
        if !bless && committed["fixtures"][name].as_str() != Some(got.as_str()) {
            differ.push(name.to_string());
        }
        hashes.insert(name.to_string(), Value::String(got));
    }
    if bless {
        let out = serde_json::json!({
            "about": "sha256 of each fixture's logits (24 positions, f32 KV, little-endian f32) through the portable kernels; written by LLAMAY_BLESS=1 cargo test -p llamay-engine --test portable_bits on x86_64",
            "written_on": std::env::consts::ARCH,
            "fixtures": hashes,
        });
        std::fs::write(
            &committed_path,
            serde_json::to_string_pretty(&out).unwrap() + "\n",
        )
        .unwrap();
        eprintln!(
            "wrote {} ({} fixtures)",
            committed_path.display(),
            hashes.len()
        );
        return;
    }
    eprintln!(
        "{} fixtures on {} ({}-endian): {} differ from {}'s bits",
        hashes.len(),
        std::env::consts::ARCH,
        if cfg!(target_endian = "big") {
            "big"
        } else {
            "little"
        },
        differ.len(),
        committed["written_on"].as_str().unwrap_or("?"),
    );
    assert!(
        differ.is_empty(),
        "logits differ from the committed portable bits: {differ:?}"
    );
}
