//! The chat layer's readers of outside text: GBNF grammars (then matching the rest of
//! the input against them), JSON Schemas, chat templates (a GGUF's `chat_template` is
//! the file author's code), messages in the APIs' JSON, and the tool-call / reasoning
//! parser over generated text. None may panic, hang or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamay_engine::grammar::{GrammarState, Rules};
use llamay_template::{ChatTemplate, Message, OutputFormat, OutputParser, RenderOptions, ToolSyntax};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    match mode % 5 {
        0 => {
            // grammar, a NUL, then input to match
            let (g, input) = text.split_once('\0').unwrap_or((&text, ""));
            if let Ok(rules) = Rules::gbnf(g) {
                let _ = GrammarState::new(rules).advance(input.as_bytes());
            }
        }
        1 => {
            if let Ok(schema) = serde_json::from_str::<serde_json::Value>(&text)
                && let Ok(rules) = Rules::json_schema(&schema)
            {
                let _ = GrammarState::new(rules).advance(b"{\"a\": [1, \"x\"]}");
            }
        }
        2 => {
            if let Ok(t) = ChatTemplate::new(&text) {
                let msgs = [Message::new("system", "s"), Message::new("user", "hi")];
                let opts = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
                let _ = t.render(&msgs, &opts);
            }
        }
        3 => {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                let _ = Message::list_from_json(&v);
            }
        }
        _ => {
            for tools in [ToolSyntax::Hermes, ToolSyntax::Llama3, ToolSyntax::Mistral, ToolSyntax::Harmony, ToolSyntax::None] {
                let f = OutputFormat { tools, think_tags: true, starts_in_reasoning: rest.first() == Some(&b'<') };
                let mut p = OutputParser::new(f);
                for chunk in text.as_bytes().chunks(3) {
                    let _ = p.push(&String::from_utf8_lossy(chunk));
                }
                let _ = p.finish();
            }
        }
    }
});
