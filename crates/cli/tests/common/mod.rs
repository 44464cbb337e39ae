//! Helpers shared by the CLI tests that run the generated architecture fixtures.
#![allow(dead_code)]

use std::path::PathBuf;
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
