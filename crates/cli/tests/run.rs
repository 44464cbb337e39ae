//! `llamay run` and `llamay perplexity` on the generated architecture fixtures
//! (scripts/gen-arch-fixtures): output contract, chat templates, and bad input.

mod common;

use common::{TempPath, fixture, llamay, ok_stdout, with_template};
use std::process::Output;

fn assert_error(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: ") && last.contains(needle),
        "expected '{needle}' in: {err}"
    );
}

#[test]
fn greedy_run_is_deterministic_and_streams_only_the_generation() {
    let m = fixture("llama-Q8_0.gguf");
    let m = m.to_str().unwrap();
    let a = ok_stdout(&llamay(&[
        "run",
        m,
        "-p",
        "hello world",
        "-n",
        "12",
        "--temp",
        "0",
    ]));
    let b = ok_stdout(&llamay(&[
        "run",
        "-m",
        m,
        "-p",
        "hello world",
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "1",
    ]));
    assert_eq!(a, b, "greedy output does not depend on the thread count");
    assert!(!a.contains("hello world"), "no prompt echo");
    let o = llamay(&["run", m, "-p", "hello world", "-n", "12", "--temp", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("prompt") && err.contains("tok/s") && err.contains("generation 12 tokens"),
        "{err}"
    );
    // Seeded sampling is reproducible.
    let s1 = ok_stdout(&llamay(&[
        "run", m, "-p", "x", "-n", "8", "--temp", "1", "--seed", "42",
    ]));
    let s2 = ok_stdout(&llamay(&[
        "run", m, "-p", "x", "-n", "8", "--temp", "1", "--seed", "42",
    ]));
    assert_eq!(s1, s2);
}

#[test]
fn chat_template_wraps_the_prompt_unless_raw() {
    let t = with_template(
        &fixture("qwen2-Q4_0.gguf"),
        "run",
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    );
    let t = t.to_str().unwrap();
    let templated = ok_stdout(&llamay(&[
        "run", t, "-p", "hi there", "-n", "10", "--temp", "0",
    ]));
    // The same text given raw, BOS written by the template (the tokenizer adds it once).
    let raw = ok_stdout(&llamay(&[
        "run",
        t,
        "-p",
        "<user>hi there</user><assistant>",
        "-n",
        "10",
        "--temp",
        "0",
        "--raw",
    ]));
    assert_eq!(templated, raw);
    let plain = ok_stdout(&llamay(&[
        "run", t, "-p", "hi there", "-n", "10", "--temp", "0", "--raw",
    ]));
    assert_ne!(templated, plain, "--raw skips the template");
}

#[test]
fn bad_run_input_is_one_clear_error() {
    let m = fixture("llama-F16.gguf");
    let m = m.to_str().unwrap();
    assert_error(&llamay(&["run", m, "-p", "x", "-n", "0"]), "-n 0");
    assert_error(
        &llamay(&["run", m, "-p", "x", "--temp", "-1"]),
        "temperature",
    );
    assert_error(&llamay(&["run", m, "-p", "x", "--top-p", "7"]), "top-p");
    assert_error(&llamay(&["run", m, "-p", "x", "--min-p", "NaN"]), "min-p");
    assert_error(
        &llamay(&["run", m, "-p", "x", "--repeat-penalty", "0"]),
        "repeat-penalty",
    );
    assert_error(&llamay(&["run", m, "-p", "x", "-t", "0"]), "-t 0");
    assert_error(
        &llamay(&["run", m, "-p", "x", "--kv", "q4"]),
        "--kv q4: use one of f32, f16, vq8, q8",
    );
    assert_error(&llamay(&["run", m]), "-p TEXT or -f FILE");
    let long = "word ".repeat(400);
    assert_error(
        &llamay(&["run", m, "-p", &long, "-c", "64"]),
        "does not fit the context of 64",
    );
    assert_error(
        &llamay(&["run", "/nonexistent.gguf", "-p", "x"]),
        "No such file",
    );
}

#[test]
fn generation_stops_at_the_context() {
    let m = fixture("gemma3-Q4_K.gguf");
    let o = llamay(&[
        "run",
        m.to_str().unwrap(),
        "-p",
        "ab",
        "-c",
        "16",
        "--temp",
        "0",
        "--ignore-eos",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("stop: context full"));
}

#[test]
fn verify_contract() {
    // gpt2: a learned position table, so the text is cut to the training context.
    for name in ["llama-Q8_0.gguf", "gpt2-Q4_K.gguf"] {
        let m = fixture(name);
        let out = ok_stdout(&llamay(&["verify", m.to_str().unwrap()]));
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("| precision | KV bytes/token |"),
            "{out}"
        );
        let row = |p: &str| {
            (lines.iter())
                .find(|l| l.starts_with(&format!("| {p} |")))
                .unwrap_or_else(|| panic!("no {p} row: {out}"))
                .to_string()
        };
        assert!(row("f32").contains("| 100% |"), "{out}");
        assert!(row("vq8").contains("| 63% |"), "{out}");
        assert!(row("q8").contains("| 27% |"), "{out}");
        // The teeth row must fail; the verdict says it does.
        assert!(row("1-bit (teeth)").contains("FAIL (teeth"), "{out}");
        let last = lines.last().unwrap();
        assert!(last.starts_with("recommended: --kv "), "{out}");
        // The mean TV column parses and stays within [0, 100].
        let tv: f64 = row("vq8")
            .split('|')
            .nth(4)
            .unwrap()
            .trim()
            .trim_end_matches('%')
            .parse()
            .unwrap();
        assert!((0.0..=100.0).contains(&tv), "{out}");
    }
    let m = fixture("llama-Q8_0.gguf");
    let m = m.to_str().unwrap();
    assert_error(&llamay(&["verify", m, "--kv", "f32"]), "--kv f32");
    assert_error(
        &llamay(&["verify", m, "--kv", "q4"]),
        "use one of f32, f16, vq8, q8",
    );
    assert_error(&llamay(&["verify", m, "-c", "0"]), "-c 0");
    let o = ok_stdout(&llamay(&["verify", m, "--kv", "q8", "-c", "40"]));
    assert!(!o.contains("| vq8 |") && o.contains("| q8 |"), "{o}");
}

#[test]
fn perplexity_contract() {
    let m = fixture("llama-Q4_K.gguf");
    let text = TempPath::file(
        "ppl.txt",
        "the quick brown fox jumps over the lazy dog. ".repeat(40),
    );
    let o = llamay(&[
        "perplexity",
        m.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        "64",
        "--chunks",
        "2",
    ]);
    let out = ok_stdout(&o);
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("Final estimate: PPL = ") && last.contains(" +/- "),
        "{out}"
    );
    let ppl: f64 = last["Final estimate: PPL = ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{ppl}");
    assert!(out.starts_with("[1]"), "{out}");
    assert_error(
        &llamay(&[
            "perplexity",
            m.to_str().unwrap(),
            "-f",
            text.to_str().unwrap(),
            "-c",
            "4096",
        ]),
        "needs at least",
    );
}

/// As llama.cpp's `-f`: one trailing newline of the prompt file is dropped (an editor
/// adds it; with it the continuation differs from `-p` of the same text).
#[test]
fn prompt_file_drops_one_trailing_newline() {
    let m = fixture("llama-Q8_0.gguf");
    let m = m.to_str().unwrap();
    let dir = TempPath::dir("run-f");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", m, "-n", "6", "--temp", "0", "--raw"];
        args.extend_from_slice(extra);
        ok_stdout(&llamay(&args))
    };
    for (file_text, same_as) in [("hello world\n", "hello world"), ("hello\n\n", "hello\n")] {
        let f = dir.join("prompt.txt");
        std::fs::write(&f, file_text).unwrap();
        assert_eq!(
            run(&["-f", f.to_str().unwrap()]),
            run(&["-p", same_as]),
            "{file_text:?}"
        );
    }
}

/// A damaged file's error says its cause once (the wrapped error's text was printed
/// again after the wrapper that already quoted it).
#[test]
fn an_error_says_its_cause_once() {
    let whole = std::fs::read(fixture("gemma3-Q4_K.gguf")).unwrap();
    for (cut, cause) in [
        (whole.len() - 1000, "lies outside the file"),
        (4096, "file ends early"),
    ] {
        let f = TempPath::file("cut.gguf", "");
        std::fs::write(&*f, &whole[..cut]).unwrap();
        for cmd in ["info", "run", "tokenize"] {
            let o =
                llamay(&[cmd, f.to_str().unwrap(), "-p", "x"][..if cmd == "info" { 2 } else { 4 }]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(err.lines().count(), 1, "{cmd}: {err}");
            assert_eq!(err.matches(cause).count(), 1, "{cmd}: {err}");
            assert_eq!(err.matches("malformed GGUF").count(), 1, "{cmd}: {err}");
        }
    }
}

/// A device that is not there, or a malformed choice, is one `error:` line naming it
/// (not a crash: a failed open closes what it opened, the loader last).
#[test]
fn bad_device_choices_are_one_line_errors() {
    let p = fixture("llama-Q8_0.gguf");
    let p = p.to_str().unwrap();
    for (device, needle) in [("vulkan:99", "vulkan:99"), ("gpu", "--device gpu")] {
        let o = llamay(&["run", p, "-p", "hi", "-n", "1", "--device", device]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        let line = err.lines().last().unwrap_or_default();
        assert!(
            line.starts_with("error: ") && line.contains(needle),
            "{err}"
        );
        if device == "vulkan:99" {
            assert!(
                line.contains("no Vulkan device 99") || line.contains("no Vulkan loader"),
                "{err}"
            );
        }
    }
}
