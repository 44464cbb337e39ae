//! `llamay embed`: one embedding per text, as llama.cpp's `llama-embedding` computes
//! them: each text tokenised with its special tokens ([CLS] … [SEP] for BERT), encoded
//! whole, the final states pooled as the file says (or `--pooling`), normalised
//! (`--normalize`, euclidean by default), texts batched together.

use crate::{ModelArg, out, session};
use anyhow::{Context as _, bail};
use llamay_engine::embed::{embed_kv_budget, normalize};
use llamay_engine::{ContextParams, KvPrecision, Pooling};
use llamay_gguf::{MappedModel, Metadata};
use llamay_tokenizer::Tokenizer;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    device: crate::device::DeviceArg,
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
    let texts = texts(args)?;
    let pooling = args
        .pooling
        .as_deref()
        .map(|p| match Pooling::parse(p) {
            Some(Pooling::Rank) | None => bail!("--pooling {p}: give mean, cls or last"),
            Some(p) => Ok(p),
        })
        .transpose()?;
    if !matches!(args.output.as_str(), "json" | "array") {
        bail!("--output {}: give json or array", args.output);
    }
    let job = Encode {
        model: &args.model,
        device: &args.device,
        threads: args.threads,
        ctx_size: args.ctx_size,
    };
    let mut vectors = job.run(
        |tok, _| {
            Ok(texts
                .iter()
                .map(|t| tok.encode(t.as_bytes(), true, true))
                .collect())
        },
        |file| match pooling.unwrap_or(file) {
            Pooling::Rank => bail!(
                "this model is a reranker (rank pooling): its output is a relevance score, not an embedding; use `llamay rerank`, or give --pooling mean|cls|last for its encoder's states"
            ),
            p => Ok(p),
        },
    )?;
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

/// Loading an encoder and running texts through it: what `embed` and `rerank` share.
pub(crate) struct Encode<'a> {
    pub model: &'a ModelArg,
    pub device: &'a crate::device::DeviceArg,
    pub threads: Option<usize>,
    pub ctx_size: Option<usize>,
}

impl Encode<'_> {
    /// Loads the model, tokenises with `tokenize`, picks the pooling from the file's
    /// with `pooling`, and returns one pooled (for rank: scored) row per text.
    pub fn run(
        &self,
        tokenize: impl FnOnce(&Tokenizer, &Metadata<'_>) -> anyhow::Result<Vec<Vec<u32>>>,
        pooling: impl FnOnce(Pooling) -> anyhow::Result<Pooling>,
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        let threads = session::threads(self.threads)?;
        let mapped = MappedModel::open(&self.model.path()?)?;
        let gguf = mapped.parse()?;
        let (model, tok) = session::load(&mapped, &gguf, threads)?;
        let n_ctx = session::context(self.ctx_size, &model)?;
        let pooling = pooling(model.config().pooling)?;
        let ids = tokenize(&tok, gguf.metadata())?;
        check_fits(&ids, n_ctx)?;
        // A decoder's pages for a batch of texts; an encoder keeps none (its batches
        // attend over their own f32 keys and values).
        let mut params = ContextParams::new(threads, KvPrecision::F32, n_ctx);
        params.kv_budget_tokens = Some(embed_kv_budget(n_ctx));
        let mut ctx = self.device.context(&model, params)?;
        let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        Ok(ctx.embed(&refs, pooling)?)
    }
}

fn check_fits(ids: &[Vec<u32>], n_ctx: usize) -> anyhow::Result<()> {
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
