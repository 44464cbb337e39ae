//! `llamay run`: generate text from a prompt, streaming it to stdout.

use crate::ModelArg;
use crate::constrain::{Bound, ConstraintArgs};
use crate::generate::{Flow, Sampling, SamplingArgs, prefill};
use crate::{session, speculate};
use anyhow::{Context, bail};
use llamay_engine::sample::Sampler;
use llamay_engine::{Context as EngineContext, ContextParams};
use llamay_gguf::MappedModel;
use llamay_template::Message;
use llamay_template::format as chat_format;
use llamay_tokenizer::Tokenizer;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// Prompt text.
    #[arg(short = 'p', long, conflicts_with = "file")]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    constraint: ConstraintArgs,
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
    #[arg(short = 't', long)]
    threads: Option<usize>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    let limit = args.sampling.limit()?;
    let kv = session::kv(&args.kv)?;
    let params = args.sampling.params()?;
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
    // A bad grammar or schema is refused before the model loads.
    let rules = args.constraint.rules()?;
    let threads = session::threads(args.threads)?;
    let t_load = Instant::now();
    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let (model, tok) = session::load(&mapped, &gguf, threads)?;
    session::require_logits(&model)?;
    let n_ctx = session::context(args.ctx_size, &model)?;
    let bound = rules.map(|r| Bound::new(r, &tok)).transpose()?;
    let format = if args.raw {
        None
    } else {
        chat_format::resolve(args.chat_template.as_deref(), gguf.metadata(), &tok)?
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
    let draft_file = speculate::open_draft_file(&args.sampling)?;
    let draft_params = speculate::DraftParams::new(&args.sampling, threads, kv, n_ctx)?;
    let draft = speculate::Draft::load(draft_file.as_ref(), draft_params, &tok)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let mut ctx = args
        .device
        .context(&model, ContextParams::new(threads, kv, n_ctx))?;
    generate(
        &mut ctx,
        &tok,
        &ids,
        Sampling {
            sampler: Sampler::new(params),
            history: ids.clone(),
            limit,
            ignore_eos: args.sampling.ignore_eos,
            constraint: bound.as_ref().map(Bound::start),
            speculation: draft.speculation(&tok)?,
        },
        load_s,
    )
}

/// Prefills `prompt` into a new sequence, then samples and streams until a stop
/// condition.
fn generate(
    ctx: &mut EngineContext<'_>,
    tok: &Tokenizer,
    prompt: &[u32],
    mut sampling: Sampling,
    load_s: f64,
) -> anyhow::Result<()> {
    let seq = ctx.new_sequence();
    let t_prompt = Instant::now();
    let logits = prefill(ctx, seq, prompt, 0)?;
    let prompt_s = t_prompt.elapsed().as_secs_f64();
    let mut stream = tok.stream_decoder();
    let mut out = std::io::stdout().lock();
    let t_gen = Instant::now();
    let (generated, stop) = sampling.run(ctx, seq, tok, logits, |id| {
        out.write_all(stream.push(id)?.as_bytes())?;
        out.flush()?;
        Ok(Flow::Continue)
    })?;
    out.write_all(stream.finish().as_bytes())?;
    out.flush()?;
    let gen_s = t_gen.elapsed().as_secs_f64();
    let spec = &sampling.speculation;
    let draft = if spec.max_draft > 0 {
        format!(" | draft {} of {} accepted", spec.accepted, spec.drafted)
    } else {
        String::new()
    };
    eprintln!(
        "\nload {load_s:.2} s | prompt {} tokens in {prompt_s:.2} s ({:.1} tok/s) | generation {generated} tokens in {gen_s:.2} s ({:.1} tok/s) | stop: {}{draft}",
        prompt.len(),
        prompt.len() as f64 / prompt_s.max(1e-9),
        generated as f64 / gen_s.max(1e-9),
        stop.as_str(),
    );
    Ok(())
}
