//! `llamay perplexity`: llama-perplexity's method. The text is tokenised whole (BOS
//! added as the vocabulary says), cut into chunks of `-c` tokens; each chunk is
//! evaluated from an empty cache with its first token replaced by BOS, and the second
//! half of each chunk is scored. `--kl-divergence-base FILE` also writes every scored
//! position's log-probabilities in llama.cpp's base-logits format; with
//! `--kl-divergence` it reads such a file (ours or llama-perplexity's) instead of a
//! text, re-evaluates its tokens, and prints llama.cpp's KL-divergence statistics.

use crate::ModelArg;
use crate::logits_file::{self, Kld, Reader, Writer};
use crate::session;
use anyhow::{Context, bail};
use llamay_engine::{BatchToken, ContextParams, Logits};
use llamay_gguf::MappedModel;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// Text file to score. With --kl-divergence the base file's tokens are scored (as
    /// llama-perplexity does); a -f given there is checked against them.
    #[arg(short = 'f', long, required_unless_present = "kl_divergence")]
    file: Option<PathBuf>,
    /// Chunk size in tokens (with --kl-divergence: the base file's).
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
    /// Write (or, with --kl-divergence, read) llama.cpp's base-logits file.
    #[arg(long, value_name = "FILE")]
    kl_divergence_base: Option<PathBuf>,
    /// Score against the --kl-divergence-base file: KL divergence, Δp, same top token.
    #[arg(long, requires = "kl_divergence_base")]
    kl_divergence: bool,
}

/// One chunk from an empty cache, first token replaced by BOS, logits for the scored
/// positions `n_ctx/2 .. n_ctx-1`.
fn eval_chunk(
    ctx: &mut llamay_engine::Context<'_>,
    chunk: &[u32],
    bos: Option<u32>,
) -> anyhow::Result<Logits> {
    let n_ctx = chunk.len();
    let first = n_ctx / 2;
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
    Ok(logits)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    if args.chunks == Some(0) {
        bail!("--chunks 0: score at least one chunk");
    }
    let kv = session::kv(&args.kv)?;
    let threads = session::threads(args.threads)?;
    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let (model, tok) = session::load(&mapped, &gguf, threads)?;
    let bos = if tok.add_bos() { tok.bos() } else { None };
    if args.kl_divergence {
        let base = args.kl_divergence_base.as_ref().expect("clap requires it");
        return kl_divergence(args, &model, &tok, base, threads, kv);
    }
    let file = args.file.as_ref().expect("clap requires -f");
    let n_ctx = args.ctx_size;
    if !(8..=1 << 20).contains(&n_ctx) {
        bail!(
            "-c {n_ctx}: the chunk size must be between 8 and {}",
            1 << 20
        );
    }
    let text = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let tokens = tok.encode(&text, true, false);
    let n_chunk = chunk_count(file, tokens.len(), n_ctx, args.chunks)?;
    let first = n_ctx / 2;
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}, scoring positions {first}..{}",
        tokens.len(),
        n_ctx - 1
    );
    // The base file is written beside its final name and renamed when whole.
    let mut writer = match &args.kl_divergence_base {
        None => None,
        Some(p) => {
            let part = p.with_extension("partial");
            let f = std::fs::File::create(&part)
                .with_context(|| format!("--kl-divergence-base {}", part.display()))?;
            let w = std::io::BufWriter::new(f);
            Some((
                Writer::new(w, n_ctx, model.config().n_vocab, &tokens[..n_chunk * n_ctx])?,
                part,
                p.clone(),
            ))
        }
    };

    let mut ctx = args
        .device
        .context(&model, ContextParams::new(threads, kv, n_ctx))?;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut out = std::io::stdout().lock();
    for i in 0..n_chunk {
        let chunk = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let logits = eval_chunk(&mut ctx, chunk, bos)?;
        for (r, &bi) in logits.index.iter().enumerate() {
            let row = logits.row(r);
            let target = chunk[bi + 1];
            let loss = match &mut writer {
                Some((w, _, _)) => w.row(row, target)?,
                None => token_nll(row, target),
            };
            nll += loss;
            nll2 += loss * loss;
            count += 1;
        }
        write!(out, "[{}]{:.4},", i + 1, (nll / count as f64).exp())?;
        out.flush()?;
    }
    writeln!(out)?;
    if let Some((w, part, dest)) = writer {
        w.finish()?;
        std::fs::rename(&part, &dest)
            .with_context(|| format!("--kl-divergence-base {}", dest.display()))?;
        eprintln!(
            "perplexity: base log-probabilities written to {}",
            dest.display()
        );
    }
    let (ppl, err) = estimate(nll, nll2, count);
    writeln!(out, "Final estimate: PPL = {ppl:.4} +/- {err:.5}")?;
    Ok(())
}

/// How many chunks of `n_ctx` tokens `n_tokens` make (at most `chunks`): llama.cpp's
/// tools need two chunks' worth at least.
pub(crate) fn chunk_count(
    file: &std::path::Path,
    n_tokens: usize,
    n_ctx: usize,
    chunks: Option<usize>,
) -> anyhow::Result<usize> {
    if n_tokens < 2 * n_ctx {
        bail!(
            "{} tokenizes to {n_tokens} tokens; a context of {n_ctx} needs at least {}",
            file.display(),
            2 * n_ctx
        );
    }
    let n_chunk_max = n_tokens / n_ctx;
    Ok(chunks.map_or(n_chunk_max, |c| c.min(n_chunk_max)))
}

/// −log p(target) under the softmax of `row`.
pub(crate) fn token_nll(row: &[f32], target: u32) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&l| f64::from(l - max).exp()).sum();
    sum.ln() - f64::from(row[target as usize] - max)
}

/// Perplexity and its error from the sums of the losses and of their squares (as
/// llama-perplexity prints them).
pub(crate) fn estimate(nll: f64, nll2: f64, count: usize) -> (f64, f64) {
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let err = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    (ppl, err)
}

fn kl_divergence(
    args: &Args,
    model: &llamay_engine::Model<'_>,
    tok: &llamay_tokenizer::Tokenizer,
    base: &std::path::Path,
    threads: llamay_engine::Threads,
    kv: llamay_engine::KvPrecision,
) -> anyhow::Result<()> {
    let what = format!("--kl-divergence-base {}", base.display());
    let f = std::fs::File::open(base).with_context(|| what.clone())?;
    let len = f.metadata()?.len();
    let mut r = Reader::open(std::io::BufReader::new(f), len, &what)?;
    let n_vocab = model.config().n_vocab;
    if r.n_vocab != n_vocab {
        bail!(
            "{what}: written for a vocabulary of {} tokens, this model has {n_vocab}",
            r.n_vocab
        );
    }
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let n_ctx = r.n_ctx;
    let n_chunk = args.chunks.map_or(r.n_chunk, |c| c.min(r.n_chunk));
    // `-f TEXT` as llama-perplexity users type it beside --kl-divergence: the base file
    // holds the tokens scored; a text that is not the one it was made from is said.
    if let Some(file) = &args.file {
        let text = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let tokens = tok.encode(&text, true, false);
        let scored = &r.tokens[..n_chunk * n_ctx];
        if let Some(at) = (0..scored.len()).find(|&i| tokens.get(i) != Some(&scored[i])) {
            eprintln!(
                "warning: -f {} is not the text {} was made from (the tokens differ at position {at}); scoring the base file's tokens",
                file.display(),
                base.display()
            );
        }
    }
    let first = n_ctx / 2;
    let width = logits_file::row_len(n_vocab);
    eprintln!(
        "kl-divergence: {n_chunk} chunks of {n_ctx} from {}",
        base.display()
    );
    let mut ctx = args
        .device
        .context(model, ContextParams::new(threads, kv, n_ctx))?;
    let mut kld = Kld::default();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
    )?;
    for i in 0..n_chunk {
        let rows = r.chunk()?;
        let chunk = r.tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        let logits = eval_chunk(&mut ctx, &chunk, bos)?;
        for (k, &bi) in logits.index.iter().enumerate() {
            debug_assert_eq!(bi, first + k);
            kld.add(
                logits.row(k),
                &rows[k * width..(k + 1) * width],
                chunk[bi + 1] as usize,
            );
        }
        writeln!(out, "{}", kld.chunk_line(i + 1))?;
        out.flush()?;
    }
    writeln!(out)?;
    if kld.count() < 100 {
        bail!(
            "{} positions scored: too few for statistics (llama.cpp asks for 100; give more chunks)",
            kld.count()
        );
    }
    write!(out, "{}", kld.report())?;
    Ok(())
}
