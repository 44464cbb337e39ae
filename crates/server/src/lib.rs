//! `llamay serve`: the Ollama and OpenAI HTTP APIs over one continuous-batching
//! scheduler per loaded model.
//!
//! - [`scheduler`]: a model's engine thread (batching, prefix reuse, cancellation).
//! - [`registry`]: names → files → loaded models, keep-alive.
//! - [`ollama`], [`openai`]: the two APIs' routes and wire shapes; [`generate`] what
//!   they share.
//! - [`guard`]: Host allow-list, API key, body limit; CORS is tower-http's.
//! - [`metrics`]: `/metrics` for Prometheus and the inference gateway.
//!
//! The HTTP side never computes: it parses, checks, submits and streams.

pub mod error;
pub mod generate;
pub mod guard;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod params;
pub mod registry;
pub mod responses;
pub mod scheduler;
pub mod stop;
pub mod stream;
pub mod tools;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use registry::Registry;
pub use scheduler::DeviceOpener;
use scheduler::EngineConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How `llamay serve` was started (cli.md).
#[derive(Clone)]
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    /// `-m PATH [--alias NAME]`.
    pub models: Vec<(PathBuf, Option<String>)>,
    pub engine: EngineConfig,
    pub api_key: Option<String>,
    pub cors_origins: Vec<String>,
    pub max_body: usize,
    /// For files without a template of their own.
    pub chat_template: Option<String>,
    /// The model store (`LLAMAY_MODELS`); `None`: none.
    pub store: Option<PathBuf>,
    /// How long SIGTERM waits for running requests.
    pub shutdown_grace: Duration,
    /// `--keep-alive`: how long an idle model stays loaded (`None`: forever).
    pub keep_alive: Option<Duration>,
    /// `--preload`: load every `-m` model at start (`/health` is 503 until then).
    pub preload: bool,
    /// `--device`: where loaded models run (`None`: the CPU).
    pub device: Option<scheduler::DeviceOpener>,
}

/// What every handler sees.
pub struct AppState {
    pub registry: Registry,
    pub metrics: metrics::Metrics,
    pub config: ServeConfig,
    pub started: Instant,
}

impl AppState {
    /// Counts a refusal at admission (503 when full) on its way to the client.
    pub fn rejected(&self, e: error::ApiError) -> error::ApiError {
        if e.status == StatusCode::SERVICE_UNAVAILABLE {
            self.metrics
                .requests_rejected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        e
    }
}

pub type State = axum::extract::State<Arc<AppState>>;

/// The whole router, with its guards.
pub fn router(state: Arc<AppState>, loopback: bool) -> Router {
    let api = Router::new()
        .route("/", get(root).head(root))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .merge(ollama::routes())
        .merge(openai::routes())
        .fallback(not_found);
    guard::apply(api, state.clone(), loopback).with_state(state)
}

async fn root() -> &'static str {
    "Ollama is running (llamay)"
}

async fn health(axum::extract::State(s): State) -> impl IntoResponse {
    if s.registry.is_loading() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "loading model"})),
        )
    } else {
        (
            StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ok"})),
        )
    }
}

async fn metrics_text(axum::extract::State(s): State) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(&s.registry),
    )
}

/// An unknown route, shaped as the API its path belongs to asks (OpenAI clients read
/// `error.message`).
async fn not_found(uri: axum::http::Uri) -> axum::response::Response {
    let e = error::ApiError::not_found(format!("no route {}", uri.path()));
    if uri.path() == "/v1" || uri.path().starts_with("/v1/") {
        error::OaiError(e).into_response()
    } else {
        e.into_response()
    }
}

/// The served names of `models`, or an error naming a duplicate name or a missing file.
/// `run` checks this first; a caller may check it before it opens anything else.
pub fn check_models(models: &[(PathBuf, Option<String>)]) -> anyhow::Result<Vec<registry::Served>> {
    let served = registry::served_names(models).map_err(anyhow::Error::msg)?;
    for s in &served {
        if !s.path.is_file() {
            anyhow::bail!("-m {}: no such file", s.path.display());
        }
    }
    Ok(served)
}

/// Runs the server until SIGTERM or SIGINT, then drains running requests for up to
/// `shutdown_grace`.
pub fn run(config: ServeConfig) -> anyhow::Result<()> {
    let served = check_models(&config.models)?;
    let store = config.store.clone().map(llamay_hub::Store::at);
    let registry = Registry::new(
        served,
        store,
        config.engine,
        config.chat_template.clone(),
        config.keep_alive,
    )
    .with_device(config.device.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let addr: SocketAddr = tokio::net::lookup_host((config.host.as_str(), config.port))
            .await
            .map_err(|e| anyhow::anyhow!("--host {}: {e}", config.host))?
            .next()
            .ok_or_else(|| anyhow::anyhow!("--host {}: no address", config.host))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let bound = listener.local_addr()?;
        let loopback = bound.ip().is_loopback();
        let grace = config.shutdown_grace;
        let state = Arc::new(AppState {
            registry,
            metrics: metrics::Metrics::default(),
            config,
            started: Instant::now(),
        });
        let reaper = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                reaper.registry.reap();
            }
        });
        if state.config.preload {
            let s = state.clone();
            s.registry.preloading(true);
            tokio::spawn(async move {
                for name in s.registry.served() {
                    if let Err(e) = s.registry.get(&name).await {
                        eprintln!("llamay serve: --preload {name}: {e}");
                    }
                }
                s.registry.preloading(false);
            });
        }
        eprintln!("llamay serve: listening on http://{bound}");
        let app = router(state, loopback);
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown_signal().await;
                eprintln!(
                    "llamay serve: shutting down; waiting up to {} s for running requests",
                    grace.as_secs()
                );
                tokio::spawn(async move {
                    tokio::time::sleep(grace).await;
                    eprintln!(
                        "llamay serve: requests still running after the grace period; exiting"
                    );
                    std::process::exit(0);
                });
            })
            .await?;
        eprintln!("llamay serve: stopped");
        Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
