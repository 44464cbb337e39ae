//! The architecture's boundaries, kept by a test (docs/ARCHITECTURE.md): every crate is
//! in the code map, and the dependency rules hold — the engine knows no HTTP and no
//! chat templates, the hub no forward pass, formats and kernels no models.

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .parent()
        .unwrap()
}

/// The `[dependencies]` names of a crate's manifest (not dev-dependencies).
fn deps(krate: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(root().join("crates").join(krate).join("Cargo.toml")).unwrap();
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = l == "[dependencies]";
            continue;
        }
        if in_deps && let Some((name, _)) = l.split_once('=') {
            out.push(name.trim().split('.').next().unwrap().to_string());
        }
    }
    out
}

#[test]
fn every_crate_is_in_the_code_map() {
    let map = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let members = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let line = members.lines().find(|l| l.starts_with("members")).unwrap();
    for m in line.split('"').filter(|s| s.starts_with("crates/")) {
        assert!(
            map.contains(&format!("`{m}`")),
            "docs/ARCHITECTURE.md's code map lacks `{m}`"
        );
    }
}

#[test]
fn dependency_boundaries_hold() {
    let forbidden: &[(&str, &[&str])] = &[
        (
            "engine",
            &[
                "reqwest",
                "llamay-hub",
                "llamay-template",
                "llamay-tokenizer",
                "minijinja",
            ],
        ),
        (
            "hub",
            &[
                "llamay-engine",
                "llamay-kernels",
                "llamay-tokenizer",
                "llamay-template",
            ],
        ),
        ("template", &["llamay-engine", "llamay-hub", "reqwest"]),
        (
            "formats",
            &["llamay-engine", "llamay-gguf", "llamay-tokenizer"],
        ),
        (
            "kernels",
            &["llamay-engine", "llamay-gguf", "llamay-tokenizer"],
        ),
        ("gguf", &["llamay-engine", "llamay-kernels", "reqwest"]),
    ];
    // The reader sees real dependencies (or the rules below check nothing).
    assert!(deps("engine").contains(&"llamay-kernels".to_string()));
    assert!(deps("hub").contains(&"reqwest".to_string()));
    for (krate, bad) in forbidden {
        let d = deps(krate);
        for b in *bad {
            assert!(
                !d.iter().any(|x| x == b),
                "crates/{krate} must not depend on {b}"
            );
        }
    }
}
