//! `llamay render`, and `run`'s `--chat-template` / `--system`, on the generated
//! architecture fixtures (scripts/gen-arch-fixtures; their vocabulary's BOS is `<s>`).

mod common;

use common::{fixture, llamay, ok_stdout, temp_file, with_template};
use serde_json::{Value, json};
use std::process::Output;

fn assert_error(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(o.stdout.is_empty(), "nothing on stdout on failure");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("error: ") && err.contains(needle),
        "expected '{needle}' in: {err}"
    );
}

/// llama.cpp's own rendering of a built-in format (crates/template/tests/data/builtin.json).
fn llama_cpp_builtin(name: &str, conversation: &str, agp: bool) -> (Value, String) {
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../template/tests/data/builtin.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let case = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["name"] == name
                && c["conversation"] == conversation
                && c["add_generation_prompt"] == agp
        })
        .unwrap();
    (
        doc["conversations"][conversation].clone(),
        case["output"].as_str().unwrap().to_string(),
    )
}

const ECHO: &str = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}</{{ m.role }}>{% endfor %}{% if tools %}[{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}]{% endif %}{% if enable_thinking is defined %}think={{ enable_thinking }}{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}";

#[test]
fn render_prints_exactly_the_templates_text() {
    let m = with_template(&fixture("llama-F16.gguf"), "render", ECHO);
    let m = m.to_str().unwrap();
    let msgs = temp_file(
        "render-msgs.json",
        &json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        ])
        .to_string(),
    );
    let tools = temp_file(
        "render-tools.json",
        &json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]).to_string(),
    );
    let (msgs, tools) = (msgs.to_str().unwrap(), tools.to_str().unwrap());
    let out = ok_stdout(&llamay(&[
        "render",
        m,
        "--messages",
        msgs,
        "--tools",
        tools,
    ]));
    assert_eq!(
        out,
        "<s><system>Be brief.</system><user>Weather in Paris?</user><assistant>[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]</assistant><tool>18 C</tool>[get_weather]<assistant>"
    );
    let out = ok_stdout(&llamay(&[
        "render",
        m,
        "--messages",
        msgs,
        "--no-generation-prompt",
        "--chat-template-kwargs",
        "{\"enable_thinking\": false}",
    ]));
    // Printed as Jinja2 prints a Python bool.
    assert!(out.ends_with("</tool>think=False"), "{out}");
}

#[test]
fn builtin_and_file_templates_render_as_llama_cpp_does() {
    // A fixture whose file has no template: --chat-template NAME gives llama.cpp's text.
    let m = fixture("llama-F16.gguf");
    let m = m.to_str().unwrap();
    for (name, conv, agp) in [
        ("chatml", "system_multi_turn", true),
        ("llama3", "system_multi_turn", false),
        ("gemma", "system_user", true),
        ("mistral-v7", "multi_turn", true),
    ] {
        let (messages, want) = llama_cpp_builtin(name, conv, agp);
        let f = temp_file(&format!("builtin-{name}.json"), &messages.to_string());
        let mut args = vec![
            "render",
            m,
            "--messages",
            f.to_str().unwrap(),
            "--chat-template",
            name,
        ];
        if !agp {
            args.push("--no-generation-prompt");
        }
        assert_eq!(ok_stdout(&llamay(&args)), want, "{name} / {conv}");
    }
    // A Jinja file wins over the name lookup.
    let f = temp_file(
        "user.json",
        &json!([{"role": "user", "content": "hi"}]).to_string(),
    );
    let t = temp_file("tmpl.jinja", "[{{ messages[0].content }}]");
    let out = ok_stdout(&llamay(&[
        "render",
        m,
        "--messages",
        f.to_str().unwrap(),
        "--chat-template",
        t.to_str().unwrap(),
    ]));
    assert_eq!(out, "[hi]");
}

#[test]
fn render_errors_name_the_problem() {
    let m = fixture("llama-F16.gguf");
    let m = m.to_str().unwrap();
    let user = temp_file(
        "err-user.json",
        &json!([{"role": "user", "content": "hi"}]).to_string(),
    );
    let user = user.to_str().unwrap();
    assert_error(
        &llamay(&["render", m, "--messages", user]),
        "has no chat template",
    );
    assert_error(
        &llamay(&["render", m, "--messages", user, "--chat-template", "nope"]),
        "built-in names: bailing",
    );
    let raising = with_template(
        &fixture("llama-F16.gguf"),
        "raise",
        "{% if messages[0].role != 'system' %}{{ raise_exception('Conversations must start with a system message') }}{% endif %}",
    );
    assert_error(
        &llamay(&["render", raising.to_str().unwrap(), "--messages", user]),
        "Conversations must start with a system message",
    );
    let image = temp_file(
        "err-image.json",
        &json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}}]}]).to_string(),
    );
    assert_error(
        &llamay(&[
            "render",
            m,
            "--messages",
            image.to_str().unwrap(),
            "--chat-template",
            "chatml",
        ]),
        "image content is not supported",
    );
    let bad = temp_file("err-bad.json", "[{\"role\": \"user\"");
    assert_error(
        &llamay(&[
            "render",
            m,
            "--messages",
            bad.to_str().unwrap(),
            "--chat-template",
            "chatml",
        ]),
        "not JSON",
    );
    assert_error(
        &llamay(&[
            "render",
            m,
            "--messages",
            user,
            "--chat-template",
            "chatml",
            "--chat-template-kwargs",
            "[1]",
        ]),
        "JSON object",
    );
}

#[test]
fn run_wraps_system_and_prompt_in_the_chosen_template() {
    let m = fixture("qwen2-Q4_0.gguf");
    let m = m.to_str().unwrap();
    let generate = |extra: &[&str]| {
        let mut a = vec!["run", m, "-n", "8", "--temp", "0"];
        a.extend_from_slice(extra);
        ok_stdout(&llamay(&a))
    };
    // The rendered chatml text given raw generates the same tokens.
    let (messages, rendered) = llama_cpp_builtin("chatml", "system_user", true);
    let (system, user) = (
        messages[0]["content"].as_str().unwrap(),
        messages[1]["content"].as_str().unwrap(),
    );
    let templated = generate(&["--chat-template", "chatml", "--system", system, "-p", user]);
    assert_eq!(templated, generate(&["--raw", "-p", &rendered]));
    assert_ne!(
        templated,
        generate(&["--chat-template", "chatml", "-p", user]),
        "--system is used"
    );
    assert_error(
        &llamay(&["run", m, "-p", "x", "--system", "s"]),
        "--system needs a chat template",
    );
}

/// `--json-schema`: on random fixture weights (whatever they prefer) and on Gemma, every
/// finished output parses and has the schema's shape; bad constraints are refused first.
#[test]
fn constrained_output_follows_the_schema() {
    let schema = temp_file(
        "schema.json",
        &json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}, "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}, "required": ["a", "b"]}).to_string(),
    );
    let schema = schema.to_str().unwrap();
    let check = |out: &str| {
        let v: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{out:?}: {e}"));
        // JSON Schema's integer: no fraction (`-0` included).
        assert!(v["a"].as_f64().is_some_and(|f| f.fract() == 0.0), "{v}");
        assert!(v["b"] == "x" || v["b"] == "y", "{v}");
        assert!(
            v.get("c").is_none_or(|c| c
                .as_array()
                .is_some_and(|c| c.len() <= 2 && c.iter().all(Value::is_boolean))),
            "{v}"
        );
        assert!(
            v.as_object()
                .unwrap()
                .keys()
                .all(|k| ["a", "b", "c"].contains(&k.as_str()))
        );
    };
    let m = fixture("qwen2-Q4_0.gguf");
    let mut finished = 0;
    for seed in 0..6 {
        let seed = seed.to_string();
        let o = llamay(&[
            "run",
            m.to_str().unwrap(),
            "-p",
            "x",
            "--temp",
            "1",
            "--seed",
            &seed,
            "-n",
            "150",
            "--json-schema",
            schema,
        ]);
        let out = ok_stdout(&o);
        let err = String::from_utf8_lossy(&o.stderr);
        if err.contains("stop: end of generation") || err.contains("stop: grammar complete") {
            check(&out);
            finished += 1;
        }
    }
    assert!(finished >= 3, "{finished} of 6 runs finished");
    if let Some(gemma) =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
    {
        let o = llamay(&[
            "run",
            gemma.to_str().unwrap(),
            "-p",
            "A JSON record:\n",
            "--temp",
            "0",
            "-n",
            "200",
            "--json-schema",
            schema,
        ]);
        check(&ok_stdout(&o));
    }
    let m = m.to_str().unwrap();
    let bad = temp_file("bad.gbnf", "root ::= \"a\" | missing\n");
    assert_error(
        &llamay(&["run", m, "-p", "x", "--grammar", bad.to_str().unwrap()]),
        "'missing' is used but never defined",
    );
    let pat = temp_file(
        "pattern.json",
        "{\"type\": \"string\", \"pattern\": \"^(?=a)\"}",
    );
    assert_error(
        &llamay(&["run", m, "-p", "x", "--json-schema", pat.to_str().unwrap()]),
        "lookaround",
    );
    let o = llamay(&[
        "run",
        m,
        "-p",
        "x",
        "--json",
        "--grammar",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "--json and --grammar conflict");
}
