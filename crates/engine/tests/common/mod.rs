//! Helpers shared by the engine tests that run the generated architecture fixtures.
#![allow(dead_code)]

use std::path::PathBuf;

/// Where scripts/gen-arch-fixtures writes: `$LLAMAY_FIXTURES`, default
/// `~/.cache/llamay/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("LLAMAY_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/llamay/fixtures")
        })
}

/// One fixture, which must exist.
pub fn fixture(name: &str) -> PathBuf {
    let p = fixtures_dir().join(name);
    assert!(
        p.exists(),
        "{} missing: generate the fixtures with scripts/gen-arch-fixtures",
        p.display()
    );
    p
}
