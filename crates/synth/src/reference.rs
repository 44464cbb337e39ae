//! Reference data the tests need from outside the repository (the llama.cpp tree, the
//! Gemma file, the built reference tools), found through environment variables. The
//! test command (scripts/test, hence CI) sets `LLAMAY_REQUIRE_REFERENCE=1`: there a
//! missing variable fails the test. Elsewhere (a developer's `cargo test`) the test is
//! skipped with a printed reason.

use std::path::PathBuf;

/// The path in `var`, or `None` (after printing why the test is skipped) when it is
/// unset outside the test command. `how` says how to set it.
pub fn path(var: &str, how: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    let required = std::env::var_os("LLAMAY_REQUIRE_REFERENCE").is_some_and(|v| v != "0")
        || std::env::var_os("CI").is_some();
    if required {
        panic!("{var} is not set, and this run requires the reference data: {how}");
    }
    eprintln!("skipped: {var} is not set ({how}; scripts/test sets it)");
    None
}
