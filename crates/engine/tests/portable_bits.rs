//! The portable kernels give the same bits on every target: each architecture
//! fixture's logits (every position of its 24-token batch, f32 KV cache), hashed as
//! little-endian f32s, equal the hashes committed in `data/portable-logits.json`,
//! which an x86-64 run wrote (`LLAMAY_BLESS=1` rewrites it). scripts/test runs this
//! natively and scripts/test-cross runs it under qemu on s390x (big-endian), riscv64
//! and ppc64le: a byte-order slip in a block decoder, or a kernel that depends on the
//! host, shows here as a different hash.
//!
//! Big-endian files (item 3 of issue 40): each of the seven formats gguf-py's
//! `gguf_convert_endian` converts, in a copy of a fixture that script turned
//! big-endian, gives the little-endian file's bits — on a little- and a big-endian
//! host alike.
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

/// Fixtures whose big-endian copies are checked: every format with a defined
/// big-endian layout that the fixtures have (BF16: none has it; its swap is F16's).
const BIG_ENDIAN: &[&str] = &[
    "llama-F32.gguf",
    "llama-F16.gguf",
    "llama-Q8_0.gguf",
    "llama-Q4_0.gguf",
    "llama-Q4_K.gguf",
    "llama-Q6_K.gguf",
    "gpt-oss-MXFP4_MOE.gguf",
];

/// The big-endian copy of fixture `name`, made once by gguf-py's own converter (from
/// the reference tree) beside the fixtures; `None` without the reference tree.
fn big_endian_copy(name: &str) -> Option<PathBuf> {
    let out = fixtures_dir().join("big-endian").join(name);
    if out.exists() {
        return Some(out);
    }
    let tree =
        llamay_synth::reference::path("LLAMAY_REF_TREE", "LLAMAY_REF_TREE=$(scripts/fetch-ref)")?;
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let tmp = out.with_extension(format!("partial-{}", std::process::id()));
    std::fs::copy(fixtures_dir().join(name), &tmp).unwrap();
    let mut child = std::process::Command::new("python3")
        .arg(tree.join("gguf-py/gguf/scripts/gguf_convert_endian.py"))
        .args([tmp.as_os_str(), "big".as_ref()])
        .env("PYTHONPATH", tree.join("gguf-py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (with numpy and tqdm, as scripts/test installs them)");
    // The script asks for "YES" before it rewrites the file.
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"YES\n").unwrap();
    let done = child.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "gguf_convert_endian on {name}: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    std::fs::rename(&tmp, &out).unwrap();
    Some(out)
}

/// A fixture's 24 tokens (arch-fixtures.json).
fn tokens_of(f: &Value) -> Vec<u32> {
    (f["tokens"].as_array().unwrap().iter())
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

fn logits_sha256(path: &Path, tokens: &[u32], threads: Threads) -> String {
    let mapped = MappedModel::open(path).unwrap();
    let gguf = mapped.parse().unwrap();
    let model = Model::load(&gguf, threads).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut ctx = model
        .context(ContextParams::new(threads, KvPrecision::F32, 64))
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
    let fixtures = doc["fixtures"].as_array().unwrap();
    // The fixtures are tiny: one model per core at a time (each on one thread) keeps
    // every core busy, which matters most under qemu.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut got: Vec<(usize, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(f) = fixtures.get(i) else { break };
                        let path = dir.join(f["file"].as_str().unwrap());
                        mine.push((i, logits_sha256(&path, &tokens_of(f), Threads(1))));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    got.sort();
    let mut hashes = Map::new();
    let mut differ = Vec::new();
    for (i, got) in got {
        let name = fixtures[i]["file"].as_str().unwrap();
        if !bless && committed["fixtures"][name].as_str() != Some(got.as_str()) {
            differ.push(name.to_string());
        }
        hashes.insert(name.to_string(), Value::String(got));
    }
    let mut big_endian = 0;
    if !bless {
        for &name in BIG_ENDIAN {
            let Some(path) = big_endian_copy(name) else {
                break;
            };
            let f = (doc["fixtures"].as_array().unwrap().iter())
                .find(|f| f["file"] == name)
                .unwrap();
            let tokens = tokens_of(f);
            let mapped = MappedModel::open(&path).unwrap();
            assert!(
                mapped.parse().unwrap().big_endian(),
                "{name}: not big-endian"
            );
            if committed["fixtures"][name].as_str()
                != Some(logits_sha256(&path, &tokens, Threads(2)).as_str())
            {
                differ.push(format!("big-endian {name}"));
            }
            big_endian += 1;
        }
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
        "{} fixtures and {big_endian} big-endian copies on {} ({}-endian): {} differ from {}'s bits",
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
