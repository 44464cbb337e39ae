//! `llamay serve` (cli.md): the Ollama and OpenAI HTTP APIs (crates/server).

// A wasm32 build refuses the networked part by name (crate::left_out); what only it
// uses is unused there.
#![cfg_attr(target_family = "wasm", allow(dead_code, unused_imports))]

use crate::session;
use anyhow::bail;
#[cfg(not(target_family = "wasm"))]
use llamay_server::ServeConfig;
#[cfg(not(target_family = "wasm"))]
use llamay_server::scheduler::EngineConfig;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// A GGUF file to serve (repeatable); named by the --alias after it, else its stem.
    #[arg(short = 'm', long = "model", value_name = "PATH")]
    models: Vec<PathBuf>,
    /// The name of the -m before it, tag included (e.g. gemma3:270m).
    #[arg(long, value_name = "NAME")]
    alias: Vec<String>,
    /// Address to listen on (LLAMAY_HOST as HOST[:PORT] when not given).
    #[arg(long)]
    host: Option<String>,
    #[arg(long)]
    port: Option<u16>,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests allowed to wait beyond --parallel (then 503 with Retry-After).
    #[arg(long, default_value_t = 512)]
    queue: usize,
    /// Positions per sequence (Ollama's num_ctx); the KV pool holds --parallel of them.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    /// KV cache precision: f32, f16 (the default here, as llama-server's), vq8, q8.
    #[arg(long, default_value = "f16")]
    kv: String,
    /// Compute threads per model (default: one per physical core).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Require this key (Authorization: Bearer KEY or X-Api-Key); LLAMAY_API_KEY too.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Another origin allowed by CORS besides localhost ones (repeatable; * for any).
    #[arg(long, value_name = "ORIGIN")]
    cors_origin: Vec<String>,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 32 << 20, value_name = "BYTES")]
    max_body: usize,
    /// Chat template (built-in name or Jinja file) for files that carry none.
    #[arg(long, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    /// How long an idle model stays loaded (Ollama's OLLAMA_KEEP_ALIVE): 5m, 1h, 300,
    /// 0 (unload when done), -1 (forever). Requests may give their own.
    #[arg(long, default_value = "5m", allow_hyphen_values = true)]
    keep_alive: String,
    /// Load every -m model at start (/health answers 503 until they are loaded).
    #[arg(long)]
    preload: bool,
    /// Prompt-lookup speculation: up to N draft tokens per request per step, verified
    /// in the same batch (the output is unchanged, greedy or sampled; 0: off).
    #[arg(long, default_value_t = 0, value_name = "N")]
    draft_lookup: usize,
    /// Seconds SIGTERM waits for running requests before exiting.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    drain_timeout: u64,
}

/// `-m A --alias a -m B`: each alias names the -m given before it. Clap keeps the two
/// lists apart, so the order is read from the command line.
fn pair_aliases(args: &[String]) -> anyhow::Result<Vec<(PathBuf, Option<String>)>> {
    let mut out: Vec<(PathBuf, Option<String>)> = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let value = |it: &mut std::iter::Peekable<std::slice::Iter<'_, String>>| {
            inline.clone().or_else(|| it.next().cloned())
        };
        match flag {
            "-m" | "--model" => {
                if let Some(v) = value(&mut it) {
                    out.push((PathBuf::from(v), None));
                }
            }
            f if f.starts_with("-m") && f.len() > 2 && !f.starts_with("--") => {
                out.push((PathBuf::from(&f[2..]), None));
            }
            "--alias" => {
                let Some(v) = value(&mut it) else { continue };
                match out.last_mut() {
                    None => bail!("--alias {v}: give it after the -m it names"),
                    Some((p, Some(prev))) => bail!(
                        "--alias {v}: -m {} is already named {prev}; give one --alias per -m",
                        p.display()
                    ),
                    Some((_, a)) => *a = Some(v),
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// `LLAMAY_HOST` as Ollama's `OLLAMA_HOST`: `HOST`, `HOST:PORT`, `:PORT`, with or
/// without `http://`.
fn host_from_env(v: &str) -> anyhow::Result<(String, Option<u16>)> {
    let v = v
        .trim()
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .trim_end_matches('/');
    let (host, port) = if let Some(rest) = v.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, p)) => (h.to_string(), p.strip_prefix(':')),
            None => bail!("LLAMAY_HOST={v}: an unclosed [ in the address"),
        }
    } else {
        match v.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h.to_string(), Some(p)),
            _ => (v.to_string(), None),
        }
    };
    let port =
        match port {
            None | Some("") => None,
            Some(p) => Some(p.parse().map_err(|_| {
                anyhow::anyhow!("LLAMAY_HOST={v}: port {p} is not a number 0-65535")
            })?),
        };
    let host = if host.is_empty() {
        "127.0.0.1".into()
    } else {
        host
    };
    Ok((host, port))
}

#[cfg(target_family = "wasm")]
pub fn run(_: &Args) -> anyhow::Result<()> {
    Err(crate::left_out::refuse(
        "serve",
        "HTTP server",
        "WASI preview 1 cannot listen on a socket",
        "run `llamay serve` from a native build",
    ))
}

#[cfg(not(target_family = "wasm"))]
pub fn run(args: &Args) -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().skip(2).collect();
    let models = pair_aliases(&argv)?;
    if models.len() != args.models.len() {
        bail!("-m: could not pair the -m and --alias flags; give each as `-m PATH --alias NAME`");
    }
    if args.parallel == 0 || args.parallel > 256 {
        bail!("--parallel {}: give 1 to 256 sequences", args.parallel);
    }
    if args.ctx_size < 16 || args.ctx_size > 1 << 24 {
        bail!(
            "--ctx-size {}: give 16 to 16777216 positions",
            args.ctx_size
        );
    }
    if args.draft_lookup > 64 {
        bail!(
            "--draft-lookup {}: at most 64 draft tokens",
            args.draft_lookup
        );
    }
    if args.max_body < 1024 {
        bail!("--max-body {}: at least 1024 bytes", args.max_body);
    }
    let (env_host, env_port) = match std::env::var("LLAMAY_HOST") {
        Ok(v) if !v.is_empty() => {
            let (h, p) = host_from_env(&v)?;
            (Some(h), p)
        }
        _ => (None, None),
    };
    let api_key = args.api_key.clone().or_else(|| {
        std::env::var("LLAMAY_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
    });
    let config = ServeConfig {
        host: args
            .host
            .clone()
            .or(env_host)
            .unwrap_or_else(|| "127.0.0.1".into()),
        port: args.port.or(env_port).unwrap_or(11434),
        models,
        engine: EngineConfig {
            threads: session::threads(args.threads)?,
            kv: session::kv(&args.kv)?,
            n_ctx: args.ctx_size,
            parallel: args.parallel,
            queue: args.queue,
            max_draft: args.draft_lookup,
        },
        api_key,
        cors_origins: args.cors_origin.clone(),
        max_body: args.max_body,
        chat_template: args.chat_template.clone(),
        store: Some(llamay_hub::Store::default_root()),
        shutdown_grace: Duration::from_secs(args.drain_timeout),
        keep_alive: llamay_server::params::keep_alive(Some(&serde_json::Value::String(
            args.keep_alive.clone(),
        )))
        .map_err(|_| {
            anyhow::anyhow!(
                "--keep-alive {}: give a duration such as 5m, 1h30m, 300 (seconds), 0 or -1 (forever)",
                args.keep_alive
            )
        })?
        .flatten(),
        preload: args.preload,
        device: None,
    };
    // Every flag and file is checked before the device is opened and announced, so a
    // bad `-m` is the one line printed.
    llamay_server::check_models(&config.models)?;
    let device = match args.device.resolve()? {
        None => None,
        Some(index) => {
            // Opened once here so that a device that cannot open fails at start.
            let probe = crate::device::open_vulkan(index)?;
            eprintln!(
                "device: {} (each loaded model runs there)",
                probe.describe()
            );
            drop(probe);
            let open: llamay_server::DeviceOpener = std::sync::Arc::new(move || {
                crate::device::open_vulkan(index).map_err(|e| crate::out::one_line(&e))
            });
            Some(open)
        }
    };
    llamay_server::run(ServeConfig { device, ..config })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn aliases_name_the_model_before_them() {
        let m = pair_aliases(&s(&[
            "-m",
            "a.gguf",
            "--alias",
            "x:1",
            "--port",
            "5",
            "-m",
            "b.gguf",
            "--model=c.gguf",
            "--alias=z",
        ]))
        .unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].1.as_deref(), Some("x:1"));
        assert_eq!(m[1].1, None);
        assert_eq!(m[2], (PathBuf::from("c.gguf"), Some("z".into())));
        assert!(pair_aliases(&s(&["--alias", "x", "-m", "a"])).is_err());
        assert!(pair_aliases(&s(&["-m", "a", "--alias", "x", "--alias", "y"])).is_err());
    }

    #[test]
    fn llamay_host_reads_as_ollama_host_does() {
        assert_eq!(
            host_from_env("0.0.0.0:8080").unwrap(),
            ("0.0.0.0".into(), Some(8080))
        );
        assert_eq!(
            host_from_env("http://localhost").unwrap(),
            ("localhost".into(), None)
        );
        assert_eq!(
            host_from_env(":9999").unwrap(),
            ("127.0.0.1".into(), Some(9999))
        );
        assert_eq!(host_from_env("[::1]:7").unwrap(), ("::1".into(), Some(7)));
        assert!(host_from_env("h:port").is_err());
    }
}
