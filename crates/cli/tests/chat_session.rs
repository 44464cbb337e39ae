//! `llamay chat`: the conversation stays in the KV cache (each turn prefills only what
//! the cache does not hold), `/save` + `/load` continue a conversation exactly, and a
//! person's session — typing, Ctrl-C during an answer, commands, multi-line input —
//! driven in tmux (send-keys, capture-pane) on the real Gemma file.

mod common;

use common::{TempPath, fixture, llamay, temp_file};
use serde_json::{Value, json};
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `llamay chat` fed `stdin`; `extra` defaults to `--chat-template chatml -n 12`.
fn chat(model: &str, stdin: &str, extra: &[&str]) -> Output {
    let mut args = vec!["chat", model, "--temp", "0"];
    if !extra.contains(&"--chat-template") {
        args.extend(["--chat-template", "chatml"]);
    }
    if !extra.contains(&"-n") {
        args.extend(["-n", "12"]);
    }
    args.extend_from_slice(extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// `[turn N] prompt T tokens: A new, B from the cache` → (T, A, B) per turn.
fn prefill_lines(stderr: &str) -> Vec<(usize, usize, usize)> {
    stderr
        .lines()
        .filter(|l| l.contains(" from the cache"))
        .map(|l| {
            let n: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            (n[1], n[2], n[3])
        })
        .collect()
}

/// The transcript line of a `/save` file.
fn transcript(path: &std::path::Path) -> Value {
    let bytes = std::fs::read(path).unwrap();
    let text = &bytes[b"LLAMAYCHAT 1\n".len()..];
    let nl = text.iter().position(|&b| b == b'\n').unwrap();
    serde_json::from_slice(&text[..nl]).unwrap()
}

#[test]
fn each_turn_prefills_only_what_the_cache_lacks() {
    let m = fixture("qwen2-Q4_0.gguf");
    let m = m.to_str().unwrap();
    let save = TempPath::new("chat.sav");
    let o = chat(
        m,
        &format!("Hi\nNext?\nThen?\n/save {}\n", save.display()),
        &["--system", "Be brief.", "-n", "4"],
    );
    let turns = prefill_lines(&String::from_utf8_lossy(&o.stderr));
    assert_eq!(turns.len(), 3);
    // Turn 1 computes everything; later turns reuse at least the previous prompt.
    assert_eq!(turns[0].2, 0);
    for w in turns.windows(2) {
        let ((prev_total, _, _), (total, new, reused)) = (w[0], w[1]);
        assert_eq!(new + reused, total);
        // (This vocabulary may tokenize the reply's text otherwise than it was
        // generated; the Gemma test checks that generated tokens are reused too.)
        assert!(reused >= prev_total, "{turns:?}");
    }
    // The reported totals are the token counts of the conversation as rendered.
    let t = transcript(&save);
    let msgs = t["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 6);
    let mut conv = vec![json!({"role": "system", "content": "Be brief."})];
    for (i, &(total, _, _)) in turns.iter().enumerate() {
        conv.push(msgs[2 * i].clone());
        let f = temp_file(
            &format!("chat-conv-{i}.json"),
            &Value::Array(conv.clone()).to_string(),
        );
        let rendered = llamay(&[
            "render",
            m,
            "--chat-template",
            "chatml",
            "--messages",
            f.to_str().unwrap(),
        ]);
        assert!(rendered.status.success());
        let mut tok = Command::new(env!("CARGO_BIN_EXE_llamay"))
            .args(["tokenize", m, "--ids"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        tok.stdin
            .take()
            .unwrap()
            .write_all(&rendered.stdout)
            .unwrap();
        let ids: Vec<u32> =
            serde_json::from_slice(&tok.wait_with_output().unwrap().stdout).unwrap();
        assert_eq!(ids.len(), total, "turn {}", i + 1);
        conv.push(msgs[2 * i + 1].clone());
    }
}

/// On a real vocabulary the reply re-tokenizes as generated: the second turn reuses
/// the first prompt and every answer token that reached the cache (all but the last).
#[test]
fn the_answer_itself_is_reused_on_gemma() {
    let Some(gemma) =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
    else {
        return;
    };
    let o = chat(
        gemma.to_str().unwrap(),
        "What is the capital of France?\nAnd of Italy?\n",
        &["--chat-template", "gemma", "-n", "24", "-c", "1024"],
    );
    let turns = prefill_lines(&String::from_utf8_lossy(&o.stderr));
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[1].2, turns[0].0 + 24 - 1, "{turns:?}");
}

#[test]
fn save_and_load_continue_the_conversation_exactly() {
    let m = fixture("llama-Q8_0.gguf");
    let m = m.to_str().unwrap();
    let save = TempPath::new("chat-cont.sav");
    let whole = chat(m, "one\ntwo\nthree\n", &[]);
    let first = chat(m, &format!("one\ntwo\n/save {}\n", save.display()), &[]);
    let second = chat(m, &format!("/load {}\nthree\n", save.display()), &[]);
    let (whole, first, second) = (
        String::from_utf8(whole.stdout).unwrap(),
        String::from_utf8(first.stdout).unwrap(),
        String::from_utf8(second.stdout).unwrap(),
    );
    assert_eq!(
        whole,
        first + &second,
        "the answers of the split session are the whole one's"
    );
    let turns = prefill_lines(&String::from_utf8_lossy(
        &chat(m, &format!("/load {}\nthree\n", save.display()), &[]).stderr,
    ));
    assert!(turns[0].2 > 0, "the loaded cache is reused: {turns:?}");
    // A damaged save is refused, and nothing is loaded.
    let mut bytes = std::fs::read(&save).unwrap();
    let n = bytes.len();
    bytes[n - 40] ^= 1;
    let bad = temp_file("chat-bad.sav", "");
    std::fs::write(&bad, &bytes).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args(["chat", m, "--chat-template", "chatml"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut o = o;
    writeln!(o.stdin.take().unwrap(), "/load {}", bad.display()).unwrap();
    let o = o.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("error: /load") && err.contains("checksum"),
        "{err}"
    );
}

#[test]
fn chat_refuses_a_model_without_a_template() {
    let m = fixture("llama-F16.gguf");
    let o = llamay(&["chat", m.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("has no chat template") && err.contains("--chat-template"),
        "{err}"
    );
}

/// A tmux session running `llamay chat`.
struct Tmux(String);

impl Tmux {
    fn send(&self, keys: &[&str]) {
        let ok = Command::new("tmux")
            .args(["send-keys", "-t", &self.0])
            .args(keys)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    fn pane(&self) -> String {
        let o = Command::new("tmux")
            .args(["capture-pane", "-p", "-J", "-S", "-2000", "-t", &self.0])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Waits until `f(pane)` holds.
    fn wait(&self, what: &str, secs: u64, f: impl Fn(&str) -> bool) -> String {
        let t = Instant::now();
        loop {
            let p = self.pane();
            if f(&p) {
                return p;
            }
            if t.elapsed() > Duration::from_secs(secs) {
                panic!("timed out waiting for {what}; pane:\n{p}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn alive(&self) -> bool {
        Command::new("tmux")
            .args(["has-session", "-t", &self.0])
            .status()
            .unwrap()
            .success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .status();
    }
}

#[test]
fn a_person_chats_in_a_terminal() {
    let Some(gemma) =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
    else {
        return;
    };
    if Command::new("tmux").arg("-V").output().is_err() {
        panic!("tmux is not installed (scripts/test installs it)");
    }
    let name = format!("llamay-chat-{}", std::process::id());
    let cmd = format!(
        "{} chat {} --chat-template gemma --temp 0 -n -1 --ignore-eos -c 8192 -t 2; sleep 30",
        env!("CARGO_BIN_EXE_llamay"),
        gemma.display()
    );
    let ok = Command::new("tmux")
        .args([
            "new-session",
            "-d",
            "-s",
            &name,
            "-x",
            "160",
            "-y",
            "50",
            &cmd,
        ])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let t = Tmux(name);
    t.wait("the banner and prompt", 60, |p| {
        p.contains("/help for commands") && p.contains(">>> ")
    });
    t.send(&["Tell me a long story about a lighthouse.", "Enter"]);
    // The answer streams (-n -1 --ignore-eos: it would run until the context is full)…
    let before = t.wait("the answer to stream", 60, |p| {
        p.contains("[turn 1] prompt")
    });
    std::thread::sleep(Duration::from_millis(1500));
    let during = t.pane();
    assert!(during.len() > before.len(), "text arrives while generating");
    // …until Ctrl-C stops it; the program goes on.
    t.send(&["C-c"]);
    let p = t.wait("the answer to stop", 30, |p| {
        p.contains("stop: interrupted")
    });
    assert!(t.alive());
    assert!(p.trim_end().ends_with(">>>"), "back at the prompt:\n{p}");
    t.send(&["/help", "Enter"]);
    t.wait("the help", 10, |p| {
        p.contains("/save FILE") && p.contains("/clear")
    });
    // Multi-line input is one turn; its prefill reuses the first turn's cache.
    t.send(&["\"\"\"First line", "Enter"]);
    t.send(&["second line\"\"\"", "Enter"]);
    let p = t.wait("turn 2", 60, |p| p.contains("[turn 2] prompt"));
    let line = p.lines().find(|l| l.contains("[turn 2] prompt")).unwrap();
    assert!(!line.contains(" 0 from the cache"), "{line}");
    t.send(&["C-c"]);
    t.wait("turn 2 to stop", 30, |p| {
        p.matches("stop: interrupted").count() == 2
    });
    t.send(&["/bye", "Enter"]);
    // The shell command goes on to `sleep` only once chat has exited 0… or not at all.
    t.wait("chat to exit", 10, |p| {
        !p.trim_end().ends_with(">>>") || !t.alive()
    });
}
