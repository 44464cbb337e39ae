//! Generated text read back into what the APIs return: the answer, the reasoning before
//! it (`<think>…</think>`, harmony's analysis channel) and tool calls, for the families
//! in scope: Hermes / Qwen 2.5 / Qwen 3 (`<tool_call>{json}</tool_call>`), Llama 3.x (a
//! bare JSON call, or `<|python_tag|>`), Mistral (`[TOOL_CALLS]`, both the JSON-array
//! and the `name[ARGS]{json}` forms) and gpt-oss harmony (`to=functions.NAME` on the
//! commentary channel).
//!
//! Streaming-safe: [`OutputParser::push`] takes text as it is generated and returns only
//! what is already certain — never part of a marker as content (text that could still
//! become a marker is held back), a call only once its JSON is complete. Whitespace at
//! the end of a piece of content or reasoning is held until more of it follows, so a
//! segment's trailing whitespace before a marker is never sent; leading whitespace of a
//! segment is dropped. Text that looks like a call but does not parse stays content,
//! verbatim.

use crate::ToolCall;
use serde_json::Value;

/// How a model's output is marked up (from its template, [`OutputFormat::detect`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutputFormat {
    pub tools: ToolSyntax,
    /// `<think>…</think>` separates reasoning.
    pub think_tags: bool,
    /// The prompt already opened `<think>` (DeepSeek R1, Qwen3 thinking templates that
    /// end the generation prompt with it): the output starts as reasoning.
    pub starts_in_reasoning: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ToolSyntax {
    /// No tool-call markup: everything is content.
    #[default]
    None,
    /// `<tool_call>{"name": …, "arguments": …}</tool_call>` (Hermes, Qwen 2.5 / 3).
    Hermes,
    /// A bare `{"name": …, "parameters": …}` as the whole answer, or `<|python_tag|>`.
    Llama3,
    /// `[TOOL_CALLS][{…}, …]` or `[TOOL_CALLS]name[ARGS]{…}`.
    Mistral,
    /// gpt-oss: `<|channel|>…<|message|>…<|end|>` messages.
    Harmony,
    /// No syntax of the template's own: one JSON object, `{"tool_calls": […]}` or
    /// `{"response": …}` (crate::generic), read when the answer is whole.
    Generic,
}

/// What the parser recognised, in output order.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Content(String),
    Reasoning(String),
    ToolCall(ToolCall),
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const H_CHANNEL: &str = "<|channel|>";
const H_MESSAGE: &str = "<|message|>";
const H_START: &str = "<|start|>";
const H_ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

/// Whether a template's model reasons before it answers (`<think>`, a thinking switch,
/// harmony's channels): what Ollama reports as the "thinking" capability.
pub fn has_thinking(template_source: &str) -> bool {
    [THINK_CLOSE, "enable_thinking", H_CHANNEL]
        .iter()
        .any(|m| template_source.contains(m))
}

impl OutputFormat {
    /// The format a template's model writes: by the markers its source mentions (as
    /// llama.cpp tells formats apart), and whether `prompt` (the rendered generation
    /// prompt) leaves the output inside `<think>`.
    pub fn detect(template_source: &str, prompt: &str) -> Self {
        let has = |s: &str| template_source.contains(s);
        let tools = if has(H_CHANNEL) && has(H_MESSAGE) {
            ToolSyntax::Harmony
        } else if has(MISTRAL_CALLS) {
            ToolSyntax::Mistral
        } else if has(HERMES_OPEN) {
            ToolSyntax::Hermes
        } else if has(PYTHON_TAG) || (has("<|start_header_id|>") && has("tools")) {
            ToolSyntax::Llama3
        } else {
            ToolSyntax::None
        };
        let think_tags = tools != ToolSyntax::Harmony && has(THINK_CLOSE);
        OutputFormat {
            tools,
            think_tags,
            starts_in_reasoning: think_tags && prompt.trim_end().ends_with(THINK_OPEN),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Mode {
    Content,
    Reasoning,
    /// Inside `<tool_call>`: the body up to `</tool_call>`.
    Hermes,
    /// After `<|python_tag|>`: the rest of the output.
    PythonTag,
    /// After `[TOOL_CALLS]`.
    Mistral,
    /// Llama 3: the answer began with `{`; it is a call only if it is one JSON call.
    LlamaJson,
    /// Harmony: a message header up to `<|message|>`.
    HarmonyHeader,
    /// Harmony: a message body up to an end marker.
    HarmonyBody(HarmonyTarget),
    /// Generic: the whole answer, read at its end.
    Generic,
}

#[derive(Clone, Debug, PartialEq)]
enum HarmonyTarget {
    Reasoning,
    Content,
    Call(String),
}

/// The incremental parser; see the module documentation.
#[derive(Clone, Debug)]
pub struct OutputParser {
    format: OutputFormat,
    mode: Mode,
    /// Text received and not yet turned into events.
    pending: String,
    /// Whitespace held at the end of the current segment.
    held_ws: String,
    /// Whether the current segment has emitted anything (leading whitespace is dropped).
    segment_started: bool,
    /// Whether any content has been emitted at all (Llama 3's bare JSON must be first).
    any_content: bool,
    /// The request's tool names, when known: a bare JSON answer (Llama 3) is a call only
    /// if it names one of them (a schema-constrained answer with a `name` field is not).
    known_tools: Option<Vec<String>>,
}

/// The first occurrence of any of `markers` in `s`: (offset, marker).
fn find_first<'m>(s: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|m| s.find(m).map(|i| (i, *m)))
        .min_by_key(|(i, _)| *i)
}

/// How many bytes at the end of `s` could be the start of one of `markers`.
fn partial_marker_len(s: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for m in markers {
        for k in (1..m.len().min(s.len() + 1)).rev() {
            if k > best && s.is_char_boundary(s.len() - k) && m.starts_with(&s[s.len() - k..]) {
                best = k;
                break;
            }
        }
    }
    best
}

/// A complete JSON value at the start of `s` (after whitespace): Ok(Some((value, end
/// offset))), Ok(None) if `s` may still become one, Err if it cannot.
fn json_prefix(s: &str) -> Result<Option<(Value, usize)>, ()> {
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    match it.next() {
        Some(Ok(v)) => Ok(Some((v, it.byte_offset()))),
        Some(Err(e)) if e.is_eof() => Ok(None),
        None => Ok(None),
        Some(Err(_)) => Err(()),
    }
}

/// `{"name": …, "arguments" | "parameters": {…}}` (plus an optional `id`) as a call.
fn call_from_object(v: &Value) -> Option<ToolCall> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?.to_string();
    let arguments = match o.get("arguments").or_else(|| o.get("parameters")) {
        Some(Value::String(s)) => serde_json::from_str(s).ok()?,
        Some(v @ Value::Object(_)) => v.clone(),
        None => Value::Object(Default::default()),
        Some(_) => return None,
    };
    let id = o.get("id").and_then(Value::as_str).map(str::to_string);
    Some(ToolCall {
        id,
        name,
        arguments,
    })
}

impl OutputParser {
    pub fn new(format: OutputFormat) -> Self {
        let mode = if format.starts_in_reasoning {
            Mode::Reasoning
        } else if format.tools == ToolSyntax::Harmony {
            Mode::HarmonyHeader
        } else if format.tools == ToolSyntax::Generic {
            Mode::Generic
        } else {
            Mode::Content
        };
        OutputParser {
            format,
            mode,
            pending: String::new(),
            held_ws: String::new(),
            segment_started: false,
            any_content: false,
            known_tools: None,
        }
    }

    /// Reads bare JSON as a call only when it names one of `names`.
    pub fn with_tools(mut self, names: Vec<String>) -> Self {
        self.known_tools = Some(names);
        self
    }

    /// Feeds generated text; returns the events now certain.
    pub fn push(&mut self, text: &str) -> Vec<Event> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        while self.step(false, &mut out) {}
        out
    }

    /// The end of the output: flushes what is held (an unfinished call is content).
    pub fn finish(mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while self.step(true, &mut out) {}
        out
    }

    /// Emits `text` as part of the current segment, holding its trailing whitespace.
    fn emit(&mut self, text: &str, out: &mut Vec<Event>) {
        let reasoning = matches!(
            self.mode,
            Mode::Reasoning | Mode::HarmonyBody(HarmonyTarget::Reasoning)
        );
        let mut text = text;
        if !self.segment_started {
            text = text.trim_start();
        }
        if text.is_empty() {
            return;
        }
        let body = text.trim_end();
        let ws = &text[body.len()..];
        if body.is_empty() {
            self.held_ws.push_str(ws);
            return;
        }
        let s = std::mem::take(&mut self.held_ws) + body;
        self.held_ws.push_str(ws);
        self.segment_started = true;
        if !reasoning {
            self.any_content = true;
        }
        match out.last_mut() {
            Some(Event::Content(c)) if !reasoning => c.push_str(&s),
            Some(Event::Reasoning(r)) if reasoning => r.push_str(&s),
            _ => out.push(if reasoning {
                Event::Reasoning(s)
            } else {
                Event::Content(s)
            }),
        }
    }

    /// Ends the current segment (its held whitespace is dropped) and enters `mode`.
    fn switch(&mut self, mode: Mode) {
        self.held_ws.clear();
        self.segment_started = false;
        self.mode = mode;
    }

    /// Markers that end plain content in this format.
    fn content_markers(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.format.think_tags {
            m.push(THINK_OPEN);
        }
        match self.format.tools {
            ToolSyntax::Hermes => m.push(HERMES_OPEN),
            ToolSyntax::Llama3 => m.push(PYTHON_TAG),
            ToolSyntax::Mistral => m.push(MISTRAL_CALLS),
            ToolSyntax::None | ToolSyntax::Harmony | ToolSyntax::Generic => {}
        }
        m
    }

    /// Emits everything of `pending` before a possible partial `markers` suffix; or all
    /// of it at the end.
    fn emit_up_to_partial(&mut self, markers: &[&str], last: bool, out: &mut Vec<Event>) {
        let keep = if last {
            0
        } else {
            partial_marker_len(&self.pending, markers)
        };
        let cut = self.pending.len() - keep;
        let text: String = self.pending.drain(..cut).collect();
        self.emit(&text, out);
    }

    /// One step of the state machine; false when nothing more can be decided now.
    fn step(&mut self, last: bool, out: &mut Vec<Event>) -> bool {
        match self.mode.clone() {
            Mode::Content => {
                if self.format.tools == ToolSyntax::Llama3
                    && !self.any_content
                    && self.pending.trim_start().starts_with('{')
                {
                    self.mode = Mode::LlamaJson;
                    return true;
                }
                if self.format.tools == ToolSyntax::Llama3
                    && !self.any_content
                    && !last
                    && self.pending.trim().is_empty()
                {
                    return false;
                }
                let markers = self.content_markers();
                match find_first(&self.pending, &markers) {
                    Some((i, m)) => {
                        let before: String = self.pending.drain(..i + m.len()).collect();
                        self.emit(&before[..i], out);
                        self.switch(match m {
                            THINK_OPEN => Mode::Reasoning,
                            HERMES_OPEN => Mode::Hermes,
                            PYTHON_TAG => Mode::PythonTag,
                            _ => Mode::Mistral,
                        });
                        true
                    }
                    None => {
                        self.emit_up_to_partial(&markers, last, out);
                        false
                    }
                }
            }
            Mode::Reasoning => match self.pending.find(THINK_CLOSE) {
                Some(i) => {
                    let before: String = self.pending.drain(..i + THINK_CLOSE.len()).collect();
                    self.emit(&before[..i], out);
                    self.switch(Mode::Content);
                    true
                }
                None => {
                    self.emit_up_to_partial(&[THINK_CLOSE], last, out);
                    false
                }
            },
            Mode::Hermes => match self.pending.find(HERMES_CLOSE) {
                Some(i) => {
                    let body: String = self.pending.drain(..i + HERMES_CLOSE.len()).collect();
                    let inner = &body[..i];
                    match serde_json::from_str::<Value>(inner.trim())
                        .ok()
                        .as_ref()
                        .and_then(call_from_object)
                    {
                        Some(call) => out.push(Event::ToolCall(call)),
                        None => self.literal(&format!("{HERMES_OPEN}{body}"), out),
                    }
                    self.switch(Mode::Content);
                    true
                }
                None if last => {
                    let body = std::mem::take(&mut self.pending);
                    self.literal(&format!("{HERMES_OPEN}{body}"), out);
                    false
                }
                None => false,
            },
            Mode::LlamaJson => match json_prefix(&self.pending) {
                Ok(Some((v, end))) if self.pending[end..].trim().is_empty() => {
                    if !last {
                        // Complete, but more may follow (then it was prose).
                        return false;
                    }
                    let text = std::mem::take(&mut self.pending);
                    let known = |c: &ToolCall| {
                        self.known_tools
                            .as_ref()
                            .is_none_or(|n| n.contains(&c.name))
                    };
                    match call_from_object(&v).filter(known) {
                        Some(call) => out.push(Event::ToolCall(call)),
                        None => self.literal(&text, out),
                    }
                    false
                }
                Ok(None) if !last => false,
                _ => {
                    // Not one JSON call: it was content all along.
                    self.mode = Mode::Content;
                    self.any_content = true;
                    let text = std::mem::take(&mut self.pending);
                    self.literal(&text, out);
                    true
                }
            },
            Mode::PythonTag => {
                if !last {
                    return false;
                }
                let body = std::mem::take(&mut self.pending);
                out.push(Event::ToolCall(python_tag_call(body.trim())));
                false
            }
            Mode::Mistral => self.step_mistral(last, out),
            Mode::Generic => {
                if last {
                    out.extend(crate::generic::parse(&std::mem::take(&mut self.pending)));
                }
                false
            }
            Mode::HarmonyHeader => match self.pending.find(H_MESSAGE) {
                Some(i) => {
                    let header: String = self.pending.drain(..i + H_MESSAGE.len()).collect();
                    let target = harmony_target(&header[..i]);
                    self.switch(Mode::HarmonyBody(target));
                    true
                }
                None => {
                    if last {
                        // A header never finished: nothing of it is content.
                        self.pending.clear();
                    }
                    false
                }
            },
            Mode::HarmonyBody(target) => match find_first(&self.pending, &H_ENDS) {
                Some((i, m)) => {
                    let body: String = self.pending.drain(..i + m.len()).collect();
                    self.harmony_body(&target, &body[..i], out);
                    // The next message may repeat `<|start|>assistant`.
                    if let Some(rest) = self.pending.strip_prefix(H_START) {
                        self.pending = rest.to_string();
                    }
                    self.switch(Mode::HarmonyHeader);
                    true
                }
                None if last => {
                    let body = std::mem::take(&mut self.pending);
                    self.harmony_body(&target, &body, out);
                    false
                }
                None => {
                    if let HarmonyTarget::Call(_) = target {
                        return false;
                    }
                    let body: String = {
                        let keep = partial_marker_len(&self.pending, &H_ENDS);
                        let cut = self.pending.len() - keep;
                        self.pending.drain(..cut).collect()
                    };
                    self.emit(&body, out);
                    false
                }
            },
        }
    }

    /// Text that looked like markup but is not: content, as written.
    fn literal(&mut self, text: &str, out: &mut Vec<Event>) {
        let mode = std::mem::replace(&mut self.mode, Mode::Content);
        self.segment_started |= self.any_content;
        self.emit(text, out);
        self.mode = mode;
    }

    fn harmony_body(&mut self, target: &HarmonyTarget, body: &str, out: &mut Vec<Event>) {
        match target {
            HarmonyTarget::Call(name) => match serde_json::from_str::<Value>(body.trim()) {
                Ok(arguments) => out.push(Event::ToolCall(ToolCall {
                    id: None,
                    name: name.clone(),
                    arguments,
                })),
                Err(_) => self.literal(body, out),
            },
            _ => self.emit(body, out),
        }
    }

    fn step_mistral(&mut self, last: bool, out: &mut Vec<Event>) -> bool {
        let s = self.pending.trim_start();
        let lead = self.pending.len() - s.len();
        if s.is_empty() {
            return false;
        }
        if s.starts_with('[') {
            // [TOOL_CALLS][{"name": …, "arguments": {…}, "id": …}, …]
            return match json_prefix(s) {
                Ok(Some((Value::Array(items), end))) => {
                    let calls: Option<Vec<ToolCall>> = items.iter().map(call_from_object).collect();
                    let taken: String = self.pending.drain(..lead + end).collect();
                    match calls {
                        Some(calls) => out.extend(calls.into_iter().map(Event::ToolCall)),
                        None => self.literal(&format!("{MISTRAL_CALLS}{taken}"), out),
                    }
                    self.after_mistral_call();
                    true
                }
                Ok(None) if !last => false,
                _ => self.mistral_literal(out),
            };
        }
        // [TOOL_CALLS]name[ARGS]{…}
        let Some(a) = s.find(MISTRAL_ARGS) else {
            return if last || s.len() > 256 {
                self.mistral_literal(out)
            } else {
                false
            };
        };
        let name = s[..a].trim().to_string();
        let args = &s[a + MISTRAL_ARGS.len()..];
        match json_prefix(args) {
            Ok(Some((arguments, end))) if !name.is_empty() => {
                let total = lead + a + MISTRAL_ARGS.len() + end;
                self.pending.drain(..total);
                out.push(Event::ToolCall(ToolCall {
                    id: None,
                    name,
                    arguments,
                }));
                self.after_mistral_call();
                true
            }
            Ok(None) if !last => false,
            _ => self.mistral_literal(out),
        }
    }

    /// After a Mistral call: another `[TOOL_CALLS]`, or back to content.
    fn after_mistral_call(&mut self) {
        let t = self.pending.trim_start();
        if let Some(rest) = t.strip_prefix(MISTRAL_CALLS) {
            self.pending = rest.to_string();
            self.mode = Mode::Mistral;
        } else {
            self.switch(Mode::Content);
        }
    }

    fn mistral_literal(&mut self, out: &mut Vec<Event>) -> bool {
        let text = std::mem::take(&mut self.pending);
        self.literal(&format!("{MISTRAL_CALLS}{text}"), out);
        self.switch(Mode::Content);
        false
    }
}

/// A harmony header (`<|channel|>commentary to=functions.f <|constrain|>json`, or
/// `assistant to=functions.f<|channel|>commentary json`): where its body goes.
fn harmony_target(header: &str) -> HarmonyTarget {
    if let Some(i) = header.find("to=") {
        let name: String = header[i + 3..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect();
        let name = name.strip_prefix("functions.").unwrap_or(&name);
        return HarmonyTarget::Call(name.to_string());
    }
    let channel = header
        .split(H_CHANNEL)
        .nth(1)
        .map(|c| c.split_whitespace().next().unwrap_or(""))
        .unwrap_or("");
    match channel {
        "analysis" => HarmonyTarget::Reasoning,
        _ => HarmonyTarget::Content,
    }
}

/// Llama 3.x after `<|python_tag|>`: a JSON call, a built-in tool call
/// (`brave_search.call(query="…")`), or code for the `python` tool.
fn python_tag_call(body: &str) -> ToolCall {
    if let Ok(v) = serde_json::from_str::<Value>(body)
        && let Some(call) = call_from_object(&v)
    {
        return call;
    }
    if let Some(call) = builtin_tool_call(body) {
        return call;
    }
    ToolCall {
        id: None,
        name: "python".into(),
        arguments: serde_json::json!({ "code": body }),
    }
}

/// `name.call(key="value", n=3)`: keyword arguments with string, number or boolean
/// values, as Llama 3.1's built-in tools are called.
fn builtin_tool_call(body: &str) -> Option<ToolCall> {
    let (name, rest) = body.split_once(".call(")?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let inner = rest.trim_end().strip_suffix(')')?;
    let mut args = serde_json::Map::new();
    let mut s = inner.trim();
    while !s.is_empty() {
        let (key, after) = s.split_once('=')?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let after = after.trim_start();
        let (value, rest) =
            if let Some(q) = after.chars().next().filter(|c| *c == '"' || *c == '\'') {
                let body = &after[1..];
                let mut end = None;
                let mut escaped = false;
                for (i, c) in body.char_indices() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        c if c == q && !escaped => {
                            end = Some(i);
                            break;
                        }
                        _ => escaped = false,
                    }
                }
                let end = end?;
                let raw = &body[..end];
                let text = raw
                    .replace(&format!("\\{q}"), &q.to_string())
                    .replace("\\\\", "\\");
                (Value::String(text), &body[end + 1..])
            } else {
                let end = after.find(',').unwrap_or(after.len());
                let lit = after[..end].trim();
                let v = match lit {
                    "True" | "true" => Value::Bool(true),
                    "False" | "false" => Value::Bool(false),
                    _ => serde_json::from_str::<Value>(lit)
                        .ok()
                        .filter(Value::is_number)?,
                };
                (v, &after[end..])
            };
        args.insert(key.to_string(), value);
        s = rest.trim_start();
        s = s.strip_prefix(',').unwrap_or(s).trim_start();
    }
    Some(ToolCall {
        id: None,
        name: name.to_string(),
        arguments: Value::Object(args),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fmt(tools: ToolSyntax, think: bool, starts: bool) -> OutputFormat {
        OutputFormat {
            tools,
            think_tags: think,
            starts_in_reasoning: starts,
        }
    }

    /// Merges adjacent content / reasoning events, as a client concatenating deltas.
    fn merged(events: Vec<Event>) -> Vec<Event> {
        let mut out: Vec<Event> = Vec::new();
        for e in events {
            match (out.last_mut(), e) {
                (Some(Event::Content(a)), Event::Content(b)) => a.push_str(&b),
                (Some(Event::Reasoning(a)), Event::Reasoning(b)) => a.push_str(&b),
                (_, e) => out.push(e),
            }
        }
        out
    }

    /// Parses `text` whole, and again fed one char at a time: same events. No
    /// streamed content delta may contain a marker's beginning that later became
    /// markup (checked by the equality with the whole parse).
    fn parse(format: OutputFormat, text: &str) -> Vec<Event> {
        let mut whole = OutputParser::new(format);
        let mut a = whole.push(text);
        a.extend(whole.finish());
        let mut streamed = OutputParser::new(format);
        let mut b = Vec::new();
        for c in text.chars() {
            b.extend(streamed.push(&c.to_string()));
        }
        b.extend(streamed.finish());
        let (a, b) = (merged(a), merged(b));
        assert_eq!(a, b, "whole vs one char at a time: {text:?}");
        a
    }

    fn call(name: &str, args: Value) -> Event {
        Event::ToolCall(ToolCall {
            id: None,
            name: name.into(),
            arguments: args,
        })
    }

    fn content(s: &str) -> Event {
        Event::Content(s.into())
    }

    fn reasoning(s: &str) -> Event {
        Event::Reasoning(s.into())
    }

    #[test]
    fn qwen3_thinks_then_calls() {
        let f = fmt(ToolSyntax::Hermes, true, false);
        let out = "<think>\nThe user wants the weather. I should call get_weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>";
        assert_eq!(
            parse(f, out),
            [
                reasoning("The user wants the weather. I should call get_weather."),
                call("get_weather", json!({"location": "Paris"}))
            ]
        );
    }

    #[test]
    fn hermes_content_then_two_calls() {
        let f = fmt(ToolSyntax::Hermes, false, false);
        let out = "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>";
        assert_eq!(
            parse(f, out),
            [
                content("Let me check both."),
                call("a", json!({})),
                call("b", json!({"x": [1, 2]}))
            ]
        );
    }

    #[test]
    fn a_broken_hermes_call_stays_content() {
        let f = fmt(ToolSyntax::Hermes, false, false);
        let out = "<tool_call>\n{\"name\": \"a\", \"arguments\": {</tool_call> done";
        assert_eq!(
            parse(f, out),
            [content(
                "<tool_call>\n{\"name\": \"a\", \"arguments\": {</tool_call>done"
            )]
        );
        // Unterminated at the end of the output.
        let out = "ok <tool_call>{\"name\": \"a\"";
        assert_eq!(parse(f, out), [content("ok<tool_call>{\"name\": \"a\"")]);
    }

    #[test]
    fn deepseek_r1_starts_inside_reasoning() {
        let f = fmt(ToolSyntax::None, true, true);
        let out = "Okay, 2+2 is 4.\n</think>\n\nThe answer is **4**.";
        assert_eq!(
            parse(f, out),
            [
                reasoning("Okay, 2+2 is 4."),
                content("The answer is **4**.")
            ]
        );
        // A marker split across pushes is never content.
        let mut p = OutputParser::new(fmt(ToolSyntax::None, true, false));
        assert_eq!(p.push("Hi <thi"), [content("Hi")]);
        assert_eq!(p.push("nk>x"), [reasoning("x")]);
        let mut p = OutputParser::new(fmt(ToolSyntax::None, true, false));
        assert_eq!(p.push("a <thing> b"), [content("a <thing> b")]);
    }

    #[test]
    fn llama3_bare_json_and_python_tag() {
        let f = fmt(ToolSyntax::Llama3, false, false);
        let out = "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}";
        assert_eq!(
            parse(f, out),
            [call("get_weather", json!({"location": "Paris"}))]
        );
        // JSON that is not a call, and JSON followed by prose: content.
        assert_eq!(parse(f, "{\"a\": 1}"), [content("{\"a\": 1}")]);
        assert_eq!(
            parse(f, "{\"x\": 1} is JSON."),
            [content("{\"x\": 1} is JSON.")]
        );
        assert_eq!(parse(f, "Paris is sunny."), [content("Paris is sunny.")]);
        assert_eq!(
            parse(
                f,
                "<|python_tag|>brave_search.call(query=\"weather \\\"Paris\\\"\", n=3)"
            ),
            [call(
                "brave_search",
                json!({"query": "weather \"Paris\"", "n": 3})
            )]
        );
        assert_eq!(
            parse(
                f,
                "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": true}}"
            ),
            [call("f", json!({"a": true}))]
        );
        assert_eq!(
            parse(f, "<|python_tag|>print(2 + 2)"),
            [call("python", json!({"code": "print(2 + 2)"}))]
        );
    }

    #[test]
    fn mistral_both_forms() {
        let f = fmt(ToolSyntax::Mistral, false, false);
        let out = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}, \"id\": \"abc123def\"}, {\"name\": \"t\", \"arguments\": {}}]";
        assert_eq!(
            parse(f, out),
            [
                Event::ToolCall(ToolCall {
                    id: Some("abc123def".into()),
                    name: "get_weather".into(),
                    arguments: json!({"location": "Paris"})
                }),
                call("t", json!({}))
            ]
        );
        let out = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"CET\"}";
        assert_eq!(
            parse(f, out),
            [
                content("Sure."),
                call("get_weather", json!({"location": "Paris"})),
                call("get_time", json!({"tz": "CET"}))
            ]
        );
        assert_eq!(
            parse(f, "[TOOL_CALLS] nonsense"),
            [content("[TOOL_CALLS] nonsense")]
        );
    }

    #[test]
    fn harmony_channels() {
        let f = fmt(ToolSyntax::Harmony, false, false);
        let out = "<|channel|>analysis<|message|>User asks weather. Call tool.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Paris\"}<|call|>";
        assert_eq!(
            parse(f, out),
            [
                reasoning("User asks weather. Call tool."),
                call("get_weather", json!({"location": "Paris"}))
            ]
        );
        let out = "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>";
        assert_eq!(parse(f, out), [reasoning("Simple."), content("2 + 2 = 4.")]);
        // The recipient before the channel.
        let out = "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>";
        assert_eq!(parse(f, out), [reasoning("x"), call("f", json!({}))]);
        // Streaming a final answer never shows a partial end marker.
        let mut p = OutputParser::new(f);
        assert_eq!(p.push("<|channel|>final<|message|>Hi<|en"), [content("Hi")]);
        assert_eq!(p.push("d|>"), []);
    }

    #[test]
    fn detect_by_template_markers() {
        let d = |src: &str, prompt: &str| OutputFormat::detect(src, prompt);
        assert_eq!(
            d("{{ '<tool_call>' }}{{ '</think>' }}", "x").tools,
            ToolSyntax::Hermes
        );
        assert!(d("<tool_call></think>", "<|im_start|>assistant\n<think>\n").starts_in_reasoning);
        assert_eq!(d("[TOOL_CALLS]", "").tools, ToolSyntax::Mistral);
        assert_eq!(d("<|channel|> <|message|>", "").tools, ToolSyntax::Harmony);
        assert_eq!(
            d("<|start_header_id|> tools <|python_tag|>", "").tools,
            ToolSyntax::Llama3
        );
        assert_eq!(d("<start_of_turn>", ""), OutputFormat::default());
    }
}
