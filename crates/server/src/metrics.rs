//! `GET /metrics` in Prometheus' text format. The first four families are the ones the
//! Gateway API Inference Extension's endpoint picker reads from a vLLM-compatible model
//! server (docs/gateway.md has the mapping); llamay's own counters and histograms
//! follow under `llamay_`.

use crate::registry::Registry;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Seconds; the buckets of every latency histogram.
const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    n: u64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (c, &b) in self.counts.iter_mut().zip(BUCKETS) {
            if secs <= b {
                *c += 1;
            }
        }
        self.sum += secs;
        self.n += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.n);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.n);
    }
}

/// The server's counters (gauges are read from the schedulers when scraped).
#[derive(Default)]
pub struct Metrics {
    pub requests_ok: AtomicU64,
    pub requests_failed: AtomicU64,
    pub requests_rejected: AtomicU64,
    pub cancelled: AtomicU64,
    ttft: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
}

impl Metrics {
    pub fn first_token(&self, d: Duration) {
        self.ttft
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(d.as_secs_f64());
    }

    pub fn failed(&self) {
        self.requests_failed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn finished(&self, d: Duration) {
        self.requests_ok.fetch_add(1, Ordering::Relaxed);
        self.e2e
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(d.as_secs_f64());
    }

    /// The exposition text.
    pub fn render(&self, reg: &Registry) -> String {
        let t = reg.totals();
        let mut out = String::new();
        let gauge = |out: &mut String, name: &str, help: &str, v: String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Requests waiting for a slot.",
            t.waiting.to_string(),
        );
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Requests being decoded.",
            t.running.to_string(),
        );
        let usage = if t.kv_total == 0 {
            0.0
        } else {
            t.kv_used as f64 / t.kv_total as f64
        };
        gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "Fraction of the KV cache's pages in use (0 to 1).",
            format!("{usage}"),
        );
        // The name endpoint pickers before GIE v1.3 read.
        gauge(
            &mut out,
            "vllm:gpu_cache_usage_perc",
            "The same as vllm:kv_cache_usage_perc (its older name).",
            format!("{usage}"),
        );
        let pages_per_layer = reg.engine().parallel * (reg.engine().n_ctx + llamay_engine::PAGE)
            / llamay_engine::PAGE;
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info The KV cache's configuration: block_size is the positions per page.\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1",
            llamay_engine::PAGE,
            pages_per_layer
        );
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let (mut prompt, mut cached, mut generated, mut drafted, mut accepted) = (0, 0, 0, 0, 0);
        for l in reg.running() {
            let g = &l.scheduler.gauges;
            drafted += g.draft_tokens.load(Ordering::Relaxed);
            accepted += g.draft_accepted.load(Ordering::Relaxed);
            prompt += g.prompt_tokens.load(Ordering::Relaxed);
            cached += g.cached_tokens.load(Ordering::Relaxed);
            generated += g.generated_tokens.load(Ordering::Relaxed);
        }
        counter(
            &mut out,
            "llamay_requests_total",
            "Generation requests answered in full.",
            self.requests_ok.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "llamay_requests_failed_total",
            "Generation requests that ended in an error.",
            self.requests_failed.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "llamay_requests_rejected_total",
            "Requests refused with 503 because the queue was full.",
            self.requests_rejected.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "llamay_prompt_tokens_total",
            "Prompt tokens of finished requests (loaded models).",
            prompt,
        );
        counter(
            &mut out,
            "llamay_prompt_tokens_cached_total",
            "Prompt tokens reused from the KV cache (loaded models).",
            cached,
        );
        counter(
            &mut out,
            "llamay_generation_tokens_total",
            "Generated tokens (loaded models).",
            generated,
        );
        counter(
            &mut out,
            "llamay_draft_tokens_total",
            "Prompt-lookup draft tokens verified (--draft-lookup; loaded models).",
            drafted,
        );
        counter(
            &mut out,
            "llamay_draft_accepted_total",
            "Draft tokens accepted (loaded models).",
            accepted,
        );
        gauge(
            &mut out,
            "llamay_models_loaded",
            "Models loaded now.",
            reg.running().len().to_string(),
        );
        self.ttft.lock().unwrap_or_else(|e| e.into_inner()).write(
            &mut out,
            "llamay_time_to_first_token_seconds",
            "Time from a request's arrival to its first token.",
        );
        self.e2e.lock().unwrap_or_else(|e| e.into_inner()).write(
            &mut out,
            "llamay_request_duration_seconds",
            "Time from a request's arrival to its last token.",
        );
        out
    }
}
