//! `llamay quantize [FLAGS] IN [OUT] TYPE [THREADS]`: llama-quantize's presets, flags and
//! file, byte for byte.

use anyhow::{anyhow, bail};
use llamay_quantize::{ImportanceMatrix, KvOverride, Request, parse_type, quantize_file};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Input GGUF model.
    input: PathBuf,
    /// Output GGUF file (written whole, then renamed into place), then the type, then
    /// optionally the thread count — llama-quantize's `IN [OUT] TYPE [THREADS]`; without
    /// OUT the file is `ggml-model-TYPE.gguf` beside the input.
    #[arg(value_name = "OUT TYPE [THREADS]", num_args = 1..=3, required = true)]
    rest: Vec<String>,
    /// Every quantisable tensor gets TYPE's default type (no per-tensor mixture).
    #[arg(long)]
    pure: bool,
    /// Convert tensors that are already quantised (precision is lost twice).
    #[arg(long)]
    allow_requantize: bool,
    /// Keep output.weight as it is.
    #[arg(long)]
    leave_output_tensor: bool,
    /// The type of output.weight (and of a tied token embedding).
    #[arg(long, value_name = "TYPE")]
    output_tensor_type: Option<String>,
    /// The type of token_embd.weight.
    #[arg(long, value_name = "TYPE")]
    token_embedding_type: Option<String>,
    /// PATTERN=TYPE: tensors whose name matches the regex PATTERN get TYPE (first match
    /// wins; repeatable).
    #[arg(long, value_name = "PATTERN=TYPE")]
    tensor_type: Vec<String>,
    /// A file of PATTERN=TYPE entries separated by whitespace.
    #[arg(long, value_name = "FILE")]
    tensor_type_file: Option<PathBuf>,
    /// KEY=TYPE:VALUE (TYPE int, float, bool or str): set a metadata key (repeatable).
    #[arg(long, value_name = "KEY=TYPE:VALUE")]
    override_kv: Vec<String>,
    /// Leave these blocks out (comma-separated numbers; the later blocks renumbered).
    #[arg(long, value_name = "N,N,...")]
    prune_layers: Option<String>,
    /// Print each tensor's type and the sizes; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Write one file per input shard (OUT-00001-of-0000N.gguf), as the input is split.
    #[arg(long)]
    keep_split: bool,
    /// Importance matrix (`llamay imatrix`'s or llama-imatrix's file, GGUF or legacy
    /// .dat): the quantisers weigh each column's error by it.
    #[arg(long, value_name = "FILE")]
    imatrix: Option<PathBuf>,
    /// Use the importance matrix only for tensors whose name contains this (repeatable).
    #[arg(
        long,
        value_name = "NAME",
        requires = "imatrix",
        conflicts_with = "exclude_weights"
    )]
    include_weights: Vec<String>,
    /// Do not use the importance matrix for tensors whose name contains this (repeatable).
    #[arg(long, value_name = "NAME", requires = "imatrix")]
    exclude_weights: Vec<String>,
    /// Worker threads (default: available cores).
    #[arg(short = 't', long, value_name = "N")]
    threads: Option<usize>,
}

/// (output, type name, threads) from llama-quantize's positional forms.
fn positionals(input: &Path, rest: &[String]) -> anyhow::Result<(PathBuf, String, Option<usize>)> {
    let threads = |s: &String| {
        s.parse::<usize>()
            .map_err(|_| anyhow!("invalid thread count '{s}'"))
    };
    let is_type = |s: &str| llamay_quantize::Ftype::parse(s).is_ok();
    match rest {
        [ty] => Ok((default_output(input, ty), ty.clone(), None)),
        [a, b] if is_type(a) && !is_type(b) && b.parse::<usize>().is_ok() => {
            Ok((default_output(input, a), a.clone(), Some(threads(b)?)))
        }
        [out, ty] => Ok((PathBuf::from(out), ty.clone(), None)),
        [out, ty, n] => Ok((PathBuf::from(out), ty.clone(), Some(threads(n)?))),
        _ => bail!("expected IN [OUT] TYPE [THREADS]"),
    }
}

/// llama-quantize's name when no output is given: `ggml-model-TYPE.gguf` beside the input.
fn default_output(input: &Path, ty: &str) -> PathBuf {
    let name = format!("ggml-model-{}.gguf", ty.to_ascii_uppercase());
    input
        .parent()
        .map_or_else(|| PathBuf::from(&name), |d| d.join(&name))
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let (output, ty, positional_threads) = positionals(&args.input, &args.rest)?;
    let mut request = Request::named(&ty).map_err(|e| anyhow!(e))?;
    if let Some(path) = &args.imatrix {
        request.imatrix =
            ImportanceMatrix::load(path, &args.include_weights, &args.exclude_weights)?;
        match &request.imatrix {
            Some(m) => eprintln!(
                "imatrix: {} entries from {} computed on {} chunks",
                m.weights.len(),
                path.display(),
                m.chunk_count
            ),
            None => eprintln!("imatrix: no entry of {} left to use", path.display()),
        }
    }
    let o = &mut request.overrides;
    o.pure = args.pure;
    o.leave_output = args.leave_output_tensor;
    o.output = args
        .output_tensor_type
        .as_deref()
        .map(|t| parse_type("--output-tensor-type", t))
        .transpose()
        .map_err(|e| anyhow!(e))?;
    o.token_embedding = args
        .token_embedding_type
        .as_deref()
        .map(|t| parse_type("--token-embedding-type", t))
        .transpose()
        .map_err(|e| anyhow!(e))?;
    let from_file = match &args.tensor_type_file {
        Some(f) => std::fs::read_to_string(f)
            .map_err(|e| anyhow!("--tensor-type-file {}: {e}", f.display()))?
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        None => Vec::new(),
    };
    for s in args.tensor_type.iter().chain(&from_file) {
        o.add_tensor_type(s).map_err(|e| anyhow!(e))?;
    }
    request.allow_requantize = args.allow_requantize;
    request.dry_run = args.dry_run;
    request.keep_split = args.keep_split;
    if let Some(list) = &args.prune_layers {
        for id in list.split(',') {
            let n = id
                .trim()
                .parse::<u32>()
                .map_err(|_| anyhow!("--prune-layers: invalid layer id '{id}'"))?;
            request.prune.push(n);
        }
    }
    for s in &args.override_kv {
        request
            .kv
            .push(KvOverride::parse(s).map_err(|e| anyhow!(e))?);
    }
    if args.input == output {
        bail!("input and output are the same file; choose another output path");
    }
    if output.is_dir() {
        bail!("{} is a directory; name the output file", output.display());
    }
    let threads = crate::session::threads(args.threads.or(positional_threads))?.0;
    let start = Instant::now();
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    let reports = quantize_file(&args.input, &output, &request, threads, |r| {
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
    let (mib_in, mib_out) = (
        bytes_in as f64 / (1 << 20) as f64,
        bytes_out as f64 / (1 << 20) as f64,
    );
    let ty = ty.to_ascii_uppercase();
    if args.dry_run {
        eprintln!(
            "dry run: {} tensors as {ty}: {mib_in:.2} MiB -> {mib_out:.2} MiB; nothing written",
            reports.len()
        );
    } else {
        eprintln!(
            "quantized {} tensors as {ty}: {mib_in:.2} MiB -> {mib_out:.2} MiB in {:.1} s; wrote {}",
            reports.len(),
            start.elapsed().as_secs_f64(),
            if args.keep_split {
                llamay_quantize::split_path(&output, 0, 1)
                    .display()
                    .to_string()
                    .replace("-00001-of-00001", "-*-of-*")
            } else {
                output.display().to_string()
            }
        );
    }
    Ok(())
}
