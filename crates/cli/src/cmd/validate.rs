//! `llamay validate [--insecure] REF` (cli.md): what a remote GGUF is and whether this
//! build runs it — the engine's own verdict — from its header alone, read through
//! bounded HTTP Range requests (a few MB at most, never the whole file).

// A wasm32 build refuses the networked part by name (crate::left_out); what only it
// uses is unused there.
#![cfg_attr(target_family = "wasm", allow(dead_code, unused_imports))]

use crate::runnable;
use anyhow::Context;
use llamay_gguf::{GgufFile, MappedModel, Model as Gguf};
use llamay_hub::Reference;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(clap::Args)]
pub struct Args {
    /// A reference as for `pull`, or a local file.
    #[arg(value_name = "REF")]
    reference: String,
    /// Allow plain-http registries and URLs.
    #[arg(long)]
    insecure: bool,
}

fn report(source: &str, len: u64, gguf: &Gguf<'_>, read: Option<u64>) {
    println!("reference: {source}");
    println!(
        "size: {len} bytes ({:.1} MiB)",
        len as f64 / (1u64 << 20) as f64
    );
    let arch = gguf
        .metadata()
        .architecture()
        .ok()
        .flatten()
        .unwrap_or("(none)");
    println!("architecture: {arch}");
    let mut mix: BTreeMap<&str, usize> = BTreeMap::new();
    for t in gguf.tensors() {
        *mix.entry(t.ty.name()).or_default() += 1;
    }
    let mix: Vec<String> = mix.iter().map(|(t, n)| format!("{t} {n}")).collect();
    println!("tensors: {} ({})", gguf.tensor_count(), mix.join(", "));
    let a = runnable::assess(gguf);
    match a.refusal {
        None => println!("runs here: yes"),
        Some(why) => println!("runs here: no — {why}"),
    }
    if let Some(n) = read {
        println!("read: {n} bytes (the header)");
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if Path::new(&args.reference).is_file() {
        let mapped = MappedModel::open(Path::new(&args.reference))?;
        let gguf = mapped.parse()?;
        report(&args.reference, mapped.total_bytes(), &gguf, None);
        return Ok(());
    }
    Reference::parse_name(&args.reference)?;
    #[cfg(target_family = "wasm")]
    return Err(crate::left_out::network("validate of a remote reference"));
    #[cfg(not(target_family = "wasm"))]
    remote(args)
}

#[cfg(not(target_family = "wasm"))]
fn remote(args: &Args) -> anyhow::Result<()> {
    let opts = llamay_hub::PullOptions::from_env(args.insecure);
    let h = llamay_hub::remote_header(&args.reference, &opts)
        .with_context(|| format!("validate {}", args.reference))?;
    let file = GgufFile::parse_header(&h.bytes, h.len).with_context(|| {
        format!(
            "{}: the first {} bytes are not a GGUF header{}",
            h.url,
            h.bytes.len(),
            if h.ranged {
                ""
            } else {
                " (the server ignores Range requests)"
            }
        )
    })?;
    report(
        &args.reference,
        h.len,
        &Gguf::single(file),
        Some(h.bytes.len() as u64),
    );
    Ok(())
}
