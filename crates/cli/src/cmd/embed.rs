//! `llamay embed`: one embedding per text, as llama.cpp's `llama-embedding` computes
//! them: each text tokenised with its special tokens ([CLS] … [SEP] for BERT), encoded
//! whole, the final states pooled as the file says (or `--pooling`), normalised
//! (`--normalize`, euclidean by default), texts batched together.

use crate::{ModelArg, out, session};
use anyhow::{Context as _, bail};
use llamay_engine::embed::{embed_kv_budget, normalize};
use llamay_engine::{ContextParams, KvPrecision, Pooling};
use llamay_gguf::MappedModel;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Texts to embed (one embedding each).
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", num_args = 1..)]
    prompts: Vec<String>,
    /// Read the texts from a file, one per line (empty lines skipped).
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// mean, cls or last (default: the file's `pooling_type`; mean for a decoder).
    #[arg(long, value_name = "KIND")]
    pooling: Option<String>,
    /// llama-embedding's --embd-normalize: -1 none, 0 max-absolute to int16 range,
    /// 1 taxicab, 2 euclidean, >2 that p-norm.
    #[arg(
        long,
        default_value_t = 2,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    normalize: i32,
    /// json (OpenAI's list, as llama-embedding's json) or array (one JSON array of
    /// vectors).
    #[arg(long, default_value = "json", value_name = "FORMAT")]
    output: String,
    /// Context size: the longest text it takes (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    #[arg(short = 't', long)]
    threads: Option<usize>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    let texts = texts(args)?;
    let pooling = args
        .pooling
        .as_deref()
        .map(|p| {
            Pooling::parse(p).with_context(|| format!("--pooling {p}: give mean, cls or last"))
        })
        .transpose()?;
    if !matches!(args.output.as_str(), "json" | "array") {
        bail!("--output {}: give json or array", args.output);
    }
    let threads = session::threads(args.threads)?;
    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let (model, tok) = session::load(&mapped, &gguf, threads)?;
    let n_ctx = session::context(args.ctx_size, &model)?;
    let pooling = pooling.unwrap_or(model.config().pooling);
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tok.encode(t.as_bytes(), true, true))
        .collect();
    for (i, t) in ids.iter().enumerate() {
        if t.is_empty() {
            bail!("text {i} has no tokens");
        }
        if t.len() > n_ctx {
            bail!(
                "text {i} is {} tokens, which does not fit the context of {n_ctx} (raise -c; an encoder reads a text whole)",
                t.len()
            );
        }
    }
    let mut params = ContextParams::new(threads, KvPrecision::F32, n_ctx);
    params.kv_budget_tokens = Some(embed_kv_budget(n_ctx));
    let mut ctx = model.context(params)?;
    let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    let mut vectors = ctx.embed(&refs, pooling)?;
    for v in &mut vectors {
        normalize(v, args.normalize);
    }
    let mut o = out::stdout();
    if args.output == "array" {
        serde_json::to_writer(&mut o, &vectors)?;
    } else {
        let data: Vec<serde_json::Value> = (vectors.iter().enumerate())
            .map(|(i, v)| serde_json::json!({"object": "embedding", "index": i, "embedding": v}))
            .collect();
        serde_json::to_writer(&mut o, &serde_json::json!({"object": "list", "data": data}))?;
    }
    writeln!(o)?;
    o.flush()?;
    Ok(())
}

fn texts(args: &Args) -> anyhow::Result<Vec<String>> {
    let mut texts = args.prompts.clone();
    if let Some(f) = &args.file {
        let body =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        texts.extend(body.lines().filter(|l| !l.is_empty()).map(str::to_string));
    }
    if texts.is_empty() {
        bail!("give texts with -p TEXT... or -f FILE");
    }
    Ok(texts)
}
