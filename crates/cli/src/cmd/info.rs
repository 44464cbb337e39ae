//! `llamay info`: what a GGUF file is, and whether this build would run it.

use crate::ModelArg;
use crate::out;
use crate::runnable::{Assessment, assess};
use anyhow::Context;
use llamay_gguf::file_type_name;
use llamay_gguf::{MappedModel, Model, TensorInfo, Value, describe};
use serde_json::{Map, Value as Json, json};
use std::collections::BTreeMap;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// List every tensor with its type, shape and byte size.
    #[arg(long)]
    tensors: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Print metadata arrays in full (by default arrays longer than 64 show their head).
    #[arg(long)]
    full_arrays: bool,
}

const ARRAY_HEAD: usize = 64;

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    let mapped = MappedModel::open(path)?;
    let model = mapped.parse()?;
    let verdict = assess(&model);
    let mut w = out::stdout();
    if args.json {
        let doc = json_doc(&mapped, &model, &verdict, args.full_arrays);
        serde_json::to_writer(&mut w, &doc).context("writing JSON")?;
        writeln!(w)?;
    } else {
        text(&mut w, &mapped, &model, &verdict, args)?;
    }
    w.flush()?;
    Ok(())
}

fn value_json(v: &Value<'_>, full_arrays: bool) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        // Through the f32's own shortest text, so 1e-6 prints as 1e-6, not as the
        // f64 widening 9.999999974752427e-7.
        Value::F32(x) => format!("{x:?}")
            .parse::<f64>()
            .map_or(Json::Null, |f| json!(f)),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s.to_string_lossy()),
        Value::Array(a) => {
            let n = if full_arrays {
                a.len()
            } else {
                a.len().min(ARRAY_HEAD)
            };
            let items: Vec<Json> = a.iter().take(n).map(|v| value_json(&v, false)).collect();
            if n == a.len() {
                Json::Array(items)
            } else {
                json!({ "elem_type": a.elem_type().name(), "len": a.len(), "head": items })
            }
        }
    }
}

fn tensor_json(t: &TensorInfo<'_>) -> Json {
    json!({
        "name": t.name,
        "type": t.ty.name(),
        "shape": t.shape,
        "offset": t.offset,
        "n_bytes": t.n_bytes,
    })
}

/// Tensor count and bytes per type, in type-id order.
fn type_mix(model: &Model<'_>) -> BTreeMap<llamay_formats::GgmlType, (usize, u64)> {
    let mut mix = BTreeMap::new();
    for t in model.tensors() {
        let e = mix.entry(t.ty).or_insert((0usize, 0u64));
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    mix
}

fn file_type(model: &Model<'_>) -> Option<String> {
    let id = model.metadata().get_u64("general.file_type").ok()??;
    Some(match file_type_name(id) {
        Some(n) => n.to_string(),
        None => format!("unknown ({id})"),
    })
}

fn json_doc(
    mapped: &MappedModel,
    model: &Model<'_>,
    verdict: &Assessment,
    full_arrays: bool,
) -> Json {
    let first = model.first();
    let md = model.metadata();
    let mut metadata = Map::new();
    let mut types = Map::new();
    for (k, v) in md.iter() {
        metadata.insert(k.to_string(), value_json(v, full_arrays));
        types.insert(k.to_string(), json!(describe(v)));
    }
    let mix: Map<String, Json> = type_mix(model)
        .into_iter()
        .map(|(ty, (n, bytes))| {
            (
                ty.name().to_string(),
                json!({ "tensors": n, "n_bytes": bytes }),
            )
        })
        .collect();
    json!({
        "path": mapped.paths().next().map(|p| p.display().to_string()),
        "shards": mapped.paths().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "file_size": mapped.total_bytes(),
        "gguf_version": first.version,
        "big_endian": first.big_endian,
        "alignment": first.alignment,
        "data_offset": first.data_offset,
        "architecture": md.architecture().ok().flatten(),
        "file_type": file_type(model),
        "tensor_count": model.tensor_count(),
        "parameter_count": model.tensors().map(|t| t.n_elements).sum::<u64>(),
        "tensor_bytes": model.tensors().map(|t| t.n_bytes).sum::<u64>(),
        "type_mix": mix,
        "metadata": metadata,
        "metadata_types": types,
        "tensors": model.tensors().map(tensor_json).collect::<Vec<_>>(),
        "runnable": verdict.runnable,
        "refusal": verdict.refusal,
        "unread": verdict.unread,
        "tokenizer": verdict.tokenizer.as_ref().map(|t| json!({
            "model": t.model,
            "pre": t.pre,
            "pre_known": t.pre_known,
            "rule_set": t.rule_set,
            "n_tokens": t.n_tokens,
            "notes": t.notes,
        })),
    })
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// A one-line rendering of a metadata value; long strings and arrays are shortened.
fn value_text(v: &Value<'_>) -> String {
    const MAX: usize = 80;
    match v {
        Value::String(s) => {
            let s = s.to_string_lossy();
            let shown: String = s.chars().take(MAX).collect();
            let q = serde_json::to_string(&shown).unwrap_or_default();
            if shown.len() < s.len() {
                format!("{q}... ({} bytes)", s.len())
            } else {
                q
            }
        }
        Value::Array(a) => {
            let head: Vec<String> = a.iter().take(8).map(|e| value_text(&e)).collect();
            let more = if a.len() > 8 { ", ..." } else { "" };
            format!(
                "[{} x {}] [{}{more}]",
                a.len(),
                a.elem_type(),
                head.join(", ")
            )
        }
        v => value_json(v, false).to_string(),
    }
}

fn text(
    w: &mut impl Write,
    mapped: &MappedModel,
    model: &Model<'_>,
    verdict: &Assessment,
    args: &Args,
) -> anyhow::Result<()> {
    let first = model.first();
    let md = model.metadata();
    let arch = md.architecture().ok().flatten();
    for (i, p) in mapped.paths().enumerate() {
        let label = if i == 0 { "file" } else { "shard" };
        writeln!(w, "{label:<16}{}", p.display())?;
    }
    writeln!(
        w,
        "{:<16}{} ({} bytes)",
        "size",
        human_bytes(mapped.total_bytes()),
        mapped.total_bytes()
    )?;
    writeln!(
        w,
        "{:<16}{} ({}-endian), alignment {}",
        "gguf version",
        first.version,
        if first.big_endian { "big" } else { "little" },
        first.alignment
    )?;
    writeln!(w, "{:<16}{}", "architecture", arch.unwrap_or("(none)"))?;
    if let Ok(Some(name)) = md.get_str("general.name") {
        writeln!(w, "{:<16}{name}", "name")?;
    }
    let params: u64 = model.tensors().map(|t| t.n_elements).sum();
    let bytes: u64 = model.tensors().map(|t| t.n_bytes).sum();
    writeln!(
        w,
        "{:<16}{:.2} M in {} tensors, {}",
        "parameters",
        params as f64 / 1e6,
        model.tensor_count(),
        human_bytes(bytes)
    )?;
    if let Some(arch) = arch {
        let prefix = format!("{arch}.");
        let hparams: Vec<String> = md
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(&prefix)
                    .map(|k| format!("{k} = {}", value_text(v)))
            })
            .collect();
        if !hparams.is_empty() {
            writeln!(w, "hyper-parameters")?;
            for h in hparams {
                writeln!(w, "  {h}")?;
            }
        }
    }
    let tok_model = md.get_str("tokenizer.ggml.model").ok().flatten();
    if let Some(tm) = tok_model {
        // What the tokenizer loader made of the vocabulary; the raw metadata when it
        // could not load it (`runnable` then says why).
        let head = match &verdict.tokenizer {
            Some(t) => format!(
                "{}, {} tokens, pre {} ({}; {})",
                t.model,
                t.n_tokens,
                if t.pre.is_empty() { "(none)" } else { &t.pre },
                t.rule_set,
                if t.pre_known { "known" } else { "GUESSED" }
            ),
            None => {
                let n = md
                    .get_array("tokenizer.ggml.tokens")
                    .ok()
                    .flatten()
                    .map_or(0, |a| a.len());
                let pre = md
                    .get_str("tokenizer.ggml.pre")
                    .ok()
                    .flatten()
                    .unwrap_or("(none)");
                format!("{tm}, {n} tokens, pre {pre}")
            }
        };
        let merges = md
            .get_array("tokenizer.ggml.merges")
            .ok()
            .flatten()
            .map_or(0, |a| a.len());
        let tmpl = md.get("tokenizer.chat_template").is_some();
        writeln!(
            w,
            "{:<16}{head}, {merges} merges, chat template: {}",
            "tokenizer",
            if tmpl { "yes" } else { "no" }
        )?;
        for note in verdict.tokenizer.iter().flat_map(|t| &t.notes) {
            writeln!(w, "{:<16}{note}", "")?;
        }
    }
    let mix: Vec<String> = type_mix(model)
        .into_iter()
        .map(|(ty, (n, b))| format!("{ty} x{n} ({})", human_bytes(b)))
        .collect();
    writeln!(
        w,
        "{:<16}{}{}",
        "quantisation",
        file_type(model)
            .map(|f| format!("{f}: "))
            .unwrap_or_default(),
        mix.join(", ")
    )?;
    match &verdict.refusal {
        None => writeln!(w, "{:<16}yes", "runnable")?,
        Some(why) => writeln!(w, "{:<16}no: {why}", "runnable")?,
    }
    if verdict.unread.is_empty() {
        writeln!(w, "{:<16}none", "unread")?;
    } else {
        writeln!(w, "{:<16}{}", "unread", verdict.unread.join(", "))?;
    }
    writeln!(w, "metadata ({} keys)", md.len())?;
    for (k, v) in md.iter() {
        writeln!(
            w,
            "  {k:<40} {:<8} {}",
            v.value_type().name(),
            value_text(v)
        )?;
    }
    if args.tensors {
        writeln!(w, "tensors ({})", model.tensor_count())?;
        writeln!(
            w,
            "  {:<40} {:<8} {:<24} {:>12} {:>14}",
            "name", "type", "shape", "bytes", "offset"
        )?;
        for t in model.tensors() {
            let shape = t
                .shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" x ");
            writeln!(
                w,
                "  {:<40} {:<8} {:<24} {:>12} {:>14}",
                t.name,
                t.ty.name(),
                shape,
                t.n_bytes,
                t.offset
            )?;
        }
    }
    Ok(())
}
