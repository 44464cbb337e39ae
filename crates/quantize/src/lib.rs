//! `llamay quantize`: rewrite a GGUF model with its weight matrices in another format.
//!
//! Which tensors are converted follows llama.cpp's `llama-quantize --pure` rules
//! (`tensor_allows_quantization` and `tensor_type_fallback` in b11434's
//! `src/llama-quant.cpp`): matrices named `*weight` except norms, routers and a few
//! special tensors; a row length the target's block does not divide falls back to the
//! type llama.cpp falls back to. Everything else is copied byte for byte, metadata too,
//! with `general.file_type` and `general.quantization_version` set as llama.cpp sets
//! them. The output is written to a temporary file and renamed into place only when
//! complete, so a failure never leaves a partial model under the output name.

mod select;

pub use select::{Target, tensor_plan};

use llamay_formats::{FormatError, GgmlType, dequantize, quantize};
use llamay_gguf::{GgufWriter, MappedModel, OpenError, TensorInfo, Value, WriteError};
use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("{0}")]
    Unsupported(String),
    #[error("tensor '{tensor}': {source}")]
    Format { tensor: String, source: FormatError },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: WriteError },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What happened to one tensor.
#[derive(Clone, Debug)]
pub struct TensorReport {
    pub name: String,
    pub from: GgmlType,
    pub to: GgmlType,
    /// Why the type differs from the target (kept, or a fallback), if it does.
    pub note: Option<String>,
    pub n_bytes_in: u64,
    pub n_bytes_out: u64,
}

/// Converts `input` to `output`. `report` is called once per tensor, in file order,
/// after that tensor has been converted.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    target: Target,
    threads: usize,
    mut report: impl FnMut(&TensorReport),
) -> Result<Vec<TensorReport>, QuantizeError> {
    let mapped = MappedModel::open(input)?;
    let model = mapped.parse()?;
    if model.big_endian() {
        return Err(QuantizeError::Unsupported(
            "the input is a big-endian GGUF; convert it with gguf-py's gguf_convert_endian first"
                .into(),
        ));
    }
    let arch = model
        .metadata()
        .architecture()
        .ok()
        .flatten()
        .unwrap_or("")
        .to_string();

    let mut w = GgufWriter::new();
    let werr = |source| QuantizeError::Write {
        path: output.to_path_buf(),
        source,
    };
    let mut saw_file_type = false;
    let mut saw_qversion = false;
    for (k, v) in model.metadata().iter() {
        // A split input becomes one output file.
        if k.starts_with("split.") {
            continue;
        }
        let v = match k {
            "general.file_type" => {
                saw_file_type = true;
                Value::U32(target.file_type())
            }
            "general.quantization_version" => {
                saw_qversion = true;
                Value::U32(QUANTIZATION_VERSION)
            }
            _ => v.clone(),
        };
        w.add_kv(k, v).map_err(werr)?;
    }
    if !saw_qversion {
        w.add_kv(
            "general.quantization_version",
            Value::U32(QUANTIZATION_VERSION),
        )
        .map_err(werr)?;
    }
    if !saw_file_type {
        w.add_kv("general.file_type", Value::U32(target.file_type()))
            .map_err(werr)?;
    }

    let tensors: Vec<&TensorInfo<'_>> = model.tensors().collect();
    let mut plans = Vec::with_capacity(tensors.len());
    for t in &tensors {
        let (to, note) = tensor_plan(&arch, t.name, &t.shape, t.ty, target);
        if to != t.ty && !t.ty.is_readable() {
            return Err(QuantizeError::Unsupported(format!(
                "tensor '{}' is {}, which llamay cannot read, so it cannot be converted to {to}",
                t.name, t.ty
            )));
        }
        w.add_tensor(t.name, to, &t.shape).map_err(werr)?;
        plans.push((to, note));
    }

    let tmp = temp_path(output);
    let io = |source| QuantizeError::Io {
        path: tmp.clone(),
        source,
    };
    let file = File::create(&tmp).map_err(io)?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut reports = Vec::with_capacity(tensors.len());
    let mut failure: Option<QuantizeError> = None;
    let result = w.write(&mut out, |i| {
        let t = tensors[i];
        let (to, note) = &plans[i];
        let data = if *to == t.ty {
            Cow::Borrowed(t.data)
        } else {
            match convert(t, *to, threads) {
                Ok(d) => Cow::Owned(d),
                Err(e) => {
                    let msg = e.to_string();
                    failure = Some(e);
                    return Err(WriteError::Invalid(msg));
                }
            }
        };
        let r = TensorReport {
            name: t.name.to_string(),
            from: t.ty,
            to: *to,
            note: note.clone(),
            n_bytes_in: t.n_bytes,
            n_bytes_out: data.len() as u64,
        };
        report(&r);
        reports.push(r);
        Ok(data)
    });
    let finished = result
        .map_err(|e| failure.take().unwrap_or_else(|| werr(e)))
        .and_then(|()| out.flush().map_err(io))
        .and_then(|()| std::fs::rename(&tmp, output).map_err(io));
    if let Err(e) = finished {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(reports)
}

/// llama.cpp's GGML_QNT_VERSION.
const QUANTIZATION_VERSION: u32 = 2;

fn temp_path(output: &Path) -> PathBuf {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The process id where the target has one (WASI preview 1 has none: the clock).
    let unique = if cfg!(target_family = "wasm") {
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
            .map_or(0, |d| d.as_nanos())
    } else {
        u128::from(std::process::id())
    };
    output.with_file_name(format!(".{name}.partial-{unique}"))
}

/// Dequantises `t` and quantises it to `to`, rows split across `threads`.
fn convert(t: &TensorInfo<'_>, to: GgmlType, threads: usize) -> Result<Vec<u8>, QuantizeError> {
    let fmt_err = |source| QuantizeError::Format {
        tensor: t.name.to_string(),
        source,
    };
    let row_len = t.row_len() as usize;
    let n_rows = (t.n_elements as usize).checked_div(row_len).unwrap_or(0);
    let in_row = t.ty.bytes_for(row_len as u64).unwrap_or(0) as usize;
    let out_row = to.bytes_for(row_len as u64).unwrap_or(0) as usize;
    let mut out = vec![0u8; n_rows * out_row];
    if n_rows == 0 || out_row == 0 {
        return Ok(out);
    }
    let threads = threads.clamp(1, n_rows);
    let rows_per = n_rows.div_ceil(threads);
    let convert_rows = |src: &[u8], dst: &mut [u8]| -> Result<(), FormatError> {
        let mut row = vec![0f32; row_len];
        for (r, dst_row) in dst.chunks_mut(out_row).enumerate() {
            dequantize(t.ty, &src[r * in_row..(r + 1) * in_row], &mut row)?;
            let q = quantize(to, &row)?;
            dst_row.copy_from_slice(&q);
        }
        Ok(())
    };
    if threads == 1 {
        // No thread to spawn (and none can be on WASI preview 1).
        convert_rows(t.data, &mut out).map_err(fmt_err)?;
        return Ok(out);
    }
    let results: Vec<Result<(), FormatError>> = std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(rows_per * out_row)
            .enumerate()
            .map(|(c, dst)| {
                let src = &t.data[c * rows_per * in_row..];
                s.spawn(move || convert_rows(src, dst))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(FormatError::Refused("a quantiser thread panicked".into()))
                })
            })
            .collect()
    });
    for r in results {
        r.map_err(fmt_err)?;
    }
    Ok(out)
}
