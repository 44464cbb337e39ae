//! `llamay bench`: llama-bench's tests (b11434, tools/llama-bench) on our engine.
//!
//! A `ppN` test evaluates one prompt of N random tokens (t/s = N / time); a `tgN` test
//! generates N tokens one by one (t/s = N / time). Each test runs a warm-up (the whole
//! prompt, or one generated token), then `-r` timed repetitions on a cleared cache,
//! after `-d` tokens of context when asked (evaluated once, untimed, and kept between
//! repetitions as llama-bench restores its saved state). Tokens are uniform over the
//! vocabulary from a fixed seed; a prompt starts with BOS when the tokenizer adds one,
//! as llama-bench's do. The mean and sample standard deviation are of per-repetition
//! t/s, as llama-bench reports them.

use crate::ModelArg;
use crate::out;
use crate::session;
use anyhow::bail;
use llamay_engine::{BatchToken, Context, ContextParams, PAGE, SeqId};
use llamay_gguf::MappedModel;
use serde::Serialize;
use std::io::Write;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// Prompt tokens of the pp test (0: no pp test).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Generated tokens of the tg test (0: no tg test).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Tokens already in the context before each test.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    n_depth: usize,
    /// Timed repetitions of each test (3, as docs/cli.md states; llama-bench's is 5).
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    reps: usize,
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Output: md (llama-bench's table), json (an array), jsonl (one object a line).
    #[arg(short = 'o', long = "output", default_value = "md")]
    output: String,
    /// KV cache precision: f32 (exact), f16 (llama.cpp's default), vq8 (int8 values), q8 (int8 keys and values).
    #[arg(long, default_value = "f32")]
    kv: String,
    /// Skip the warm-up runs.
    #[arg(long)]
    no_warmup: bool,
}

/// Tokens per decode call (llama-bench's default micro-batch, `-ub 512`).
const UBATCH: usize = 512;
/// Tokens per logical batch (llama-bench's `-b 2048`): one logits row per batch.
const BATCH: usize = 2048;
const SEED: u64 = 0x6c6c_616d_6179_2121;

#[derive(Clone, Copy, PartialEq)]
enum Format {
    Md,
    Json,
    Jsonl,
}

/// One test's result, with llama-bench's JSON field names (those that apply here).
#[derive(Serialize)]
struct TestResult {
    build_commit: &'static str,
    build_number: u32,
    cpu_info: String,
    gpu_info: &'static str,
    backends: &'static str,
    /// Ours: the kernel set the matmuls ran on.
    kernel_set: &'static str,
    model_filename: String,
    model_type: String,
    model_size: u64,
    model_n_params: u64,
    n_batch: usize,
    n_ubatch: usize,
    n_threads: usize,
    type_k: &'static str,
    type_v: &'static str,
    n_gpu_layers: u32,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    test_time: String,
    avg_ns: u64,
    stddev_ns: u64,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ns: Vec<u64>,
    samples_ts: Vec<f64>,
}

impl TestResult {
    fn name(&self) -> String {
        let mut s = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, g) => format!("tg{g}"),
            (p, g) => format!("pp{p}+tg{g}"),
        };
        if self.n_depth > 0 {
            s += &format!(" @ d{}", self.n_depth);
        }
        s
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    let format = match args.output.as_str() {
        "md" => Format::Md,
        "json" => Format::Json,
        "jsonl" => Format::Jsonl,
        o => bail!("-o {o}: the output formats are md, json and jsonl"),
    };
    if args.n_prompt == 0 && args.n_gen == 0 {
        bail!("-p 0 -n 0: nothing to measure (give -p N for a prompt test, -n N for generation)");
    }
    if args.reps == 0 {
        bail!("-r 0: at least one repetition is needed");
    }
    const MAX_TOKENS: usize = 1 << 20;
    for (flag, v) in [
        ("-p", args.n_prompt),
        ("-n", args.n_gen),
        ("-d", args.n_depth),
    ] {
        if v > MAX_TOKENS {
            bail!("{flag} {v}: at most {MAX_TOKENS} tokens");
        }
    }
    let kv = session::kv(&args.kv)?;
    let threads = session::threads(args.threads)?;

    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let (model, tok) = session::load(&mapped, &gguf, threads)?;
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let n_vocab = model.config().n_vocab as u64;
    drop(tok);

    let md = gguf.metadata();
    let arch = md.architecture().ok().flatten().unwrap_or("?");
    let model_size: u64 = gguf.tensors().map(|t| t.n_bytes).sum();
    let model_n_params: u64 = gguf.tensors().map(|t| t.n_elements).sum();
    let size_label = md
        .get_str("general.size_label")
        .ok()
        .flatten()
        .map(str::to_string)
        .unwrap_or_else(|| params_label(model_n_params));
    let ftype = md
        .get_u64("general.file_type")
        .ok()
        .flatten()
        .and_then(llamay_gguf::file_type_name)
        .unwrap_or("unknown type");
    let model_type = format!("{arch} {size_label} {ftype}");
    let kv_name = kv.name();

    let mut tests = Vec::new();
    if args.n_prompt > 0 {
        tests.push((args.n_prompt, 0));
    }
    if args.n_gen > 0 {
        tests.push((0, args.n_gen));
    }
    let mut rng = SplitMix(SEED);
    let mut out = out::stdout();
    let backend = format!("CPU {}", llamay_kernels::kernel_set());
    if format == Format::Md {
        writeln!(
            out,
            "| {:<30} | {:>10} | {:>10} | {:<14} | {:>7} | {:>15} | {:>20} |",
            "model", "size", "params", "backend", "threads", "test", "t/s"
        )?;
        writeln!(
            out,
            "| {:-<30} | {:->9}: | {:->9}: | {:-<14} | {:->6}: | {:->14}: | {:->19}: |",
            "", "", "", "", "", "", ""
        )?;
        out.flush()?;
    } else if format == Format::Json {
        writeln!(out, "[")?;
    }
    let mut first = true;
    for (n_prompt, n_gen) in tests {
        let n_ctx = args.n_depth + n_prompt + n_gen;
        // A fork of the prefilled depth per repetition (sharing its pages): room for
        // the depth, one repetition's tokens and the page each fork copies.
        let params = ContextParams {
            kv_budget_tokens: Some(n_ctx + n_prompt + n_gen + 2 * PAGE),
            ..ContextParams::new(threads, kv, n_ctx)
        };
        let mut ctx = args.device.context(&model, params)?;
        let mut tokens = |n: usize| {
            let mut v: Vec<u32> = (0..n).map(|_| rng.below(n_vocab) as u32).collect();
            if let (Some(b), Some(t)) = (bos, v.first_mut()) {
                *t = b;
            }
            v
        };
        if !args.no_warmup {
            let warm = ctx.new_sequence();
            if n_prompt > 0 {
                prompt(&mut ctx, warm, &tokens(n_prompt))?;
            }
            if n_gen > 0 {
                generate(&mut ctx, warm, &tokens(1))?;
            }
            ctx.kv_mut().free(warm)?;
        }
        let depth = ctx.new_sequence();
        if args.n_depth > 0 {
            prompt(&mut ctx, depth, &tokens(args.n_depth))?;
        }
        let mut samples_ns = Vec::with_capacity(args.reps);
        for _ in 0..args.reps {
            let seq = ctx.kv_mut().fork(depth)?;
            let (p, g) = (tokens(n_prompt), tokens(n_gen));
            let t0 = Instant::now();
            if n_prompt > 0 {
                prompt(&mut ctx, seq, &p)?;
            }
            if n_gen > 0 {
                generate(&mut ctx, seq, &g)?;
            }
            samples_ns.push(t0.elapsed().as_nanos().max(1) as u64);
            ctx.kv_mut().free(seq)?;
        }
        let n_tokens = (n_prompt + n_gen) as f64;
        let samples_ts: Vec<f64> = samples_ns
            .iter()
            .map(|&ns| 1e9 * n_tokens / ns as f64)
            .collect();
        let ns_f: Vec<f64> = samples_ns.iter().map(|&x| x as f64).collect();
        let r = TestResult {
            build_commit: option_env!("LLAMAY_GIT_COMMIT").unwrap_or("unknown"),
            build_number: 0,
            cpu_info: cpu_info(),
            gpu_info: "",
            backends: "CPU",
            kernel_set: llamay_kernels::kernel_set(),
            model_filename: path.display().to_string(),
            model_type: model_type.clone(),
            model_size,
            model_n_params,
            n_batch: BATCH,
            n_ubatch: UBATCH,
            n_threads: threads.0,
            type_k: kv_name,
            type_v: kv_name,
            n_gpu_layers: 0,
            n_prompt,
            n_gen,
            n_depth: args.n_depth,
            test_time: utc_now(),
            avg_ns: mean(&ns_f) as u64,
            stddev_ns: stdev(&ns_f) as u64,
            avg_ts: mean(&samples_ts),
            stddev_ts: stdev(&samples_ts),
            samples_ns,
            samples_ts,
        };
        match format {
            Format::Md => writeln!(
                out,
                "| {:<30} | {:>10} | {:>10} | {:<14} | {:>7} | {:>15} | {:>20} |",
                r.model_type,
                size_str(r.model_size),
                params_str(r.model_n_params),
                backend,
                r.n_threads,
                r.name(),
                format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts),
            )?,
            Format::Json => {
                if !first {
                    writeln!(out, ",")?;
                }
                write!(out, "  {}", serde_json::to_string(&r)?)?;
            }
            Format::Jsonl => writeln!(out, "{}", serde_json::to_string(&r)?)?,
        }
        first = false;
        out.flush()?;
    }
    match format {
        Format::Md => writeln!(
            out,
            "\nbuild: llamay {} ({})",
            env!("CARGO_PKG_VERSION"),
            option_env!("LLAMAY_GIT_COMMIT").unwrap_or("unknown")
        )?,
        Format::Json => writeln!(out, "\n]")?,
        Format::Jsonl => {}
    }
    out.flush()?;
    Ok(())
}

/// Evaluates `tokens` after the cache's positions, in micro-batches of [`UBATCH`], with
/// logits for the last token of each [`BATCH`] (llama-bench's batching).
fn prompt(ctx: &mut Context<'_>, seq: SeqId, tokens: &[u32]) -> anyhow::Result<()> {
    let start = ctx.kv().len(seq)?;
    let mut batch = Vec::with_capacity(UBATCH.min(tokens.len()));
    for (c, chunk) in tokens.chunks(UBATCH).enumerate() {
        let base = c * UBATCH;
        batch.clear();
        batch.extend(chunk.iter().enumerate().map(|(i, &token)| {
            let done = base + i + 1;
            BatchToken {
                seq,
                token,
                pos: start + base + i,
                logits: done == tokens.len() || done.is_multiple_of(BATCH),
            }
        }));
        ctx.decode(&batch)?;
    }
    Ok(())
}

/// Decodes `tokens` one at a time, each with its logits (what generation does).
fn generate(ctx: &mut Context<'_>, seq: SeqId, tokens: &[u32]) -> anyhow::Result<()> {
    for &token in tokens {
        let pos = ctx.kv().len(seq)?;
        ctx.decode(&[BatchToken {
            seq,
            token,
            pos,
            logits: true,
        }])?;
    }
    Ok(())
}

/// SplitMix64: a fixed, portable sequence of random tokens.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift.
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// Sample standard deviation (n - 1), 0 for fewer than two samples, as llama-bench.
fn stdev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    let ss: f64 = v.iter().map(|x| (x - m) * (x - m)).sum();
    (ss / (v.len() - 1) as f64).sqrt()
}

fn size_str(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes < 1 << 30 {
        format!("{:.2} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.2} GiB", b / 1024.0 / 1024.0 / 1024.0)
    }
}

fn params_str(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

/// A size label for files without `general.size_label`: "268M", "1.2B".
fn params_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else if n >= 1_000_000 {
        format!("{}M", n / 1_000_000)
    } else {
        format!("{}K", n.div_ceil(1000))
    }
}

/// The CPU's model name, from /proc/cpuinfo where there is one.
fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Now as RFC 3339 UTC (`2025-01-31T12:34:56Z`), as llama-bench's `test_time`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = llamay_template::civil_date(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdev_matches_llama_bench() {
        assert_eq!(stdev(&[5.0]), 0.0);
        assert!((stdev(&[1.0, 2.0, 3.0, 4.0]) - 1.2909944487358056).abs() < 1e-12);
    }

    #[test]
    fn random_tokens_stay_in_the_vocabulary() {
        let mut r = SplitMix(SEED);
        assert!((0..10_000).all(|_| r.below(7) < 7));
    }

    #[test]
    fn labels() {
        assert_eq!(size_str(246_579_200), "235.16 MiB");
        assert_eq!(params_str(268_098_176), "268.10 M");
        assert_eq!(params_label(268_098_176), "268M");
    }
}
