//! The chat template a command renders through: `--chat-template NAME|FILE` if given
//! (a file that exists wins over a built-in name), else the model's own
//! `tokenizer.chat_template`; and the prompt's tokens from its text.

use anyhow::{Context, bail};
use llamay_gguf::Metadata;
use llamay_template::{ChatTemplate, Message, OutputFormat, RenderOptions, builtin};
use llamay_tokenizer::Tokenizer;
use std::path::Path;

/// Where a template came from, for messages.
enum Origin {
    File(String),
    Builtin(&'static str),
    Model,
}

pub struct ChatFormat {
    template: ChatTemplate,
    /// The Jinja source: what the output markup is detected from.
    source: String,
    bos: String,
    eos: String,
}

/// The template to use, or `None` when neither the flag nor the model gives one.
pub fn resolve(
    flag: Option<&str>,
    metadata: &Metadata<'_>,
    tok: &Tokenizer,
) -> anyhow::Result<Option<ChatFormat>> {
    let (source, origin) = match flag {
        Some(f) if Path::new(f).is_file() => (
            std::fs::read_to_string(f).with_context(|| format!("--chat-template {f}"))?,
            Origin::File(f.to_string()),
        ),
        Some(name) => match builtin::get(name) {
            Some((name, src)) => (src.to_string(), Origin::Builtin(name)),
            None => bail!(
                "--chat-template {name}: no such file, and not a built-in template; built-in names: {}",
                builtin::NAMES.join(", ")
            ),
        },
        None => match metadata.get_str("tokenizer.chat_template").ok().flatten() {
            Some(s) => (s.to_string(), Origin::Model),
            None => return Ok(None),
        },
    };
    let template = ChatTemplate::new(&source).with_context(|| match &origin {
        Origin::File(f) => format!("--chat-template {f}"),
        Origin::Builtin(n) => format!("built-in template {n}"),
        Origin::Model => "the model's tokenizer.chat_template".into(),
    })?;
    let text = |id: Option<u32>| {
        id.and_then(|i| tok.token_to_piece(i, true).ok())
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    Ok(Some(ChatFormat {
        template,
        source,
        bos: text(tok.bos()),
        eos: text(tok.eos()),
    }))
}

/// As [`resolve`], for commands that cannot go on without a template.
pub fn require(
    flag: Option<&str>,
    metadata: &Metadata<'_>,
    tok: &Tokenizer,
) -> anyhow::Result<ChatFormat> {
    resolve(flag, metadata, tok)?.with_context(|| {
        format!(
            "this model has no chat template (no tokenizer.chat_template); give one with --chat-template NAME|FILE (built-in names: {})",
            builtin::NAMES.join(", ")
        )
    })
}

/// `--chat-template-kwargs '{"enable_thinking": false}'`: a JSON object of template variables.
pub fn kwargs(flag: Option<&str>) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    match flag {
        None => Ok(serde_json::Map::new()),
        Some(s) => match serde_json::from_str(s) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(_) => bail!(
                "--chat-template-kwargs: give a JSON object, e.g. '{{\"enable_thinking\": false}}'"
            ),
            Err(e) => bail!("--chat-template-kwargs is not JSON: {e}"),
        },
    }
}

impl ChatFormat {
    /// How the model marks up reasoning and tool calls after `prompt`.
    pub fn output_format(&self, prompt: &str) -> OutputFormat {
        OutputFormat::detect(&self.source, prompt)
    }

    /// The prompt text for `messages`, as transformers' `apply_chat_template` renders it.
    pub fn render(
        &self,
        messages: &[Message],
        tools: Option<serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<String> {
        let opts = RenderOptions {
            add_generation_prompt,
            tools,
            bos_token: self.bos.clone(),
            eos_token: self.eos.clone(),
            kwargs,
        };
        Ok(self.template.render(messages, &opts)?)
    }

    /// The tokens of rendered text: special-token text parsed, and the vocabulary's BOS
    /// added unless the template already wrote it (never two).
    pub fn encode(&self, tok: &Tokenizer, rendered: &str) -> Vec<u32> {
        let add_special = self.bos.is_empty() || !rendered.starts_with(&self.bos);
        tok.encode(rendered.as_bytes(), add_special, true)
    }
}
