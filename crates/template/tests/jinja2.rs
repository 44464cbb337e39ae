//! Every chat template of llama.cpp b11434's models/templates renders byte-identically to
//! Python's Jinja2 under Hugging Face's settings, over a matrix of conversations
//! (system prompt, multi-turn, content parts, tools, tool calls and results, parallel
//! calls, reasoning with `enable_thinking` unset / false / true), and fails where Jinja2
//! fails — with the template's own message where the template raised it. Where Jinja2
//! works only by accident of Python semantics or not at all (`for` over none, a `map`
//! generator given to `tojson`, Markup's escaping on `|safe +`), the text required is
//! Jinja2's render under the script's lenient settings (`lenient_output`).
//! Goldens: scripts/gen-template-expected. Needs the reference tree:
//! `LLAMAY_REF_TREE=$(scripts/fetch-ref)` (scripts/test sets it).

use llamay_template::{ChatTemplate, Message, RenderOptions, TemplateError};
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
    let mut failures = Vec::new();
    let (mut same, mut as_intended, mut both_failed) = (0, 0, 0);
    let mut templates = std::collections::BTreeSet::new();
    for case in doc["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        templates.insert(name);
        let conv_name = case["conversation"].as_str().unwrap();
        let what = format!(
            "{name} / {conv_name} / agp={} {}",
            case["add_generation_prompt"], case["kwargs"]
        );
        let source = std::fs::read_to_string(tree.join("models/templates").join(name)).unwrap();
        let t =
            ChatTemplate::with_fixed_date(&source, date).unwrap_or_else(|e| panic!("{name}: {e}"));
        let conv = &doc["conversations"][conv_name];
        let msgs = Message::list_from_json(&conv["messages"]).unwrap();
        let opts = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools: conv.get("tools").cloned(),
            bos_token: "<s>".into(),
            eos_token: "</s>".into(),
            kwargs: case["kwargs"].as_object().unwrap().clone(),
        };
        let got = t.render(&msgs, &opts);
        // Where Python's semantics and the template's intent part (the script's LENIENT
        // note), Jinja2's render under the lenient settings is the text required.
        let lenient = case.get("lenient_output").and_then(Value::as_str);
        let want = lenient.or(case.get("output").and_then(Value::as_str));
        match (want, got) {
            (Some(want), Ok(got)) if got == want && lenient.is_some() => as_intended += 1,
            (Some(want), Ok(got)) if got == want => same += 1,
            (Some(want), Ok(got)) => {
                let at = got
                    .bytes()
                    .zip(want.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                failures.push(format!(
                    "{what}: differs at byte {at}: ours {:?} / Jinja2 {:?}",
                    &got[at.saturating_sub(20).min(got.len())..(at + 40).min(got.len())],
                    &want[at.saturating_sub(20).min(want.len())..(at + 40).min(want.len())]
                ))
            }
            (None, Err(e)) => {
                let want = case["error"].as_str().unwrap();
                if case["error_kind"] == "raise_exception"
                    && e != TemplateError::Raised(want.into())
                {
                    failures.push(format!("{what}: Jinja2 raised '{want}', we: {e}"));
                } else {
                    both_failed += 1;
                }
            }
            (want, got) => failures.push(format!(
                "{what}: Jinja2 gave {:?}, we gave {:?}",
                want.map(|w| &w[..w.len().min(80)]).ok_or(&case["error"]),
                got.as_ref().map(|g| &g[..g.len().min(80)])
            )),
        }
    }
    eprintln!(
        "{} templates: {same} renders byte-identical to Jinja2, {as_intended} identical to its lenient render, {both_failed} errors where Jinja2 errs, {} failures",
        templates.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(templates.len(), 71, "every template of models/templates");
    assert_eq!(
        same + as_intended + both_failed,
        doc["cases"].as_array().unwrap().len()
    );
}
