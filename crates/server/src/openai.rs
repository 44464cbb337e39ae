//! OpenAI's API: chat completions and completions (server-sent events ending in
//! `data: [DONE]`), models, embeddings (of an embedding model) and rerank (of a
//! cross-encoder). Errors in OpenAI's shape.

use crate::error::{ApiError, OaiError};
use crate::generate::{self, ChatDelta, ChatOutput, ChatParser, Generation};
use crate::ollama::body_object;
use crate::params::{self, Fields};
use crate::registry::Loaded;
use crate::scheduler::{Event, Finish, Piece, Summary};
use crate::stream::{self, Framing, Out};
use crate::{AppState, State};
use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use llamay_engine::sample::SamplerParams;
use llamay_template::{Message, ToolCall};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/rerank", post(rerank))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/responses", post(crate::responses::create))
}

type Result<T> = std::result::Result<T, OaiError>;

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", params::random_seed())
}

/// The sampling fields both completion routes take.
pub struct Common {
    pub(crate) name: String,
    pub(crate) params: SamplerParams,
    pub(crate) max_tokens: usize,
    pub(crate) stop: Vec<String>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) ignore_eos: bool,
    /// Choices asked for (`n`).
    pub(crate) n: usize,
}

impl Common {
    /// The engine's request for `prompt` under these fields (the server's `--ctx-size`).
    pub(crate) fn generation(
        &self,
        prompt: Vec<u32>,
        grammar: Option<Arc<llamay_engine::grammar::Rules>>,
        logprobs: Option<usize>,
        render_special: bool,
    ) -> Generation {
        Generation {
            prompt,
            params: self.params.clone(),
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            grammar,
            logprobs,
            n_ctx: None,
            render_special,
            ignore_eos: self.ignore_eos,
            // OpenAI and llama-server refuse a prompt longer than the context.
            truncate_keep: None,
        }
    }
}

/// The most choices one request may ask for.
const MAX_CHOICES: usize = 16;

fn common(body: &Map<String, Value>, default_max: usize) -> std::result::Result<Common, ApiError> {
    let f = Fields::top(body);
    let name = f
        .str("model")?
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::field("model", "is required"))?
        .to_string();
    // Choices share the prompt's prefill (the later ones fork the first's cache).
    let n = f.int("n", 1, MAX_CHOICES as i64)?.unwrap_or(1) as usize;
    let params = SamplerParams {
        temperature: f.f32("temperature", 0.0, 100.0)?.unwrap_or(0.8),
        top_k: f.int("top_k", 0, 1 << 30)?.map_or(40, |k| k as usize),
        top_p: f.f32("top_p", 0.0, 1.0)?.unwrap_or(0.95),
        min_p: f.f32("min_p", 0.0, 1.0)?.unwrap_or(0.05),
        repeat_penalty: f.f32("repeat_penalty", 0.0, 100.0)?.unwrap_or(1.0),
        presence_penalty: f.f32("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: f.f32("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        seed: f.seed("seed")?.unwrap_or_else(params::random_seed),
        ..SamplerParams::default()
    };
    params.validate().map_err(ApiError::bad)?;
    let max = match f.int("max_completion_tokens", -1, i64::MAX)? {
        Some(n) => Some(n),
        None => f.int("max_tokens", -1, i64::MAX)?,
    };
    let max_tokens = match max {
        None => default_max,
        Some(-1) => usize::MAX,
        Some(n) => n as usize,
    };
    let so = Fields::of(body.get("stream_options"), "stream_options.")?;
    Ok(Common {
        name,
        params,
        max_tokens,
        stop: f.strings("stop")?,
        stream: f.bool("stream")?.unwrap_or(false),
        include_usage: so.bool("include_usage")?.unwrap_or(false),
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        n,
    })
}

/// llama-server's extensions: `grammar` (GBNF) and `json_schema` at the top level.
fn extension_grammar(
    body: &Map<String, Value>,
) -> std::result::Result<Option<Arc<llamay_engine::grammar::Rules>>, ApiError> {
    let f = Fields::top(body);
    if let Some(g) = f.str("grammar")?.filter(|g| !g.is_empty()) {
        return llamay_engine::grammar::Rules::gbnf(g)
            .map(Some)
            .map_err(|e| ApiError::field("grammar", e));
    }
    generate::grammar_of_format("json_schema", body.get("json_schema"))
}

/// Usage of `n` choices of one prompt: its tokens once (the choices share its
/// prefill), every choice's generated tokens.
#[derive(Default)]
struct Usage {
    prompt: usize,
    cached: usize,
    generated: usize,
}

impl Usage {
    fn add(&mut self, s: &Summary) {
        if self.prompt == 0 {
            self.prompt = s.prompt_tokens;
            self.cached = s.cached_tokens;
        }
        self.generated += s.generated;
    }

    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.generated,
            "total_tokens": self.prompt + self.generated,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

/// OpenAI's `finish_reason`: a token limit is "length" even after calls (the answer
/// was cut), calls otherwise "tool_calls".
fn finish_reason(s: &Summary, tools: bool) -> &'static str {
    match s.finish {
        Finish::Length => "length",
        Finish::Stop if tools => "tool_calls",
        Finish::Stop => "stop",
    }
}

/// One token's entry in a chat `logprobs.content` list.
fn token_logprob(model: &Loaded, p: &Piece) -> Option<Value> {
    let lp = p.logprob.as_ref()?;
    let text = |id: u32| {
        let b = model.tok.token_to_piece(id, true).unwrap_or(&[]).to_vec();
        (String::from_utf8_lossy(&b).into_owned(), b)
    };
    let (t, b) = text(p.token);
    let top: Vec<Value> = lp
        .top
        .iter()
        .map(|&(id, l)| {
            let (t, b) = text(id);
            json!({"token": t, "logprob": l, "bytes": b})
        })
        .collect();
    Some(json!({"token": t, "logprob": lp.logprob, "bytes": b, "top_logprobs": top}))
}

fn tool_calls_json(calls: &[ToolCall], from: usize) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "index": from + i,
                    "id": generate::call_id(c, from + i),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments.to_string()},
                })
            })
            .collect(),
    )
}

/// A chat request made ready: its model, fields, rendered prompt and the engine's request.
pub(crate) struct Prepared {
    pub(crate) model: Arc<Loaded>,
    pub(crate) c: Common,
    pub(crate) prompt: generate::ChatPrompt,
    pub(crate) g: Generation,
}

/// A checked `/v1/chat/completions` body: every field read and range-checked before a
/// model is touched (the `server_request` fuzz target runs this on arbitrary JSON).
pub struct ChatRequest {
    pub(crate) c: Common,
    pub(crate) messages: Vec<Message>,
    pub(crate) tools: crate::tools::ToolRequest,
    pub(crate) grammar: Option<Arc<llamay_engine::grammar::Rules>>,
    pub(crate) logprobs: Option<usize>,
    pub(crate) kwargs: Map<String, Value>,
}

impl ChatRequest {
    /// The messages through `model`'s chat template, the answer read as OpenAI reads it
    /// (content under a `response_format`, calls where tools force or allow them), and
    /// the engine's request for that prompt. Chat completions and Responses share it.
    pub(crate) async fn prepare(self, s: &AppState) -> std::result::Result<Prepared, ApiError> {
        let model = s.registry.get(&self.c.name).await.map_err(ApiError::from)?;
        let asked = self.grammar.is_some();
        let (c, tools) = (self.c, self.tools);
        let mut prompt = generate::chat_prompt(
            &model,
            &c.name,
            &self.messages,
            &tools,
            self.grammar,
            self.kwargs,
        )?;
        prompt.answer_is_content(asked, &tools);
        let g = c.generation(
            prompt.tokens.clone(),
            prompt.grammar.clone(),
            self.logprobs,
            true,
        );
        Ok(Prepared {
            model,
            c,
            prompt,
            g,
        })
    }

    pub fn parse(body: &Map<String, Value>) -> std::result::Result<Self, ApiError> {
        let c = common(body, usize::MAX)?;
        let f = Fields::top(body);
        let messages = Message::list_from_json(body.get("messages").unwrap_or(&Value::Null))
            .map_err(|e| ApiError::field("messages", e))?;
        if messages.is_empty() {
            return Err(ApiError::field(
                "messages",
                "must hold at least one message",
            ));
        }
        let tools = crate::tools::ToolRequest::parse(body)?;
        let grammar = match body.get("response_format") {
            None | Some(Value::Null) => extension_grammar(body)?,
            Some(rf) => match rf.get("type").and_then(Value::as_str) {
                Some("text") => None,
                Some("json_object") => Some(llamay_engine::grammar::Rules::json_object()),
                Some("json_schema") => {
                    let schema = rf
                        .get("json_schema")
                        .and_then(|j| j.get("schema"))
                        .ok_or_else(|| {
                            ApiError::field("response_format.json_schema.schema", "is required")
                        })?;
                    generate::grammar_of_format("response_format.json_schema.schema", Some(schema))?
                }
                _ => {
                    return Err(ApiError::field(
                        "response_format.type",
                        "must be \"text\", \"json_object\" or \"json_schema\"",
                    ));
                }
            },
        };
        let logprobs = if f.bool("logprobs")?.unwrap_or(false) {
            Some(f.int("top_logprobs", 0, 20)?.unwrap_or(0) as usize)
        } else {
            None
        };
        let mut kwargs = match body.get("chat_template_kwargs") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                return Err(ApiError::field("chat_template_kwargs", "must be an object"));
            }
        };
        if let Some(e) = f.str("reasoning_effort")? {
            kwargs.insert("reasoning_effort".into(), e.into());
        }
        Ok(ChatRequest {
            c,
            messages,
            tools,
            grammar,
            logprobs,
            kwargs,
        })
    }
}

/// Submits `n` generations of one prompt (seeds `seed`, `seed + 1`, …): the first
/// alone, the rest once its prompt is in the cache (its first event), so that they fork
/// that prefill instead of repeating it. One receiver of (choice, event).
async fn submit_n(
    model: &Loaded,
    s: &crate::AppState,
    g: Generation,
    n: usize,
) -> std::result::Result<tokio::sync::mpsc::UnboundedReceiver<(usize, Event)>, ApiError> {
    let again = |i: usize| Generation {
        params: SamplerParams {
            seed: g.params.seed.wrapping_add(i as u64),
            ..g.params.clone()
        },
        ..g.clone()
    };
    let rest: Vec<Generation> = (1..n).map(again).collect();
    let mut first = generate::submit(model, g).map_err(|e| s.rejected(e))?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let forward = |i: usize,
                   mut from: tokio::sync::mpsc::UnboundedReceiver<Event>,
                   tx: tokio::sync::mpsc::UnboundedSender<(usize, Event)>| {
        tokio::spawn(async move {
            while let Some(ev) = from.recv().await {
                if tx.send((i, ev)).is_err() {
                    return; // the client went away: dropping `from` cancels it
                }
            }
        });
    };
    if !rest.is_empty() {
        match first.recv().await {
            Some(ev) => {
                let _ = tx.send((0, ev));
            }
            None => return Err(ApiError::internal("the model's engine stopped")),
        }
        for (k, g) in rest.into_iter().enumerate() {
            let rx_i = generate::submit(model, g).map_err(|e| s.rejected(e))?;
            forward(k + 1, rx_i, tx.clone());
        }
    }
    forward(0, first, tx);
    Ok(rx)
}

/// One choice's state while its chunks are made.
#[derive(Default)]
struct Choice {
    parser: Option<ChatParser>,
    pending_lp: Vec<Value>,
    n_calls: usize,
    sent_role: bool,
    done: bool,
}

async fn chat(axum::extract::State(s): State, body: Body) -> Result<Response> {
    let start = Instant::now();
    let body = body_object(&s, body).await?;
    let Prepared {
        model,
        c,
        prompt,
        g,
    } = ChatRequest::parse(&body)?.prepare(&s).await?;
    let logprobs = g.logprobs;
    let n = c.n;
    let rx = submit_n(&model, &s, g, n).await?;
    let id = new_id("chatcmpl");
    let created = unix_now();
    let name = c.name.clone();
    let st = s.clone();
    let m2 = model.clone();
    let mut choices: Vec<Choice> = (0..n)
        .map(|_| Choice {
            parser: Some(prompt.parser()),
            ..Choice::default()
        })
        .collect();
    let mut first = true;
    let mut finished = 0usize;
    let mut total = Usage::default();
    // A whole (non-streamed) answer always carries its usage.
    let include_usage = c.include_usage || !c.stream;
    let convert = move |_: &mut (), ev: Option<(usize, Event)>| -> Out {
        let chunk = |i: usize, delta: Value, finish: Value, lp: Option<Vec<Value>>| {
            let mut choice = json!({"index": i, "delta": delta, "finish_reason": finish});
            if let Some(lp) = lp {
                choice["logprobs"] = json!({"content": lp});
            } else {
                choice["logprobs"] = Value::Null;
            }
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [choice]})
        };
        let delta_json = |d: ChatDelta, n_calls: &mut usize, role: bool| {
            let mut m = Map::new();
            if role {
                m.insert("role".into(), "assistant".into());
            }
            if !d.content.is_empty() || role {
                m.insert("content".into(), d.content.into());
            }
            if !d.reasoning.is_empty() {
                m.insert("reasoning_content".into(), d.reasoning.into());
            }
            if !d.tool_calls.is_empty() {
                m.insert(
                    "tool_calls".into(),
                    tool_calls_json(&d.tool_calls, *n_calls),
                );
                *n_calls += d.tool_calls.len();
            }
            Value::Object(m)
        };
        match ev {
            Some((i, Event::Token(p))) => {
                if first {
                    first = false;
                    st.metrics.first_token(start.elapsed());
                }
                let ch = &mut choices[i];
                if let Some(v) = token_logprob(&m2, &p) {
                    ch.pending_lp.push(v);
                }
                let d = ch
                    .parser
                    .as_mut()
                    .map(|x| x.push(&p.text))
                    .unwrap_or_default();
                if d.is_empty() {
                    return Out {
                        objects: vec![],
                        end: false,
                    };
                }
                let lp = logprobs.map(|_| std::mem::take(&mut ch.pending_lp));
                let role = !std::mem::replace(&mut ch.sent_role, true);
                let delta = delta_json(d, &mut ch.n_calls, role);
                Out {
                    objects: vec![chunk(i, delta, Value::Null, lp)],
                    end: false,
                }
            }
            Some((i, Event::Done(sum))) => {
                st.metrics.finished(start.elapsed());
                let ch = &mut choices[i];
                ch.done = true;
                finished += 1;
                let mut out = ChatOutput::default();
                if let Some(mut p) = ch.parser.take() {
                    p.push(&sum.tail).append_to(&mut out);
                    p.finish().append_to(&mut out);
                }
                let d = ChatDelta {
                    content: out.content,
                    reasoning: out.reasoning,
                    tool_calls: out.tool_calls,
                };
                let mut objects = Vec::new();
                let role = !std::mem::replace(&mut ch.sent_role, true);
                if !d.is_empty() || role {
                    let lp = logprobs.map(|_| std::mem::take(&mut ch.pending_lp));
                    objects.push(chunk(
                        i,
                        delta_json(d, &mut ch.n_calls, role),
                        Value::Null,
                        lp,
                    ));
                }
                let lp = logprobs
                    .map(|_| std::mem::take(&mut ch.pending_lp))
                    .filter(|l| !l.is_empty());
                objects.push(chunk(
                    i,
                    json!({}),
                    finish_reason(&sum, ch.n_calls > 0).into(),
                    lp,
                ));
                total.add(&sum);
                let end = finished == choices.len();
                if end && include_usage {
                    objects.push(json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [], "usage": total.json()}));
                }
                Out { objects, end }
            }
            Some((_, Event::Failed(why))) => {
                st.metrics.failed();
                stream::failed(Some(why), true)
            }
            None => stream::failed(None, true),
        }
    };
    if c.stream {
        return Ok(stream::respond(Framing::Sse, rx, (), convert));
    }
    let chunks = collect(rx, convert).await?;
    // Fold the chunks into one chat.completion, a message per choice.
    #[derive(Default)]
    struct Folded {
        content: String,
        reasoning: String,
        calls: Vec<Value>,
        lps: Vec<Value>,
        finish: Value,
    }
    let mut folded: Vec<Folded> = (0..n).map(|_| Folded::default()).collect();
    let mut usage_v = Value::Null;
    for ch in &chunks {
        if let Some(u) = ch.get("usage") {
            usage_v = u.clone();
        }
        let Some(choice) = ch["choices"].get(0) else {
            continue;
        };
        let f = &mut folded[choice["index"].as_u64().unwrap_or(0) as usize];
        let d = &choice["delta"];
        f.content += d["content"].as_str().unwrap_or("");
        f.reasoning += d["reasoning_content"].as_str().unwrap_or("");
        if let Some(a) = d["tool_calls"].as_array() {
            for call in a {
                let mut call = call.clone();
                if let Some(o) = call.as_object_mut() {
                    o.remove("index");
                }
                f.calls.push(call);
            }
        }
        if let Some(a) = choice["logprobs"]["content"].as_array() {
            f.lps.extend(a.iter().cloned());
        }
        if !choice["finish_reason"].is_null() {
            f.finish = choice["finish_reason"].clone();
        }
    }
    let out: Vec<Value> = folded
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let mut message = json!({"role": "assistant", "content": f.content});
            if !f.reasoning.is_empty() {
                message["reasoning_content"] = f.reasoning.into();
            }
            if !f.calls.is_empty() {
                message["tool_calls"] = Value::Array(f.calls);
            }
            json!({"index": i, "message": message, "finish_reason": f.finish,
                   "logprobs": if logprobs.is_some() { json!({"content": f.lps}) } else { Value::Null }})
        })
        .collect();
    let first = &chunks[0];
    Ok(axum::Json(json!({
        "id": first["id"], "object": "chat.completion", "created": first["created"], "model": first["model"],
        "choices": out,
        "usage": usage_v,
    }))
    .into_response())
}

/// Runs a non-streamed request through the stream's converter (usage always asked
/// for): the chunks it would have sent.
pub(crate) async fn collect<S: Default, T>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
    mut convert: impl FnMut(&mut S, Option<T>) -> Out,
) -> Result<Vec<Value>> {
    let mut state = S::default();
    let mut chunks = Vec::new();
    loop {
        let ev = rx.recv().await;
        let closed = ev.is_none();
        let out = convert(&mut state, ev);
        for o in out.objects {
            if let Some(e) = o.get("error") {
                let msg = e["message"].as_str().unwrap_or("generation failed");
                return Err(ApiError::internal(msg).into());
            }
            chunks.push(o);
        }
        if out.end || closed {
            break;
        }
    }
    Ok(chunks)
}

/// A completion's prompt: text or token ids (a one-element list of either is taken).
pub enum PromptInput {
    Text(String),
    Ids(Vec<i64>),
}

fn prompt_input(v: Option<&Value>) -> std::result::Result<PromptInput, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(PromptInput::Text(s.clone())),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_number) => a
            .iter()
            .map(|t| {
                t.as_i64().ok_or_else(|| {
                    ApiError::field("prompt", format!("token id {t} is not an integer"))
                })
            })
            .collect::<std::result::Result<_, _>>()
            .map(PromptInput::Ids),
        Some(Value::Array(a)) if a.len() == 1 => prompt_input(a.first()),
        Some(Value::Array(a)) if a.len() > 1 => Err(ApiError::field(
            "prompt",
            "llamay completes one prompt per request; send the prompts as separate requests",
        )),
        _ => Err(ApiError::field(
            "prompt",
            "must be a string or a list of token ids",
        )),
    }
}

/// The prompt's tokens: text encoded with BOS, or ids checked against the vocabulary.
fn prompt_tokens(model: &Loaded, p: &PromptInput) -> std::result::Result<Vec<u32>, ApiError> {
    let n_vocab = model.tok.n_vocab();
    match p {
        PromptInput::Text(s) => Ok(model.tok.encode(s.as_bytes(), true, true)),
        PromptInput::Ids(ids) => token_ids(ids, n_vocab, "prompt"),
    }
}

/// Token ids a client gave, each checked against the vocabulary (400 naming `field`).
fn token_ids(ids: &[i64], n_vocab: usize, field: &str) -> std::result::Result<Vec<u32>, ApiError> {
    ids.iter()
        .map(|&id| match usize::try_from(id) {
            Ok(u) if u < n_vocab => Ok(u as u32),
            _ => Err(ApiError::field(
                field,
                format!("token id {id} is outside the vocabulary [0, {n_vocab})"),
            )),
        })
        .collect()
}

/// A checked `/v1/completions` body.
pub struct CompletionRequest {
    c: Common,
    prompt: PromptInput,
    logprobs: Option<usize>,
    grammar: Option<Arc<llamay_engine::grammar::Rules>>,
}

impl CompletionRequest {
    pub fn parse(body: &Map<String, Value>) -> std::result::Result<Self, ApiError> {
        // OpenAI's default for this route is 16 tokens.
        let c = common(body, 16)?;
        let f = Fields::top(body);
        if f.bool("echo")?.unwrap_or(false) {
            return Err(ApiError::field(
                "echo",
                "echoing the prompt is not supported",
            ));
        }
        if f.str("suffix")?.is_some_and(|x| !x.is_empty()) {
            return Err(ApiError::field(
                "suffix",
                "fill-in-the-middle is not supported",
            ));
        }
        if let Some(b) = f.int("best_of", 1, i64::MAX)?
            && b != 1
        {
            return Err(ApiError::field(
                "best_of",
                "llamay returns one choice (best_of = 1)",
            ));
        }
        Ok(CompletionRequest {
            c,
            prompt: prompt_input(body.get("prompt"))?,
            logprobs: f.int("logprobs", 0, 20)?.map(|n| n as usize),
            grammar: extension_grammar(body)?,
        })
    }
}

async fn completions(axum::extract::State(s): State, body: Body) -> Result<Response> {
    let start = Instant::now();
    let body = body_object(&s, body).await?;
    let CompletionRequest {
        c,
        prompt,
        logprobs,
        grammar,
    } = CompletionRequest::parse(&body)?;
    let model = s.registry.get(&c.name).await.map_err(ApiError::from)?;
    let tokens = prompt_tokens(&model, &prompt)?;
    let g = c.generation(tokens, grammar, logprobs, false);
    let n = c.n;
    let rx = submit_n(&model, &s, g, n).await?;
    let id = new_id("cmpl");
    let created = unix_now();
    let name = c.name.clone();
    let st = s.clone();
    let m2 = model.clone();
    // A whole (non-streamed) answer always carries its usage.
    let include_usage = c.include_usage || !c.stream;
    let mut first = true;
    let mut finished = 0usize;
    let mut total = Usage::default();
    let convert = move |_: &mut (), ev: Option<(usize, Event)>| -> Out {
        let chunk = |i: usize, text: &str, finish: Value, lp: Value| {
            json!({"id": id, "object": "text_completion", "created": created, "model": name,
                   "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}]})
        };
        match ev {
            Some((i, Event::Token(p))) => {
                if first {
                    first = false;
                    st.metrics.first_token(start.elapsed());
                }
                let lp = match token_logprob(&m2, &p) {
                    Some(v) => {
                        let top: Map<String, Value> = v["top_logprobs"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|t| {
                                (
                                    t["token"].as_str().unwrap_or("").to_string(),
                                    t["logprob"].clone(),
                                )
                            })
                            .collect();
                        json!({"tokens": [v["token"]], "token_logprobs": [v["logprob"]], "top_logprobs": [top]})
                    }
                    None => Value::Null,
                };
                if p.text.is_empty() && lp.is_null() {
                    return Out {
                        objects: vec![],
                        end: false,
                    };
                }
                Out {
                    objects: vec![chunk(i, &p.text, Value::Null, lp)],
                    end: false,
                }
            }
            Some((i, Event::Done(sum))) => {
                st.metrics.finished(start.elapsed());
                finished += 1;
                let mut objects = vec![chunk(
                    i,
                    &sum.tail,
                    finish_reason(&sum, false).into(),
                    Value::Null,
                )];
                total.add(&sum);
                let end = finished == n;
                if end && include_usage {
                    objects.push(json!({"id": id, "object": "text_completion", "created": created, "model": name, "choices": [], "usage": total.json()}));
                }
                Out { objects, end }
            }
            Some((_, Event::Failed(why))) => {
                st.metrics.failed();
                stream::failed(Some(why), true)
            }
            None => stream::failed(None, true),
        }
    };
    if c.stream {
        return Ok(stream::respond(Framing::Sse, rx, (), convert));
    }
    let chunks = collect(rx, convert).await?;
    #[derive(Default)]
    struct Folded {
        text: String,
        tokens: Vec<Value>,
        token_lps: Vec<Value>,
        tops: Vec<Value>,
        finish: Value,
    }
    let mut folded: Vec<Folded> = (0..n).map(|_| Folded::default()).collect();
    let mut usage_v = Value::Null;
    for ch in &chunks {
        if let Some(u) = ch.get("usage") {
            usage_v = u.clone();
        }
        let Some(choice) = ch["choices"].get(0) else {
            continue;
        };
        let f = &mut folded[choice["index"].as_u64().unwrap_or(0) as usize];
        f.text += choice["text"].as_str().unwrap_or("");
        if let Some(lp) = choice["logprobs"].as_object() {
            let list = |k: &str| lp[k].as_array().into_iter().flatten().cloned();
            f.tokens.extend(list("tokens"));
            f.token_lps.extend(list("token_logprobs"));
            f.tops.extend(list("top_logprobs"));
        }
        if !choice["finish_reason"].is_null() {
            f.finish = choice["finish_reason"].clone();
        }
    }
    let out: Vec<Value> = folded
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let lp = if logprobs.is_some() {
                json!({"tokens": f.tokens, "token_logprobs": f.token_lps, "top_logprobs": f.tops})
            } else {
                Value::Null
            };
            json!({"index": i, "text": f.text, "logprobs": lp, "finish_reason": f.finish})
        })
        .collect();
    let first = &chunks[0];
    Ok(axum::Json(json!({
        "id": first["id"], "object": "text_completion", "created": first["created"], "model": first["model"],
        "choices": out,
        "usage": usage_v,
    }))
    .into_response())
}

async fn embeddings(axum::extract::State(s): State, body: Body) -> Result<Response> {
    let body = body_object(&s, body).await?;
    let f = Fields::top(&body);
    let name = f
        .str("model")?
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::field("model", "is required"))?
        .to_string();
    let base64 = match f.str("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(_) => {
            return Err(
                ApiError::field("encoding_format", "must be \"float\" or \"base64\"").into(),
            );
        }
    };
    let dims = f.int("dimensions", 1, 1 << 20)?.map(|d| d as usize);
    // A string, a list of strings, a list of token ids, or a list of such lists.
    enum Input {
        Text(String),
        Ids(Vec<i64>),
    }
    let one = |v: &Value| -> std::result::Result<Input, ApiError> {
        match v {
            Value::String(s) => Ok(Input::Text(s.clone())),
            Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_i64) => {
                Ok(Input::Ids(a.iter().filter_map(Value::as_i64).collect()))
            }
            _ => Err(ApiError::field(
                "input",
                "must be a string, a list of strings, or token ids",
            )),
        }
    };
    let items: Vec<Input> = match body.get("input") {
        Some(Value::Array(a))
            if a.iter().all(|x| x.is_string() || x.is_array()) && !a.is_empty() =>
        {
            a.iter().map(one).collect::<std::result::Result<_, _>>()?
        }
        Some(v) => vec![one(v)?],
        None => return Err(ApiError::field("input", "is required").into()),
    };
    let model = s.registry.get(&name).await.map_err(ApiError::from)?;
    let n_vocab = model.tok.n_vocab();
    let mut inputs = Vec::with_capacity(items.len());
    for it in items {
        inputs.push(match it {
            Input::Text(t) => generate::embedding_inputs(&model, &[t], false)?.0.remove(0),
            Input::Ids(ids) => token_ids(&ids, n_vocab, "input")?,
        });
    }
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let vectors = generate::embed(&model, inputs).await?;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let v = generate::normalized(v, dims);
            let embedding = if base64 {
                use base64::Engine as _;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list", "data": data, "model": name,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}

/// llama-server's `/v1/rerank`: `query`, `documents` (strings), optional `top_n` and
/// `return_documents`; results by descending relevance, each with its index.
async fn rerank(axum::extract::State(s): State, body: Body) -> Result<Response> {
    let body = body_object(&s, body).await?;
    let f = Fields::top(&body);
    let name = f
        .str("model")?
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::field("model", "is required"))?
        .to_string();
    let query = f
        .str("query")?
        .ok_or_else(|| ApiError::field("query", "is required"))?
        .to_string();
    let docs: Vec<String> = match body.get("documents") {
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(|d| d.as_str().map(str::to_string))
            .collect(),
        Some(_) => {
            return Err(ApiError::field("documents", "must be a non-empty list of strings").into());
        }
        None => return Err(ApiError::field("documents", "is required").into()),
    };
    let top_n = f
        .int("top_n", 1, i64::MAX)?
        .map_or(docs.len(), |n| n as usize);
    let with_docs = f.bool("return_documents")?.unwrap_or(false);
    let model = s.registry.get(&name).await.map_err(ApiError::from)?;
    let (scores, n_tokens) = generate::rerank(&model, &query, &docs).await?;
    let mut order: Vec<usize> = (0..docs.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let results: Vec<Value> = (order.iter().take(top_n))
        .map(|&i| {
            let mut r = json!({"index": i, "relevance_score": scores[i]});
            if with_docs {
                r["document"] = json!({"text": docs[i]});
            }
            r
        })
        .collect();
    Ok(axum::Json(json!({
        "model": name, "object": "list", "results": results,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}

fn model_object(name: &str, created: Option<SystemTime>) -> Value {
    let created = created
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    json!({"id": name, "object": "model", "created": created, "owned_by": "llamay"})
}

async fn models(axum::extract::State(s): State) -> Response {
    let data: Vec<Value> = s
        .registry
        .names()
        .iter()
        .map(|(n, _, t)| model_object(n, *t))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn model(
    axum::extract::State(s): State,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response> {
    let names = s.registry.names();
    match names.iter().find(|(n, _, _)| *n == id) {
        Some((n, _, t)) => Ok(axum::Json(model_object(n, *t)).into_response()),
        None => Err(ApiError::not_found(format!("model '{id}' not found")).into()),
    }
}
