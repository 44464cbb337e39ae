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

/// The `[dependencies]` names of a crate's manifest, target-specific ones included
/// (`[target.'cfg(…)'.dependencies]`; not dev-dependencies).
fn deps(krate: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(root().join("crates").join(krate).join("Cargo.toml")).unwrap();
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = l == "[dependencies]"
                || (l.starts_with("[target.") && l.ends_with(".dependencies]"));
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
                "llamay-server",
                "axum",
                "tokio",
            ],
        ),
        (
            "hub",
            &[
                "llamay-engine",
                "llamay-kernels",
                "llamay-tokenizer",
                "llamay-template",
                "llamay-server",
            ],
        ),
        (
            "template",
            &["llamay-engine", "llamay-hub", "reqwest", "llamay-server"],
        ),
        // The server fetches through the hub, never with an HTTP client of its own.
        ("server", &["reqwest", "llamay-kernels", "llamay-cli"]),
        (
            "formats",
            &["llamay-engine", "llamay-gguf", "llamay-tokenizer"],
        ),
        (
            "kernels",
            &["llamay-engine", "llamay-gguf", "llamay-tokenizer"],
        ),
        ("gguf", &["llamay-engine", "llamay-kernels", "reqwest"]),
        // Files and sums: the forward pass reaches it through the engine's observer.
        (
            "imatrix",
            &["llamay-engine", "llamay-kernels", "llamay-tokenizer"],
        ),
        ("quantize", &["llamay-engine", "llamay-kernels"]),
        // A device crate computes; it knows no HTTP, store or chat, and the engine
        // reaches it only through the seam it owns.
        (
            "vulkan",
            &[
                "llamay-server",
                "llamay-hub",
                "llamay-template",
                "reqwest",
                "llamay-cli",
            ],
        ),
    ];
    // The reader sees real dependencies (or the rules below check nothing).
    assert!(deps("engine").contains(&"llamay-kernels".to_string()));
    assert!(deps("hub").contains(&"reqwest".to_string()));
    assert!(deps("server").contains(&"axum".to_string()));
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

/// The device API stays in its crate: only crates/vulkan names `ash` (the engine talks
/// to a device through its seam, the CLI through the device crate's own functions).
#[test]
fn only_the_device_crate_names_the_device_api() {
    let crates = std::fs::read_dir(root().join("crates")).unwrap();
    for c in crates {
        let name = c.unwrap().file_name().to_string_lossy().into_owned();
        if name == "vulkan" {
            assert!(deps(&name).contains(&"ash".to_string()));
            continue;
        }
        assert!(
            !deps(&name).iter().any(|d| d == "ash"),
            "crates/{name} depends on ash: the Vulkan API belongs to crates/vulkan"
        );
    }
}

/// Design invariant 6: the server computes on its engine threads only — no other module
/// of crates/server calls the engine's `decode` or a sampler.
#[test]
fn only_the_scheduler_decodes_and_samples() {
    let dir = root().join("crates/server/src");
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name == "scheduler.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        for bad in [".decode(", "Sampler::new", ".sample(", "sample_constrained"] {
            assert!(
                !text.contains(bad),
                "crates/server/src/{name} calls {bad}: computation belongs on the engine thread (scheduler.rs)"
            );
        }
    }
}
