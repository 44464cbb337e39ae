//! `llamay imatrix`: llama-imatrix's importance matrix. The text is tokenised and cut
//! into chunks of `-c` tokens as `llamay perplexity` cuts it (BOS first in each chunk);
//! every layer runs on every token of a chunk (as llama-imatrix makes it by asking for
//! all logits; here only the scored ones are asked for), and the rows each weight
//! matrix multiplies are summed per column
//! (`llamay_imatrix::Imatrix`): Σx² and Σx, and the rows, per expert for stacked
//! expert tensors. As llama-imatrix: only the blocks' matrices unless
//! `--process-output`, products of fewer than 16 rows skipped, the perplexity of each
//! chunk's second half printed, the file saved every `--output-frequency` chunks and
//! at the end; `--in-file` adds saved files first (with no `-f`, only merges them).

use crate::ModelArg;
use crate::session;
use anyhow::{Context as _, bail};
use llamay_engine::{ActivationObserver, BatchToken, ContextParams};
use llamay_gguf::MappedModel;
use llamay_imatrix::{Format, Imatrix};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Text to run the model over.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// The importance matrix to write.
    #[arg(short = 'o', long = "output-file", default_value = "imatrix.gguf")]
    output: PathBuf,
    /// File format: gguf (llama-imatrix's default) or dat (its legacy format).
    #[arg(long, default_value = "gguf")]
    output_format: String,
    /// Chunk size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Run over at most this many chunks (default: all).
    #[arg(long)]
    chunks: Option<usize>,
    /// Skip this many chunks at the start of the text.
    #[arg(long = "chunk", value_name = "N", default_value_t = 0)]
    skip_chunks: usize,
    /// Save the file every N chunks.
    #[arg(long, default_value_t = 10)]
    output_frequency: usize,
    /// Also save a copy every N chunks as OUTPUT.at_N (0: never).
    #[arg(long, default_value_t = 0)]
    save_frequency: usize,
    /// Add a saved importance matrix first (repeatable; GGUF or legacy .dat).
    #[arg(long = "in-file", value_name = "FILE")]
    in_files: Vec<PathBuf>,
    /// Also collect output.weight (and a tied token_embd.weight).
    #[arg(long)]
    process_output: bool,
    /// Do not compute the perplexity.
    #[arg(long)]
    no_ppl: bool,
    /// Tokenise special-token text in the file as the special tokens.
    #[arg(long)]
    parse_special: bool,
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// KV cache precision (llama.cpp's default is f16).
    #[arg(long, default_value = "f16")]
    kv: String,
}

/// Sums the rows the forward pass multiplies into the shared matrix; the first error
/// (a size that changes, a non-finite sum) is kept for the command to report.
struct Collector {
    sums: Arc<Mutex<Imatrix>>,
    error: Arc<Mutex<Option<String>>>,
    process_output: bool,
}

impl ActivationObserver for Collector {
    fn matmul_input(
        &mut self,
        weight: &str,
        expert: Option<(usize, usize)>,
        x: &[f32],
        cols: usize,
    ) {
        let output = matches!(weight, "output.weight" | "token_embd.weight");
        if !(weight.starts_with("blk.") || (self.process_output && output)) || cols == 0 {
            return;
        }
        let mut m = self.sums.lock().expect("the collector's lock");
        let result = match expert {
            Some((e, n)) => {
                (x.chunks_exact(cols)).try_for_each(|row| m.add_expert_row(weight, e, n, row))
            }
            // llama-imatrix skips products of fewer than 16 rows.
            None if x.len() / cols < 16 => Ok(()),
            None => m.add_rows(weight, x, cols),
        };
        if let Err(e) = result {
            self.error
                .lock()
                .expect("the error's lock")
                .get_or_insert(e.to_string());
        }
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let format = match args.output_format.as_str() {
        "gguf" => Format::Gguf,
        "dat" => Format::Dat,
        other => bail!("--output-format {other}: gguf or dat"),
    };
    if args.output.is_dir() {
        bail!(
            "-o {}: is a directory; name the file to write",
            args.output.display()
        );
    }
    let n_ctx = args.ctx_size;
    if !(16..=1 << 20).contains(&n_ctx) {
        bail!(
            "-c {n_ctx}: the chunk size must be between 16 and {}",
            1 << 20
        );
    }
    if args.output_frequency == 0 {
        bail!("--output-frequency 0: save at least every N chunks (N ≥ 1)");
    }
    let mut sums = Imatrix::new(n_ctx as u32);
    for f in &args.in_files {
        eprintln!("imatrix: loading {}", f.display());
        let loaded = llamay_imatrix::read(f)?;
        sums.merge(loaded)
            .with_context(|| format!("--in-file {}", f.display()))?;
    }
    let Some(text_file) = &args.file else {
        if args.in_files.is_empty() {
            bail!("no text (-f FILE) and no --in-file to combine: give one or both");
        }
        save(&sums, args, format, None, None)?;
        eprintln!(
            "imatrix: {} saved ({} matrices)",
            args.output.display(),
            sums.stats.len()
        );
        return Ok(());
    };
    let dataset = text_file.to_string_lossy().into_owned();

    let path = &args.model.path()?;
    let kv = session::kv(&args.kv)?;
    let threads = session::threads(args.threads)?;
    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let (model, tok) = session::load(&mapped, &gguf, threads)?;
    if !model.config().causal {
        bail!(
            "{}: an encoder (embedding) model; imatrix runs decoder models",
            path.display()
        );
    }
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let text =
        std::fs::read(text_file).with_context(|| format!("reading {}", text_file.display()))?;
    let mut tokens = tok.encode(&text, true, args.parse_special);
    if args.skip_chunks > 0 {
        if (args.skip_chunks + 2) * n_ctx >= tokens.len() {
            bail!(
                "--chunk {}: not enough tokens left after removing {} chunks ({} tokens)",
                args.skip_chunks,
                args.skip_chunks,
                tokens.len()
            );
        }
        tokens.drain(..args.skip_chunks * n_ctx);
    }
    let n_chunk = super::perplexity::chunk_count(text_file, tokens.len(), n_ctx, args.chunks)?;
    if n_chunk == 0 {
        bail!("--chunks 0: run at least one chunk");
    }
    eprintln!(
        "imatrix: {} tokens, {n_chunk} chunks of {n_ctx}, {} threads",
        tokens.len(),
        threads.0
    );

    let shared = Arc::new(Mutex::new(sums));
    let error = Arc::new(Mutex::new(None));
    let mut ctx = model.context(ContextParams::new(threads, kv, n_ctx))?;
    ctx.observe(Some(Box::new(Collector {
        sums: shared.clone(),
        error: error.clone(),
        process_output: args.process_output,
    })))?;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut out = std::io::stdout().lock();
    let start = Instant::now();
    for i in 0..n_chunk {
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let pass = Instant::now();
        let seq = ctx.new_sequence();
        // Every layer runs on every token whatever is asked for (the engine picks the
        // rows for the head after the last layer), so only the scored positions' logits
        // are computed — every position's with --process-output, whose head input is
        // summed (llama-imatrix asks for them all, to make its last layer run on all).
        let first = n_ctx / 2;
        let batch: Vec<BatchToken> = (chunk.iter().enumerate())
            .map(|(p, &t)| BatchToken {
                seq,
                token: if p == 0 { bos.unwrap_or(t) } else { t },
                pos: p,
                logits: args.process_output || p + 1 == n_ctx || (!args.no_ppl && p >= first),
            })
            .collect();
        let logits = ctx.decode(&batch)?;
        ctx.kv_mut().free(seq)?;
        if let Some(e) = error.lock().expect("the error's lock").take() {
            bail!("{e}");
        }
        if i == 0 {
            let t = pass.elapsed().as_secs_f64();
            eprintln!(
                "imatrix: {t:.2} seconds per pass - ETA {:.2} minutes",
                t * n_chunk as f64 / 60.0
            );
        }
        if !args.no_ppl {
            for (r, &p) in logits.index.iter().enumerate() {
                if p < first || p + 1 >= n_ctx {
                    continue;
                }
                let loss = super::perplexity::token_nll(logits.row(r), chunk[p + 1]);
                nll += loss;
                nll2 += loss * loss;
                count += 1;
            }
            write!(out, "[{}]{:.4},", i + 1, (nll / count as f64).exp())?;
            out.flush()?;
        }
        let done = i + 1;
        let m = shared.lock().expect("the collector's lock");
        if done % args.output_frequency == 0 && done < n_chunk {
            save(&m, args, format, Some(&dataset), None)?;
        }
        if args.save_frequency > 0 && done % args.save_frequency == 0 {
            save(&m, args, format, Some(&dataset), Some(done))?;
        }
    }
    ctx.observe(None)?;
    let elapsed = start.elapsed().as_secs_f64();
    writeln!(out)?;
    if !args.no_ppl {
        let (ppl, err) = super::perplexity::estimate(nll, nll2, count);
        writeln!(out, "Final estimate: PPL = {ppl:.4} +/- {err:.5}")?;
    }
    let m = shared.lock().expect("the collector's lock");
    for (name, share) in m.partial() {
        eprintln!("imatrix: warning: entry '{name}' has partial data ({share:.2}%)");
    }
    save(&m, args, format, Some(&dataset), None)?;
    eprintln!(
        "imatrix: {} matrices over {} tokens in {elapsed:.2} s ({:.2} tokens/s); saved to {}",
        m.stats.len(),
        n_chunk * n_ctx,
        (n_chunk * n_ctx) as f64 / elapsed,
        args.output.display()
    );
    Ok(())
}

/// Saves to -o (or, with `at`, to `-o`.at_N), whole or not at all.
fn save(
    m: &Imatrix,
    args: &Args,
    format: Format,
    dataset: Option<&str>,
    at: Option<usize>,
) -> anyhow::Result<()> {
    let path: PathBuf = match at {
        None => args.output.clone(),
        Some(n) => {
            let mut s = args.output.clone().into_os_string();
            s.push(format!(".at_{n}"));
            s.into()
        }
    };
    m.save(Path::new(&path), format, dataset)?;
    Ok(())
}
