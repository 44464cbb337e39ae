//! Chat messages as the OpenAI and Ollama APIs carry them, normalised into the form
//! templates are written against (what llama.cpp and Ollama hand their templates):
//! tool-call arguments parsed from their JSON string into an object, a null content as
//! "", text parts joined, reasoning under both names templates read.

use serde_json::{Map, Value};

/// One chat message, normalised.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool` (or any role a template knows).
    pub role: String,
    pub content: String,
    /// The model's reasoning before its answer (`reasoning_content` on OpenAI-style
    /// servers, `thinking` on Ollama's).
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// On a `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
    /// On a `tool` message: the function's name.
    pub name: Option<String>,
}

/// A call the assistant made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: Option<String>,
    pub name: String,
    /// The arguments as a JSON value (an object for every real tool).
    pub arguments: Value,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MessageError {
    #[error("message {index}: {what}")]
    Invalid { index: usize, what: String },
    #[error(
        "message {index}: {kind} content is not supported (vision and audio are out of scope; send text)"
    )]
    Media { index: usize, kind: String },
}

impl Message {
    /// A message with text content and nothing else.
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    /// Reads one message of an OpenAI `messages` array or an Ollama `/api/chat`
    /// `messages` array (`index` names it in errors). Content: a string, null, or a
    /// list of parts whose text parts are joined; an image or audio part (or Ollama's
    /// `images`) is refused by name. Tool-call arguments: a JSON string (OpenAI) or an
    /// object (Ollama).
    pub fn from_json(index: usize, v: &Value) -> Result<Self, MessageError> {
        let bad = |what: String| MessageError::Invalid { index, what };
        let o = v
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let text = |key: &str| -> Result<Option<String>, MessageError> {
            match o.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(bad(format!("`{key}` is not a string"))),
            }
        };
        let role = text("role")?.ok_or_else(|| bad("`role` is missing".into()))?;
        if role.is_empty() {
            return Err(bad("`role` is empty".into()));
        }
        if o.get("images")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            return Err(MessageError::Media {
                index,
                kind: "image".into(),
            });
        }
        let content = match o.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match p.get("type").and_then(Value::as_str) {
                        Some("text") | Some("input_text") => s.push_str(
                            p.get("text")
                                .and_then(Value::as_str)
                                .ok_or_else(|| bad("a text part has no `text` string".into()))?,
                        ),
                        Some(kind @ ("image_url" | "image" | "input_image")) => {
                            return Err(MessageError::Media {
                                index,
                                kind: kind.replace("_url", "").replace("input_", ""),
                            });
                        }
                        Some(kind @ ("input_audio" | "audio" | "file")) => {
                            return Err(MessageError::Media {
                                index,
                                kind: kind.replace("input_", ""),
                            });
                        }
                        Some(kind) => {
                            return Err(bad(format!("unknown content part type `{kind}`")));
                        }
                        None => return Err(bad("a content part has no `type`".into())),
                    }
                }
                s
            }
            Some(_) => {
                return Err(bad(
                    "`content` is neither a string nor a list of parts".into()
                ));
            }
        };
        let reasoning = match text("reasoning_content")? {
            Some(r) => Some(r),
            None => text("thinking")?,
        };
        let mut tool_calls = Vec::new();
        match o.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) => {
                for (j, c) in calls.iter().enumerate() {
                    tool_calls.push(
                        ToolCall::from_json(c).map_err(|w| bad(format!("tool call {j}: {w}")))?,
                    );
                }
            }
            Some(_) => return Err(bad("`tool_calls` is not a list".into())),
        }
        Ok(Message {
            role,
            content,
            reasoning,
            tool_calls,
            tool_call_id: text("tool_call_id")?,
            name: text("name")?.or(text("tool_name")?),
        })
    }

    /// Reads a whole `messages` array.
    pub fn list_from_json(v: &Value) -> Result<Vec<Self>, MessageError> {
        let a = v.as_array().ok_or_else(|| MessageError::Invalid {
            index: 0,
            what: "`messages` is not a JSON array".into(),
        })?;
        a.iter()
            .enumerate()
            .map(|(i, m)| Self::from_json(i, m))
            .collect()
    }

    /// The message in OpenAI's wire shape (tool-call arguments as a JSON string,
    /// reasoning as `reasoning_content`); [`Message::from_json`] reads it back equal.
    pub fn to_openai(&self) -> Value {
        self.to_map(Shape::Wire)
    }

    /// What the template sees: a mapping with only the keys this message has, in a
    /// fixed order (role, content, reasoning_content, thinking, tool_calls,
    /// tool_call_id, name) — the dict transformers would be given.
    pub fn to_template_value(&self) -> Value {
        self.to_map(Shape::Template)
    }

    fn to_map(&self, shape: Shape) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), self.role.clone().into());
        m.insert("content".into(), self.content.clone().into());
        if let Some(r) = &self.reasoning {
            m.insert("reasoning_content".into(), r.clone().into());
            if shape == Shape::Template {
                m.insert("thinking".into(), r.clone().into());
            }
        }
        if !self.tool_calls.is_empty() {
            let calls = self.tool_calls.iter().map(|c| c.to_map(shape)).collect();
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), id.clone().into());
        }
        if let Some(n) = &self.name {
            m.insert("name".into(), n.clone().into());
        }
        Value::Object(m)
    }
}

/// The two forms a message is written in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// OpenAI's wire shape: arguments as a JSON string, reasoning once.
    Wire,
    /// What templates are given: arguments as an object, reasoning under both names.
    Template,
}

impl ToolCall {
    fn from_json(v: &Value) -> Result<Self, String> {
        let f = v.get("function").ok_or("no `function`")?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or("no function `name` string")?
            .to_string();
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::String(s)) => serde_json::from_str(s)
                .map_err(|e| format!("`arguments` of `{name}` is not valid JSON: {e}"))?,
            Some(other) => other.clone(),
        };
        let id = match v.get("id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err("`id` is not a string".into()),
        };
        Ok(ToolCall {
            id,
            name,
            arguments,
        })
    }

    fn to_map(&self, shape: Shape) -> Value {
        let mut m = Map::new();
        if let Some(id) = &self.id {
            m.insert("id".into(), id.clone().into());
        }
        m.insert("type".into(), "function".into());
        let arguments = match shape {
            Shape::Wire => Value::String(self.arguments.to_string()),
            Shape::Template => self.arguments.clone(),
        };
        let mut f = Map::new();
        f.insert("name".into(), self.name.clone().into());
        f.insert("arguments".into(), arguments);
        m.insert("function".into(), Value::Object(f));
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_and_ollama_shapes_normalise_alike() {
        let openai = json!({"role": "assistant", "content": null, "reasoning_content": "hmm",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "f", "arguments": "{\"x\": 1}"}}]});
        let ollama = json!({"role": "assistant", "content": "", "thinking": "hmm",
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}]});
        let a = Message::from_json(0, &openai).unwrap();
        assert_eq!(a, Message::from_json(0, &ollama).unwrap());
        assert_eq!(a.tool_calls[0].arguments, json!({"x": 1}));
        assert_eq!(
            Message::from_json(0, &a.to_openai()).unwrap(),
            a,
            "round trip"
        );
        assert_eq!(
            a.to_template_value(),
            json!({"role": "assistant", "content": "", "reasoning_content": "hmm", "thinking": "hmm",
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]})
        );
    }

    #[test]
    fn parts_join_and_media_is_refused_by_name() {
        let m = json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(Message::from_json(0, &m).unwrap().content, "ab");
        let m =
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]});
        let e = Message::from_json(3, &m).unwrap_err().to_string();
        assert!(e.contains("message 3") && e.contains("image"), "{e}");
        let m = json!({"role": "user", "content": "hi", "images": ["aGk="]});
        assert!(
            Message::from_json(0, &m)
                .unwrap_err()
                .to_string()
                .contains("image")
        );
    }

    #[test]
    fn malformed_messages_name_the_problem() {
        for (v, want) in [
            (json!("hi"), "not a JSON object"),
            (json!({"content": "x"}), "`role` is missing"),
            (json!({"role": 3}), "`role` is not a string"),
            (json!({"role": "user", "content": 5}), "`content`"),
            (
                json!({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}),
                "not valid JSON",
            ),
            (
                json!({"role": "assistant", "tool_calls": [{}]}),
                "no `function`",
            ),
            (
                json!({"role": "user", "content": [{"type": "video"}]}),
                "`video`",
            ),
        ] {
            let e = Message::from_json(0, &v).unwrap_err().to_string();
            assert!(e.contains(want), "{v}: {e}");
        }
    }
}
