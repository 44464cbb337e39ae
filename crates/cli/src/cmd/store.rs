//! `llamay pull`, `list`, `rm` (cli.md): the local model store.

// A wasm32 build refuses the networked part by name (crate::left_out); what only it
// uses is unused there.
#![cfg_attr(target_family = "wasm", allow(dead_code, unused_imports))]

use anyhow::Context;
#[cfg(not(target_family = "wasm"))]
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
#[cfg(not(target_family = "wasm"))]
use llamay_hub::PullOptions;
use llamay_hub::Store;
#[cfg(not(target_family = "wasm"))]
use std::io::IsTerminal;
use std::io::Write;

#[derive(clap::Args)]
pub struct PullArgs {
    /// What to fetch: NAME[:TAG], [HOST/]NAMESPACE/NAME[:TAG], hf.co/OWNER/REPO[:QUANT],
    /// hf:OWNER/REPO/FILE.gguf[@REV], or an https:// URL.
    #[arg(value_name = "REF")]
    reference: String,
    /// Allow plain-http registries and URLs (loopback included).
    #[arg(long)]
    insecure: bool,
}

#[derive(clap::Args)]
pub struct ListArgs {}

#[derive(clap::Args)]
pub struct RmArgs {
    #[arg(value_name = "REF")]
    reference: String,
}

fn store() -> anyhow::Result<Store> {
    Ok(Store::open(Store::default_root())?)
}

/// Bytes as Ollama's `list` prints them.
fn human(n: u64) -> String {
    let (v, unit) = match n {
        n if n >= 1 << 30 => (n as f64 / (1u64 << 30) as f64, "GB"),
        n if n >= 1 << 20 => (n as f64 / (1u64 << 20) as f64, "MB"),
        n if n >= 1 << 10 => (n as f64 / (1u64 << 10) as f64, "KB"),
        n => return format!("{n} B"),
    };
    format!("{v:.1} {unit}")
}

#[cfg(target_family = "wasm")]
pub fn pull(_: &PullArgs) -> anyhow::Result<()> {
    Err(crate::left_out::network("pull"))
}

#[cfg(not(target_family = "wasm"))]
pub fn pull(args: &PullArgs) -> anyhow::Result<()> {
    let store = store()?;
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )
        .expect("a valid template"),
    );
    let opts = PullOptions::from_env(args.insecure);
    let m = llamay_hub::pull(&store, &args.reference, &opts, &mut |p| {
        bar.set_message(p.what.chars().take(19).collect::<String>());
        if let Some(t) = p.total {
            bar.set_length(t);
        }
        bar.set_position(p.done);
    })
    .with_context(|| format!("pull {}", args.reference))?;
    bar.finish_and_clear();
    let model = m.model().expect("a pulled manifest has a model layer");
    println!(
        "pulled {} ({}, {})",
        m.reference,
        human(m.size()),
        model.digest
    );
    Ok(())
}

pub fn list(_: &ListArgs) -> anyhow::Result<()> {
    let store = Store::at(Store::default_root());
    let mut out = std::io::stdout().lock();
    for m in store.list()? {
        let (y, mo, d) = llamay_template::civil_date((m.pulled / 86_400) as i64);
        let t = m.pulled % 86_400;
        writeln!(
            out,
            "{}  {}  {y:04}-{mo:02}-{d:02} {:02}:{:02}",
            m.reference,
            human(m.size()),
            t / 3600,
            t / 60 % 60
        )?;
    }
    Ok(())
}

pub fn rm(args: &RmArgs) -> anyhow::Result<()> {
    let store = Store::at(Store::default_root());
    let removed = store.remove(&args.reference)?;
    println!(
        "removed {} ({} blob{} freed)",
        args.reference,
        removed.len(),
        if removed.len() == 1 { "" } else { "s" }
    );
    Ok(())
}
