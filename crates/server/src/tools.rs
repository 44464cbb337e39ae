//! Tool use beyond what a template renders: OpenAI's `tool_choice` ("required", or one
//! named function) and `parallel_tool_calls`, honoured by constraining the answer to
//! calls in the model's own tool-call syntax (as llama-server does, from the tools'
//! schemas), and the generic format for templates with no syntax of their own
//! (llamay_template::generic), whose answer is always constrained JSON.

use crate::error::ApiError;
use llamay_engine::grammar::Rules;
use llamay_template::ToolSyntax;
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// What the request lets the model do with its tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    /// At least one call, of any tool.
    Required,
    /// A call of this function.
    Named(String),
}

/// The tools of a request and what it asks of them.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    /// An OpenAI `tools` list, or None when there are none (or `tool_choice: "none"`).
    pub tools: Option<Value>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): false allows one call.
    pub parallel: bool,
}

impl ToolRequest {
    pub fn none() -> Self {
        ToolRequest {
            tools: None,
            choice: ToolChoice::Auto,
            parallel: true,
        }
    }

    /// `tools`, `tool_choice` and `parallel_tool_calls` of an OpenAI body.
    pub fn parse(body: &Map<String, Value>) -> Result<Self, ApiError> {
        let choice = match body.get("tool_choice") {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(t)) => match t.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::field(
                        "tool_choice",
                        format!(
                            "\"{other}\" is not one of \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                        ),
                    ));
                }
            },
            // Chat Completions' {"type": "function", "function": {"name"}} and the
            // Responses API's {"type": "function", "name"}.
            Some(v @ Value::Object(_)) => {
                let name = v
                    .pointer("/function/name")
                    .or_else(|| v.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        ApiError::field("tool_choice", "an object must be {\"type\": \"function\", \"function\": {\"name\": …}}")
                    })?;
                ToolChoice::Named(name.to_string())
            }
            Some(_) => {
                return Err(ApiError::field(
                    "tool_choice",
                    "must be a string or an object",
                ));
            }
        };
        let parallel = match body.get("parallel_tool_calls") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::field("parallel_tool_calls", "must be a boolean")),
        };
        let tools = match body.get("tools") {
            Some(Value::Array(a)) if !a.is_empty() && choice != ToolChoice::None => {
                Some(Value::Array(a.clone()))
            }
            None | Some(Value::Null) | Some(Value::Array(_)) => None,
            Some(_) => return Err(ApiError::field("tools", "must be a list")),
        };
        match (&choice, &tools) {
            (ToolChoice::Required | ToolChoice::Named(_), None) => {
                return Err(ApiError::field(
                    "tool_choice",
                    "forces a call, but the request has no tools",
                ));
            }
            (ToolChoice::Named(n), Some(t)) if !functions(t).iter().any(|(name, _)| name == n) => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("names \"{n}\", which is not among the request's tools"),
                ));
            }
            _ => {}
        }
        Ok(ToolRequest {
            tools,
            choice,
            parallel,
        })
    }

    /// The names of the request's functions.
    pub fn names(&self) -> Vec<String> {
        self.tools
            .as_ref()
            .map(functions)
            .unwrap_or_default()
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    }

    /// Whether the answer must be a call.
    pub fn forced(&self) -> bool {
        self.tools.is_some() && matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// The grammar of the answer, given the one the request asked for (`format`,
    /// `response_format`): a forced call's in `syntax` (the requested format is for a
    /// later text answer); in the generic format, a call or a `{"response"}` that holds
    /// the requested schema; else what was asked.
    pub fn grammar(
        &self,
        syntax: ToolSyntax,
        asked: Option<Arc<Rules>>,
    ) -> Result<Option<Arc<Rules>>, ApiError> {
        let Some(tools) = &self.tools else {
            return Ok(asked);
        };
        if !self.forced() && syntax != ToolSyntax::Generic {
            return Ok(asked);
        }
        let answer = match &asked {
            None => None,
            Some(r) => Some(r.schema().ok_or_else(|| {
                ApiError::bad("a GBNF grammar and tools on a model without tool-call syntax cannot be combined (give a JSON Schema)")
            })?),
        };
        let args_key = if syntax == ToolSyntax::Llama3 {
            "parameters"
        } else {
            "arguments"
        };
        let call = call_schema(tools, &self.choice, args_key)?;
        // A named function is one call of it (what instructor and LangChain's
        // function_calling read back; llama-server's default too); "required" makes as
        // many as parallel_tool_calls allows.
        let many =
            self.parallel && syntax != ToolSyntax::Llama3 && self.choice == ToolChoice::Required;
        let calls = |open: &str, sep: &str, close: &str| {
            let more = if many {
                format!(" ({sep} json)*")
            } else {
                String::new()
            };
            format!("{open} json{more} {close}")
        };
        let root = match syntax {
            ToolSyntax::Hermes => {
                let block = "tc ::= \"<tool_call>\" \"\\n\"? json \"</tool_call>\"\n";
                format!(
                    "{block}root ::= tc{}\n",
                    if many { " (\"\\n\"? tc)*" } else { "" }
                )
            }
            ToolSyntax::Llama3 => "root ::= json\n".to_string(),
            ToolSyntax::Mistral => format!(
                "root ::= {}\n",
                calls("\"[TOOL_CALLS]\" \"[\" space", "\",\" space", "\"]\" space")
            ),
            ToolSyntax::Generic => {
                let call = calls(
                    "\"{\" space \"\\\"tool_calls\\\"\" space \":\" space \"[\" space",
                    "\",\" space",
                    "\"]\" space \"}\" space",
                );
                let response = if answer.is_some() { "answer" } else { "string" };
                if self.forced() {
                    format!("root ::= {call}\n")
                } else {
                    format!(
                        "root ::= {call} | \"{{\" space \"\\\"response\\\"\" space \":\" space {response} \"}}\" space\n"
                    )
                }
            }
            ToolSyntax::Harmony => {
                return Err(ApiError::field(
                    "tool_choice",
                    "forcing a call is not supported on harmony (gpt-oss) templates yet; use \"auto\"",
                ));
            }
            ToolSyntax::None => {
                unreachable!("a template without tool syntax answers in the generic format")
            }
        };
        match answer.filter(|_| syntax == ToolSyntax::Generic && !self.forced()) {
            Some(a) => Rules::json_schemas_in(&call, a, &root),
            None => Rules::json_schema_in(&call, &root),
        }
        .map(Some)
        .map_err(|e| ApiError::field("tools", format!("a tool's parameters: {e}")))
    }
}

/// (name, parameters) of each function in an OpenAI `tools` list (Ollama's too).
fn functions(tools: &Value) -> Vec<(String, Value)> {
    tools
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name")?.as_str()?.to_string();
            let params = f
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            Some((name, params))
        })
        .collect()
}

/// The JSON Schema of one call of an allowed tool: `{"name": N, args_key: parameters}`,
/// the tools' `$defs` hoisted to the top so their references resolve.
fn call_schema(tools: &Value, choice: &ToolChoice, args_key: &str) -> Result<Value, ApiError> {
    let mut defs = Map::new();
    let mut branches = Vec::new();
    for (name, mut params) in functions(tools) {
        if matches!(choice, ToolChoice::Named(n) if *n != name) {
            continue;
        }
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(d)) = params.as_object_mut().and_then(|p| p.remove(key)) {
                let slot = defs.entry(key.to_string()).or_insert_with(|| json!({}));
                for (k, v) in d {
                    if slot.get(&k).is_some_and(|old| *old != v) {
                        return Err(ApiError::field(
                            "tools",
                            format!("two tools define \"{key}/{k}\" differently"),
                        ));
                    }
                    slot[&k] = v;
                }
            }
        }
        branches.push(json!({
            "type": "object",
            "properties": {"name": {"const": name}, args_key: params},
            "required": ["name", args_key],
        }));
    }
    if branches.is_empty() {
        return Err(ApiError::field("tools", "no tool has a function name"));
    }
    let mut top = if branches.len() == 1 {
        branches.pop().expect("one")
    } else {
        json!({"anyOf": branches})
    };
    if let Some(o) = top.as_object_mut() {
        o.extend(defs);
    }
    Ok(top)
}

#[cfg(test)]
mod tests {
    use super::*;
    use llamay_engine::grammar::GrammarState;

    fn accepts(g: &Arc<Rules>, text: &str) -> bool {
        GrammarState::new(g.clone())
            .advance(text.as_bytes())
            .is_some_and(|s| s.is_complete())
    }

    fn request(choice: Value, parallel: bool) -> ToolRequest {
        let tool = |n: &str| {
            json!({"type": "function", "function": {"name": n,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
        };
        let body = json!({"tools": [tool("a"), tool("b")], "tool_choice": choice, "parallel_tool_calls": parallel});
        ToolRequest::parse(body.as_object().unwrap()).unwrap()
    }

    #[test]
    fn forced_calls_in_each_syntax() {
        let a = r#"{"name": "a", "arguments": {"city": "X"}}"#;
        let b = r#"{"name": "b", "arguments": {"city": "Y"}}"#;
        let cases: [(ToolSyntax, String, String); 3] = [
            (
                ToolSyntax::Hermes,
                format!("<tool_call>\n{a}</tool_call>"),
                format!("<tool_call>{a}</tool_call>\n<tool_call>{b}</tool_call>"),
            ),
            (
                ToolSyntax::Mistral,
                format!("[TOOL_CALLS][{a}]"),
                format!("[TOOL_CALLS][{a}, {b}]"),
            ),
            (
                ToolSyntax::Generic,
                format!(r#"{{"tool_calls": [{a}]}}"#),
                format!(r#"{{"tool_calls": [{a}, {b}]}}"#),
            ),
        ];
        for (syntax, one, two) in cases {
            let g = request(json!("required"), true)
                .grammar(syntax, None)
                .unwrap()
                .unwrap();
            assert!(accepts(&g, &one) && accepts(&g, &two), "{syntax:?}");
            assert!(
                !accepts(&g, "plain text") && !accepts(&g, r#"{"response": "x"}"#),
                "{syntax:?}"
            );
            let g = request(json!("required"), false)
                .grammar(syntax, None)
                .unwrap()
                .unwrap();
            assert!(
                accepts(&g, &one) && !accepts(&g, &two),
                "{syntax:?}: parallel_tool_calls false"
            );
            let g = request(json!({"type": "function", "function": {"name": "b"}}), true)
                .grammar(syntax, None)
                .unwrap()
                .unwrap();
            assert!(
                !accepts(&g, &one),
                "{syntax:?}: a named choice allows that function only"
            );
        }
        let g = request(json!("required"), true)
            .grammar(ToolSyntax::Llama3, None)
            .unwrap()
            .unwrap();
        assert!(accepts(&g, r#"{"name": "a", "parameters": {"city": "X"}}"#));
        assert!(!accepts(
            &g,
            r#"{"name": "c", "parameters": {"city": "X"}}"#
        ));
        // Generic with auto: a call or a response; other syntaxes unconstrained.
        let g = request(json!("auto"), true)
            .grammar(ToolSyntax::Generic, None)
            .unwrap()
            .unwrap();
        assert!(
            accepts(&g, r#"{"response": "hi"}"#)
                && accepts(&g, &format!(r#"{{"tool_calls": [{a}]}}"#))
        );
        assert!(
            request(json!("auto"), true)
                .grammar(ToolSyntax::Hermes, None)
                .unwrap()
                .is_none()
        );
        assert!(
            request(json!("required"), true)
                .grammar(ToolSyntax::Harmony, None)
                .is_err()
        );
    }

    #[test]
    fn bad_choices_are_named() {
        for (body, want) in [
            (json!({"tools": [], "tool_choice": "required"}), "no tools"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a"}}], "tool_choice": {"type": "function", "function": {"name": "z"}}}),
                "\"z\"",
            ),
            (json!({"tool_choice": "sometimes"}), "sometimes"),
            (json!({"parallel_tool_calls": "yes"}), "parallel_tool_calls"),
        ] {
            let e = ToolRequest::parse(body.as_object().unwrap()).unwrap_err();
            assert!(e.message.contains(want), "{body}: {}", e.message);
        }
    }
}
