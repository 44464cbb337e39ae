//! What both APIs share between a parsed request and the engine: the prompt's tokens
//! from messages or text, the grammar from a `format`/`response_format`, submission
//! with admission control, and the parsing of chat output into content, reasoning and
//! tool calls.

use crate::error::ApiError;
use crate::registry::Loaded;
use crate::scheduler::{EmbedJob, Event, Job, Refused};
use crate::tools::ToolRequest;
use llamay_engine::grammar::Rules;
use llamay_engine::sample::SamplerParams;
use llamay_template::{Message, OutputFormat, OutputParser, ToolCall, ToolSyntax};
use serde_json::{Map, Value};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// A request ready for the engine, from either API.
#[derive(Clone)]
pub struct Generation {
    pub prompt: Vec<u32>,
    pub params: SamplerParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub grammar: Option<Arc<Rules>>,
    pub logprobs: Option<usize>,
    /// Most positions (`num_ctx`); `None`: the server's `--ctx-size`.
    pub n_ctx: Option<usize>,
    pub render_special: bool,
    /// Generate past end-of-generation tokens (llama-server's `ignore_eos`; benchmarks).
    pub ignore_eos: bool,
    /// A prompt longer than the context is cut, as Ollama's runner cuts it, keeping this
    /// many tokens at its start and the rest from its end; `None`: refused (OpenAI's
    /// routes, Ollama's with `truncate: false`).
    pub truncate_keep: Option<usize>,
}

/// The positions a request's sequence may use: its `num_ctx`, clamped to the server's
/// `--ctx-size` as Ollama clamps it to its runner's.
pub fn context_of(model: &Loaded, requested: Option<usize>) -> usize {
    let server_ctx = model.scheduler.config().n_ctx;
    requested.map_or(server_ctx, |n| n.min(server_ctx))
}

/// The most prompt tokens a cut prompt keeps in a context of `n_ctx`: the rest is room
/// for the answer (up to `max_tokens`, at most a quarter of the context; Ollama's runner
/// instead shifts the context as the answer grows, which llamay does not do).
pub fn prompt_room(n_ctx: usize, max_tokens: usize) -> usize {
    n_ctx - max_tokens.min(n_ctx / 4).max(1)
}

/// A chat prompt: its tokens, how the model's answer will be marked up, and the
/// grammar of the answer (the request's `asked` one, as its tools shape it).
pub struct ChatPrompt {
    pub tokens: Vec<u32>,
    pub output: OutputFormat,
    pub grammar: Option<Arc<Rules>>,
    /// The request's tool names (what a bare JSON answer may call).
    pub tool_names: Vec<String>,
}

impl ChatPrompt {
    /// OpenAI's reading: an answer under the request's `response_format` (no forced
    /// call) is content, never a call, even when its JSON looks like one (Ollama parses
    /// calls out of `format`-constrained output; the generic format's own JSON is read
    /// as ever).
    pub fn answer_is_content(&mut self, asked: bool, tools: &ToolRequest) {
        if asked && !tools.forced() && self.output.tools != ToolSyntax::Generic {
            self.output.tools = ToolSyntax::None;
        }
    }

    /// The parser of this prompt's answer.
    pub fn parser(&self) -> ChatParser {
        ChatParser {
            parser: OutputParser::new(self.output).with_tools(self.tool_names.clone()),
        }
    }
}

/// Renders `messages` (and the tools) through the model's chat template. A template
/// with no tool-call syntax of its own gets the tools in the generic format.
pub fn chat_prompt(
    model: &Loaded,
    name: &str,
    messages: &[Message],
    tools: &ToolRequest,
    asked: Option<Arc<Rules>>,
    kwargs: Map<String, Value>,
) -> Result<ChatPrompt, ApiError> {
    let format = model.format.as_ref().ok_or_else(|| {
        ApiError::bad(format!(
            "model '{name}' has no chat template (no tokenizer.chat_template); start the server with --chat-template NAME|FILE, or use /api/generate with raw: true"
        ))
    })?;
    let generic = tools.tools.is_some() && format.output_format("").tools == ToolSyntax::None;
    let adapted;
    let (messages, template_tools) = match &tools.tools {
        Some(t) if generic => {
            adapted = llamay_template::generic::adapt_messages(messages, t, tools.forced());
            (&adapted[..], None)
        }
        t => (messages, t.clone()),
    };
    let text = format
        .render(messages, template_tools, true, kwargs)
        .map_err(|e| ApiError::bad(format!("the chat template failed on these messages: {e}")))?;
    let mut output = format.output_format(&text);
    if generic {
        output.tools = ToolSyntax::Generic;
    }
    Ok(ChatPrompt {
        tokens: format.encode(&model.tok, &text),
        grammar: tools.grammar(output.tools, asked)?,
        tool_names: tools.names(),
        output,
    })
}

/// Checks and queues `g` on `model`: the events of its answer.
pub fn submit(model: &Loaded, g: Generation) -> Result<UnboundedReceiver<Event>, ApiError> {
    if let Some(arch) = model.scheduler.encoder() {
        return Err(ApiError::bad(format!(
            "this model ({arch}) is an embedding model: it computes embeddings (/api/embed, /v1/embeddings), not text"
        )));
    }
    let n_ctx = context_of(model, g.n_ctx);
    // As Ollama does: clamped to what the runner holds (clients send the training
    // context from /api/show on every call), and said once per model.
    if let Some(n) = g.n_ctx.filter(|&n| n > n_ctx)
        && !model
            .num_ctx_clamped
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        eprintln!(
            "llamay serve: {}: num_ctx {n} is more than --ctx-size {n_ctx}; clamped to {n_ctx} (said once)",
            model.name
        );
    }
    if g.prompt.is_empty() {
        return Err(ApiError::bad("the prompt has no tokens"));
    }
    let n_vocab = model.tok.n_vocab();
    if let Some(&t) = g.prompt.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ApiError::field(
            "prompt",
            format!("token id {t} is outside the vocabulary [0, {n_vocab})"),
        ));
    }
    let mut g = g;
    if g.prompt.len() >= n_ctx
        && let Some(keep) = g.truncate_keep
    {
        let room = prompt_room(n_ctx, g.max_tokens);
        if keep < room {
            let cut = g.prompt.len() - room;
            eprintln!(
                "llamay serve: {}: prompt of {} tokens truncated to {room} to fit num_ctx {n_ctx} (kept the first {keep} and the last {})",
                model.name,
                g.prompt.len(),
                room - keep
            );
            g.prompt.drain(keep..keep + cut);
        }
    }
    if g.prompt.len() >= n_ctx {
        return Err(ApiError::bad(format!(
            "the prompt has {} tokens and the context holds {n_ctx}: shorten it or raise num_ctx (up to --ctx-size)",
            g.prompt.len()
        )));
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        prompt: g.prompt,
        params: g.params,
        max_tokens: g.max_tokens,
        stop: g.stop,
        grammar: g.grammar,
        logprobs: g.logprobs,
        ignore_eos: g.ignore_eos,
        render_special: g.render_special,
        n_ctx,
        events: tx,
    };
    match model.scheduler.submit(job) {
        Ok(()) => Ok(rx),
        Err(Refused::Busy) => Err(ApiError::busy()),
        Err(Refused::Stopped) => Err(ApiError::internal("the model's engine stopped")),
    }
}

/// The grammar of a `format` (Ollama: `"json"` or a JSON Schema object) or an OpenAI
/// `response_format`'s schema.
pub fn grammar_of_format(field: &str, v: Option<&Value>) -> Result<Option<Arc<Rules>>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(Rules::json_object())),
        Some(Value::String(s)) => Err(ApiError::field(
            field,
            format!("\"{s}\" is not a format; give \"json\" or a JSON Schema object"),
        )),
        Some(schema @ Value::Object(_)) => Rules::json_schema(schema)
            .map(Some)
            .map_err(|e| ApiError::field(field, e)),
        Some(_) => Err(ApiError::field(
            field,
            "must be \"json\" or a JSON Schema object",
        )),
    }
}

/// The parsed answer of a chat so far.
#[derive(Default, Debug)]
pub struct ChatOutput {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
}

/// Splits generated text into content, reasoning and tool calls as it streams.
pub struct ChatParser {
    parser: OutputParser,
}

/// What one piece of text added.
#[derive(Default, Debug)]
pub struct ChatDelta {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
}

impl ChatDelta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.tool_calls.is_empty()
    }

    fn add(&mut self, events: Vec<llamay_template::Event>) {
        for e in events {
            match e {
                llamay_template::Event::Content(s) => self.content += &s,
                llamay_template::Event::Reasoning(s) => self.reasoning += &s,
                llamay_template::Event::ToolCall(c) => self.tool_calls.push(c),
            }
        }
    }

    pub fn append_to(self, out: &mut ChatOutput) {
        out.content += &self.content;
        out.reasoning += &self.reasoning;
        out.tool_calls.extend(self.tool_calls);
    }
}

impl ChatParser {
    pub fn new(format: OutputFormat) -> Self {
        ChatParser {
            parser: OutputParser::new(format),
        }
    }

    pub fn push(&mut self, text: &str) -> ChatDelta {
        let mut d = ChatDelta::default();
        d.add(self.parser.push(text));
        d
    }

    pub fn finish(self) -> ChatDelta {
        let mut d = ChatDelta::default();
        d.add(self.parser.finish());
        d
    }
}

/// A tool call's id: the model's, or a fresh one.
pub fn call_id(c: &ToolCall, i: usize) -> String {
    c.id.clone()
        .unwrap_or_else(|| format!("call_{:08x}{i}", crate::params::random_seed() as u32))
}

/// Embedding inputs: their tokens, cut to the context when `truncate` allows (how many
/// were cut is returned, so the response can say so), else refused.
pub fn embedding_inputs(
    model: &Loaded,
    texts: &[String],
    truncate: bool,
) -> Result<(Vec<Vec<u32>>, usize), ApiError> {
    let n_ctx = model.scheduler.config().n_ctx;
    let mut cut = 0;
    let mut out = Vec::with_capacity(texts.len());
    for (i, t) in texts.iter().enumerate() {
        let mut ids = model.tok.encode(t.as_bytes(), true, true);
        if ids.is_empty() {
            return Err(ApiError::field("input", format!("input {i} has no tokens")));
        }
        if ids.len() > n_ctx {
            if !truncate {
                return Err(ApiError::field(
                    "input",
                    format!(
                        "input {i} has {} tokens and the context holds {n_ctx}",
                        ids.len()
                    ),
                ));
            }
            ids.truncate(n_ctx);
            cut += 1;
        }
        out.push(ids);
    }
    Ok((out, cut))
}

/// Mean-pooled final hidden states of each input (computed on the engine thread).
pub async fn embed(model: &Loaded, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ApiError> {
    if model.scheduler.reranker() {
        return Err(ApiError::field(
            "model",
            format!(
                "'{}' is a reranker (rank pooling): it scores query-document pairs (/v1/rerank), it makes no embeddings",
                model.name
            ),
        ));
    }
    encode(model, inputs).await
}

/// A cross-encoder's relevance score for each (query, document) pair, and the tokens
/// the pairs took.
pub async fn rerank(
    model: &Loaded,
    query: &str,
    docs: &[String],
) -> Result<(Vec<f32>, usize), ApiError> {
    if !model.scheduler.reranker() {
        return Err(ApiError::field(
            "model",
            format!(
                "'{}' is not a reranker: reranking needs a cross-encoder (a bert-style file with pooling_type 4, rank, and a classification head)",
                model.name
            ),
        ));
    }
    let inputs: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| model.tok.encode_pair(query, d))
        .collect();
    let n_tokens = inputs.iter().map(Vec::len).sum();
    let scores = encode(model, inputs).await?;
    let scores = (scores.iter())
        .map(|s| s.first().copied().unwrap_or(f32::NAN))
        .collect();
    Ok((scores, n_tokens))
}

/// Runs inputs through the model's encoder, one pooled row each.
async fn encode(model: &Loaded, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ApiError> {
    let n_ctx = model.scheduler.config().n_ctx;
    let n_vocab = model.tok.n_vocab();
    for (i, ids) in inputs.iter().enumerate() {
        if ids.is_empty() || ids.len() > n_ctx {
            return Err(ApiError::field(
                "input",
                format!("input {i} has {} tokens; give 1 to {n_ctx}", ids.len()),
            ));
        }
        if let Some(&t) = ids.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ApiError::field(
                "input",
                format!("token id {t} is outside the vocabulary [0, {n_vocab})"),
            ));
        }
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    match model.scheduler.submit_embed(EmbedJob { inputs, reply: tx }) {
        Ok(()) => {}
        Err(Refused::Busy) => return Err(ApiError::busy()),
        Err(Refused::Stopped) => return Err(ApiError::internal("the model's engine stopped")),
    }
    match rx.await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(why)) => Err(ApiError::internal(why)),
        Err(_) => Err(ApiError::internal("the model's engine stopped")),
    }
}

/// `v` cut to its first `dims` values (if given) and scaled to unit length.
pub fn normalized(mut v: Vec<f32>, dims: Option<usize>) -> Vec<f32> {
    if let Some(d) = dims {
        v.truncate(d);
    }
    let norm = v
        .iter()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
    v
}
