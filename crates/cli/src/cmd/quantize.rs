//! `llamay quantize IN OUT TYPE`: as llama-quantize --pure, for the plain types.

use anyhow::{anyhow, bail};
use llamay_quantize::{Target, quantize_file};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Input GGUF model.
    input: PathBuf,
    /// Output GGUF file (written whole, then renamed into place).
    output: PathBuf,
    /// Target type: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K.
    #[arg(value_name = "TYPE")]
    ty: String,
    /// Importance matrix (llama-imatrix format).
    #[arg(long, value_name = "FILE")]
    imatrix: Option<PathBuf>,
    /// Worker threads (default: available cores).
    #[arg(short = 't', long, value_name = "N")]
    threads: Option<usize>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let target = Target::parse(&args.ty).map_err(|e| anyhow!(e))?;
    if args.imatrix.is_some() {
        bail!(
            "--imatrix is not supported yet: this build writes llama.cpp's reference (unweighted) quantisations; run without --imatrix"
        );
    }
    if args.input == args.output {
        bail!("input and output are the same file; choose another output path");
    }
    let threads = crate::session::threads(args.threads)?.0;
    let start = Instant::now();
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    let reports = quantize_file(&args.input, &args.output, target, threads, |r| {
        bytes_in += r.n_bytes_in;
        bytes_out += r.n_bytes_out;
        let note = r
            .note
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        eprintln!(
            "{:<40} {:>7} -> {:<7}{note}",
            r.name,
            r.from.name(),
            r.to.name()
        );
    })?;
    eprintln!(
        "quantized {} tensors to {}: {:.2} MiB -> {:.2} MiB in {:.1} s; wrote {}",
        reports.len(),
        target.ty,
        bytes_in as f64 / (1 << 20) as f64,
        bytes_out as f64 / (1 << 20) as f64,
        start.elapsed().as_secs_f64(),
        args.output.display()
    );
    Ok(())
}
