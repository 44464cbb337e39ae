//! The built-in templates (`--chat-template NAME`) render the bytes llama.cpp b11434's
//! own formatter writes for the same name and conversation (goldens:
//! scripts/gen-builtin-templates, llama_chat_apply_template).

use llamay_template::{ChatTemplate, Message, RenderOptions, builtin};
use serde_json::Value;
use std::path::Path;

#[test]
fn builtin_templates_match_llama_cpp() {
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/builtin.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let names: Vec<&str> = doc["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        builtin::NAMES,
        "llama.cpp's built-in names, all of them"
    );
    let mut failures = Vec::new();
    let mut same = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let (_, source) = builtin::get(name).unwrap();
        let t = ChatTemplate::new(source).unwrap_or_else(|e| panic!("{name}: {e}"));
        let conv = case["conversation"].as_str().unwrap();
        let msgs = Message::list_from_json(&doc["conversations"][conv]).unwrap();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let opts = RenderOptions {
            add_generation_prompt: agp,
            ..RenderOptions::default()
        };
        let got = t.render(&msgs, &opts);
        match (case["output"].as_str(), got) {
            (Some(want), Ok(got)) if got == want => same += 1,
            (want, got) => failures.push(format!(
                "{name} / {conv} / agp={agp}: llama.cpp {want:?}, ours {got:?}"
            )),
        }
    }
    eprintln!(
        "{same} of {} built-in renders identical to llama.cpp",
        doc["cases"].as_array().unwrap().len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(same, 432);
}

#[test]
fn names_resolve_in_any_case() {
    assert_eq!(builtin::get("ChatML").unwrap().0, "chatml");
    assert!(builtin::get("no-such-format").is_none());
}
