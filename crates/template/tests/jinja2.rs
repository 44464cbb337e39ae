//! Real chat templates (llama.cpp b11434's models/templates) render byte-identically to
//! Python's Jinja2 under Hugging Face's settings (scripts/gen-template-expected).
//! Needs the reference tree: `LLAMAY_REF_TREE=$(scripts/fetch-ref)` (scripts/test sets it).

use llamay_template::{ChatTemplate, Message};
use serde_json::Value;
use std::path::Path;

#[test]
fn renders_like_jinja2() {
    let Some(tree) =
        llamay_synth::reference::path("LLAMAY_REF_TREE", "LLAMAY_REF_TREE=$(scripts/fetch-ref)")
    else {
        return;
    };
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/expected.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let date = "29 Nov 2026";
    let mut checked = 0;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let source = std::fs::read_to_string(tree.join("models/templates").join(name)).unwrap();
        let t =
            ChatTemplate::with_fixed_date(&source, date).unwrap_or_else(|e| panic!("{name}: {e}"));
        let conv = &doc["conversations"][case["conversation"].as_str().unwrap()];
        let msgs: Vec<Message> = conv
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let got = t.render(&msgs, agp, "<s>", "</s>");
        match (case.get("output").and_then(Value::as_str), got) {
            (Some(want), Ok(got)) => {
                assert_eq!(got, want, "{name} / {} / agp={agp}", case["conversation"])
            }
            (None, Err(e)) => {
                let want = case["error"].as_str().unwrap();
                assert!(
                    e.to_string().contains(want),
                    "{name}: error '{e}' should contain '{want}'"
                );
            }
            (want, got) => panic!("{name}: Jinja2 gave {want:?}, we gave {got:?}"),
        }
        checked += 1;
    }
    assert_eq!(checked, 48);
}
