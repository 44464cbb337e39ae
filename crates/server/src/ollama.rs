//! Ollama's API, wire-compatible with its Go server: NDJSON streams (one object per
//! line), integer-nanosecond durations, `done_reason`, RFC 3339 dates.

use crate::error::ApiError;
use crate::generate::{self, ChatOutput, Generation};
use crate::params::{self, Fields};
use crate::registry::Loaded;
use crate::scheduler::{Event, Finish, Summary};
use crate::stream::{self, Framing, Out};
use crate::{AppState, State};
use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use llamay_engine::grammar::Rules;
use llamay_engine::sample::SamplerParams;
use llamay_template::Message;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/generate", post(generate))
        .route("/api/chat", post(chat))
        .route("/api/embed", post(embed))
        .route("/api/embeddings", post(embeddings_legacy))
        .route("/api/tags", get(tags))
        .route("/api/show", post(show))
        .route("/api/ps", get(ps))
        .route("/api/pull", post(pull))
        .route("/api/delete", delete(delete_model))
        .route("/api/copy", post(copy))
        .route("/api/version", get(version))
        .route("/api/push", post(push))
        .route("/api/create", post(create))
}

/// The body as a JSON object (400 when it is not one, 413 past `--max-body`).
pub async fn body_object(state: &AppState, body: Body) -> Result<Map<String, Value>, ApiError> {
    let max = state.config.max_body;
    let bytes = axum::body::to_bytes(body, max)
        .await
        .map_err(|_| crate::guard::too_large(max))?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// RFC 3339 in UTC, with nanoseconds (as Go's time.Time marshals).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (y, m, day) = llamay_template::civil_date(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_nanos()
    )
}

fn model_name(f: &Fields<'_>) -> Result<String, ApiError> {
    match f.str("model")? {
        Some(m) if !m.is_empty() => Ok(m.to_string()),
        _ => Err(ApiError::field("model", "is required")),
    }
}

/// `options` (and the sampling defaults Ollama uses) → the engine's settings.
pub struct Options {
    params: SamplerParams,
    max_tokens: usize,
    stop: Vec<String>,
    n_ctx: Option<usize>,
    /// See `Generation::truncate_keep`.
    truncate_keep: Option<usize>,
}

impl Options {
    /// The engine's request for `prompt` under these options.
    fn generation(
        self,
        prompt: Vec<u32>,
        grammar: Option<Arc<Rules>>,
        render_special: bool,
    ) -> Generation {
        Generation {
            prompt,
            params: self.params,
            max_tokens: self.max_tokens,
            stop: self.stop,
            grammar,
            logprobs: None,
            n_ctx: self.n_ctx,
            render_special,
            ignore_eos: false,
            truncate_keep: self.truncate_keep,
        }
    }
}

fn options(body: &Map<String, Value>) -> Result<Options, ApiError> {
    let o = Fields::of(body.get("options"), "options.")?;
    let d = SamplerParams::default();
    let params = SamplerParams {
        temperature: o.f32("temperature", 0.0, 100.0)?.unwrap_or(0.8),
        top_k: o.int("top_k", 0, 1 << 30)?.map_or(40, |k| k as usize),
        top_p: o.f32("top_p", 0.0, 1.0)?.unwrap_or(0.9),
        min_p: o.f32("min_p", 0.0, 1.0)?.unwrap_or(0.0),
        repeat_penalty: o.f32("repeat_penalty", 0.0, 100.0)?.unwrap_or(1.1),
        presence_penalty: o.f32("presence_penalty", -100.0, 100.0)?.unwrap_or(0.0),
        frequency_penalty: o.f32("frequency_penalty", -100.0, 100.0)?.unwrap_or(0.0),
        penalty_last_n: o
            .int("repeat_last_n", -1, 1 << 30)?
            .map_or(d.penalty_last_n, |n| {
                if n < 0 { usize::MAX } else { n as usize }
            }),
        seed: o.seed("seed")?.unwrap_or_else(params::random_seed),
    };
    params.validate().map_err(ApiError::bad)?;
    // Ollama cuts a prompt longer than the context unless `truncate: false`, keeping
    // `num_keep` tokens (4 by default) at its start; -1 keeps them all, so nothing can
    // be cut.
    let truncate = Fields::top(body).bool("truncate")?.unwrap_or(true);
    let truncate_keep = match o.int("num_keep", -1, 1 << 30)? {
        _ if !truncate => None,
        Some(-1) => None,
        Some(k) => Some(k as usize),
        None => Some(4),
    };
    // Accepted and range-checked; llamay has no use for them (one CPU, no GPU layers).
    o.int("num_thread", 0, 1 << 16)?;
    o.int("num_batch", 0, 1 << 30)?;
    o.int("num_gpu", -1, 1 << 16)?;
    o.f32("typical_p", 0.0, 1.0)?;
    let max_tokens = match o.int("num_predict", -2, i64::MAX)? {
        None | Some(-1) | Some(-2) => usize::MAX,
        Some(n) => n as usize,
    };
    let n_ctx = o.int("num_ctx", 1, 1 << 24)?.map(|n| n as usize);
    Ok(Options {
        params,
        max_tokens,
        stop: o.strings("stop")?,
        n_ctx,
        truncate_keep,
    })
}

/// The request's keep-alive, or the server's; every request restarts the clock.
fn keep_alive(state: &AppState, model: &Loaded, asked: Option<Option<Duration>>) {
    model.keep_for(asked.unwrap_or_else(|| state.registry.default_keep_alive()));
}

/// The closing fields every final object carries.
fn stats(start: Instant, load: std::time::Duration, s: &Summary) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("done".into(), true.into());
    m.insert(
        "done_reason".into(),
        match s.finish {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
        .into(),
    );
    m.insert(
        "total_duration".into(),
        (start.elapsed().as_nanos() as u64).into(),
    );
    m.insert("load_duration".into(), (load.as_nanos() as u64).into());
    m.insert("prompt_eval_count".into(), s.prompt_tokens.max(1).into());
    m.insert(
        "prompt_eval_duration".into(),
        (s.prompt_eval.as_nanos() as u64).into(),
    );
    m.insert("eval_count".into(), s.generated.into());
    m.insert("eval_duration".into(), (s.eval.as_nanos() as u64).into());
    m
}

fn now() -> String {
    rfc3339(SystemTime::now())
}

/// Loads (or finds) the model, noting how long a load this request waited for took.
async fn model_for(
    state: &AppState,
    name: &str,
) -> Result<(Arc<Loaded>, std::time::Duration), ApiError> {
    let t = Instant::now();
    let was_loaded = state
        .registry
        .running()
        .iter()
        .any(|l| state.registry.resolve(name).is_ok_and(|p| p == l.path));
    let m = state.registry.get(name).await?;
    let load = if was_loaded {
        std::time::Duration::ZERO
    } else {
        t.elapsed()
    };
    Ok((m, load))
}

fn refuse_images(body: &Map<String, Value>) -> Result<(), ApiError> {
    if body
        .get("images")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return Err(ApiError::field(
            "images",
            "llamay runs text models only; images are not supported",
        ));
    }
    Ok(())
}

/// A checked `/api/generate` body: every field read and range-checked before a model
/// is touched (the `server_request` fuzz target runs this on arbitrary JSON).
pub struct GenerateRequest {
    name: String,
    prompt: String,
    raw: bool,
    stream: bool,
    opts: Options,
    grammar: Option<Arc<Rules>>,
    context: Vec<u32>,
    system: Option<String>,
    template: Option<String>,
    /// `think`, as template arguments.
    kwargs: Map<String, Value>,
    keep_alive: Option<Option<Duration>>,
}

impl GenerateRequest {
    pub fn parse(body: &Map<String, Value>) -> Result<Self, ApiError> {
        let f = Fields::top(body);
        let name = model_name(&f)?;
        refuse_images(body)?;
        if f.str("suffix")?.is_some_and(|x| !x.is_empty()) {
            return Err(ApiError::field(
                "suffix",
                "fill-in-the-middle is not supported by llamay's chat templates; send the whole prompt with raw: true",
            ));
        }
        let bad_context = || ApiError::field("context", "must be a list of token ids");
        let context: Vec<u32> = match body.get("context") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<_>>()
                .ok_or_else(bad_context)?,
            Some(_) => return Err(bad_context()),
        };
        Ok(GenerateRequest {
            prompt: f.str("prompt")?.unwrap_or("").to_string(),
            raw: f.bool("raw")?.unwrap_or(false),
            stream: f.bool("stream")?.unwrap_or(true),
            opts: options(body)?,
            grammar: generate::grammar_of_format("format", body.get("format"))?,
            context,
            system: f.str("system")?.map(str::to_string),
            template: f.str("template")?.map(str::to_string),
            kwargs: think(body)?,
            keep_alive: params::keep_alive(body.get("keep_alive"))?,
            name,
        })
    }
}

/// A checked `/api/chat` body.
pub struct ChatRequest {
    name: String,
    stream: bool,
    opts: Options,
    grammar: Option<Arc<Rules>>,
    messages: Vec<Message>,
    /// Ollama has no `tool_choice`: the model calls when it will.
    tools: crate::tools::ToolRequest,
    kwargs: Map<String, Value>,
    keep_alive: Option<Option<Duration>>,
}

impl ChatRequest {
    pub fn parse(body: &Map<String, Value>) -> Result<Self, ApiError> {
        let f = Fields::top(body);
        let name = model_name(&f)?;
        let messages = match body.get("messages") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => Message::list_from_json(v).map_err(|e| ApiError::field("messages", e))?,
        };
        let tools = crate::tools::ToolRequest {
            tools: match body.get("tools") {
                None | Some(Value::Null) => None,
                Some(v @ Value::Array(a)) if !a.is_empty() => Some(v.clone()),
                Some(Value::Array(_)) => None,
                Some(_) => return Err(ApiError::field("tools", "must be a list")),
            },
            ..crate::tools::ToolRequest::none()
        };
        let kwargs = think(body)?;
        Ok(ChatRequest {
            name,
            stream: f.bool("stream")?.unwrap_or(true),
            opts: options(body)?,
            grammar: generate::grammar_of_format("format", body.get("format"))?,
            messages,
            tools,
            kwargs,
            keep_alive: params::keep_alive(body.get("keep_alive"))?,
        })
    }
}

/// `think` as template arguments (`enable_thinking`, `reasoning_effort`).
fn think(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = Map::new();
    match body.get("think") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => {
            kwargs.insert("enable_thinking".into(), (*b).into());
        }
        Some(Value::String(level)) if matches!(level.as_str(), "low" | "medium" | "high") => {
            kwargs.insert("enable_thinking".into(), true.into());
            kwargs.insert("reasoning_effort".into(), level.clone().into());
        }
        Some(_) => {
            return Err(ApiError::field(
                "think",
                "must be true, false, \"low\", \"medium\" or \"high\"",
            ));
        }
    }
    Ok(kwargs)
}

/// Thinking asked of a model whose template has no reasoning: a 400, as Ollama gives it
/// (never ignored).
fn check_thinking(
    name: &str,
    format: Option<&llamay_template::ChatFormat>,
    kwargs: &Map<String, Value>,
) -> Result<(), ApiError> {
    let asked = kwargs.get("enable_thinking") == Some(&Value::Bool(true));
    if asked && !format.is_some_and(|f| llamay_template::has_thinking(f.source())) {
        return Err(ApiError::bad(format!(
            "\"{name}\" does not support thinking"
        )));
    }
    Ok(())
}

async fn generate(axum::extract::State(s): State, body: Body) -> Result<Response, ApiError> {
    let start = Instant::now();
    let body = body_object(&s, body).await?;
    let GenerateRequest {
        name,
        prompt,
        raw,
        stream,
        opts,
        grammar,
        context,
        system,
        template,
        kwargs,
        keep_alive: keep,
    } = GenerateRequest::parse(&body)?;
    let (model, load) = model_for(&s, &name).await?;
    keep_alive(&s, &model, keep);
    if prompt.is_empty() && context.is_empty() {
        // Ollama's way to load a model (or, with keep_alive 0, to unload it).
        if keep == Some(Some(Duration::ZERO)) {
            s.registry.unload(&model.path);
        }
        let mut m = Map::new();
        m.insert("model".into(), name.clone().into());
        m.insert("created_at".into(), now().into());
        m.insert("response".into(), "".into());
        m.insert("done".into(), true.into());
        m.insert("done_reason".into(), "load".into());
        return Ok(axum::Json(Value::Object(m)).into_response());
    }
    let tokens = if raw {
        let add_bos = context.is_empty();
        let mut t = context.clone();
        t.extend(model.tok.encode(prompt.as_bytes(), add_bos, true));
        t
    } else {
        let mut msgs = Vec::new();
        if let Some(sys) = &system {
            msgs.push(Message::new("system", sys));
        }
        msgs.push(Message::new("user", &prompt));
        let own;
        let format = match template.as_deref() {
            Some(src) if !src.is_empty() => {
                own = llamay_template::ChatFormat::from_source(src, &model.tok).map_err(|e| {
                    ApiError::field(
                        "template",
                        format!("llamay renders Jinja chat templates (as in tokenizer.chat_template); this one does not parse: {e}"),
                    )
                })?;
                Some(&own)
            }
            _ => model.format.as_ref(),
        };
        check_thinking(&name, format, &kwargs)?;
        let mut t = context.clone();
        match format {
            Some(fmt) => {
                let text = fmt
                    .render(&msgs, None, true, kwargs)
                    .map_err(|e| ApiError::bad(format!("the chat template failed: {e}")))?;
                if context.is_empty() {
                    t.extend(fmt.encode(&model.tok, &text));
                } else {
                    t.extend(model.tok.encode(text.as_bytes(), false, true));
                }
            }
            // No template: the prompt as it is (Ollama's `{{ .Prompt }}`).
            None => {
                let text = match &system {
                    Some(sys) => format!("{sys}\n\n{prompt}"),
                    None => prompt.clone(),
                };
                t.extend(model.tok.encode(text.as_bytes(), context.is_empty(), true));
            }
        }
        t
    };
    let g = opts.generation(tokens, grammar, false);
    let rx = generate::submit(&model, g).map_err(|e| s.rejected(e))?;
    let st = s.clone();
    let mut first = true;
    let convert = move |text: &mut String, ev: Option<Event>| -> Out {
        let base = |response: &str| {
            let mut m = Map::new();
            m.insert("model".into(), name.clone().into());
            m.insert("created_at".into(), now().into());
            m.insert("response".into(), response.into());
            m
        };
        match ev {
            Some(Event::Token(p)) => {
                if first {
                    first = false;
                    st.metrics.first_token(start.elapsed());
                }
                if p.text.is_empty() {
                    return Out {
                        objects: vec![],
                        end: false,
                    };
                }
                text.push_str(&p.text);
                let mut m = base(&p.text);
                m.insert("done".into(), false.into());
                Out {
                    objects: vec![Value::Object(m)],
                    end: false,
                }
            }
            Some(Event::Done(sum)) => {
                st.metrics.finished(start.elapsed());
                let mut objects = Vec::new();
                if !sum.tail.is_empty() {
                    let mut m = base(&sum.tail);
                    m.insert("done".into(), false.into());
                    objects.push(Value::Object(m));
                }
                let mut m = base("");
                m.extend(stats(start, load, &sum));
                m.insert("context".into(), json!(sum.tokens));
                objects.push(Value::Object(m));
                Out { objects, end: true }
            }
            Some(Event::Failed(why)) => {
                st.metrics.failed();
                stream::failed(Some(why), false)
            }
            None => stream::failed(None, false),
        }
    };
    if stream {
        return Ok(stream::respond(Framing::NdJson, rx, String::new(), convert));
    }
    collect(rx, convert).await
}

/// A non-streamed answer: every object the stream would have sent, folded into one
/// (the concatenated `response`/`message`, the final object's statistics).
async fn collect(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    mut convert: impl FnMut(&mut String, Option<Event>) -> Out,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut merged: Option<Map<String, Value>> = None;
    loop {
        let ev = rx.recv().await;
        let closed = ev.is_none();
        let out = convert(&mut text, ev);
        for o in out.objects {
            if let Some(e) = o.get("error").and_then(Value::as_str) {
                return Err(ApiError::internal(e));
            }
            let Value::Object(o) = o else { continue };
            merge(&mut merged, o);
        }
        if out.end || closed {
            break;
        }
    }
    Ok(axum::Json(Value::Object(merged.unwrap_or_default())).into_response())
}

/// Folds one streamed object into the whole: strings in `response` and the message's
/// `content`/`thinking` concatenate, `tool_calls` accumulate, anything else is the
/// latest.
fn merge(acc: &mut Option<Map<String, Value>>, o: Map<String, Value>) {
    let Some(a) = acc else {
        *acc = Some(o);
        return;
    };
    for (k, v) in o {
        match (k.as_str(), a.get_mut(&k), v) {
            ("response", Some(Value::String(s)), Value::String(t)) => s.push_str(&t),
            ("message", Some(Value::Object(m)), Value::Object(n)) => {
                for (mk, mv) in n {
                    match (mk.as_str(), m.get_mut(&mk), mv) {
                        ("content" | "thinking", Some(Value::String(s)), Value::String(t)) => {
                            s.push_str(&t)
                        }
                        ("tool_calls", Some(Value::Array(x)), Value::Array(y)) => x.extend(y),
                        (_, _, mv) => {
                            m.insert(mk, mv);
                        }
                    }
                }
            }
            (_, _, v) => {
                a.insert(k, v);
            }
        }
    }
}

fn tool_calls_json(calls: &[llamay_template::ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"id": generate::call_id(c, i), "function": {"index": i, "name": c.name, "arguments": c.arguments}}))
            .collect(),
    )
}

async fn chat(axum::extract::State(s): State, body: Body) -> Result<Response, ApiError> {
    let start = Instant::now();
    let body = body_object(&s, body).await?;
    let ChatRequest {
        name,
        stream,
        opts,
        grammar,
        messages,
        tools,
        kwargs,
        keep_alive: keep,
    } = ChatRequest::parse(&body)?;
    let (model, load) = model_for(&s, &name).await?;
    keep_alive(&s, &model, keep);
    if messages.is_empty() {
        if keep == Some(Some(Duration::ZERO)) {
            s.registry.unload(&model.path);
        }
        return Ok(axum::Json(json!({
            "model": name, "created_at": now(),
            "message": {"role": "assistant", "content": ""},
            "done": true, "done_reason": "load",
        }))
        .into_response());
    }
    check_thinking(&name, model.format.as_ref(), &kwargs)?;
    let render = |messages: &[Message]| {
        generate::chat_prompt(
            &model,
            &name,
            messages,
            &tools,
            grammar.clone(),
            kwargs.clone(),
        )
    };
    let mut prompt = render(&messages)?;
    // As Ollama's chatPrompt: a conversation longer than the context loses its oldest
    // messages (never a system message, never the last one) before the runner cuts
    // tokens (generate::submit).
    if opts.truncate_keep.is_some() {
        let n_ctx = generate::context_of(&model, opts.n_ctx);
        let room = generate::prompt_room(n_ctx, opts.max_tokens);
        let mut kept = messages.clone();
        while prompt.tokens.len() > room {
            let Some(i) = kept[..kept.len() - 1]
                .iter()
                .position(|m| m.role != "system")
            else {
                break;
            };
            kept.remove(i);
            prompt = render(&kept)?;
        }
        if kept.len() < messages.len() {
            eprintln!(
                "llamay serve: {name}: the conversation's {} oldest messages dropped to fit num_ctx {n_ctx}",
                messages.len() - kept.len()
            );
        }
    }
    let g = opts.generation(prompt.tokens.clone(), prompt.grammar.clone(), true);
    let rx = generate::submit(&model, g).map_err(|e| s.rejected(e))?;
    let st = s.clone();
    let mut parser = Some(prompt.parser());
    let mut first = true;
    let convert = move |_: &mut String, ev: Option<Event>| -> Out {
        let chunk = |d: generate::ChatDelta| {
            let mut msg = Map::new();
            msg.insert("role".into(), "assistant".into());
            msg.insert("content".into(), d.content.into());
            if !d.reasoning.is_empty() {
                msg.insert("thinking".into(), d.reasoning.into());
            }
            if !d.tool_calls.is_empty() {
                msg.insert("tool_calls".into(), tool_calls_json(&d.tool_calls));
            }
            let mut m = Map::new();
            m.insert("model".into(), name.clone().into());
            m.insert("created_at".into(), now().into());
            m.insert("message".into(), Value::Object(msg));
            m
        };
        match ev {
            Some(Event::Token(p)) => {
                if first {
                    first = false;
                    st.metrics.first_token(start.elapsed());
                }
                let d = parser.as_mut().map(|x| x.push(&p.text)).unwrap_or_default();
                if d.is_empty() {
                    return Out {
                        objects: vec![],
                        end: false,
                    };
                }
                let mut m = chunk(d);
                m.insert("done".into(), false.into());
                Out {
                    objects: vec![Value::Object(m)],
                    end: false,
                }
            }
            Some(Event::Done(sum)) => {
                st.metrics.finished(start.elapsed());
                let mut objects = Vec::new();
                let mut d = parser
                    .as_mut()
                    .map(|x| x.push(&sum.tail))
                    .unwrap_or_default();
                if let Some(p) = parser.take() {
                    let rest = p.finish();
                    let mut out = ChatOutput::default();
                    d.append_to(&mut out);
                    rest.append_to(&mut out);
                    d = generate::ChatDelta {
                        content: out.content,
                        reasoning: out.reasoning,
                        tool_calls: out.tool_calls,
                    };
                }
                if !d.is_empty() {
                    let mut m = chunk(d);
                    m.insert("done".into(), false.into());
                    objects.push(Value::Object(m));
                }
                let mut m = chunk(generate::ChatDelta::default());
                m.extend(stats(start, load, &sum));
                objects.push(Value::Object(m));
                Out { objects, end: true }
            }
            Some(Event::Failed(why)) => {
                st.metrics.failed();
                stream::failed(Some(why), false)
            }
            None => stream::failed(None, false),
        }
    };
    if stream {
        return Ok(stream::respond(Framing::NdJson, rx, String::new(), convert));
    }
    collect(rx, convert).await
}

/// `input` (or the legacy `prompt`): a string or a list of strings.
fn texts(f: &Fields<'_>, key: &str) -> Result<Vec<String>, ApiError> {
    let t = f.strings(key)?;
    if t.is_empty() {
        return Err(ApiError::field(
            key,
            "is required (a string or a list of strings)",
        ));
    }
    Ok(t)
}

/// `/api/embed`: normalised, mean-pooled final hidden states, as llama.cpp's
/// `--pooling mean` (for a decoder-only model, as Ollama gives them too).
async fn embed(axum::extract::State(s): State, body: Body) -> Result<Response, ApiError> {
    let start = Instant::now();
    let body = body_object(&s, body).await?;
    let f = Fields::top(&body);
    let name = model_name(&f)?;
    let input = texts(&f, "input")?;
    let truncate = f.bool("truncate")?.unwrap_or(true);
    let keep = params::keep_alive(body.get("keep_alive"))?;
    let dims = f.int("dimensions", 1, 1 << 20)?.map(|d| d as usize);
    let (model, load) = model_for(&s, &name).await?;
    keep_alive(&s, &model, keep);
    let (inputs, cut) = generate::embedding_inputs(&model, &input, truncate)?;
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let t = Instant::now();
    let vectors = generate::embed(&model, inputs).await?;
    let embeddings: Vec<Vec<f32>> = vectors
        .into_iter()
        .map(|v| generate::normalized(v, dims))
        .collect();
    let mut out = json!({
        "model": name,
        "embeddings": embeddings,
        "total_duration": start.elapsed().as_nanos() as u64,
        "load_duration": load.as_nanos() as u64,
        "prompt_eval_count": n_tokens,
        "prompt_eval_duration": t.elapsed().as_nanos() as u64,
    });
    if cut > 0 {
        // Ollama cuts silently; llamay says how many inputs it cut to the context.
        out["truncated_inputs"] = cut.into();
    }
    Ok(axum::Json(out).into_response())
}

/// The legacy `/api/embeddings`: one `prompt`, the pooled vector as computed (not
/// normalised, as Ollama's legacy route returns it).
async fn embeddings_legacy(
    axum::extract::State(s): State,
    body: Body,
) -> Result<Response, ApiError> {
    let body = body_object(&s, body).await?;
    let f = Fields::top(&body);
    let name = model_name(&f)?;
    let prompt = f
        .str("prompt")?
        .ok_or_else(|| ApiError::field("prompt", "is required"))?
        .to_string();
    let keep = params::keep_alive(body.get("keep_alive"))?;
    let (model, _) = model_for(&s, &name).await?;
    keep_alive(&s, &model, keep);
    let (inputs, _) = generate::embedding_inputs(&model, &[prompt], true)?;
    let mut v = generate::embed(&model, inputs).await?;
    Ok(axum::Json(json!({ "embedding": v.pop().unwrap_or_default() })).into_response())
}

/// `details` as Ollama reports them, from the file's header.
fn details(path: &std::path::Path) -> Result<(Value, Map<String, Value>), ApiError> {
    let mapped = llamay_gguf::MappedModel::open(path)
        .map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?;
    let gguf = mapped
        .parse()
        .map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?;
    let md = gguf.metadata();
    let arch = md.architecture().ok().flatten().unwrap_or("").to_string();
    let params: u64 = gguf.tensors().map(|t| t.n_elements).sum();
    let quant = md
        .get_u64("general.file_type")
        .ok()
        .flatten()
        .and_then(llamay_gguf::file_type_name)
        .unwrap_or("unknown");
    let size = if params >= 1_000_000_000 {
        format!("{:.1}B", params as f64 / 1e9)
    } else {
        format!("{:.0}M", params as f64 / 1e6)
    };
    let mut info = Map::new();
    for (k, v) in md.iter() {
        // Vocabulary-sized arrays are left out, as Ollama leaves them out unless verbose.
        if let llamay_gguf::Value::Array(a) = v
            && a.len() > 64
        {
            info.insert(k.to_string(), Value::Null);
            continue;
        }
        if k == "tokenizer.chat_template" {
            continue;
        }
        info.insert(k.to_string(), gguf_json(v));
    }
    info.insert("general.parameter_count".into(), params.into());
    let d = json!({
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch],
        "parameter_size": size,
        "quantization_level": quant,
    });
    Ok((d, info))
}

fn gguf_json(v: &llamay_gguf::Value<'_>) -> Value {
    use llamay_gguf::Value as G;
    match v {
        G::U8(x) => (*x).into(),
        G::I8(x) => (*x).into(),
        G::U16(x) => (*x).into(),
        G::I16(x) => (*x).into(),
        G::U32(x) => (*x).into(),
        G::I32(x) => (*x).into(),
        G::U64(x) => (*x).into(),
        G::I64(x) => (*x).into(),
        G::F32(x) => serde_json::Number::from_f64(*x as f64).map_or(Value::Null, Value::Number),
        G::F64(x) => serde_json::Number::from_f64(*x).map_or(Value::Null, Value::Number),
        G::Bool(b) => (*b).into(),
        G::String(s) => s.to_string_lossy().into(),
        G::Array(a) => Value::Array(a.iter().map(|x| gguf_json(&x)).collect()),
        #[allow(unreachable_patterns)]
        _ => Value::Null,
    }
}

async fn tags(axum::extract::State(s): State) -> Result<Response, ApiError> {
    let names = s.registry.names();
    let models = tokio::task::spawn_blocking(move || {
        names
            .into_iter()
            .map(|(name, path, modified)| {
                let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                let det = details(&path).map(|d| d.0).unwrap_or(Value::Null);
                json!({
                    "name": name, "model": name,
                    "modified_at": rfc3339(modified.unwrap_or(SystemTime::UNIX_EPOCH)),
                    "size": size,
                    "digest": digest_of(&path),
                    "details": det,
                })
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(axum::Json(json!({ "models": models })).into_response())
}

/// A model's digest: a store blob's is its file name; a `-m` file's is its sha256,
/// computed once per file (size and modification time) and cached, so that clients
/// keying models by digest never merge two files.
fn digest_of(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};
    type Key = (u64, Option<SystemTime>);
    static CACHE: LazyLock<Mutex<HashMap<std::path::PathBuf, (Key, String)>>> =
        LazyLock::new(Default::default);
    let n = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(hex) = n.strip_prefix("sha256-").filter(|h| h.len() == 64) {
        return hex.to_string();
    }
    let Ok(meta) = std::fs::metadata(path) else {
        return String::new();
    };
    let key = (meta.len(), meta.modified().ok());
    if let Some((k, d)) = CACHE.lock().unwrap_or_else(|e| e.into_inner()).get(path)
        && *k == key
    {
        return d.clone();
    }
    let mut h = Sha256::new();
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    if std::io::copy(&mut f, &mut h).is_err() {
        return String::new();
    }
    let d: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path.to_path_buf(), (key, d.clone()));
    d
}

async fn show(axum::extract::State(s): State, body: Body) -> Result<Response, ApiError> {
    let body = body_object(&s, body).await?;
    let f = Fields::top(&body);
    let name = match f.str("model")?.or(f.str("name")?) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => return Err(ApiError::field("model", "is required")),
    };
    let path = s.registry.resolve(&name)?;
    let p = path.clone();
    let (det, info, template) = tokio::task::spawn_blocking(move || {
        let (d, i) = details(&p)?;
        let t = llamay_gguf::MappedModel::open(&p).ok().and_then(|m| {
            m.parse().ok().and_then(|g| {
                g.metadata()
                    .get_str("tokenizer.chat_template")
                    .ok()
                    .flatten()
                    .map(str::to_string)
            })
        });
        Ok::<_, ApiError>((d, i, t))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    let template = template.or_else(|| {
        s.config
            .chat_template
            .as_deref()
            .and_then(|n| llamay_template::builtin::get(n).map(|(_, src)| src.to_string()))
    });
    // As Ollama derives them: an embedding model (one with a pooling type) embeds and
    // does not complete; tools when the template takes them, thinking when it has
    // reasoning markup.
    let arch = info["general.architecture"].as_str().unwrap_or_default();
    let mut capabilities = vec![];
    if info.get(&format!("{arch}.pooling_type")).is_some() {
        capabilities.push("embedding");
    } else {
        capabilities.push("completion");
        if let Some(t) = &template {
            if t.contains("tools") {
                capabilities.push("tools");
            }
            if llamay_template::has_thinking(t) {
                capabilities.push("thinking");
            }
        }
    }
    let e = s.registry.engine();
    let parameters = format!("num_ctx {}", e.n_ctx);
    let mut modelfile = format!(
        "# Modelfile generated by llamay\nFROM {}\nPARAMETER {parameters}\n",
        path.display()
    );
    if let Some(t) = &template {
        modelfile += &format!("TEMPLATE \"\"\"{t}\"\"\"\n");
    }
    Ok(axum::Json(json!({
        "modelfile": modelfile,
        "parameters": parameters,
        "template": template.unwrap_or_default(),
        "details": det,
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": rfc3339(std::fs::metadata(&path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH)),
    }))
    .into_response())
}

async fn ps(axum::extract::State(s): State) -> Response {
    let names = s.registry.names();
    let models: Vec<Value> = s
        .registry
        .running()
        .iter()
        .map(|l| {
            // Every name standing for this file is listed, the one it loaded under first.
            let name = if names.iter().any(|(n, _, _)| n == &l.name) {
                l.name.clone()
            } else {
                names
                    .iter()
                    .find(|(_, p, _)| p == &l.path)
                    .map_or(l.name.clone(), |n| n.0.clone())
            };
            json!({
                "name": name, "model": name,
                "size": l.size, "size_vram": l.size_vram(),
                "digest": digest_of(&l.path),
                "details": details(&l.path).map(|d| d.0).unwrap_or(Value::Null),
                "expires_at": l.expires_at().map_or_else(|| "0001-01-01T00:00:00Z".to_string(), rfc3339),
                "context_length": l.scheduler.config().n_ctx,
            })
        })
        .collect();
    axum::Json(json!({ "models": models })).into_response()
}

async fn pull(axum::extract::State(s): State, body: Body) -> Result<Response, ApiError> {
    let body = body_object(&s, body).await?;
    let f = Fields::top(&body);
    let name = match f.str("model")?.or(f.str("name")?) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => return Err(ApiError::field("model", "is required")),
    };
    let insecure = f.bool("insecure")?.unwrap_or(false);
    let stream = f.bool("stream")?.unwrap_or(true);
    let Some(root) = s.registry.store().map(|st| st.root().to_path_buf()) else {
        return Err(ApiError::bad("this server has no model store"));
    };
    // Opened for writing only now: a server that never pulls makes no directories.
    let store = llamay_hub::Store::open(&root)
        .map_err(|e| ApiError::internal(format!("the model store: {e}")))?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    tokio::task::spawn_blocking(move || {
        let _ = tx.send(json!({"status": "pulling manifest"}));
        let opts = llamay_hub::PullOptions::from_env(insecure);
        let mut last = String::new();
        let r = llamay_hub::pull(&store, &name, &opts, &mut |p| {
            if p.what != last {
                last = p.what.clone();
            }
            let mut m = json!({"status": format!("pulling {}", p.what), "completed": p.done});
            if let Some(t) = p.total {
                m["total"] = t.into();
            }
            if p.what.starts_with("sha256:") {
                m["digest"] = p.what.clone().into();
            }
            let _ = tx.send(m);
        });
        match r {
            Ok(_) => {
                let _ = tx.send(json!({"status": "verifying sha256 digest"}));
                let _ = tx.send(json!({"status": "writing manifest"}));
                let _ = tx.send(json!({"status": "success"}));
            }
            Err(e) => {
                let _ = tx.send(json!({"error": e.to_string()}));
            }
        }
    });
    if stream {
        let body = futures_util::stream::unfold(rx, |mut rx| async move {
            let v = rx.recv().await?;
            let mut line = serde_json::to_vec(&v).expect("JSON");
            line.push(b'\n');
            Some((
                Ok::<_, std::convert::Infallible>(bytes::Bytes::from(line)),
                rx,
            ))
        });
        let mut r = Response::new(Body::from_stream(body));
        r.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/x-ndjson"),
        );
        return Ok(r);
    }
    let mut rx = rx;
    let mut last = Value::Null;
    while let Some(v) = rx.recv().await {
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            return Err(ApiError::internal(e));
        }
        last = v;
    }
    Ok(axum::Json(last).into_response())
}

async fn delete_model(axum::extract::State(s): State, body: Body) -> Result<Response, ApiError> {
    let body = body_object(&s, body).await?;
    let f = Fields::top(&body);
    let name = match f.str("model")?.or(f.str("name")?) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => return Err(ApiError::field("model", "is required")),
    };
    if s.registry.forget(&name) {
        return Ok(StatusCode::OK.into_response());
    }
    let Some(store) = s.registry.store() else {
        return Err(ApiError::not_found(format!("model '{name}' not found")));
    };
    match store.remove(&name) {
        Ok(_) => Ok(StatusCode::OK.into_response()),
        Err(e) => Err(ApiError::not_found(format!(
            "model '{name}' not found: {e}"
        ))),
    }
}

async fn copy(axum::extract::State(s): State, body: Body) -> Result<Response, ApiError> {
    let body = body_object(&s, body).await?;
    let f = Fields::top(&body);
    let source = f
        .str("source")?
        .filter(|x| !x.is_empty())
        .ok_or_else(|| ApiError::field("source", "is required"))?;
    let dest = f
        .str("destination")?
        .filter(|x| !x.is_empty())
        .ok_or_else(|| ApiError::field("destination", "is required"))?;
    if dest.chars().any(|c| c.is_whitespace() || c.is_control()) || dest.len() > 300 {
        return Err(ApiError::field("destination", "is not a valid model name"));
    }
    s.registry.copy(source, dest)?;
    Ok(StatusCode::OK.into_response())
}

async fn version() -> Response {
    axum::Json(json!({ "version": concat!("0.12.0-llamay-", env!("CARGO_PKG_VERSION")) }))
        .into_response()
}

async fn push() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "/api/push is not supported: llamay fetches models from registries, it never hosts or uploads them",
    )
}

async fn create() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "/api/create is not supported: llamay fetches models (llamay pull, /api/pull) and serves GGUF files given with -m; it does not build models from Modelfiles or uploaded blobs",
    )
}
