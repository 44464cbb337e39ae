//! Tools on a template with no tool-call syntax, as llama.cpp's chat layer handles
//! them ("generic"): the tools are described in the system turn, the answer is one JSON
//! object — `{"tool_calls": [{"name", "arguments"}, …]}` or `{"response": "…"}` — which
//! the server constrains with a grammar, so a call comes back on any model. Earlier
//! calls and tool results are written into the conversation as that same JSON, and
//! turns of one role that end up adjacent are joined (templates that insist on
//! alternating roles).

use crate::{Event, Message, ToolCall};
use serde_json::{Value, json};

/// The system text that describes `tools` (an OpenAI `tools` list) and the answer's shape.
pub fn system_text(tools: &Value, call_required: bool) -> String {
    let list = serde_json::to_string_pretty(tools).unwrap_or_default();
    let shape = if call_required {
        "Respond with a JSON object that calls one or more of the tools:\n{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<the tool's arguments>}}]}"
    } else {
        "Respond with a JSON object: either a call of one or more of the tools,\n{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<the tool's arguments>}}]}\nor an answer to the user,\n{\"response\": \"<your answer>\"}"
    };
    format!(
        "You can call any of the following tools to satisfy the user's requests:\n{list}\n\n{shape}"
    )
}

/// The conversation as a template without tool syntax can render it: the tool text in
/// the system turn, calls and results as JSON text, adjacent turns of a role joined.
pub fn adapt_messages(messages: &[Message], tools: &Value, call_required: bool) -> Vec<Message> {
    let text = system_text(tools, call_required);
    let mut out: Vec<Message> = Vec::new();
    match messages.first() {
        Some(m) if m.role == "system" => {
            out.push(Message::new("system", &format!("{}\n\n{text}", m.content)));
        }
        _ => out.push(Message::new("system", &text)),
    }
    let rest = messages.iter().skip(usize::from(
        messages.first().is_some_and(|m| m.role == "system"),
    ));
    for m in rest {
        let (role, content) = match m.role.as_str() {
            "assistant" if !m.tool_calls.is_empty() => {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| json!({"name": c.name, "arguments": c.arguments}))
                    .collect();
                ("assistant", json!({"tool_calls": calls}).to_string())
            }
            "assistant" => ("assistant", json!({"response": m.content}).to_string()),
            "tool" => (
                "user",
                json!({"tool_response": {"tool": m.name, "id": m.tool_call_id, "content": m.content}})
                    .to_string(),
            ),
            other => (other, m.content.clone()),
        };
        match out.last_mut() {
            Some(prev) if prev.role == role && role != "system" => {
                prev.content.push('\n');
                prev.content.push_str(&content);
            }
            _ => out.push(Message::new(role, &content)),
        }
    }
    out
}

/// The events of a whole generic answer: its calls, or its response as content; text
/// that is neither stays content, verbatim.
pub fn parse(output: &str) -> Vec<Event> {
    let v: Option<Value> = serde_json::from_str(output.trim()).ok();
    if let Some(calls) = v
        .as_ref()
        .and_then(|v| v.get("tool_calls"))
        .and_then(Value::as_array)
    {
        let parsed: Option<Vec<ToolCall>> = calls
            .iter()
            .map(|c| {
                Some(ToolCall {
                    id: c.get("id").and_then(Value::as_str).map(str::to_string),
                    name: c.get("name")?.as_str()?.to_string(),
                    arguments: c.get("arguments").cloned().unwrap_or_else(|| json!({})),
                })
            })
            .collect();
        if let Some(calls) = parsed {
            return calls.into_iter().map(Event::ToolCall).collect();
        }
    }
    let only_response = v
        .as_ref()
        .and_then(Value::as_object)
        .is_some_and(|o| o.len() == 1);
    match v.as_ref().and_then(|v| v.get("response")) {
        // A text answer, or one under a requested schema (its JSON text).
        Some(Value::String(r)) if only_response => vec![Event::Content(r.to_string())],
        Some(r) if only_response => vec![Event::Content(r.to_string())],
        _ if output.trim().is_empty() => Vec::new(),
        _ => vec![Event::Content(output.trim().to_string())],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_responses_and_anything_else() {
        let calls = parse(
            r#"{"tool_calls": [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]}"#,
        );
        assert_eq!(calls.len(), 2);
        assert!(
            matches!(&calls[0], Event::ToolCall(c) if c.name == "f" && c.arguments == json!({"x": 1}))
        );
        assert_eq!(
            parse(r#" {"response": "hi"} "#),
            vec![Event::Content("hi".into())]
        );
        assert_eq!(parse("plain"), vec![Event::Content("plain".into())]);
        assert_eq!(
            parse(r#"{"response": {"n": 1}}"#),
            vec![Event::Content(r#"{"n":1}"#.into())]
        );
    }

    #[test]
    fn the_conversation_is_rewritten_for_a_template_without_tools() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let mut asked = Message::new("assistant", "");
        asked.tool_calls.push(ToolCall {
            id: Some("c1".into()),
            name: "f".into(),
            arguments: json!({"x": 1}),
        });
        let mut result = Message::new("tool", "42");
        result.tool_call_id = Some("c1".into());
        let msgs = [
            Message::new("user", "go"),
            asked,
            result,
            Message::new("user", "and?"),
        ];
        let out = adapt_messages(&msgs, &tools, false);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(
            out[0].content.contains("\"name\": \"f\"") && out[0].content.contains("\"response\"")
        );
        assert_eq!(
            out[2].content,
            r#"{"tool_calls":[{"name":"f","arguments":{"x":1}}]}"#
        );
        assert!(
            out[3].content.starts_with(r#"{"tool_response""#) && out[3].content.ends_with("\nand?")
        );
    }
}
