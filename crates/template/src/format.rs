//! The chat format of a model: the template it renders through (`--chat-template
//! NAME|FILE` if given — a file that exists wins over a built-in name — else the
//! model's own `tokenizer.chat_template`), its BOS/EOS texts, and the prompt's tokens
//! from the rendered text. The CLI's commands and the server share it.

use crate::{ChatTemplate, Message, OutputFormat, RenderOptions, TemplateError, builtin};
use llamay_gguf::Metadata;
use llamay_tokenizer::Tokenizer;
use std::path::Path;

/// Why no chat format could be had; the message names the flag or the file's key.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("--chat-template {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error(
        "--chat-template {0}: no such file, and not a built-in template; built-in names: {names}",
        names = builtin::NAMES.join(", ")
    )]
    UnknownName(String),
    #[error("{origin}: {err}")]
    Template { origin: String, err: TemplateError },
    #[error(
        "this model has no chat template (no tokenizer.chat_template); give one with --chat-template NAME|FILE (built-in names: {names})",
        names = builtin::NAMES.join(", ")
    )]
    Missing,
}

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
) -> Result<Option<ChatFormat>, FormatError> {
    let (source, origin) = match flag {
        Some(f) if Path::new(f).is_file() => (
            std::fs::read_to_string(f).map_err(|err| FormatError::Read {
                path: f.to_string(),
                err,
            })?,
            Origin::File(f.to_string()),
        ),
        Some(name) => match builtin::get(name) {
            Some((name, src)) => (src.to_string(), Origin::Builtin(name)),
            None => return Err(FormatError::UnknownName(name.to_string())),
        },
        None => match metadata.get_str("tokenizer.chat_template").ok().flatten() {
            Some(s) => (s.to_string(), Origin::Model),
            None => return Ok(None),
        },
    };
    let template = ChatTemplate::new(&source).map_err(|err| FormatError::Template {
        origin: match &origin {
            Origin::File(f) => format!("--chat-template {f}"),
            Origin::Builtin(n) => format!("built-in template {n}"),
            Origin::Model => "the model's tokenizer.chat_template".into(),
        },
        err,
    })?;
    Ok(Some(ChatFormat::with_tokens(template, source, tok)))
}

/// As [`resolve`], for commands that cannot go on without a template.
pub fn require(
    flag: Option<&str>,
    metadata: &Metadata<'_>,
    tok: &Tokenizer,
) -> Result<ChatFormat, FormatError> {
    resolve(flag, metadata, tok)?.ok_or(FormatError::Missing)
}

impl ChatFormat {
    /// The format for a template's source (a request's or a store layer's template).
    pub fn from_source(source: &str, tok: &Tokenizer) -> Result<ChatFormat, TemplateError> {
        let template = ChatTemplate::new(source)?;
        Ok(ChatFormat::with_tokens(template, source.to_string(), tok))
    }

    fn with_tokens(template: ChatTemplate, source: String, tok: &Tokenizer) -> ChatFormat {
        let text = |id: Option<u32>| {
            id.and_then(|i| tok.token_to_piece(i, true).ok())
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        ChatFormat {
            template,
            source,
            bos: text(tok.bos()),
            eos: text(tok.eos()),
        }
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

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
    ) -> Result<String, TemplateError> {
        let opts = RenderOptions {
            add_generation_prompt,
            tools,
            bos_token: self.bos.clone(),
            eos_token: self.eos.clone(),
            kwargs,
        };
        self.template.render(messages, &opts)
    }

    /// The tokens of rendered text: special-token text parsed, and the vocabulary's BOS
    /// added unless the template already wrote it (never two).
    pub fn encode(&self, tok: &Tokenizer, rendered: &str) -> Vec<u32> {
        let add_special = self.bos.is_empty() || !rendered.starts_with(&self.bos);
        tok.encode(rendered.as_bytes(), add_special, true)
    }
}
