//! `llamay quantize`: rewrite a GGUF model with its weight matrices in other formats,
//! as llama-quantize b11434 does, byte for byte.
//!
//! Which type each tensor gets follows llama.cpp's rules (`preset.rs`: the presets'
//! per-tensor mixtures, `--pure`, the fallbacks when a row does not split into blocks,
//! the flags that override them). The file is laid out as llama-quantize lays it out:
//! its tensor order (by layer, then name), the input's metadata with the split keys
//! removed and `general.quantization_version` then `general.file_type` (then any
//! `--override-kv`) moved to the end, 32-byte alignment. The output is written to a
//! temporary file and renamed into place only when complete, so a failure never
//! leaves a partial model under the output name.

mod preset;

pub use llamay_imatrix;
pub use preset::{
    Ftype, ModelFacts, Overrides, Planner, allows_quantization, parse_type, tensor_order,
};

use llamay_formats::{FormatError, GgmlType, dequantize, quantize_weighted};
use llamay_gguf::{GgufWriter, MappedModel, Model, OpenError, TensorInfo, Value, WriteError};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A `--override-kv` value, written as llama-quantize writes it (an integer as a u32 of
/// its magnitude, a float as f32).
#[derive(Clone, Debug, PartialEq)]
pub enum KvOverride {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

impl KvOverride {
    /// llama.cpp's `KEY=TYPE:VALUE` (TYPE: int, float, bool, str).
    pub fn parse(s: &str) -> Result<(String, KvOverride), String> {
        let bad = |why: &str| {
            format!("--override-kv '{s}': {why} (KEY=TYPE:VALUE, TYPE int, float, bool or str)")
        };
        let (key, rest) = s.split_once('=').ok_or_else(|| bad("no '='"))?;
        if key.is_empty() || key.len() >= 128 {
            return Err(bad("the key must be 1 to 127 bytes"));
        }
        let (ty, v) = rest
            .split_once(':')
            .ok_or_else(|| bad("no ':' after the type"))?;
        let value = match ty {
            "int" => KvOverride::Int(v.parse().map_err(|_| bad("not an integer"))?),
            "float" => KvOverride::Float(v.parse().map_err(|_| bad("not a number"))?),
            "bool" => match v {
                "true" => KvOverride::Bool(true),
                "false" => KvOverride::Bool(false),
                _ => return Err(bad("a bool is true or false")),
            },
            "str" if v.len() < 128 => KvOverride::Str(v.to_string()),
            "str" => return Err(bad("a string value is at most 127 bytes")),
            _ => return Err(bad("unknown type")),
        };
        Ok((key.to_string(), value))
    }

    fn value(&self) -> Value<'_> {
        match self {
            KvOverride::Int(i) => Value::U32(i.unsigned_abs() as u32),
            KvOverride::Float(f) => Value::F32(*f as f32),
            KvOverride::Bool(b) => Value::Bool(*b),
            KvOverride::Str(s) => Value::String(s.as_str().into()),
        }
    }
}

/// What to write: llama-quantize's file type and flags.
#[derive(Clone, Debug)]
pub struct Request {
    pub ftype: Ftype,
    /// `COPY`: every tensor as it is, the input's file type kept.
    pub copy: bool,
    pub overrides: Overrides,
    /// `--allow-requantize`: a quantised input tensor may be converted again.
    pub allow_requantize: bool,
    /// `--override-kv`, in order.
    pub kv: Vec<(String, KvOverride)>,
    /// `--prune-layers`: blocks left out (the later ones renumbered).
    pub prune: Vec<u32>,
    /// `--dry-run`: plan and report the sizes, write nothing.
    pub dry_run: bool,
    /// `--imatrix`: the importance matrix the quantisers weigh their error by.
    pub imatrix: Option<ImportanceMatrix>,
    /// `--keep-split`: one output file per input shard (see [`split_path`]), tensors in
    /// the input's order.
    pub keep_split: bool,
}

/// An importance matrix as llama-quantize uses it (`load_imatrix`, `prepare_imatrix`).
#[derive(Clone, Debug)]
pub struct ImportanceMatrix {
    /// The path as given (written to `quantize.imatrix.file`).
    pub file: String,
    /// Per matrix name, per column (per expert, one after another): the weights.
    pub weights: HashMap<String, Vec<f32>>,
    pub datasets: Vec<String>,
    /// The chunks it was computed on (0: unknown).
    pub chunk_count: u32,
}

impl ImportanceMatrix {
    /// Reads `path` (llama-imatrix's GGUF or legacy file), keeps the entries whose
    /// names contain none of `exclude` and (if any are given) one of `include`, as
    /// `--exclude-weights` / `--include-weights` do. `None` when no entry is left.
    pub fn load(
        path: &Path,
        include: &[String],
        exclude: &[String],
    ) -> Result<Option<Self>, QuantizeError> {
        let loaded = llamay_imatrix::read(path)
            .map_err(|e| QuantizeError::Unsupported(format!("--imatrix: {e}")))?;
        if !loaded.legacy && !loaded.has_metadata {
            return Err(QuantizeError::Unsupported(format!(
                "--imatrix {}: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size)",
                path.display()
            )));
        }
        let mut weights = loaded.quant_weights();
        weights.retain(|name, _| !exclude.iter().any(|x| name.contains(x.as_str())));
        if !include.is_empty() {
            weights.retain(|name, _| include.iter().any(|x| name.contains(x.as_str())));
        }
        if weights.is_empty() {
            return Ok(None);
        }
        for (name, w) in &weights {
            if let Some(v) = w.iter().find(|v| !v.is_finite()) {
                return Err(QuantizeError::Unsupported(format!(
                    "--imatrix {}: the entry for {name} contains the non-finite value {v}",
                    path.display()
                )));
            }
        }
        Ok(Some(ImportanceMatrix {
            file: path.to_string_lossy().into_owned(),
            weights,
            datasets: loaded.datasets,
            chunk_count: loaded.chunk_count,
        }))
    }

    /// The keys llama-quantize records about it, after the user's overrides.
    fn kv(&self) -> Vec<(String, KvOverride)> {
        // llama.cpp copies the strings into 128-byte fields.
        let cut = |s: &str| {
            let mut end = s.len().min(127);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_string()
        };
        let mut kv = vec![(
            "quantize.imatrix.file".to_string(),
            KvOverride::Str(cut(&self.file)),
        )];
        if let Some(d) = self.datasets.first() {
            kv.push((
                "quantize.imatrix.dataset".to_string(),
                KvOverride::Str(cut(d)),
            ));
        }
        kv.push((
            "quantize.imatrix.entries_count".to_string(),
            KvOverride::Int(self.weights.len() as i64),
        ));
        if self.chunk_count > 0 {
            kv.push((
                "quantize.imatrix.chunks_count".to_string(),
                KvOverride::Int(i64::from(self.chunk_count)),
            ));
        }
        kv
    }

    /// `t`'s weights, checked against its size (one per column, per expert); `None`
    /// where the matrix has no entry, or a token embedding's entry does not fit (llama-
    /// quantize ignores that one).
    fn for_tensor(&self, t: &TensorInfo<'_>) -> Result<Option<&[f32]>, QuantizeError> {
        let Some(w) = self.weights.get(t.name) else {
            return Ok(None);
        };
        let want = t.row_len() * t.shape.get(2).copied().unwrap_or(1);
        if w.len() as u64 == want {
            return Ok(Some(w));
        }
        if preset::is_token_embedding(t.name) {
            return Ok(None);
        }
        Err(QuantizeError::Unsupported(format!(
            "imatrix size {} is different from tensor size {want} for {} (an importance matrix of another model?)",
            w.len(),
            t.name
        )))
    }
}

impl Request {
    /// The file type `name` names (llama-quantize's names), nothing else asked.
    pub fn named(name: &str) -> Result<Request, String> {
        let (ftype, copy) = Ftype::parse(name)?;
        Ok(Request {
            ftype,
            copy,
            overrides: Overrides::default(),
            allow_requantize: false,
            kv: Vec::new(),
            prune: Vec::new(),
            dry_run: false,
            imatrix: None,
            keep_split: false,
        })
    }
}

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

/// Converts `input` to `output`. `report` is called once per tensor, in the output's
/// order, after that tensor has been converted.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    request: &Request,
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
    let facts = model_facts(&model);
    let mut all: Vec<&TensorInfo<'_>> = model.tensors().collect();
    all.sort_by(|a, b| tensor_order(a.name, b.name));
    // The input's file type, for COPY (llama.cpp's loader reads or guesses it from
    // every tensor, pruned ones included).
    let input_file_type = model
        .metadata()
        .get_u64("general.file_type")
        .ok()
        .flatten()
        .map_or_else(|| guessed_file_type(&all), |v| v as u32);
    // --prune-layers: the pruned blocks' tensors dropped, the later blocks renumbered.
    let mut prune = preset::Pruning::new(&request.prune);
    let mut tensors: Vec<(&TensorInfo<'_>, String)> = all
        .iter()
        .filter_map(|t| prune.rename(t.name).map(|n| (*t, n)))
        .collect();
    // Each tensor's (input shard, offset): --keep-split writes them in that order.
    let placement: HashMap<&str, (usize, u64)> = (model.shards.iter().enumerate())
        .flat_map(|(s, f)| f.tensors.iter().map(move |t| (t.name, (s, t.offset))))
        .collect();
    if request.keep_split {
        tensors.sort_by_key(|(t, _)| placement[t.name]);
    }

    // The types first (llama.cpp plans every tensor before it writes one).
    let mut planner = Planner::new(
        request.ftype,
        request.copy,
        &facts,
        &request.overrides,
        tensors.iter().map(|(_, n)| n.as_str()),
    )
    .with_imatrix(request.imatrix.is_some());
    let mut plans = Vec::with_capacity(tensors.len());
    for (t, name) in &tensors {
        let to = planner
            .plan(name, &t.shape, t.ty)
            .map_err(QuantizeError::Unsupported)?;
        // A dry run only reports (llama-quantize warns that an imatrix will be needed).
        if preset::requires_imatrix(name, to, request.ftype) {
            match &request.imatrix {
                None if request.dry_run => {}
                None => {
                    return Err(QuantizeError::Unsupported(format!(
                        "{} requires an importance matrix (tensor '{}' would be {to}), as llama-quantize does: give one with --imatrix FILE (llamay imatrix makes it), or use another preset",
                        request.ftype.name(),
                        t.name
                    )));
                }
                Some(m) if to != t.ty && m.for_tensor(t)?.is_none() => {
                    return Err(QuantizeError::Unsupported(format!(
                        "missing importance matrix for tensor '{}' in a very low-bit quantization ({to}): the --imatrix file has no entry for it",
                        t.name
                    )));
                }
                Some(_) => {}
            }
        }
        if to != t.ty {
            if !t.ty.is_readable() {
                return Err(QuantizeError::Unsupported(format!(
                    "tensor '{}' is {}, which llamay cannot read, so it cannot be converted to {to}",
                    t.name, t.ty
                )));
            }
            if preset::is_quantized(t.ty) && !request.allow_requantize && !request.dry_run {
                return Err(QuantizeError::Unsupported(format!(
                    "tensor '{}' is already quantised ({}); requantising it to {to} loses precision twice — pass --allow-requantize to do it anyway, or start from an F32/F16/BF16 file",
                    t.name, t.ty
                )));
            }
            if !to.is_writable() {
                return Err(QuantizeError::Unsupported(format!(
                    "tensor '{}' would be {to}, which llamay does not write",
                    t.name
                )));
            }
        }
        plans.push(to);
    }

    let file_type = if request.copy {
        input_file_type
    } else {
        request.ftype.id()
    };
    let mut kvs: Vec<(&str, Value<'_>)> = model
        .metadata()
        .iter()
        .filter(|(k, _)| !SPLIT_KEYS.contains(k))
        .map(|(k, v)| (k, v.clone()))
        .collect();
    // gguf_set_val_*: an existing key is removed and the new one appended.
    let mut set = |k: &'static str, v: Value<'static>| {
        kvs.retain(|(key, _)| *key != k);
        kvs.push((k, v));
    };
    set(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    set("general.file_type", Value::U32(file_type));
    let imatrix_kv = request
        .imatrix
        .as_ref()
        .map(ImportanceMatrix::kv)
        .unwrap_or_default();
    for (k, v) in request.kv.iter().chain(&imatrix_kv) {
        kvs.retain(|(key, _)| key != k);
        kvs.push((k.as_str(), v.value()));
    }
    let block_count = format!("{}.block_count", facts.arch);
    if let Some(n) = prune.block_count() {
        kvs.retain(|(key, _)| *key != block_count);
        kvs.push((block_count.as_str(), Value::U32(n)));
    }

    let report_of = |t: &TensorInfo<'_>, name: &str, to: GgmlType, n_bytes_out: u64| TensorReport {
        name: name.to_string(),
        from: t.ty,
        to,
        note: note(&facts.arch, t, to, request),
        n_bytes_in: t.n_bytes,
        n_bytes_out,
    };
    if request.dry_run {
        // llama-quantize's --dry-run: the plan and its sizes, nothing written.
        let reports = tensors
            .iter()
            .zip(&plans)
            .map(|((t, name), &to)| {
                let bytes = if to == t.ty {
                    t.n_bytes
                } else {
                    to.bytes_for(t.n_elements).unwrap_or(0)
                };
                report_of(t, name, to, bytes)
            })
            .inspect(|r| report(r))
            .collect();
        return Ok(reports);
    }

    // The files: one, or with --keep-split one per input shard (llama-quantize's
    // names; the first holds the metadata, every one the split keys).
    let shard_of: Vec<usize> = tensors.iter().map(|(t, _)| placement[t.name].0).collect();
    let n_split = if request.keep_split {
        shard_of.iter().max().map_or(1, |m| m + 1)
    } else {
        1
    };
    let mut files = Vec::with_capacity(n_split);
    for i in 0..n_split {
        let path = match request.keep_split {
            true => split_path(output, i, n_split),
            false => output.to_path_buf(),
        };
        let werr = |source| QuantizeError::Write {
            path: path.clone(),
            source,
        };
        let mut w = GgufWriter::new();
        if i == 0 {
            for (k, v) in &kvs {
                w.add_kv(k, v.clone()).map_err(werr)?;
            }
        }
        if n_split > 1 {
            w.add_kv("split.no", Value::U16(i as u16)).map_err(werr)?;
            w.add_kv("split.count", Value::U16(n_split as u16))
                .map_err(werr)?;
            w.add_kv("split.tensors.count", Value::I32(tensors.len() as i32))
                .map_err(werr)?;
        }
        let mine: Vec<usize> = (0..tensors.len())
            .filter(|&j| !request.keep_split || shard_of[j] == i)
            .collect();
        for &j in &mine {
            let ((t, name), to) = (&tensors[j], plans[j]);
            // ggml writes a tensor's ggml_n_dims: trailing dimensions of 1 are dropped
            // (a [256, 1] input is [256] in llama-quantize's file).
            let n_dims = preset::n_dims(&t.shape).min(t.shape.len());
            w.add_tensor(name, to, &t.shape[..n_dims]).map_err(werr)?;
        }
        files.push((path, w, mine));
    }
    let mut reports = Vec::with_capacity(tensors.len());
    let mut written: Vec<(PathBuf, PathBuf)> = Vec::new();
    for (path, w, mine) in files {
        let tmp = temp_path(&path);
        written.push((tmp.clone(), path.clone()));
        let result = write_file(&tmp, &path, &w, |k| {
            let ((t, name), to) = (&tensors[mine[k]], plans[mine[k]]);
            let data = if to == t.ty {
                Cow::Borrowed(t.data)
            } else {
                let weights = match &request.imatrix {
                    Some(m) => m.for_tensor(t)?,
                    None => None,
                };
                Cow::Owned(convert(t, to, weights, threads)?)
            };
            let r = report_of(t, name, to, data.len() as u64);
            report(&r);
            reports.push(r);
            Ok(data)
        });
        if let Err(e) = result {
            // Nothing under a final name: every file written so far goes.
            for (tmp, _) in &written {
                let _ = std::fs::remove_file(tmp);
            }
            return Err(e);
        }
    }
    for (tmp, path) in &written {
        if let Err(source) = std::fs::rename(tmp, path) {
            for (tmp, _) in &written {
                let _ = std::fs::remove_file(tmp);
            }
            return Err(QuantizeError::Io {
                path: path.clone(),
                source,
            });
        }
    }
    Ok(reports)
}

/// Writes `w` to `tmp` (the caller renames it to `path` when every file is whole),
/// tensor `k`'s bytes from `data(k)`.
fn write_file<'a>(
    tmp: &Path,
    path: &Path,
    w: &GgufWriter<'a>,
    mut data: impl FnMut(usize) -> Result<Cow<'a, [u8]>, QuantizeError>,
) -> Result<(), QuantizeError> {
    let io = |source| QuantizeError::Io {
        path: tmp.to_path_buf(),
        source,
    };
    let file = File::create(tmp).map_err(io)?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut failure: Option<QuantizeError> = None;
    let result = w.write(&mut out, |k| {
        data(k).map_err(|e| {
            let msg = e.to_string();
            failure = Some(e);
            WriteError::Invalid(msg)
        })
    });
    result
        .map_err(|e| {
            failure.take().unwrap_or_else(|| QuantizeError::Write {
                path: path.to_path_buf(),
                source: e,
            })
        })
        .and_then(|()| out.flush().map_err(io))
}

/// llama.cpp's `llama_split_path`: `PREFIX-00001-of-00003.gguf`, where PREFIX is the
/// output with its `.gguf` taken off (llama-quantize's `--keep-split`).
pub fn split_path(output: &Path, i: usize, n: usize) -> PathBuf {
    let s = output.to_string_lossy();
    // llama-quantize drops the suffix's length when the name contains ".gguf" at all.
    let prefix = if s.contains(".gguf") {
        &s[..s.len().saturating_sub(5)]
    } else {
        &s[..]
    };
    PathBuf::from(format!("{prefix}-{:05}-of-{n:05}.gguf", i + 1))
}

/// The keys llama-quantize removes (`LLM_KV_SPLIT_*`): a split input becomes one file.
const SPLIT_KEYS: &[&str] = &["split.no", "split.count", "split.tensors.count"];

/// Why a tensor's type is not the file type's default, when it is not.
fn note(arch: &str, t: &TensorInfo<'_>, to: GgmlType, request: &Request) -> Option<String> {
    let default = request.ftype.default_type();
    if request.copy || to == default {
        return None;
    }
    if to == t.ty && !allows_quantization(arch, t.name, &t.shape, request.overrides.leave_output) {
        return Some("kept: not a quantised weight".into());
    }
    let ne0 = t.shape.first().copied().unwrap_or(1);
    if ne0 % default.block_size() != 0 {
        return Some(format!(
            "row length {ne0} is not a multiple of {} for {default}",
            default.block_size()
        ));
    }
    Some(format!("{to} by the preset's rules"))
}

/// llama.cpp's guess of a file's type when it names none (`LLAMA_FTYPE_GUESSED` set):
/// from the most frequent tensor type, the first to reach that count in its order.
fn guessed_file_type(tensors: &[&TensorInfo<'_>]) -> u32 {
    const GUESSED: u32 = 1024;
    const BY_TYPE: &[(GgmlType, u32)] = &[
        (GgmlType::F32, 0),
        (GgmlType::F16, 1),
        (GgmlType::BF16, 32),
        (GgmlType::Q4_0, 2),
        (GgmlType::Q4_1, 3),
        (GgmlType::Q5_0, 8),
        (GgmlType::Q5_1, 9),
        (GgmlType::Q8_0, 7),
        (GgmlType::Q2_K, 10),
        (GgmlType::Q3_K, 12),
        (GgmlType::Q4_K, 15),
        (GgmlType::Q5_K, 17),
        (GgmlType::Q6_K, 18),
        (GgmlType::TQ1_0, 36),
        (GgmlType::TQ2_0, 37),
        (GgmlType::IQ2_XXS, 19),
        (GgmlType::IQ2_XS, 20),
        (GgmlType::IQ2_S, 28),
        (GgmlType::IQ3_XXS, 23),
        (GgmlType::IQ1_S, 24),
        (GgmlType::IQ1_M, 31),
        (GgmlType::IQ4_NL, 25),
        (GgmlType::IQ4_XS, 30),
        (GgmlType::IQ3_S, 26),
        (GgmlType::NVFP4, 39),
    ];
    let mut counts = std::collections::HashMap::new();
    let (mut best, mut best_n) = (GgmlType::F32, 0);
    for t in tensors {
        let n = counts.entry(t.ty).or_insert(0u32);
        *n += 1;
        if *n > best_n {
            (best, best_n) = (t.ty, *n);
        }
    }
    GUESSED
        | BY_TYPE
            .iter()
            .find(|(t, _)| *t == best)
            .map_or(0, |(_, f)| *f)
}

/// The shape facts llama.cpp's rules read, from the metadata.
fn model_facts(model: &Model<'_>) -> ModelFacts {
    let md = model.metadata();
    let arch = md.architecture().ok().flatten().unwrap_or("").to_string();
    let int = |key: &str| -> Option<u64> {
        // A per-layer array counts by its first layer (llama.cpp's `n_head(0)`).
        match md.get(&format!("{arch}.{key}"))? {
            Value::Array(a) => a.get(0)?.as_u64(),
            v => v.as_u64(),
        }
    };
    let n_layer = int("block_count").unwrap_or(0) as u32;
    let n_expert = int("expert_count").unwrap_or(0) as u32;
    let n_head = int("attention.head_count").unwrap_or(0);
    let n_head_kv = int("attention.head_count_kv").unwrap_or(n_head);
    let n_gqa = n_head.checked_div(n_head_kv).unwrap_or(0) as u32;
    ModelFacts::new(&arch, n_layer, n_expert, n_gqa)
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

/// Dequantises `t` and quantises it to `to`, rows split across `threads`; `weights`
/// (one per column, per expert of a stacked tensor) steer the quantisers as an
/// importance matrix does.
fn convert(
    t: &TensorInfo<'_>,
    to: GgmlType,
    weights: Option<&[f32]>,
    threads: usize,
) -> Result<Vec<u8>, QuantizeError> {
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
    // An expert's rows take that expert's weights.
    let rows_per_expert = t.shape.get(1).map_or(1, |&n| n.max(1) as usize);
    let convert_rows = |first: usize, src: &[u8], dst: &mut [u8]| -> Result<(), FormatError> {
        let mut row = vec![0f32; row_len];
        for (r, dst_row) in dst.chunks_mut(out_row).enumerate() {
            dequantize(t.ty, &src[r * in_row..(r + 1) * in_row], &mut row)?;
            let expert = (first + r) / rows_per_expert;
            let w = weights.and_then(|w| w.get(expert * row_len..(expert + 1) * row_len));
            let q = quantize_weighted(to, &row, row_len, w)?;
            dst_row.copy_from_slice(&q);
        }
        Ok(())
    };
    if threads == 1 {
        // No thread to spawn (and none can be on WASI preview 1).
        convert_rows(0, t.data, &mut out).map_err(fmt_err)?;
        return Ok(out);
    }
    let results: Vec<Result<(), FormatError>> = std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(rows_per * out_row)
            .enumerate()
            .map(|(c, dst)| {
                let src = &t.data[c * rows_per * in_row..];
                s.spawn(move || convert_rows(c * rows_per, src, dst))
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
