//! OpenAI's Responses API (`POST /v1/responses`), stateless as Ollama serves it: the
//! request is translated into a chat completion's (input items → messages,
//! `instructions` → the system turn, flat function tools → chat tools, `text.format` →
//! `response_format`) and run through the same prompt, grammar and output parsing; the
//! answer comes back as output items — `message` (`output_text`), `function_call`,
//! `reasoning` — whole, or streamed as the documented events in their order
//! (`response.created`, `response.in_progress`, per item `output_item.added`, its
//! deltas and `done` events, `output_item.done`, then `response.completed` or
//! `response.incomplete`). `previous_response_id` is refused by name: nothing is kept.

use crate::State;
use crate::error::{ApiError, OaiError};
use crate::generate::{self, ChatDelta};
use crate::ollama::body_object;
use crate::openai::{ChatRequest, collect, new_id, unix_now};
use crate::scheduler::{Event, Finish, Summary};
use crate::stream::{self, Framing, Out};
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use llamay_template::ToolCall;
use serde_json::{Map, Value, json};
use std::time::Instant;

type Result<T> = std::result::Result<T, OaiError>;

/// The text of a message's `content`: a string, or its text parts.
fn content_text(v: &Value, at: &str) -> std::result::Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        out += p.get("text").and_then(Value::as_str).unwrap_or_default();
                    }
                    Some(t @ ("input_image" | "input_file" | "input_audio")) => {
                        return Err(ApiError::field(
                            at,
                            format!(
                                "{t} content is not supported (vision, files and audio are out of scope; send text)"
                            ),
                        ));
                    }
                    other => {
                        return Err(ApiError::field(
                            at,
                            format!(
                                "a content part of type {other:?} is not one of input_text, output_text"
                            ),
                        ));
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::field(
            at,
            "must be a string or a list of content parts",
        )),
    }
}

/// `input` (and `instructions`) as chat messages.
fn messages(body: &Map<String, Value>) -> std::result::Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => out.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(ApiError::field("instructions", "must be a string")),
    }
    let items = match body.get("input") {
        Some(Value::String(s)) => {
            return Ok({
                out.push(json!({"role": "user", "content": s}));
                out
            });
        }
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => return Err(ApiError::field("input", "is required")),
        Some(_) => {
            return Err(ApiError::field(
                "input",
                "must be a string or a list of items",
            ));
        }
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            None | Some("message") => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer" | "system") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    other => {
                        return Err(ApiError::field(
                            &format!("{at}.role"),
                            format!("{other:?} is not one of user, assistant, system, developer"),
                        ));
                    }
                };
                let text = content_text(
                    item.get("content").unwrap_or(&Value::Null),
                    &format!("{at}.content"),
                )?;
                out.push(json!({"role": role, "content": text}));
            }
            Some("function_call") => {
                let field = |k: &str| {
                    item.get(k).and_then(Value::as_str).ok_or_else(|| {
                        ApiError::field(&format!("{at}.{k}"), "is required (a string)")
                    })
                };
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?}});
                // Calls in a row are one assistant turn.
                match out.last_mut() {
                    Some(m)
                        if m["role"] == "assistant"
                            && m.get("tool_calls").is_some()
                            && m["content"].is_null() =>
                    {
                        m["tool_calls"].as_array_mut().expect("a list").push(call);
                    }
                    _ => out
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            Some("function_call_output") => {
                let id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::field(&format!("{at}.call_id"), "is required (a string)")
                })?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(v, &format!("{at}.output"))?,
                    Some(v) => v.to_string(),
                    None => return Err(ApiError::field(&format!("{at}.output"), "is required")),
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            // The model's earlier reasoning is not sent back into the prompt (as chat
            // templates drop it from past turns).
            Some("reasoning") => {}
            Some("item_reference") => {
                return Err(ApiError::field(
                    &at,
                    "item_reference needs stored responses; llamay keeps none (send the items themselves)",
                ));
            }
            Some(other) => {
                return Err(ApiError::field(
                    &format!("{at}.type"),
                    format!(
                        "\"{other}\" is not one of message, function_call, function_call_output, reasoning"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// A Responses body as the chat completion it asks for.
fn as_chat(body: &Map<String, Value>) -> std::result::Result<Map<String, Value>, ApiError> {
    if body
        .get("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApiError::field(
            "previous_response_id",
            "llamay keeps no responses (stateless, as Ollama's /v1/responses); send the whole conversation in input",
        ));
    }
    if body.get("conversation").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::field(
            "conversation",
            "llamay keeps no conversations; send the whole conversation in input",
        ));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages(body)?));
    for k in [
        "model",
        "stream",
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "seed",
        "top_logprobs",
    ] {
        if let Some(v) = body.get(k) {
            chat.insert(k.into(), v.clone());
        }
    }
    if let Some(v) = body.get("max_output_tokens") {
        chat.insert("max_tokens".into(), v.clone());
    }
    if let Some(tc) = body.get("tool_choice") {
        chat.insert("tool_choice".into(), tc.clone());
    }
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let mut list = Vec::new();
            for (i, t) in tools.iter().enumerate() {
                match t.get("type").and_then(Value::as_str) {
                    Some("function") => {
                        let mut f = t.as_object().cloned().unwrap_or_default();
                        f.remove("type");
                        f.remove("strict");
                        list.push(json!({"type": "function", "function": f}));
                    }
                    other => {
                        return Err(ApiError::field(
                            &format!("tools[{i}].type"),
                            format!(
                                "{other:?}: only function tools run here (web search, file search, computer use and hosted tools are OpenAI's)"
                            ),
                        ));
                    }
                }
            }
            chat.insert("tools".into(), Value::Array(list));
        }
        Some(_) => return Err(ApiError::field("tools", "must be a list")),
    }
    if let Some(format) = body.get("text").and_then(|t| t.get("format")) {
        let rf = match format.get("type").and_then(Value::as_str) {
            Some("text") => json!({"type": "text"}),
            Some("json_object") => json!({"type": "json_object"}),
            Some("json_schema") => json!({"type": "json_schema", "json_schema": {
                "name": format.get("name").cloned().unwrap_or(Value::Null),
                "schema": format.get("schema").cloned().unwrap_or(Value::Null)}}),
            _ => {
                return Err(ApiError::field(
                    "text.format.type",
                    "must be \"text\", \"json_object\" or \"json_schema\"",
                ));
            }
        };
        chat.insert("response_format".into(), rf);
    }
    Ok(chat)
}

/// The fields every response object echoes from its request.
fn skeleton(body: &Map<String, Value>, id: &str, created: u64, model: &str) -> Value {
    let get = |k: &str, d: Value| body.get(k).cloned().filter(|v| !v.is_null()).unwrap_or(d);
    json!({
        "id": id, "object": "response", "created_at": created, "status": "in_progress",
        "model": model, "output": [], "error": null, "incomplete_details": null,
        "instructions": get("instructions", Value::Null),
        "max_output_tokens": get("max_output_tokens", Value::Null),
        "parallel_tool_calls": get("parallel_tool_calls", true.into()),
        "temperature": get("temperature", json!(0.8)),
        "top_p": get("top_p", json!(0.95)),
        "tool_choice": get("tool_choice", "auto".into()),
        "tools": get("tools", json!([])),
        "text": get("text", json!({"format": {"type": "text"}})),
        "reasoning": get("reasoning", json!({"effort": null, "summary": null})),
        "metadata": get("metadata", json!({})),
        "previous_response_id": null, "store": false, "truncation": "disabled", "usage": null,
    })
}

/// Which kind of item is open (receiving deltas).
enum Open {
    None,
    Message { id: String, text: String },
    Reasoning { id: String, text: String },
}

/// The stream's state: the response so far and the item receiving deltas.
struct Builder {
    response: Value,
    seq: u64,
    open: Open,
}

impl Builder {
    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        fields["type"] = kind.into();
        fields["sequence_number"] = self.seq.into();
        self.seq += 1;
        fields
    }

    fn output(&mut self) -> &mut Vec<Value> {
        self.response["output"].as_array_mut().expect("a list")
    }

    /// Closes the open item: its done events, its final form in `output`.
    fn close(&mut self, out: &mut Vec<Value>) {
        let index = self.output().len();
        // The open item's own done-events, then the item's.
        let (done, item) = match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Message { id, text } => {
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                let done = vec![
                    (
                        "response.output_text.done",
                        json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                    ),
                    (
                        "response.content_part.done",
                        json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                    ),
                ];
                (
                    done,
                    json!({"type": "message", "id": id, "status": "completed", "role": "assistant", "content": [part]}),
                )
            }
            Open::Reasoning { id, text } => {
                let done = vec![(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                )];
                let part = json!({"type": "reasoning_text", "text": text});
                (
                    done,
                    json!({"type": "reasoning", "id": id, "summary": [], "content": [part]}),
                )
            }
        };
        for (kind, body) in done {
            let ev = self.event(kind, body);
            out.push(ev);
        }
        let ev = self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        out.push(ev);
        self.output().push(item);
    }

    fn text(&mut self, reasoning: bool, delta: &str, out: &mut Vec<Value>) {
        if delta.is_empty() {
            return;
        }
        let fits = matches!(
            (&self.open, reasoning),
            (Open::Message { .. }, false) | (Open::Reasoning { .. }, true)
        );
        if !fits {
            self.close(out);
            let index = self.output().len();
            if reasoning {
                let id = new_id("rs");
                let ev = self.event(
                    "response.output_item.added",
                    json!({"output_index": index,
                    "item": {"type": "reasoning", "id": id, "summary": [], "content": []}}),
                );
                out.push(ev);
                self.open = Open::Reasoning {
                    id,
                    text: String::new(),
                };
            } else {
                let id = new_id("msg");
                let ev = self.event("response.output_item.added", json!({"output_index": index,
                    "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}}));
                out.push(ev);
                let ev = self.event("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}));
                out.push(ev);
                self.open = Open::Message {
                    id,
                    text: String::new(),
                };
            }
        }
        // The open item is not in `output` yet: its index is the next one.
        let index = self.output().len();
        let (id, kind) = match &mut self.open {
            Open::Message { id, text } => {
                text.push_str(delta);
                (id.clone(), "response.output_text.delta")
            }
            Open::Reasoning { id, text } => {
                text.push_str(delta);
                (id.clone(), "response.reasoning_text.delta")
            }
            Open::None => unreachable!("opened above"),
        };
        let mut fields =
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta});
        if kind == "response.output_text.delta" {
            fields["logprobs"] = json!([]);
        }
        let ev = self.event(kind, fields);
        out.push(ev);
    }

    fn call(&mut self, c: &ToolCall, out: &mut Vec<Value>) {
        self.close(out);
        let index = self.output().len();
        let id = new_id("fc");
        let call_id = generate::call_id(c, index);
        let args = c.arguments.to_string();
        let mut item = json!({"type": "function_call", "id": id, "call_id": call_id, "name": c.name,
            "arguments": "", "status": "in_progress"});
        let ev = self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        out.push(ev);
        let ev = self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": args}),
        );
        out.push(ev);
        let ev = self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": c.name, "arguments": args}),
        );
        out.push(ev);
        item["arguments"] = args.into();
        item["status"] = "completed".into();
        let ev = self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        out.push(ev);
        self.output().push(item);
    }

    fn delta(&mut self, d: ChatDelta, out: &mut Vec<Value>) {
        self.text(true, &d.reasoning, out);
        self.text(false, &d.content, out);
        for c in &d.tool_calls {
            self.call(c, out);
        }
    }

    fn finish(&mut self, sum: &Summary, out: &mut Vec<Value>) {
        self.close(out);
        let cut = sum.finish == Finish::Length;
        self.response["status"] = if cut { "incomplete" } else { "completed" }.into();
        if cut {
            self.response["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        self.response["usage"] = json!({
            "input_tokens": sum.prompt_tokens,
            "input_tokens_details": {"cached_tokens": sum.cached_tokens},
            "output_tokens": sum.generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": sum.prompt_tokens + sum.generated,
        });
        let response = self.response.clone();
        let kind = if cut {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let ev = self.event(kind, json!({"response": response}));
        out.push(ev);
    }
}

/// A Responses body checked as the chat request it becomes (the fuzz target's entry).
pub fn parse(body: &Map<String, Value>) -> std::result::Result<ChatRequest, ApiError> {
    ChatRequest::parse(&as_chat(body)?)
}

/// `POST /v1/responses`.
pub async fn create(axum::extract::State(s): State, body: Body) -> Result<Response> {
    let start = Instant::now();
    let body = body_object(&s, body).await?;
    // Responses has no `logprobs` (as_chat does not carry it): the request's is None.
    let crate::openai::Prepared {
        model,
        c,
        prompt,
        g,
    } = parse(&body)?.prepare(&s).await?;
    let rx = generate::submit(&model, g).map_err(|e| s.rejected(e))?;
    let mut b = Builder {
        response: skeleton(&body, &new_id("resp"), unix_now(), &c.name),
        seq: 0,
        open: Open::None,
    };
    let mut parser = Some(prompt.parser());
    let mut started = false;
    let st = s.clone();
    let convert = move |_: &mut (), ev: Option<Event>| -> Out {
        let mut out = Vec::new();
        if !started {
            started = true;
            let r = b.response.clone();
            let ev = b.event("response.created", json!({"response": r}));
            out.push(ev);
            let r = b.response.clone();
            let ev = b.event("response.in_progress", json!({"response": r}));
            out.push(ev);
        }
        match ev {
            Some(Event::Token(p)) => {
                let d = parser.as_mut().map(|x| x.push(&p.text)).unwrap_or_default();
                b.delta(d, &mut out);
                Out {
                    objects: out,
                    end: false,
                }
            }
            Some(Event::Done(sum)) => {
                st.metrics.finished(start.elapsed());
                if let Some(mut p) = parser.take() {
                    let d = p.push(&sum.tail);
                    b.delta(d, &mut out);
                    b.delta(p.finish(), &mut out);
                }
                b.finish(&sum, &mut out);
                Out {
                    objects: out,
                    end: true,
                }
            }
            Some(Event::Failed(why)) => {
                st.metrics.failed();
                failed(&mut b, why, out)
            }
            None => failed(&mut b, "the engine stopped".into(), out),
        }
    };
    if c.stream {
        return Ok(stream::respond(Framing::SseTyped, rx, (), convert));
    }
    let events = collect(rx, convert).await?;
    let last = events.last().cloned().unwrap_or(Value::Null);
    match last["type"].as_str() {
        Some("response.completed" | "response.incomplete") => {
            Ok(axum::Json(last["response"].clone()).into_response())
        }
        _ => Err(ApiError::internal(
            last["response"]["error"]["message"]
                .as_str()
                .unwrap_or("the engine stopped")
                .to_string(),
        )
        .into()),
    }
}

/// The stream's end when the engine failed: `response.failed` with the error.
fn failed(b: &mut Builder, why: String, mut out: Vec<Value>) -> Out {
    b.response["status"] = "failed".into();
    b.response["error"] = json!({"code": "server_error", "message": why});
    let r = b.response.clone();
    let ev = b.event("response.failed", json!({"response": r}));
    out.push(ev);
    Out {
        objects: out,
        end: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_messages() {
        let body = json!({"model": "m", "instructions": "be brief", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"city\":\"R\"}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"city\":\"P\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "developer", "content": "dev note"},
        ]});
        let chat = as_chat(body.as_object().unwrap()).unwrap();
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "weather?"}));
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"})
        );
        assert_eq!(m[4], json!({"role": "system", "content": "dev note"}));
        assert_eq!(m.len(), 5);
    }

    #[test]
    fn refusals_are_named() {
        for (body, want) in [
            (
                json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}),
                "item_reference",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                "input_image",
            ),
            (json!({"model": "m"}), "input"),
            (
                json!({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}),
                "text.format.type",
            ),
        ] {
            let e = as_chat(body.as_object().unwrap()).unwrap_err();
            assert!(e.message.contains(want), "{body}: {}", e.message);
        }
    }
}
