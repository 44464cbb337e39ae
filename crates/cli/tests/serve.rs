//! `llamay serve` as users meet it: the real server started on 127.0.0.1:0 with the
//! real Gemma 3 270M file, driven by the official `ollama` and `openai` Python clients
//! (tests/serve/clients.py; scripts/test installs them into a venv and sets
//! LLAMAY_PYTHON), raw HTTP for every hostile request, a real Prometheus scraping
//! `/metrics`, and nginx serving a model for `/api/pull`.
//!
//! Needs the model: `LLAMAY_GEMMA=$(scripts/fetch-models)` (scripts/test sets it).

mod common;

use common::{llamay, ok_stdout};

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn gemma() -> Option<PathBuf> {
    llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
}

/// A running `llamay serve`, killed on drop.
struct Serve {
    child: Child,
    base: String,
    log: Arc<Mutex<String>>,
}

impl Serve {
    fn start(args: &[&str]) -> Serve {
        Self::start_env(args, &[])
    }

    fn start_env(args: &[&str], env: &[(&str, &str)]) -> Serve {
        let store = std::env::temp_dir().join(format!("llamay-serve-store-{}", std::process::id()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_llamay"));
        cmd.arg("serve")
            .args(["--port", "0", "-t", "2"])
            .args(args)
            .env("LLAMAY_MODELS", &store)
            .env_remove("LLAMAY_HOST")
            .env_remove("LLAMAY_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start llamay serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("llamay serve: listening on ") {
                    let _ = tx.send(addr.to_string());
                }
                l.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("llamay serve did not start: {}", log.lock().unwrap()));
        Serve { child, base, log }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = client().post(self.url(path)).json(body).send().unwrap();
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(Value::Null))
    }

    /// A gauge's value from `/metrics`.
    fn gauge(&self, name: &str) -> f64 {
        let text = client()
            .get(self.url("/metrics"))
            .send()
            .unwrap()
            .text()
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
            .parse()
            .unwrap()
    }

    fn wait_gauge(&self, name: &str, want: f64, within: Duration) -> Duration {
        let t = Instant::now();
        loop {
            if self.gauge(name) == want {
                return t.elapsed();
            }
            assert!(
                t.elapsed() < within,
                "{name} still {} after {within:?} (want {want})",
                self.gauge(name)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `LLAMAY_TEST_TIME_SCALE` (default 1): how many times longer a request may take, for
/// a slow device (scripts/test-serve-device: lavapipe decodes Gemma at ~2 tokens/s).
/// Only the hang guards (and the SIGTERM test's drain bound) stretch; the timing
/// assertions (a slot freed within one step, 503s while busy) keep their bounds.
fn time_scale() -> u64 {
    std::env::var("LLAMAY_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(300 * time_scale()))
        .build()
        .unwrap()
}

fn greedy(prompt: &str, n: u32) -> Value {
    json!({"model": "gemma", "prompt": prompt, "raw": true, "stream": false,
           "options": {"temperature": 0, "num_predict": n}})
}

fn python() -> Option<PathBuf> {
    llamay_synth::reference::path(
        "LLAMAY_PYTHON",
        "a Python with the ollama and openai packages (scripts/test makes one)",
    )
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name)
}

/// A server of the Gemma file as `gemma3:270m` and, when `tools` names a copy, that
/// copy under the Llama 3 tool-calling template as `tools` (removed when the returned
/// path drops).
fn serve_gemma(g: &Path, tools: Option<&str>) -> (Serve, Option<common::TempPath>) {
    let copy = tools.map(|name| {
        let template = std::fs::read_to_string(data("data/serve/llama3-tools.jinja")).unwrap();
        common::with_template(g, name, &template)
    });
    let mut args = vec!["-m", g.to_str().unwrap(), "--alias", "gemma3:270m"];
    if let Some(c) = &copy {
        args.extend(["-m", c.to_str().unwrap(), "--alias", "tools"]);
    }
    args.extend(["--chat-template", "gemma"]);
    (Serve::start(&args), copy)
}

/// Runs the Python script `tests/serve/NAME` with the server's address and `args`;
/// its output is printed, and a failure shows it with the server's log.
fn run_script(s: &Serve, py: &Path, name: &str, args: &[&str]) {
    let out = Command::new(py)
        .arg(data(&format!("serve/{name}")))
        .arg(&s.base)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "{name} {args:?} failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log.lock().unwrap()
    );
}

#[test]
fn serve_help_exits_0_and_bad_flags_are_named() {
    let o = common::llamay(&["serve", "--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--alias",
        "--parallel",
        "--queue",
        "--ctx-size",
        "--kv",
        "--api-key",
        "--cors-origin",
        "--max-body",
        "--keep-alive",
    ] {
        assert!(help.contains(flag), "serve --help lacks {flag}");
    }
    for (args, want) in [
        (&["serve", "--parallel", "0"][..], "--parallel 0"),
        (&["serve", "--kv", "q3"][..], "--kv q3"),
        (&["serve", "--keep-alive", "soon"][..], "--keep-alive soon"),
        (&["serve", "--alias", "x"][..], "--alias x"),
        (
            &["serve", "-m", "/nonexistent.gguf"][..],
            "/nonexistent.gguf",
        ),
        (&["serve", "-c", "1"][..], "--ctx-size 1"),
    ] {
        let o = common::llamay(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error:") && err.contains(want),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn serve_the_official_ollama_and_openai_clients_work_unmodified() {
    let (Some(g), Some(py)) = (gemma(), python()) else {
        return;
    };
    let (s, tools) = serve_gemma(&g, Some("serve-tools"));
    let tools = tools.unwrap();
    for group in ["ollama", "openai", "tools"] {
        run_script(&s, &py, "clients.py", &[group]);
    }
    // clients.py sent num_ctx above --ctx-size twice: clamped, said once.
    let log = s.log.lock().unwrap().clone();
    assert_eq!(log.matches("clamped to").count(), 1, "{log}");
    // Every -m model has a digest, the file's sha256, the same in /api/tags and /api/ps:
    // clients that key models by digest must not merge these two.
    let sha = |p: &Path| {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(std::fs::read(p).unwrap());
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let tags: Value = client()
        .get(s.url("/api/tags"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let digest = |name: &str| {
        tags["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(digest("gemma3:270m"), sha(&g));
    assert_eq!(digest("tools"), sha(&tools));
    let ps: Value = client()
        .get(s.url("/api/ps"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let loaded = ps["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "gemma3:270m")
        .unwrap();
    assert_eq!(loaded["digest"].as_str().unwrap(), sha(&g));
}

/// ≥ 30 schemas as pydantic writes them (constrained ints and floats, patterns,
/// datetimes, UUIDs, enums, Literals, Optionals, tuples, maps, nested
/// models through `$defs`, a discriminated union), each answer validated by the
/// `jsonschema` validator with formats checked and by pydantic (tests/serve/schemas.py).
#[test]
fn serve_structured_output_is_valid_on_pydantic_schemas() {
    let (Some(g), Some(py)) = (gemma(), python()) else {
        return;
    };
    let (s, _) = serve_gemma(&g, None);
    run_script(&s, &py, "schemas.py", &[]);
}

/// The frameworks people put in front of a server, each used as its README shows
/// (tests/serve/frameworks.py: LangChain's Ollama and OpenAI integrations, instructor,
/// the OpenAI agents SDK on the Responses API; pinned in a venv of their own by
/// scripts/test, LLAMAY_FRAMEWORKS_PYTHON).
#[test]
fn serve_the_frameworks_work_as_their_readmes_show() {
    let (Some(g), Some(py)) = (
        gemma(),
        llamay_synth::reference::path(
            "LLAMAY_FRAMEWORKS_PYTHON",
            "a Python with langchain-ollama, langchain-openai, instructor and openai-agents (scripts/test makes one)",
        ),
    ) else {
        return;
    };
    let (s, _tools) = serve_gemma(&g, Some("serve-frameworks-tools"));
    run_script(&s, &py, "frameworks.py", &[]);
}

/// Open WebUI (0.12.4, its server without the local-ML extras: scripts/test installs it,
/// `LLAMAY_OPENWEBUI` names the venv), running on a free port in front of a server
/// through its Ollama or its OpenAI connection; killed and its data removed on drop.
struct OpenWebUi {
    child: Child,
    base: String,
    data: PathBuf,
}

impl OpenWebUi {
    fn start(venv: &Path, backend: &str, mode: &str) -> OpenWebUi {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data =
            std::env::temp_dir().join(format!("llamay-openwebui-{}-{mode}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data).unwrap();
        let log = std::fs::File::create(data.join("open-webui.log")).unwrap();
        let mut cmd = Command::new(venv.join("bin/open-webui"));
        cmd.args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
            .env("DATA_DIR", &data)
            // Its slim mode: no local embedding model or vector store.
            .env("USE_SLIM_DOCKER", "true")
            .env("OFFLINE_MODE", "true")
            .env("HF_HUB_OFFLINE", "1")
            .env("ENABLE_VERSION_UPDATE_CHECK", "false")
            .env("ANONYMIZED_TELEMETRY", "false")
            .env("DO_NOT_TRACK", "true")
            .env("WEBUI_SECRET_KEY", "llamay-test")
            // Title generation asks for 1000 tokens unless bounded.
            .env("TASK_MODEL_PARAMS", r#"{"max_tokens":48}"#)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if mode == "ollama" {
            cmd.env("ENABLE_OLLAMA_API", "true")
                .env("OLLAMA_BASE_URL", backend)
                .env("ENABLE_OPENAI_API", "false");
        } else {
            cmd.env("ENABLE_OLLAMA_API", "false")
                .env("ENABLE_OPENAI_API", "true")
                .env("OPENAI_API_BASE_URL", format!("{backend}/v1"))
                .env("OPENAI_API_KEY", "none");
        }
        let ui = OpenWebUi {
            child: cmd.spawn().expect("start open-webui"),
            base: format!("http://127.0.0.1:{port}"),
            data,
        };
        let t = Instant::now();
        let healthy = |base: &str| {
            client()
                .get(format!("{base}/health"))
                .send()
                .is_ok_and(|r| r.status().is_success())
        };
        while !healthy(&ui.base) {
            assert!(
                t.elapsed() < Duration::from_secs(180),
                "Open WebUI did not start:\n{}",
                ui.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!(
            "Open WebUI ({mode}) ready in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        ui
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.data.join("open-webui.log")).unwrap_or_default()
    }
}

impl Drop for OpenWebUi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// A chat UI driven through its own HTTP API: Open WebUI, as its browser front end
/// drives it (tests/serve/openwebui.py), in front of `llamay serve` through its Ollama
/// connection and through its OpenAI one.
#[test]
fn serve_open_webui_works_through_its_own_api() {
    let (Some(g), Some(venv)) = (
        gemma(),
        llamay_synth::reference::path(
            "LLAMAY_OPENWEBUI",
            "a venv with open-webui 0.12.4 and tests/serve/openwebui-requirements.txt (scripts/test makes one)",
        ),
    ) else {
        return;
    };
    let (s, _) = serve_gemma(&g, None);
    for mode in ["ollama", "openai"] {
        let ui = OpenWebUi::start(&venv, &s.base, mode);
        let out = Command::new(venv.join("bin/python"))
            .arg(data("serve/openwebui.py"))
            .args([ui.base.as_str(), "gemma3:270m", mode])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        assert!(
            out.status.success(),
            "openwebui.py {mode} failed:\n{stdout}\n{}\nOpen WebUI's log (tail):\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            ui.log()
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n"),
            s.log.lock().unwrap()
        );
    }
}

/// `n` choices share one prefill: the later ones fork the first's prompt while it is
/// still generating, so every prompt token but the last comes from the cache for them
/// (with each request prefilling alone, none would).
#[test]
fn serve_n_choices_share_the_prompts_prefill() {
    let Some(g) = gemma() else {
        return;
    };
    let s = Serve::start(&[
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--chat-template",
        "gemma",
    ]);
    let text = "The history of the harbour, told slowly and in detail. ".repeat(12);
    let (st, v) = s.post(
        "/v1/chat/completions",
        &json!({"model": "gemma", "messages": [{"role": "user", "content": text}],
                "temperature": 0.9, "seed": 1, "max_tokens": 16, "n": 4}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 4, "{v}");
    let prompt = v["usage"]["prompt_tokens"].as_f64().unwrap();
    assert!(prompt > 100.0, "{v}");
    assert_eq!(s.gauge("llamay_prompt_tokens_total"), 4.0 * prompt);
    let cached = s.gauge("llamay_prompt_tokens_cached_total");
    assert_eq!(
        cached,
        3.0 * (prompt - 1.0),
        "the 3 later choices forked all but the last prompt token"
    );
}

/// A prompt longer than the context, as Ollama answers it (Open WebUI's default tools
/// alone are 7.6k tokens): /api/chat drops the oldest messages (never the system one or
/// the last), then the prompt is cut keeping its first `num_keep` tokens and its end,
/// leaving room for the answer; `truncate: false` and the OpenAI routes refuse it,
/// naming both sizes.
#[test]
fn serve_ollama_routes_cut_a_prompt_beyond_the_context() {
    let Some(g) = gemma() else {
        return;
    };
    let s = Serve::start(&[
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--chat-template",
        "gemma",
        "-c",
        "256",
    ]);
    let turn = "Tell me again about the harbour, the boats and the long grey winter. ";
    let mut messages = vec![json!({"role": "system", "content": "You answer briefly."})];
    for i in 0..12 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": turn.repeat(2)}));
    }
    messages.push(json!({"role": "user", "content": "Name a colour."}));
    let options = json!({"num_predict": 8, "temperature": 0});
    let (st, v) = s.post(
        "/api/chat",
        &json!({"model": "gemma", "messages": messages, "stream": false, "options": options}),
    );
    assert_eq!(st, 200, "{v}");
    // Room for the 8 tokens asked for: at most 248 prompt tokens.
    let n = v["prompt_eval_count"].as_u64().unwrap();
    assert!(n <= 248 && n > 100, "{v}");
    assert!(
        s.log
            .lock()
            .unwrap()
            .contains("oldest messages dropped to fit num_ctx 256")
    );

    let long = turn.repeat(40);
    let (st, v) = s.post(
        "/api/generate",
        &json!({"model": "gemma", "prompt": long, "stream": false, "options": options}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["prompt_eval_count"], 248, "{v}");
    assert!(
        s.log
            .lock()
            .unwrap()
            .contains("truncated to 248 to fit num_ctx 256 (kept the first 4")
    );

    for (route, body) in [
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": long, "truncate": false, "options": options}),
        ),
        (
            "/api/chat",
            json!({"model": "gemma", "messages": messages, "truncate": false, "stream": false}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gemma", "messages": messages, "max_tokens": 8}),
        ),
    ] {
        let (st, v) = s.post(route, &body);
        assert_eq!(st, 400, "{route}: {v}");
        assert!(
            v.to_string().contains("the context holds 256"),
            "{route}: {v}"
        );
    }
}

/// Pooled embeddings against llama.cpp's (llama-server --embeddings --pooling mean, f32
/// cache, exact attention; scripts/gen-embed-expected). llama.cpp's own default run
/// (flash attention, which rounds to f16) is 0.998-0.9999 in cosine from that exact
/// answer; llamay's f32 cache must be at least as close on every text, and on the CPU
/// ≥ 0.999. Under `LLAMAY_DEVICE` (scripts/test-serve-device) the server runs on the
/// device, whose last bits differ from the CPU's (float sums in another order, then an
/// activation's Q8_K rounding tipping the other way, layer after layer): Gemma's final
/// hidden state is as sensitive to that as to llama.cpp's f16 rounding (measured on
/// lavapipe: 1 - cosine 1.5e-3 between the device and the CPU on "x"), so there the
/// bar is the size of llama.cpp's own default run's distance: at most twice it.
#[test]
fn serve_embeddings_agree_with_llama_cpp() {
    let Some(g) = gemma() else { return };
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(data("data/serve/embeddings.json")).unwrap())
            .unwrap();
    let s = Serve::start(&["-m", g.to_str().unwrap(), "--alias", "gemma", "--kv", "f32"]);
    let items = doc["texts"].as_array().unwrap();
    let texts: Vec<&str> = items.iter().map(|t| t["text"].as_str().unwrap()).collect();
    let (st, v) = s.post("/v1/embeddings", &json!({"model": "gemma", "input": texts}));
    assert_eq!(st, 200, "{v}");
    let tokens: u64 = items
        .iter()
        .map(|t| t["prompt_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(
        v["usage"]["prompt_tokens"], tokens,
        "the same tokens, BOS included"
    );
    let floats = |x: &Value| -> Vec<f64> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_f64().unwrap())
            .collect()
    };
    for (i, item) in items.iter().enumerate() {
        let want = floats(&item["embedding"]);
        let got = floats(&v["data"][i]["embedding"]);
        assert_eq!(got.len(), want.len());
        let dot: f64 = want.iter().zip(&got).map(|(a, b)| a * b).sum();
        let cos = dot
            / (want.iter().map(|a| a * a).sum::<f64>() * got.iter().map(|b| b * b).sum::<f64>())
                .sqrt();
        let theirs = item["llama_cpp_default_cosine"].as_f64().unwrap();
        eprintln!(
            "{:?}: cosine {cos:.6} (llama.cpp's default run: {theirs:.6})",
            texts[i]
        );
        let on_device = std::env::var("LLAMAY_DEVICE").is_ok_and(|d| d != "cpu");
        let (floor, times) = if on_device {
            (0.998, 2.0)
        } else {
            (0.999, 1.05)
        };
        assert!(cos >= floor, "{:?}: cosine {cos}", texts[i]);
        assert!(
            1.0 - cos <= (1.0 - theirs) * times + 1e-7,
            "{:?}: ours {cos} is farther from exact than {times} × llama.cpp's default {theirs}",
            texts[i]
        );
    }
}

#[test]
fn serve_hostile_requests_get_named_errors() {
    let Some(g) = gemma() else { return };
    let s = Serve::start(&["-m", g.to_str().unwrap(), "--alias", "gemma", "-c", "256"]);
    let c = client();
    // DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends its own Host.
    for (host, want) in [
        ("evil.example", 403),
        ("localhost.evil.example:11434", 403),
        ("localhost", 200),
        ("127.0.0.1:11434", 200),
        ("[::1]:80", 200),
    ] {
        let r = c
            .get(s.url("/api/version"))
            .header("host", host)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "Host: {host}");
    }
    // Malformed JSON and non-objects.
    let r = c
        .post(s.url("/api/generate"))
        .body("{\"model\": ")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().unwrap();
    assert!(
        v["error"].as_str().unwrap().contains("not valid JSON"),
        "{v}"
    );
    let r = c
        .post(s.url("/v1/chat/completions"))
        .body("[1]")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("JSON object"),
        "{v}"
    );
    // Every range check names its field.
    let cases = [
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "options": {"num_predict": -3}}),
            "num_predict",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "options": {"top_k": -1}}),
            "top_k",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "options": {"top_p": 1.5}}),
            "top_p",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "options": {"temperature": "hot"}}),
            "temperature",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "options": {"num_ctx": 0}}),
            "num_ctx",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "options": {"num_ctx": 100_000_000}}),
            "num_ctx",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "options": {"seed": "x"}}),
            "seed",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "options": {"num_keep": -5}}),
            "num_keep",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "keep_alive": "soon"}),
            "keep_alive",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": "x", "format": "xml"}),
            "format",
        ),
        (
            "/api/generate",
            json!({"model": "gemma", "prompt": 5}),
            "prompt",
        ),
        ("/api/generate", json!({"prompt": "x"}), "model"),
        (
            "/api/chat",
            json!({"model": "gemma", "messages": [{"content": "x"}]}),
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gemma", "messages": [{"role": "user", "content": "x"}], "max_tokens": -2}),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gemma", "messages": [{"role": "user", "content": "x"}], "temperature": "warm"}),
            "temperature",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gemma", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 99, "logprobs": true}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gemma", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            "/v1/completions",
            json!({"model": "gemma", "prompt": [1, 2, 262144]}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"model": "gemma", "prompt": [-1]}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"model": "gemma", "prompt": "x", "n": 17}),
            "n",
        ),
    ];
    for (path, body, field) in cases {
        let (status, v) = s.post(path, &body);
        assert_eq!(status, 400, "{path} {body}: {v}");
        let msg = if path.starts_with("/v1/") {
            v["error"]["message"].as_str().unwrap_or("").to_string()
        } else {
            v["error"].as_str().unwrap_or("").to_string()
        };
        assert!(
            msg.contains(field),
            "{path} {body}: the error does not name {field}: {v}"
        );
    }
    // Unknown models: 404 on both APIs, in each API's shape.
    let (st, v) = s.post(
        "/api/generate",
        &json!({"model": "gemma:7b", "prompt": "x"}),
    );
    assert_eq!((st, v["error"].is_string()), (404, true), "{v}");
    let (st, v) = s.post(
        "/v1/chat/completions",
        &json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (404, Some("not_found_error")),
        "{v}"
    );
    // A prompt longer than the context with truncate: false: an error saying so (by
    // default Ollama's routes cut it, logged: serve_ollama_routes_cut_…).
    let long = "word ".repeat(400);
    let mut body = greedy(&long, 4);
    body["truncate"] = json!(false);
    let (st, v) = s.post("/api/generate", &body);
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("context holds 256"),
        "{v}"
    );
    // A num_predict beyond the context is not refused: generation stops at its end.
    let (st, v) = s.post("/api/generate", &greedy("Once upon a time", 1_000_000));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["done_reason"], "length");
    // 256 positions decoded; the last token is sampled from position 255's logits and
    // needs no position of its own.
    let total = v["prompt_eval_count"].as_u64().unwrap() + v["eval_count"].as_u64().unwrap();
    assert_eq!(total, 257, "{v}");
    // Bodies over 32 MiB: 413, whether the length is announced (refused before any of
    // it is read) or streamed in chunks (refused at the limit).
    let addr = s.base.trim_start_matches("http://").to_string();
    assert_eq!(raw_status(&addr, "Content-Length: 33554433\r\n", &[]), 413);
    let mut chunked = Vec::new();
    for _ in 0..33 {
        chunked.extend_from_slice(b"100000\r\n");
        chunked.extend(std::iter::repeat_n(b' ', 1 << 20));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(
        raw_status(&addr, "Transfer-Encoding: chunked\r\n", &chunked),
        413
    );
    let (st, _) = s.post("/api/generate", &greedy("just under the limit", 1));
    assert_eq!(st, 200);
    // Push and create: refused by name.
    for p in ["/api/push", "/api/create"] {
        let (st, v) = s.post(p, &json!({"model": "gemma"}));
        assert_eq!(st, 501, "{p}");
        assert!(v["error"].as_str().unwrap().contains(&p[5..]), "{v}");
    }
    // CORS: localhost origins only.
    let r = c
        .get(s.url("/api/tags"))
        .header("origin", "http://localhost:3000")
        .send()
        .unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:3000"
    );
    let r = c
        .get(s.url("/api/tags"))
        .header("origin", "https://evil.example")
        .send()
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

/// The status of a POST /api/chat written by hand: `headers`, then as much of `body`
/// as the server reads before it answers.
fn raw_status(addr: &str, headers: &str, body: &[u8]) -> u16 {
    use std::io::Write;
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(c, "POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{headers}\r\n").unwrap();
    // The server may answer and close before the body is through: a write error then
    // is the refusal working.
    let _ = c.write_all(body);
    let mut reply = Vec::new();
    let _ = c.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"))
}

#[test]
fn serve_an_api_key_guards_every_route_but_health_and_cors_origins_can_be_added() {
    let Some(g) = gemma() else { return };
    let s = Serve::start(&[
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--api-key",
        "s3cret",
        "--cors-origin",
        "https://app.example",
    ]);
    let c = client();
    let get = |path: &str, h: Option<(&str, &str)>| {
        let mut r = c.get(s.url(path));
        if let Some((k, v)) = h {
            r = r.header(k, v);
        }
        r.send().unwrap().status().as_u16()
    };
    assert_eq!(get("/health", None), 200);
    assert_eq!(get("/api/tags", None), 401);
    assert_eq!(
        get("/v1/models", Some(("authorization", "Bearer wrong"))),
        401
    );
    assert_eq!(
        get("/v1/models", Some(("authorization", "Bearer s3cret!"))),
        401
    );
    assert_eq!(
        get("/v1/models", Some(("authorization", "Bearer s3cret"))),
        200
    );
    assert_eq!(get("/api/tags", Some(("x-api-key", "s3cret"))), 200);
    // The gateway's scraper sends no key.
    assert_eq!(get("/metrics", None), 200);
    let r = c
        .get(s.url("/api/tags"))
        .header("x-api-key", "s3cret")
        .header("origin", "https://app.example")
        .send()
        .unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
}

/// Reads one NDJSON line of a streaming response.
fn line(r: &mut BufReader<reqwest::blocking::Response>) -> Value {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l:?}"))
}

fn stream(s: &Serve, prompt: &str, n: i64) -> BufReader<reqwest::blocking::Response> {
    let r = client()
        .post(s.url("/api/generate"))
        .json(&json!({"model": "gemma", "prompt": prompt, "raw": true,
                      "options": {"temperature": 0, "num_predict": n}}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    BufReader::new(r)
}

#[test]
fn serve_a_dropped_stream_frees_its_slot_within_one_step() {
    let Some(g) = gemma() else { return };
    let s = Serve::start(&[
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--parallel",
        "1",
    ]);
    for path in ["/api/generate", "/v1/completions"] {
        let body = if path == "/api/generate" {
            json!({"model": "gemma", "prompt": "Tell me a long story.", "raw": true, "options": {"num_predict": 100000}})
        } else {
            json!({"model": "gemma", "prompt": "Tell me a long story.", "max_tokens": -1, "stream": true})
        };
        let r = client().post(s.url(path)).json(&body).send().unwrap();
        let mut r = BufReader::new(r);
        let mut first = String::new();
        r.read_line(&mut first).unwrap();
        assert!(!first.is_empty());
        assert_eq!(s.gauge("vllm:num_requests_running"), 1.0);
        assert!(s.gauge("vllm:kv_cache_usage_perc") > 0.0);
        drop(r);
        let t = s.wait_gauge("vllm:num_requests_running", 0.0, Duration::from_secs(2));
        eprintln!("{path}: slot freed {t:?} after the disconnect");
        assert_eq!(s.gauge("vllm:kv_cache_usage_perc"), 0.0);
        // The one slot serves the next request at once.
        let (st, v) = s.post("/api/generate", &greedy("Hello", 3));
        assert_eq!((st, v["eval_count"].as_u64()), (200, Some(3)), "{v}");
    }
}

#[test]
fn serve_beyond_parallel_and_queue_requests_get_503_with_retry_after() {
    let Some(g) = gemma() else { return };
    let s = Serve::start(&[
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--parallel",
        "1",
        "--queue",
        "1",
    ]);
    let mut running = stream(&s, "Tell me a long story.", 100000);
    line(&mut running);
    // The second waits in the queue (its headers come back; no token yet).
    let waiting = stream(&s, "Another long story.", 5);
    s.wait_gauge("vllm:num_requests_waiting", 1.0, Duration::from_secs(2));
    let r = client()
        .post(s.url("/v1/completions"))
        .json(&json!({"model": "gemma", "prompt": "x", "max_tokens": 2}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("busy"),
        "{v}"
    );
    drop(running);
    // The queued request runs once the slot is free.
    let mut waiting = waiting;
    let mut last = line(&mut waiting);
    while last["done"] != true {
        last = line(&mut waiting);
    }
    assert_eq!(last["eval_count"], 5);
    let text = client()
        .get(s.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(text.contains("llamay_requests_rejected_total 1"), "{text}");
}

/// The route a test request goes to: chat when it has messages.
fn route(r: &Value) -> &'static str {
    if r.get("messages").is_some() {
        "/api/chat"
    } else {
        "/api/generate"
    }
}

/// Every request sent at once, one thread each: the answers in request order.
fn all_at_once(s: &Serve, requests: &[Value]) -> Vec<Value> {
    let handles: Vec<_> = requests
        .iter()
        .cloned()
        .map(|r| {
            let url = s.url(route(&r));
            std::thread::spawn(move || -> Value {
                client().post(url).json(&r).send().unwrap().json().unwrap()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Greedy (and seeded) answers are the same bits whatever runs beside them.
#[test]
fn serve_six_concurrent_requests_each_equal_the_same_request_alone() {
    let Some(g) = gemma() else { return };
    let s = Serve::start(&[
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--parallel",
        "4",
        "--chat-template",
        "gemma",
    ]);
    let long = "The history of the city, told in many parts. ".repeat(70);
    let requests: Vec<Value> = vec![
        greedy("The capital of France is", 40),
        greedy("Once upon a time, in a land far away,", 48),
        greedy(&long, 24),
        json!({"model": "gemma", "prompt": "A poem about rain:", "raw": true, "stream": false,
               "options": {"temperature": 0.9, "seed": 1234, "num_predict": 40}}),
        greedy("def fibonacci(n):", 40),
        json!({"model": "gemma", "messages": [{"role": "user", "content": "Hi there"}], "stream": false,
               "options": {"temperature": 0, "num_predict": 32}}),
    ];
    let text = |v: &Value| {
        v.get("response")
            .or(v.get("message").and_then(|m| m.get("content")))
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{v}"))
            .to_string()
    };
    // Alone, one after another, on a fresh server (nothing cached yet).
    let alone: Vec<String> = requests
        .iter()
        .map(|r| {
            let (st, v) = s.post(route(r), r);
            assert_eq!(st, 200, "{v}");
            text(&v)
        })
        .collect();
    // All six at once (four decode together, two wait; the long prompt is prefilled in
    // chunks beside the others' decoding, and every prompt now shares a cached prefix).
    for round in 0..2 {
        for (i, v) in all_at_once(&s, &requests).into_iter().enumerate() {
            assert_eq!(
                text(&v),
                alone[i],
                "round {round}, request {i} changed when batched: {v}"
            );
            if round == 0 && i == 2 {
                assert!(
                    v["prompt_eval_count"].as_u64().unwrap() > 512,
                    "the long prompt must span chunks"
                );
            }
        }
    }
    let cached = s.gauge("llamay_prompt_tokens_cached_total");
    assert!(
        cached > 1000.0,
        "the batched rounds reused cached prefixes ({cached})"
    );
    // Prompt-lookup speculation changes no token either, batched or not, greedy or
    // seeded (a code-repeating prompt added, greedy and sampled, so that drafts are
    // accepted; their answers without speculation from this server).
    let code = std::fs::read_to_string(data("data/speculate/code-edit.txt")).unwrap();
    let code_req = json!({"model": "gemma", "messages": [{"role": "user", "content": code}], "stream": false,
                          "options": {"temperature": 0, "num_predict": 64}});
    let code_sampled = json!({"model": "gemma", "messages": [{"role": "user", "content": code}], "stream": false,
                              "options": {"temperature": 0.5, "seed": 11, "num_predict": 64}});
    let mut alone = alone;
    for r in [&code_req, &code_sampled] {
        let (st, v) = s.post("/api/chat", r);
        assert_eq!(st, 200, "{v}");
        alone.push(text(&v));
    }
    drop(s);
    let s = Serve::start(&[
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--parallel",
        "4",
        "--chat-template",
        "gemma",
        "--draft-lookup",
        "8",
    ]);
    let mut requests = requests;
    requests.extend([code_req, code_sampled]);
    for (i, v) in all_at_once(&s, &requests).into_iter().enumerate() {
        assert_eq!(
            text(&v),
            alone[i],
            "request {i} changed under --draft-lookup: {v}"
        );
    }
    let accepted = s.gauge("llamay_draft_accepted_total");
    let drafted = s.gauge("llamay_draft_tokens_total");
    eprintln!("--draft-lookup 8: {accepted} of {drafted} draft tokens accepted");
    assert!(accepted >= 40.0, "{accepted} of {drafted}");
}

#[test]
fn serve_health_loading_keep_alive_and_ps() {
    let Some(g) = gemma() else { return };
    let s = Serve::start(&["-m", g.to_str().unwrap(), "--alias", "gemma"]);
    let c = client();
    assert_eq!(
        c.get(s.url("/health")).send().unwrap().status().as_u16(),
        200
    );
    // A request loads the model; meanwhile /health says so.
    let url = s.url("/api/generate");
    let h = std::thread::spawn(move || {
        client()
            .post(url)
            .json(&greedy("Hi", 2))
            .send()
            .unwrap()
            .status()
            .as_u16()
    });
    let t = Instant::now();
    let mut saw_loading = false;
    while t.elapsed() < Duration::from_secs(20) && !h.is_finished() {
        if c.get(s.url("/health")).send().unwrap().status().as_u16() == 503 {
            saw_loading = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(h.join().unwrap(), 200);
    assert!(
        saw_loading,
        "/health never answered 503 while the model loaded"
    );
    assert_eq!(
        c.get(s.url("/health")).send().unwrap().status().as_u16(),
        200
    );
    let ps: Value = c.get(s.url("/api/ps")).send().unwrap().json().unwrap();
    assert_eq!(ps["models"][0]["name"], "gemma", "{ps}");
    let exp = ps["models"][0]["expires_at"].as_str().unwrap();
    assert!(
        exp.len() >= 20 && exp.ends_with('Z') && exp.as_bytes()[10] == b'T',
        "{exp}"
    );
    // keep_alive 0: unloaded once the request is done.
    let mut r = greedy("Hi", 2);
    r["keep_alive"] = json!(0);
    let (st, _) = s.post("/api/generate", &r);
    assert_eq!(st, 200);
    let t = Instant::now();
    loop {
        let ps: Value = c.get(s.url("/api/ps")).send().unwrap().json().unwrap();
        if ps["models"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "keep_alive 0 did not unload: {ps}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And it loads again on the next request.
    let (st, v) = s.post("/api/generate", &greedy("Hi", 2));
    assert_eq!((st, v["eval_count"].as_u64()), (200, Some(2)));
}

#[test]
fn serve_sigterm_drains_running_requests_then_exits() {
    let Some(g) = gemma() else { return };
    // The default drain bound (30 s), stretched for a slow device as the hang guards are:
    // lavapipe takes 20-40 s for these 40 tokens.
    let drain = (30 * time_scale()).to_string();
    let mut s = Serve::start(&[
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--drain-timeout",
        &drain,
    ]);
    let mut r = stream(&s, "Count with me: one, two,", 40);
    let first = line(&mut r);
    assert_eq!(first["done"], false);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc_kill(s.child.id() as i32, 15) }, 0);
    let mut n = 1;
    let mut last = first;
    while last["done"] != true {
        last = line(&mut r);
        n += 1;
    }
    assert_eq!(
        last["eval_count"], 40,
        "the running request was cut: {last}"
    );
    assert!(n > 30);
    let t = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}: {}", s.log.lock().unwrap());
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// Prometheus as the gateway's scraper would run it: the gauges it stores move under
/// load, and the exposition parses.
#[test]
fn serve_prometheus_scrapes_the_gauges_under_load() {
    let Some(g) = gemma() else { return };
    let prom = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("prometheus is not installed (scripts/test installs it: scripts/apt-ensure)");
    let s = Serve::start(&[
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--parallel",
        "4",
    ]);
    let dir = std::env::temp_dir().join(format!("llamay-prom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let target = s.base.trim_start_matches("http://");
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 200ms\nscrape_configs:\n  - job_name: llamay\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut p = Command::new(prom)
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _p = Kill(&mut p);
    let query = |q: &str| -> Value {
        client()
            .get(format!("http://127.0.0.1:{port}/api/v1/query"))
            .query(&[("query", q)])
            .send()
            .ok()
            .and_then(|r| r.json().ok())
            .unwrap_or(Value::Null)
    };
    let t = Instant::now();
    while query("up")["data"]["result"][0]["value"][1] != "1" {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "prometheus never scraped llamay: {}",
            query("up")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Load: four streams decoding together for a few seconds.
    let loads: Vec<_> = (0..4)
        .map(|i| {
            let url = s.url("/api/generate");
            std::thread::spawn(move || {
                client()
                    .post(url)
                    .json(&greedy(&format!("Story number {i}:"), 120))
                    .send()
                    .unwrap()
                    .text()
                    .unwrap()
            })
        })
        .collect();
    for l in loads {
        l.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(600));
    let max = |m: &str| -> f64 {
        let v = query(&format!("max_over_time({m}[1m])"));
        v["data"]["result"][0]["value"][1]
            .as_str()
            .unwrap_or_else(|| panic!("{m}: {v}"))
            .parse()
            .unwrap()
    };
    let running = max("vllm:num_requests_running");
    let kv = max("vllm:kv_cache_usage_perc");
    eprintln!("prometheus saw running {running}, kv usage {kv}");
    assert!(running >= 2.0, "running gauge never rose: {running}");
    assert!(kv > 0.0 && kv <= 1.0, "kv usage: {kv}");
    let now_running = query("vllm:num_requests_running")["data"]["result"][0]["value"][1].clone();
    assert_eq!(now_running, "0");
    let info = query("vllm:cache_config_info");
    assert!(
        info["data"]["result"][0]["metric"]["block_size"]
            .as_str()
            .is_some(),
        "{info}"
    );
    let generated =
        query("llamay_generation_tokens_total")["data"]["result"][0]["value"][1].clone();
    assert_eq!(generated.as_str().unwrap().parse::<f64>().unwrap(), 480.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_api_pull_streams_progress_and_the_pulled_model_serves() {
    let Some(_) = gemma() else { return };
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("nginx is not installed (scripts/test installs it)");
    let dir = std::env::temp_dir().join(format!("llamay-serve-pull-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("www")).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    std::fs::copy(
        common::fixture("llama-Q8_0.gguf"),
        dir.join("www/tiny.gguf"),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = dir.display();
    std::fs::write(
        dir.join("nginx.conf"),
        format!(
            "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;\nevents {{}}\nhttp {{ client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp; uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp; access_log off;\n  server {{ listen 127.0.0.1:{port}; root {d}/www; }} }}\n"
        ),
    )
    .unwrap();
    let mut ng = Command::new(nginx)
        .args([
            "-p",
            &d.to_string(),
            "-e",
            &format!("{d}/error.log"),
            "-c",
            &format!("{d}/nginx.conf"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "nginx did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let store = dir.join("store");
    let s = Serve::start_env(&[], &[("LLAMAY_MODELS", store.to_str().unwrap())]);
    let url = format!("http://127.0.0.1:{port}/tiny.gguf");
    let r = client()
        .post(s.url("/api/pull"))
        .json(&json!({"model": url, "insecure": true}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let lines: Vec<Value> = r
        .text()
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let statuses: Vec<&str> = lines.iter().filter_map(|l| l["status"].as_str()).collect();
    assert_eq!(statuses.first(), Some(&"pulling manifest"), "{lines:?}");
    assert_eq!(statuses.last(), Some(&"success"), "{lines:?}");
    let size = std::fs::metadata(dir.join("www/tiny.gguf")).unwrap().len();
    assert!(
        lines
            .iter()
            .any(|l| l["completed"] == size && l["total"] == size),
        "no progress line reached the whole size: {lines:?}"
    );
    // The pulled model is listed and answers.
    let tags: Value = client()
        .get(s.url("/api/tags"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let name = tags["models"][0]["name"].as_str().unwrap().to_string();
    let (st, v) = s.post(
        "/api/generate",
        &json!({"model": name, "prompt": "hi", "raw": true, "stream": false, "options": {"num_predict": 3}}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["eval_count"], 3);
    // A bad reference: the error arrives in the stream, named.
    let r = client()
        .post(s.url("/api/pull"))
        .json(&json!({"model": format!("http://127.0.0.1:{port}/missing.gguf"), "insecure": true}))
        .send()
        .unwrap();
    let text = r.text().unwrap();
    assert!(text.lines().last().unwrap().contains("\"error\""), "{text}");
    // Delete removes it from the store.
    let r = client()
        .delete(s.url("/api/delete"))
        .json(&json!({"model": name}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let tags: Value = client()
        .get(s.url("/api/tags"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(tags["models"].as_array().unwrap().is_empty(), "{tags}");
    let _ = ng.kill();
    let _ = ng.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/api/embed` of `texts` on `model` equals `llamay embed`'s on the CPU to rounding of
/// the normalisation (the server's runs in f64).
fn assert_embeds_as_the_cli(s: &Serve, model: &str, file: &Path, texts: &[&str]) {
    let (st, v) = s.post("/api/embed", &json!({"model": model, "input": texts}));
    assert_eq!(st, 200, "{v}");
    let got: Vec<Vec<f64>> = serde_json::from_value(v["embeddings"].clone()).unwrap();
    let mut args = vec!["embed", file.to_str().unwrap(), "--device", "cpu"];
    args.extend(["--output", "array", "-p"]);
    args.extend(texts);
    let want: Vec<Vec<f64>> = serde_json::from_str(&ok_stdout(&llamay(&args))).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        let worst = (g.iter().zip(w))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-6, "max |Δ| {worst} from the CLI's vector");
    }
}

/// An encoder (all-MiniLM-L6-v2 from scripts/convert-bert) serves embeddings pooled as
/// its file says, equal to `llamay embed`'s to rounding (an encoder keeps no KV cache,
/// so the server's cache precision does not touch it), and refuses generation by name.
#[test]
fn serve_embeds_with_an_encoder_and_refuses_it_text() {
    let Some(m) =
        llamay_synth::reference::path("LLAMAY_MINILM", "LLAMAY_MINILM=$(scripts/convert-bert)")
    else {
        return;
    };
    let s = Serve::start(&["-m", m.to_str().unwrap(), "--alias", "minilm", "-c", "512"]);
    let texts = ["The cat sat on the mat.", "Embeddings map text to vectors."];
    assert_embeds_as_the_cli(&s, "minilm", &m, &texts);
    let (st, v) = s.post(
        "/v1/embeddings",
        &json!({"model": "minilm", "input": texts[0]}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 384);
    let (st, v) = s.post(
        "/api/generate",
        &json!({"model": "minilm", "prompt": "hi", "stream": false}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("embedding model"), "{v}");
    // Ollama's capabilities for a file with a pooling type: it embeds, nothing else.
    let (st, v) = s.post("/api/show", &json!({"model": "minilm"}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["capabilities"], json!(["embedding"]), "{v}");
}

/// A cross-encoder (the tiny BERT reranker fixture, F32) serves `/v1/rerank` as
/// llama-server does: results by descending score, `top_n`, `return_documents`, each
/// score llama.cpp's (llama-embedding, scripts/gen-bert-expected); an embedding request
/// to it, and a rerank request to an embedding model, are refused by name.
#[test]
fn serve_reranks_with_a_cross_encoder() {
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(data("data/embed/bert-fixtures.json")).unwrap(),
    )
    .unwrap();
    let f = (want["fixtures"].as_array().unwrap().iter())
        .find(|f| f["file"] == "bert-rerank-F32.gguf")
        .unwrap();
    let reranker = common::fixture("bert-rerank-F32.gguf");
    let embedder = common::fixture("bert-F32.gguf");
    let s = Serve::start(&[
        "-m",
        reranker.to_str().unwrap(),
        "--alias",
        "ranker",
        "-m",
        embedder.to_str().unwrap(),
        "--alias",
        "embedder",
        "-c",
        "256",
    ]);
    let body = json!({"model": "ranker", "query": f["query"], "documents": f["documents"],
                      "top_n": 3, "return_documents": true});
    let (st, v) = s.post("/v1/rerank", &body);
    assert_eq!(st, 200, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "top_n");
    let scores: Vec<f64> = serde_json::from_value(f["scores"].clone()).unwrap();
    let mut last = f64::INFINITY;
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        let got = r["relevance_score"].as_f64().unwrap();
        // As the CLI's (crates/cli/tests/embed.rs): an encoder attends over f32 keys
        // and values whatever the server's cache precision.
        assert!(
            (got - scores[i]).abs() < 2e-3,
            "document {i}: {got} vs {}",
            scores[i]
        );
        assert!(got <= last, "descending");
        last = got;
        assert_eq!(r["document"]["text"], f["documents"][i]);
    }
    let (st, v) = s.post("/v1/embeddings", &json!({"model": "ranker", "input": "hi"}));
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("reranker"), "{v}");
    let (st, v) = s.post(
        "/v1/rerank",
        &json!({"model": "embedder", "query": "q", "documents": ["d"]}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("not a reranker"), "{v}");
    let (st, v) = s.post(
        "/v1/rerank",
        &json!({"model": "ranker", "query": "q", "documents": []}),
    );
    assert_eq!(st, 400, "{v}");
}

/// `serve --device vulkan` (Mesa's lavapipe under the test command) with serve's
/// defaults (4 sequences of 4096 positions, an f16 cache: 144 MiB of keys, more than
/// lavapipe binds per buffer, so the cache is split over buffers): requests sent
/// together equal each alone, greedy and seeded — the device path is batch-invariant
/// too (each row's matmul, norm and attention depend on that row alone) — and its
/// answers are the CPU's text where the logits' margins allow (not asserted: the
/// device's last bits differ, see crates/vulkan/tests/forward.rs).
#[test]
fn serve_on_the_vulkan_device_is_batch_invariant() {
    let Some(g) = gemma() else { return };
    if !common::vulkan_device() {
        return;
    }
    let minilm =
        llamay_synth::reference::path("LLAMAY_MINILM", "LLAMAY_MINILM=$(scripts/convert-bert)");
    let mut args = vec![
        "-m",
        g.to_str().unwrap(),
        "--alias",
        "gemma",
        "--device",
        "vulkan",
    ];
    if let Some(m) = &minilm {
        args.extend(["-m", m.to_str().unwrap(), "--alias", "minilm"]);
    }
    let s = Serve::start(&args);
    let log = s.log.lock().unwrap().clone();
    assert!(log.contains("device: ") && log.contains("Vulkan"), "{log}");
    let requests: Vec<Value> = vec![
        greedy("The capital of France is", 12),
        greedy("Once upon a time,", 10),
        json!({"model": "gemma", "prompt": "A poem about rain:", "raw": true, "stream": false,
               "options": {"temperature": 0.9, "seed": 7, "num_predict": 10}}),
    ];
    let alone: Vec<Value> = requests
        .iter()
        .map(|r| {
            let (st, v) = s.post(route(r), r);
            assert_eq!(st, 200, "{v}");
            v
        })
        .collect();
    for (i, v) in all_at_once(&s, &requests).into_iter().enumerate() {
        assert_eq!(
            v["response"], alone[i]["response"],
            "request {i} changed when batched: {v}"
        );
        assert!(!v["response"].as_str().unwrap().is_empty());
    }
    // Ollama's `size_vram`: the whole Q4_K_M file is on the device.
    let ps = |name: &str| {
        let v: Value = client()
            .get(s.url("/api/ps"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let m = v["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .cloned();
        m.unwrap_or_else(|| panic!("{name} not in /api/ps: {v}"))
    };
    let m = ps("gemma");
    assert!(m["size"].as_u64().unwrap() > 0);
    assert_eq!(m["size_vram"], m["size"], "{m}");
    // An encoder, which the device declines as a whole, is served from the CPU beside
    // it: logged with the reason, `size_vram` 0, its embeddings the CPU's.
    let Some(m) = minilm else { return };
    assert_embeds_as_the_cli(&s, "minilm", &m, &["The cat sat on the mat."]);
    let m = ps("minilm");
    assert_eq!(m["size_vram"], 0, "{m}");
    let log = s.log.lock().unwrap().clone();
    assert!(
        log.contains("gemma runs on ") && log.contains("Vulkan"),
        "{log}"
    );
    assert!(
        log.contains("minilm runs on the CPU (") && log.contains("encoder"),
        "{log}"
    );
}
