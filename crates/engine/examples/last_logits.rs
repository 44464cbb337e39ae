//! Developer tool for long-context parity (scripts/check-long-context): decodes a token
//! sequence in chunks and writes the logits of its last N positions as little-endian
//! f32 `[N][n_vocab]`.
//!
//!   last_logits MODEL IDS_FILE N OUT.f32 [f32|f16]
//!
//! IDS_FILE holds comma- or whitespace-separated token ids.

use llamay_engine::{BatchToken, ContextParams, KvPrecision, Model, Threads};
use llamay_gguf::MappedModel;
use std::io::Write;
use std::process::ExitCode;

const CHUNK: usize = 512;

fn run() -> Result<(), String> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        return Err("usage: last_logits MODEL IDS_FILE N OUT.f32 [f32|f16]".into());
    }
    let text = std::fs::read_to_string(&a[2]).map_err(|e| format!("{}: {e}", a[2]))?;
    let ids: Vec<u32> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|e| format!("bad id {s:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let last: usize = a[3].parse().map_err(|e| format!("N: {e}"))?;
    if last == 0 || last > ids.len() {
        return Err(format!("N must be in 1..={}", ids.len()));
    }
    let kv = match a.get(5).map(String::as_str) {
        None | Some("f32") => KvPrecision::F32,
        Some("f16") => KvPrecision::F16,
        Some(o) => return Err(format!("kv precision {o}: use f32 or f16")),
    };
    let mapped = MappedModel::open(a[1].as_ref()).map_err(|e| e.to_string())?;
    let gguf = mapped.parse().map_err(|e| e.to_string())?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = Model::load(&gguf, Threads(threads)).map_err(|e| e.to_string())?;
    let mut ctx = model
        .context(ContextParams::new(Threads(2), kv, ids.len()))
        .unwrap();
    let s0 = ctx.new_sequence();
    let first_kept = ids.len() - last;
    let mut out = std::io::BufWriter::new(std::fs::File::create(&a[4]).map_err(|e| e.to_string())?);
    let t0 = std::time::Instant::now();
    for (c, chunk) in ids.chunks(CHUNK).enumerate() {
        let base = c * CHUNK;
        let batch: Vec<BatchToken> = chunk
            .iter()
            .enumerate()
            .map(|(i, &t)| BatchToken {
                seq: s0,
                token: t,
                pos: base + i,
                logits: base + i >= first_kept,
            })
            .collect();
        let l = ctx.decode(&batch).map_err(|e| e.to_string())?;
        for v in &l.values {
            out.write_all(&v.to_le_bytes()).map_err(|e| e.to_string())?;
        }
        eprint!(
            "\r{} / {} tokens, {:.0} s",
            base + chunk.len(),
            ids.len(),
            t0.elapsed().as_secs_f64()
        );
    }
    eprintln!();
    out.flush().map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
