//! `llamay perplexity`: llama-perplexity's method. The text is tokenised whole (BOS
//! added as the vocabulary says), cut into chunks of `-c` tokens; each chunk is
//! evaluated from an empty cache with its first token replaced by BOS, and the second
//! half of each chunk is scored.

use crate::ModelArg;
use crate::session;
use anyhow::{Context, bail};
use llamay_engine::{BatchToken, ContextParams};
use llamay_gguf::MappedModel;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Text file to score.
    #[arg(short = 'f', long)]
    file: PathBuf,
    /// Chunk size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Score at most this many chunks (default: all).
    #[arg(long)]
    chunks: Option<usize>,
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// KV cache precision: f32 (exact), f16 (llama.cpp's default), vq8 (int8 values), q8 (int8 keys and values).
    #[arg(long, default_value = "f32")]
    kv: String,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    let n_ctx = args.ctx_size;
    if !(8..=1 << 20).contains(&n_ctx) {
        bail!(
            "-c {n_ctx}: the chunk size must be between 8 and {}",
            1 << 20
        );
    }
    if args.chunks == Some(0) {
        bail!("--chunks 0: score at least one chunk");
    }
    let kv = session::kv(&args.kv)?;
    let text =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let threads = session::threads(args.threads)?;
    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let (model, tok) = session::load(&mapped, &gguf, threads)?;
    let tokens = tok.encode(&text, true, false);
    if tokens.len() < 2 * n_ctx {
        bail!(
            "{} tokenizes to {} tokens; a context of {n_ctx} needs at least {}",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    let n_chunk_max = tokens.len() / n_ctx;
    let n_chunk = args.chunks.map_or(n_chunk_max, |c| c.min(n_chunk_max));
    let first = n_ctx / 2;
    let bos = if tok.add_bos() { tok.bos() } else { None };
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}, scoring positions {first}..{}",
        tokens.len(),
        n_ctx - 1
    );

    let mut ctx = model.context(ContextParams::new(threads, kv, n_ctx))?;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut out = std::io::stdout().lock();
    for i in 0..n_chunk {
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let seq = ctx.new_sequence();
        let batch: Vec<BatchToken> = chunk
            .iter()
            .enumerate()
            .map(|(p, &t)| BatchToken {
                seq,
                token: if p == 0 { bos.unwrap_or(t) } else { t },
                pos: p,
                logits: p >= first && p + 1 < n_ctx,
            })
            .collect();
        let logits = ctx.decode(&batch)?;
        ctx.kv_mut().free(seq)?;
        for (r, &bi) in logits.index.iter().enumerate() {
            let row = logits.row(r);
            let target = chunk[bi + 1] as usize;
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = row.iter().map(|&l| f64::from(l - max).exp()).sum();
            let logprob = f64::from(row[target] - max) - sum.ln();
            nll -= logprob;
            nll2 += logprob * logprob;
            count += 1;
        }
        write!(out, "[{}]{:.4},", i + 1, (nll / count as f64).exp())?;
        out.flush()?;
    }
    writeln!(out)?;
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let err = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    writeln!(out, "Final estimate: PPL = {ppl:.4} +/- {err:.5}")?;
    Ok(())
}
