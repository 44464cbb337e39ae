//! Reading importance-matrix files as llama.cpp's `common_imatrix_load` does: the GGUF
//! file llama-imatrix writes, or (when the bytes are not GGUF) its legacy `.dat` file.
//! Outside data: every count and length is checked against the bytes, and a problem is
//! an error naming the file and what is wrong.

use crate::ImatrixError;
use llamay_formats::GgmlType;
use llamay_gguf::{GgufFile, TensorInfo};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// One matrix's data as a file holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadedEntry {
    /// GGUF: the raw Σx² (`in_sum2`); legacy: each column's mean times the chunks.
    pub sums: Vec<f32>,
    /// Σx (`in_sum`), where the file has it.
    pub activations: Option<Vec<f32>>,
    /// GGUF: rows per matrix (one per expert); legacy: one, the chunks (`ncall`).
    pub counts: Vec<i64>,
}

/// A whole file.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub entries: BTreeMap<String, LoadedEntry>,
    pub datasets: Vec<String>,
    pub chunk_count: u32,
    pub chunk_size: u32,
    pub n_layer_nextn: u32,
    pub legacy: bool,
    /// A GGUF file with the `imatrix.datasets`, `chunk_count` and `chunk_size` keys
    /// (llama-quantize refuses one without them).
    pub has_metadata: bool,
}

impl Loaded {
    /// What llama-quantize hands its quantisers: per matrix, per column, the mean of
    /// the squares (a GGUF file's sums over each expert's count; an expert with no
    /// row weighs every column 1; a legacy file's values over its chunk count).
    pub fn quant_weights(&self) -> HashMap<String, Vec<f32>> {
        let mut out = HashMap::new();
        for (name, e) in &self.entries {
            let mut w = vec![0f32; e.sums.len()];
            if self.legacy {
                let ncall = e.counts.first().copied().unwrap_or(0);
                for (o, &s) in w.iter_mut().zip(&e.sums) {
                    *o = if ncall > 0 { s / ncall as f32 } else { s };
                }
            } else if !e.counts.is_empty() {
                let ne0 = e.sums.len() / e.counts.len();
                for (j, &count) in e.counts.iter().enumerate() {
                    let count = count as f32;
                    let rows = &e.sums[j * ne0..(j + 1) * ne0];
                    for (o, &s) in w[j * ne0..(j + 1) * ne0].iter_mut().zip(rows) {
                        *o = if count > 0.0 { s / count } else { 1.0 };
                    }
                }
            }
            out.insert(name.clone(), w);
        }
        out
    }
}

/// Reads `path` (GGUF or legacy).
pub fn read(path: &Path) -> Result<Loaded, ImatrixError> {
    let bytes = std::fs::read(path).map_err(|e| ImatrixError::File {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    read_bytes(&bytes).map_err(|why| ImatrixError::File {
        path: path.to_path_buf(),
        why,
    })
}

/// Reads a file's bytes (GGUF or legacy); the error says what is wrong.
pub fn read_bytes(bytes: &[u8]) -> Result<Loaded, String> {
    if bytes.starts_with(b"GGUF") {
        let file = GgufFile::parse(bytes).map_err(|e| format!("not a readable GGUF file: {e}"))?;
        return read_gguf(&file);
    }
    read_legacy(bytes)
}

fn read_gguf(file: &GgufFile<'_>) -> Result<Loaded, String> {
    let md = &file.metadata;
    if file.tensors.is_empty() {
        return Err("no data in the file (no tensors)".into());
    }
    let mut out = Loaded::default();
    if let Some(kind) = md.get_str("general.type").ok().flatten()
        && kind != "imatrix"
    {
        return Err(format!(
            "general.type is '{kind}', not 'imatrix': this is not an importance matrix (a model file?)"
        ));
    }
    if let Some(strings) =
        (md.get_array("imatrix.datasets").ok().flatten()).and_then(|a| a.as_strings())
    {
        for s in strings.iter() {
            out.datasets.push(s.to_string_lossy().into_owned());
        }
    }
    let u32_of = |key: &str| -> Result<Option<u32>, String> {
        match md.get_u64(key) {
            Ok(v) => v
                .map(|v| u32::try_from(v).map_err(|_| format!("{key} = {v} is out of range")))
                .transpose(),
            Err(e) => Err(e.to_string()),
        }
    };
    let count = u32_of("imatrix.chunk_count")?;
    let size = u32_of("imatrix.chunk_size")?;
    out.has_metadata = md.get("imatrix.datasets").is_some() && count.is_some() && size.is_some();
    out.chunk_count = count.unwrap_or(0);
    out.chunk_size = size.unwrap_or(0);
    out.n_layer_nextn = u32_of("imatrix.n_layer_nextn")?.unwrap_or(0);

    #[derive(Default)]
    struct Parts<'f, 'a> {
        in_sum: Option<&'f TensorInfo<'a>>,
        in_sum2: Option<&'f TensorInfo<'a>>,
        counts: Option<&'f TensorInfo<'a>>,
    }
    let mut by_name: BTreeMap<&str, Parts<'_, '_>> = BTreeMap::new();
    for t in &file.tensors {
        // `.in_sum2` before `.in_sum`: the one is a suffix of neither, but test the longer first.
        if let Some(n) = t.name.strip_suffix(".in_sum2") {
            by_name.entry(n).or_default().in_sum2 = Some(t);
        } else if let Some(n) = t.name.strip_suffix(".in_sum") {
            by_name.entry(n).or_default().in_sum = Some(t);
        } else if let Some(n) = t.name.strip_suffix(".counts") {
            by_name.entry(n).or_default().counts = Some(t);
        }
    }
    for (name, p) in by_name {
        let (Some(in_sum2), Some(counts)) = (p.in_sum2, p.counts) else {
            return Err(format!("mismatched sums and counts for {name}"));
        };
        if p.in_sum.is_some_and(|s| s.n_elements != in_sum2.n_elements) {
            return Err(format!("mismatched sums and counts for {name}"));
        }
        let sums = f32s(in_sum2)?;
        let counts = f32s(counts)?;
        // Rows counted: whole numbers an f32 holds (2^53 is far beyond any run).
        if let Some(c) = (counts.iter()).find(|c| !(0.0..=crate::MAX_COUNT as f32).contains(*c)) {
            return Err(format!("{name}: a row count of {c} is not a count"));
        }
        if counts.is_empty() || !sums.len().is_multiple_of(counts.len()) {
            return Err(format!(
                "{name}: {} sums do not split over {} counts",
                sums.len(),
                counts.len()
            ));
        }
        out.entries.insert(
            name.to_string(),
            LoadedEntry {
                sums,
                activations: p.in_sum.map(f32s).transpose()?,
                counts: counts.iter().map(|&c| c.round() as i64).collect(),
            },
        );
    }
    if out.entries.is_empty() {
        return Err(
            "no importance-matrix data in the file (no <name>.in_sum2 and <name>.counts tensors)"
                .into(),
        );
    }
    Ok(out)
}

fn f32s(t: &TensorInfo<'_>) -> Result<Vec<f32>, String> {
    if t.ty != GgmlType::F32 {
        return Err(format!(
            "sums and counts for {} must be F32, not {}",
            t.name, t.ty
        ));
    }
    Ok(t.data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// The legacy format: `n_entries`, then per entry the name, `ncall`, `nval` and the
/// values; optionally the chunk count and the dataset's name at the end.
fn read_legacy(bytes: &[u8]) -> Result<Loaded, String> {
    let mut r = Cursor { bytes, at: 0 };
    let n_entries = r.i32().map_err(|_| "no data in the file".to_string())?;
    if n_entries < 1 {
        return Err(format!(
            "no data in the file ({n_entries} entries): neither an imatrix GGUF file nor a legacy .dat file"
        ));
    }
    let mut out = Loaded {
        legacy: true,
        ..Loaded::default()
    };
    for i in 0..n_entries {
        let bad = |what: &str| {
            format!(
                "truncated or malformed legacy imatrix: {what} of entry {}",
                i + 1
            )
        };
        let len = r.i32().map_err(|_| bad("the name length"))?;
        let name = r
            .take(usize::try_from(len).map_err(|_| bad("the name length"))?)
            .map_err(|_| bad("the name"))?;
        // llama.cpp reads the name as a C string.
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        let name = String::from_utf8_lossy(name).into_owned();
        let ncall = r.i32().map_err(|_| bad("the call count"))?;
        if ncall < 0 {
            return Err(bad("the call count (negative)"));
        }
        let nval = r.i32().map_err(|_| bad("the value count"))?;
        if nval < 1 {
            return Err(bad("the value count"));
        }
        let raw = r
            .take(
                (nval as usize)
                    .checked_mul(4)
                    .ok_or_else(|| bad("the value count"))?,
            )
            .map_err(|_| bad("the values"))?;
        let sums = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.entries.insert(
            name,
            LoadedEntry {
                sums,
                activations: None,
                counts: vec![i64::from(ncall)],
            },
        );
    }
    // The chunk count and dataset name are optional.
    if r.at < bytes.len()
        && let Ok(n) = r.i32()
    {
        out.chunk_count = n.max(0) as u32;
        if let Ok(len) = r.i32()
            && len > 0
            && let Ok(name) = r.take(len as usize)
        {
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            out.datasets
                .push(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok(out)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ()> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(())?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn i32(&mut self) -> Result<i32, ()> {
        let b = self.take(4)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}
