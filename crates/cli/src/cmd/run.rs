//! `llamay run`: generate text from a prompt, streaming it to stdout.

use crate::ModelArg;
use crate::chat;
use crate::session;
use anyhow::{Context, bail};
use llamay_engine::sample::{Sampler, SamplerParams};
use llamay_engine::{BatchToken, Context as EngineContext, ContextParams};
use llamay_gguf::MappedModel;
use llamay_template::Message;
use llamay_tokenizer::Tokenizer;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Prompt text.
    #[arg(short = 'p', long, conflicts_with = "file")]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// Tokens to generate (-1: until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    n_predict: i64,
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    temp: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    top_p: f32,
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Context size (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// KV cache precision: f32 (exact), f16 (llama.cpp's default), vq8 (int8 values), q8 (int8 keys and values).
    #[arg(long, default_value = "f32")]
    kv: String,
    /// Do not wrap the prompt in a chat template.
    #[arg(long, conflicts_with_all = ["system", "chat_template"])]
    raw: bool,
    /// A system message before the prompt (through the chat template).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// A built-in template name or a Jinja file, instead of the model's own.
    #[arg(long, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    #[arg(short = 't', long)]
    threads: Option<usize>,
}

/// Prompt tokens evaluated per decode call: bounds the activations' memory.
const PREFILL_CHUNK: usize = 512;

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = args.model.path()?;
    if args.n_predict == 0 || args.n_predict < -1 {
        bail!(
            "-n {}: give the number of tokens to generate (>= 1), or -1 to generate until the end",
            args.n_predict
        );
    }
    let kv = session::kv(&args.kv)?;
    let params = SamplerParams {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
        ..SamplerParams::default()
    };
    params.validate().map_err(anyhow::Error::msg)?;
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), None) => p.clone(),
        (None, Some(f)) => {
            let mut text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            // As llama.cpp's -f: one trailing newline is dropped, so a prompt file made
            // with an editor continues as the same prompt given with -p.
            if text.ends_with('\n') {
                text.pop();
            }
            text
        }
        _ => bail!("give a prompt with -p TEXT or -f FILE"),
    };
    let threads = session::threads(args.threads)?;
    let t_load = Instant::now();
    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let (model, tok) = session::load(&mapped, &gguf, threads)?;
    let n_ctx = session::context(args.ctx_size, &model)?;
    let format = if args.raw {
        None
    } else {
        chat::resolve(args.chat_template.as_deref(), gguf.metadata(), &tok)?
    };
    let ids = match format {
        Some(format) => {
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(Message::new("system", system));
            }
            messages.push(Message::new("user", &prompt));
            let rendered = format.render(&messages, None, true, Default::default())?;
            format.encode(&tok, &rendered)
        }
        None if args.system.is_some() => bail!(
            "--system needs a chat template, and this model has none; give one with --chat-template NAME|FILE"
        ),
        None => tok.encode(prompt.as_bytes(), true, true),
    };
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    if ids.len() >= n_ctx {
        bail!(
            "the prompt is {} tokens, which does not fit the context of {n_ctx} (raise -c)",
            ids.len()
        );
    }
    let load_s = t_load.elapsed().as_secs_f64();
    let mut ctx = model.context(ContextParams::new(threads, kv, n_ctx))?;
    generate(&mut ctx, &tok, &ids, args, params, load_s)
}

/// Prefills `prompt` into `cache` (whose capacity is the context size), then samples
/// and streams until a stop condition.
fn generate(
    ctx: &mut EngineContext<'_>,
    tok: &Tokenizer,
    prompt: &[u32],
    args: &Args,
    params: SamplerParams,
    load_s: f64,
) -> anyhow::Result<()> {
    let n_ctx = ctx.kv().n_ctx();
    let seq = ctx.new_sequence();
    let t_prompt = Instant::now();
    let mut logits = Vec::new();
    for (c, chunk) in prompt.chunks(PREFILL_CHUNK).enumerate() {
        let base = c * PREFILL_CHUNK;
        let last = base + chunk.len() == prompt.len();
        let batch: Vec<BatchToken> = chunk
            .iter()
            .enumerate()
            .map(|(i, &t)| BatchToken {
                seq,
                token: t,
                pos: base + i,
                logits: last && i + 1 == chunk.len(),
            })
            .collect();
        let out = ctx.decode(&batch)?;
        if last {
            logits = out.row(0).to_vec();
        }
    }
    let prompt_s = t_prompt.elapsed().as_secs_f64();

    let mut sampler = Sampler::new(params);
    let mut history: Vec<u32> = prompt.to_vec();
    let mut stream = tok.stream_decoder();
    let mut out = std::io::stdout().lock();
    let limit = if args.n_predict < 0 {
        usize::MAX
    } else {
        args.n_predict as usize
    };
    let t_gen = Instant::now();
    let mut generated = 0usize;
    let mut stop = "length";
    while generated < limit {
        let id = sampler.sample(&logits, &history);
        if tok.is_eog(id) && !args.ignore_eos {
            stop = "end of generation";
            break;
        }
        let text = stream.push(id)?;
        out.write_all(text.as_bytes())?;
        out.flush()?;
        history.push(id);
        generated += 1;
        let pos = ctx.kv().len(seq)?;
        if pos >= n_ctx {
            stop = "context full";
            break;
        }
        if generated == limit {
            break;
        }
        let l = ctx.decode(&[BatchToken {
            seq,
            token: id,
            pos,
            logits: true,
        }])?;
        logits.clear();
        logits.extend_from_slice(l.row(0));
    }
    out.write_all(stream.finish().as_bytes())?;
    out.flush()?;
    let gen_s = t_gen.elapsed().as_secs_f64();
    eprintln!(
        "\nload {load_s:.2} s | prompt {} tokens in {prompt_s:.2} s ({:.1} tok/s) | generation {generated} tokens in {gen_s:.2} s ({:.1} tok/s) | stop: {stop}",
        prompt.len(),
        prompt.len() as f64 / prompt_s.max(1e-9),
        generated as f64 / gen_s.max(1e-9),
    );
    Ok(())
}
