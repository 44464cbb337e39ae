//! The target triple, for `llamay version` (std names only the arch and OS).
fn main() {
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=LLAMAY_TARGET={target}");
    println!("cargo:rerun-if-changed=build.rs");
}
