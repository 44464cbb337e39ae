//! `llamay render` (cli.md): the exact prompt text a chat template makes of a
//! conversation — what a person debugging a template needs. Reads only the model's
//! metadata and vocabulary (vocab-only files work).

use crate::ModelArg;
use crate::chat;
use anyhow::{Context, bail};
use llamay_gguf::MappedModel;
use llamay_template::Message;
use llamay_template::format as chat_format;
use llamay_tokenizer::Tokenizer;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// A JSON array of messages in OpenAI's shape (role, content, tool_calls, ...).
    #[arg(long, value_name = "FILE")]
    messages: PathBuf,
    /// A JSON array of OpenAI tool definitions.
    #[arg(long, value_name = "FILE")]
    tools: Option<PathBuf>,
    /// A built-in template name or a Jinja file, instead of the model's own.
    #[arg(long, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    /// Template variables as a JSON object, e.g. '{"enable_thinking": false}'.
    #[arg(long, value_name = "JSON")]
    chat_template_kwargs: Option<String>,
    /// Render without the assistant turn's opening (add_generation_prompt = false).
    #[arg(long)]
    no_generation_prompt: bool,
}

/// A JSON file given to a flag.
fn read_json(flag: &str, path: &Path) -> anyhow::Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("{flag} {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{flag} {}: not JSON", path.display()))
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    let messages = Message::list_from_json(&read_json("--messages", &args.messages)?)
        .with_context(|| format!("--messages {}", args.messages.display()))?;
    let tools = match &args.tools {
        Some(p) => {
            let v = read_json("--tools", p)?;
            if !v.is_array() {
                bail!(
                    "--tools {}: give a JSON array of tool definitions",
                    p.display()
                );
            }
            Some(v)
        }
        None => None,
    };
    let kwargs = chat::kwargs(args.chat_template_kwargs.as_deref())?;
    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let tok = Tokenizer::from_metadata(gguf.metadata()).context("cannot load the tokenizer")?;
    let format = chat_format::require(args.chat_template.as_deref(), gguf.metadata(), &tok)?;
    let text = format.render(&messages, tools, !args.no_generation_prompt, kwargs)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}
