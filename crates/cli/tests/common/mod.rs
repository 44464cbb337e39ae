//! Helpers shared by the CLI tests that run the generated architecture fixtures.
#![allow(dead_code)]

use llamay_gguf::{GgufFile, GgufWriter, Value};
pub use llamay_synth::TempPath;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fixture written by scripts/gen-arch-fixtures into `$LLAMAY_FIXTURES`
/// (default `~/.cache/llamay/fixtures`).
pub fn fixture(name: &str) -> PathBuf {
    let dir = std::env::var_os("LLAMAY_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/llamay/fixtures")
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} missing: run scripts/gen-arch-fixtures",
        p.display()
    );
    p
}

pub fn llamay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args(args)
        .output()
        .expect("run llamay")
}

/// stdout of a run that must succeed.
pub fn ok_stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// A copy of `src` with `template` as its `tokenizer.chat_template`, in the temp dir
/// under a name with `tag` (tests running in parallel use different tags).
pub fn with_template(src: &Path, tag: &str, template: &str) -> TempPath {
    let bytes = std::fs::read(src).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata.iter() {
        if k != "tokenizer.chat_template" {
            w.add_kv(k, v.clone()).unwrap();
        }
    }
    w.add_kv("tokenizer.chat_template", Value::String(template.into()))
        .unwrap();
    for t in &f.tensors {
        w.add_tensor(t.name, t.ty, &t.shape).unwrap();
    }
    let out = TempPath::new(&format!("template-{tag}.gguf"));
    let mut file = std::fs::File::create(&out).unwrap();
    w.write(&mut file, |i| Ok(Cow::Borrowed(f.tensors[i].data)))
        .unwrap();
    out
}

/// A file in the temp dir holding `text`, removed when the guard drops.
pub fn temp_file(name: &str, text: &str) -> TempPath {
    TempPath::file(name, text)
}

/// Whether a usable Vulkan device is here. Under the test command (which installs
/// lavapipe) its absence fails the test; elsewhere the test is skipped with a reason.
pub fn vulkan_device() -> bool {
    match llamay_vulkan::probe() {
        Ok(d) if d.iter().any(|d| d.unusable.is_none()) => true,
        other => {
            assert!(
                std::env::var_os("LLAMAY_REQUIRE_REFERENCE").is_none(),
                "no Vulkan device ({:?}); scripts/test installs lavapipe",
                other.err()
            );
            eprintln!("skipped: no Vulkan device");
            false
        }
    }
}

/// A statistic's value from a perplexity report: the number after `label`.
pub fn stat(report: &str, label: &str) -> f64 {
    let line = report
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} in:\n{report}"));
    line[label.len()..]
        .trim_start_matches([' ', ':'])
        .split([' ', '%'])
        .find(|s| !s.is_empty())
        .unwrap()
        .parse()
        .unwrap()
}
