//! llama.cpp's importance matrix (b11434's `tools/imatrix`): for every weight matrix a
//! model multiplies, per input column, the sum of the squared activations it saw (and
//! their plain sum), with how many rows went in — per expert for stacked expert
//! tensors. The quantisers weigh their rounding error by it (`llamay quantize
//! --imatrix`).
//!
//! This crate owns the numbers and the files, not the forward pass: [`Imatrix`] takes
//! the rows a run feeds each matrix (`add_rows`, `add_expert_row`, as llama-imatrix's
//! `collect_imatrix` does), merges saved files (`--in-file`, its `load_imatrix`), and
//! writes llama-imatrix's GGUF file (`<name>.in_sum2`, `.counts`, `.in_sum`, `.stats`
//! and the `imatrix.*` keys) or its legacy `.dat` file. [`read`] loads either format
//! as llama.cpp's `common_imatrix_load` does; [`Loaded::quant_weights`] gives what
//! llama-quantize hands its quantisers.

mod file;
mod stats;

pub use file::{Loaded, LoadedEntry, read, read_bytes};

use llamay_gguf::{GgufWriter, Value, WriteError};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One matrix's sums: `values` (Σx², llama.cpp's `in_sum2`) and `activations` (Σx,
/// `in_sum`; empty for data that came from a legacy file) hold `cols` values per
/// matrix, `counts` the rows summed into each (one per expert of a stacked tensor,
/// one for a dense matrix).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub activations: Vec<f32>,
    pub values: Vec<f32>,
    pub counts: Vec<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImatrixError {
    #[error("{path}: {why}")]
    File { path: PathBuf, why: String },
    #[error("{0}")]
    Mismatch(String),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: WriteError },
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The file formats llama-imatrix writes (`--output-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Gguf,
    /// The legacy format (`--output-format dat`).
    Dat,
}

/// The sums of a run (and of the files merged into it).
#[derive(Clone, Debug, Default)]
pub struct Imatrix {
    /// By matrix name (`blk.0.attn_q.weight`), in name order (the files' order).
    pub stats: BTreeMap<String, Stats>,
    /// The text files the sums came from, earliest first (the merged files' own, then
    /// this run's).
    pub datasets: Vec<String>,
    /// Tokens per chunk, as the first merged GGUF file says (0: none said).
    pub file_chunk_size: u32,
    /// This run's tokens per chunk (`-c`), used where no merged file says.
    pub run_chunk_size: u32,
    /// llama-imatrix's `imatrix.n_layer_nextn` (multi-token-prediction layers), kept
    /// from merged files.
    pub n_layer_nextn: u32,
}

impl Imatrix {
    /// Empty sums for chunks of `chunk_size` tokens.
    pub fn new(chunk_size: u32) -> Imatrix {
        Imatrix {
            run_chunk_size: chunk_size,
            ..Imatrix::default()
        }
    }

    /// Tokens per chunk: a merged GGUF file's, else this run's (llama-imatrix's
    /// `e_chunk_size`).
    pub fn chunk_size(&self) -> u32 {
        if self.file_chunk_size > 0 {
            self.file_chunk_size
        } else {
            self.run_chunk_size
        }
    }

    /// Adds rows of `cols` values that a dense matrix `name` multiplied (llama-imatrix
    /// collects a `MUL_MAT` this way): Σx and Σx² per column in row order, the count
    /// by the number of rows.
    pub fn add_rows(&mut self, name: &str, x: &[f32], cols: usize) -> Result<(), ImatrixError> {
        if cols == 0 {
            return Ok(());
        }
        let e = self.stats.entry(name.to_string()).or_default();
        // One count per dense matrix (a merged file may carry one per expert, all equal).
        if e.counts.len() > 1 && e.counts.iter().all(|&c| c == e.counts[0]) {
            e.counts.truncate(1);
        }
        if e.values.is_empty() {
            e.activations = vec![0.0; cols];
            e.values = vec![0.0; cols];
            e.counts = vec![0];
        } else if e.values.len() != cols {
            return Err(ImatrixError::Mismatch(format!(
                "inconsistent size for {name} ({} vs {cols})",
                e.values.len()
            )));
        }
        let has_act = !e.activations.is_empty();
        for row in x.chunks_exact(cols) {
            for (acc, &v) in e.values.iter_mut().zip(row) {
                *acc += v * v;
            }
            if has_act {
                for (act, &v) in e.activations.iter_mut().zip(row) {
                    *act += v;
                }
            }
        }
        if e.values.iter().any(|v| !v.is_finite()) {
            return Err(ImatrixError::Mismatch(format!(
                "non-finite values detected in {name}"
            )));
        }
        let rows = (x.len() / cols) as i64;
        e.counts
            .iter_mut()
            .for_each(|c| *c = c.saturating_add(rows));
        Ok(())
    }

    /// Adds one row that expert `expert` (of `n_experts`) of the stacked matrix `name`
    /// multiplied (llama-imatrix's `MUL_MAT_ID` path).
    pub fn add_expert_row(
        &mut self,
        name: &str,
        expert: usize,
        n_experts: usize,
        x: &[f32],
    ) -> Result<(), ImatrixError> {
        let cols = x.len();
        let e = self.stats.entry(name.to_string()).or_default();
        if e.counts.len() == 1 && n_experts > 1 {
            // Broadcast an older file's single count.
            e.counts.resize(n_experts, e.counts[0]);
        }
        if e.values.is_empty() {
            e.activations = vec![0.0; cols * n_experts];
            e.values = vec![0.0; cols * n_experts];
            e.counts = vec![0; n_experts];
        } else if e.values.len() != cols * n_experts {
            return Err(ImatrixError::Mismatch(format!(
                "inconsistent size for {name} ({} vs {})",
                e.values.len(),
                cols * n_experts
            )));
        } else if e.counts.len() != n_experts {
            return Err(ImatrixError::Mismatch(format!(
                "inconsistent expert count for {name} ({} vs {n_experts})",
                e.counts.len()
            )));
        }
        let acc = &mut e.values[expert * cols..(expert + 1) * cols];
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += v * v;
        }
        if !e.activations.is_empty() {
            let act = &mut e.activations[expert * cols..(expert + 1) * cols];
            for (a, &v) in act.iter_mut().zip(x) {
                *a += v;
            }
        }
        e.counts[expert] = e.counts[expert].saturating_add(1);
        if acc.iter().any(|v| !v.is_finite()) {
            return Err(ImatrixError::Mismatch(format!(
                "non-finite values detected in {name}"
            )));
        }
        Ok(())
    }

    /// Adds a loaded file's sums (llama-imatrix's `--in-file`, `load_imatrix`): a GGUF
    /// file's raw sums add up; a legacy file's means are scaled back by the chunk size.
    pub fn merge(&mut self, loaded: Loaded) -> Result<(), ImatrixError> {
        if loaded.n_layer_nextn > 0 && self.n_layer_nextn == 0 {
            self.n_layer_nextn = loaded.n_layer_nextn;
        }
        if !loaded.legacy && loaded.chunk_size > 0 && self.file_chunk_size == 0 {
            self.file_chunk_size = loaded.chunk_size;
        }
        let chunk_size = self.chunk_size();
        for (name, entry) in loaded.entries {
            let e = self.stats.entry(name.clone()).or_default();
            if loaded.legacy {
                if e.values.is_empty() {
                    e.values = vec![0.0; entry.sums.len()];
                    e.counts = vec![0];
                }
                if e.values.len() != entry.sums.len() {
                    return Err(ImatrixError::Mismatch(format!(
                        "mismatched sums size for {name}: {} != {}",
                        entry.sums.len(),
                        e.values.len()
                    )));
                }
                for (v, s) in e.values.iter_mut().zip(&entry.sums) {
                    *v += s * chunk_size as f32;
                }
                let add = entry.counts[0].saturating_mul(i64::from(chunk_size));
                e.counts.iter_mut().for_each(|c| *c = c.saturating_add(add));
                e.activations.clear();
                continue;
            }
            let (nval, ncounts) = (entry.sums.len(), entry.counts.len());
            let first = e.values.is_empty();
            if first {
                e.values = vec![0.0; nval];
            } else if e.values.len() != nval {
                return Err(ImatrixError::Mismatch(format!(
                    "mismatched sums size for {name}: {nval} != {}",
                    e.values.len()
                )));
            }
            if e.counts.is_empty() {
                e.counts = vec![0; ncounts];
            } else if e.counts.len() == 1 && ncounts > 1 {
                e.counts.resize(ncounts, e.counts[0]);
            } else if e.counts.len() != ncounts {
                return Err(ImatrixError::Mismatch(format!(
                    "mismatched counts size for {name}: {ncounts} != {}",
                    e.counts.len()
                )));
            }
            e.values
                .iter_mut()
                .zip(&entry.sums)
                .for_each(|(v, s)| *v += s);
            e.counts
                .iter_mut()
                .zip(&entry.counts)
                .for_each(|(c, n)| *c = c.saturating_add(*n));
            match entry.activations {
                Some(act) if first || !e.activations.is_empty() => {
                    if e.activations.is_empty() {
                        e.activations = vec![0.0; act.len()];
                    }
                    e.activations
                        .iter_mut()
                        .zip(&act)
                        .for_each(|(a, s)| *a += s);
                }
                _ => e.activations.clear(),
            }
        }
        self.datasets.extend(loaded.datasets);
        // What is written must read back: a count beyond any run is refused here too.
        if let Some((name, _)) =
            (self.stats.iter()).find(|(_, s)| s.counts.iter().any(|&c| c > MAX_COUNT))
        {
            return Err(ImatrixError::Mismatch(format!(
                "{name}: the merged row count exceeds {MAX_COUNT}"
            )));
        }
        Ok(())
    }

    /// Chunks summed so far: the most rows any matrix took, in chunks rounded to the
    /// nearest (llama-imatrix's `m_last_chunk`).
    pub fn chunk_count(&self) -> u32 {
        let max = (self.stats.values())
            .flat_map(|s| s.counts.iter().copied())
            .max()
            .unwrap_or(0);
        rows_to_chunks(max, self.chunk_size())
    }

    /// Matrices some of whose experts took no row (their sums stay zero): name and the
    /// share that did, as llama-imatrix warns.
    pub fn partial(&self) -> Vec<(&str, f32)> {
        (self.stats.iter())
            .filter_map(|(name, s)| {
                let zeros = s.counts.iter().filter(|&&c| c == 0).count();
                (zeros > 0).then(|| {
                    let n = s.counts.len();
                    (name.as_str(), 100.0 * (n - zeros) as f32 / n as f32)
                })
            })
            .collect()
    }

    /// Writes `path` in `format`, whole or not at all (a temporary file renamed into
    /// place). `dataset` is this run's text file, named after the merged ones.
    pub fn save(
        &self,
        path: &Path,
        format: Format,
        dataset: Option<&str>,
    ) -> Result<(), ImatrixError> {
        let bytes = match format {
            Format::Gguf => self
                .gguf_bytes(dataset)
                .map_err(|source| ImatrixError::Write {
                    path: path.to_path_buf(),
                    source,
                })?,
            Format::Dat => self.dat_bytes(dataset),
        };
        let io = |source| ImatrixError::Io {
            path: path.to_path_buf(),
            source,
        };
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(
            ".{}.partial-{}",
            name.unwrap_or_default(),
            std::process::id()
        ));
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.flush()))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }

    /// llama-imatrix's GGUF file (`save_imatrix`): the keys, then per matrix in name
    /// order `in_sum2`, `counts`, `in_sum` (where there are plain sums) and `stats`.
    pub fn gguf_bytes(&self, dataset: Option<&str>) -> Result<Vec<u8>, WriteError> {
        let mut datasets: Vec<&str> = self.datasets.iter().map(String::as_str).collect();
        datasets.extend(dataset);
        fn strings<'s>(v: &[&'s str]) -> Value<'s> {
            Value::Array(llamay_gguf::Array::strings(
                v.iter()
                    .map(|s| llamay_gguf::GgufStr(s.as_bytes()))
                    .collect(),
            ))
        }
        let mut w = GgufWriter::new();
        w.add_kv("general.type", Value::String("imatrix".into()))?;
        w.add_kv("imatrix.datasets", strings(&datasets))?;
        w.add_kv("imatrix.chunk_count", Value::U32(self.chunk_count()))?;
        w.add_kv("imatrix.chunk_size", Value::U32(self.chunk_size()))?;
        if self.n_layer_nextn > 0 {
            w.add_kv("imatrix.n_layer_nextn", Value::U32(self.n_layer_nextn))?;
        }
        w.add_kv("imatrix.stats_schema", strings(&stats::SCHEMA))?;
        let per_tensor = stats::tensor_stats(&self.stats, self.n_layer_nextn);
        let f32s = |v: &mut Vec<Vec<u8>>, vals: &mut dyn Iterator<Item = f32>| {
            v.push(vals.flat_map(f32::to_le_bytes).collect());
        };
        let mut data: Vec<Vec<u8>> = Vec::new();
        for (name, s) in &self.stats {
            let (nval, nmat) = (s.values.len(), s.counts.len());
            if nval > 0 && nmat > 0 {
                // ggml writes a tensor's ggml_n_dims: a trailing 1 is dropped.
                let shape = |cols: usize| -> Vec<u64> {
                    if nmat == 1 {
                        vec![cols as u64]
                    } else {
                        vec![cols as u64, nmat as u64]
                    }
                };
                let dtype = llamay_formats::GgmlType::F32;
                w.add_tensor(&format!("{name}.in_sum2"), dtype, &shape(nval / nmat))?;
                f32s(&mut data, &mut s.values.iter().copied());
                w.add_tensor(&format!("{name}.counts"), dtype, &shape(1))?;
                f32s(&mut data, &mut s.counts.iter().map(|&c| c as f32));
                if !s.activations.is_empty() {
                    let nact = s.activations.len();
                    w.add_tensor(&format!("{name}.in_sum"), dtype, &shape(nact / nmat))?;
                    f32s(&mut data, &mut s.activations.iter().copied());
                }
            }
            let row = per_tensor
                .get(name.as_str())
                .map_or([0.0; 12], stats::TensorStats::row);
            w.add_tensor(
                &format!("{name}.stats"),
                llamay_formats::GgmlType::F32,
                &[12],
            )?;
            f32s(&mut data, &mut row.into_iter());
        }
        let mut out = Vec::new();
        w.write(&mut out, |i| {
            Ok(std::borrow::Cow::Owned(std::mem::take(&mut data[i])))
        })?;
        Ok(out)
    }

    /// llama-imatrix's legacy `.dat` file (`save_imatrix_legacy`): matrices with no
    /// row at all are left out; each value is the mean scaled by the chunks it took.
    pub fn dat_bytes(&self, dataset: Option<&str>) -> Vec<u8> {
        let chunk_size = i64::from(self.chunk_size().max(1));
        let stored: Vec<(&String, &Stats)> = (self.stats.iter())
            .filter(|(_, s)| !s.counts.is_empty() && s.counts.iter().any(|&c| c != 0))
            .collect();
        let mut out = Vec::new();
        let i32_le = |out: &mut Vec<u8>, v: i64| out.extend_from_slice(&(v as i32).to_le_bytes());
        i32_le(&mut out, stored.len() as i64);
        for (name, s) in stored {
            i32_le(&mut out, name.len() as i64);
            out.extend_from_slice(name.as_bytes());
            let max = s.counts.iter().copied().max().unwrap_or(0);
            let ncall = max.saturating_add(chunk_size - 1) / chunk_size;
            i32_le(&mut out, ncall);
            let (nval, nmat) = (s.values.len(), s.counts.len());
            i32_le(&mut out, nval as i64);
            if nval > 0 && nmat > 0 {
                for (i, &v) in s.values.iter().enumerate() {
                    let mut count = s.counts[i / (nval / nmat)] as f32;
                    let mut value = v;
                    if count == 0.0 {
                        (value, count) = (1.0, 1.0);
                    }
                    out.extend_from_slice(&((value / count) * ncall as f32).to_le_bytes());
                }
            }
        }
        i32_le(&mut out, i64::from(self.chunk_count()));
        let last = dataset
            .or(self.datasets.last().map(String::as_str))
            .unwrap_or("");
        i32_le(&mut out, last.len() as i64);
        out.extend_from_slice(last.as_bytes());
        out
    }
}

/// The most rows a count may hold (far beyond any run; what a file may say).
pub(crate) const MAX_COUNT: i64 = 9_000_000_000_000_000;

/// Rows to chunks, rounded to the nearest (llama-imatrix's `rows_to_chunks`).
fn rows_to_chunks(rows: i64, chunk_size: u32) -> u32 {
    if chunk_size == 0 {
        return 0;
    }
    let c = i64::from(chunk_size);
    (rows.saturating_add(c / 2) / c).min(i64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Imatrix {
        let mut m = Imatrix::new(4);
        let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.25 - 3.0).collect();
        m.add_rows("blk.0.attn_q.weight", &x, 8).unwrap();
        m.add_rows("blk.1.attn_q.weight", &x, 8).unwrap();
        m.add_expert_row("blk.0.ffn_up_exps.weight", 1, 3, &x[..8])
            .unwrap();
        m
    }

    #[test]
    fn sums_counts_and_a_written_file_read_back() {
        let m = sample();
        let s = &m.stats["blk.0.attn_q.weight"];
        assert_eq!(s.counts, [4]);
        // Column 0 saw -3, -1, 1, 3.
        assert_eq!(s.values[0], 9.0 + 1.0 + 1.0 + 9.0);
        assert_eq!(s.activations[0], 0.0);
        assert_eq!(m.stats["blk.0.ffn_up_exps.weight"].counts, [0, 1, 0]);
        assert_eq!(m.partial(), [("blk.0.ffn_up_exps.weight", 100.0 / 3.0)]);
        let loaded = read_bytes(&m.gguf_bytes(Some("text.txt")).unwrap()).unwrap();
        assert_eq!(loaded.datasets, ["text.txt"]);
        assert_eq!((loaded.chunk_size, loaded.chunk_count), (4, 1));
        let e = &loaded.entries["blk.0.attn_q.weight"];
        assert_eq!((&e.sums, &e.counts), (&s.values, &vec![4]));
        // Merged twice: every sum and count doubles.
        let mut twice = Imatrix::new(512);
        twice.merge(loaded.clone()).unwrap();
        twice.merge(loaded).unwrap();
        assert_eq!(twice.chunk_size(), 4, "a merged file's chunk size wins");
        assert_eq!(twice.stats["blk.0.attn_q.weight"].counts, [8]);
        assert_eq!(twice.stats["blk.0.attn_q.weight"].values[0], 40.0);
        // The quantiser's weights: the mean square, 1 for an expert with no row.
        let w = read_bytes(&twice.gguf_bytes(None).unwrap())
            .unwrap()
            .quant_weights();
        assert_eq!(w["blk.0.attn_q.weight"][0], 5.0);
        assert_eq!(w["blk.0.ffn_up_exps.weight"][0], 1.0);
    }

    #[test]
    fn a_size_that_changes_is_an_error_not_a_panic() {
        let mut m = sample();
        let e = m
            .add_rows("blk.0.attn_q.weight", &[1.0; 32], 16)
            .unwrap_err();
        assert!(e.to_string().contains("inconsistent size"), "{e}");
        let e = m
            .add_expert_row("blk.0.ffn_up_exps.weight", 0, 4, &[1.0; 6])
            .unwrap_err();
        assert!(e.to_string().contains("inconsistent expert count"), "{e}");
        let e = m
            .add_rows("blk.2.attn_q.weight", &[f32::INFINITY; 8], 8)
            .unwrap_err();
        assert!(e.to_string().contains("non-finite"), "{e}");
    }

    #[test]
    fn absurd_counts_and_truncated_files_are_refused() {
        let mut m = sample();
        m.stats.get_mut("blk.0.attn_q.weight").unwrap().counts[0] = i64::MAX;
        let bytes = m.gguf_bytes(None).unwrap();
        assert!(read_bytes(&bytes).unwrap_err().contains("is not a count"));
        let good = sample().gguf_bytes(None).unwrap();
        assert!(
            read_bytes(&good[..good.len() / 2])
                .unwrap_err()
                .contains("GGUF")
        );
        let dat = sample().dat_bytes(Some("t"));
        let legacy = read_bytes(&dat).unwrap();
        assert!(legacy.legacy && legacy.datasets == ["t"]);
        assert!(
            read_bytes(&dat[..dat.len() / 3])
                .unwrap_err()
                .contains("truncated")
        );
        assert!(read_bytes(&[0, 0, 0, 0]).unwrap_err().contains("no data"));
    }
}
