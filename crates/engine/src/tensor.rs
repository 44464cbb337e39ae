//! Weights as the forward pass sees them, and the one matmul interface every
//! projection goes through (the CPU-kernels work replaces its body, not its callers).
//!
//! Numerics follow llama.cpp where they shape the result: the activation is rounded
//! through the weight format's dot-product type (Q8_0, Q8_1, Q8_K, F16, BF16) before
//! the dot product, and products accumulate in f32.

use crate::LoadError;
use llamay_formats::{GgmlType, dequantize};
use llamay_gguf::TensorInfo;
use llamay_kernels::{PackedMatrix, QuantizedRows, ThreadPool};
use std::ops::Range;
use std::sync::Mutex;

/// A 2-D weight borrowed from the mapping: `rows` outputs of `cols` inputs each.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
}

impl<'a> Matrix<'a> {
    /// Binds a tensor as a matrix of `cols` columns; its remaining dimensions are rows.
    pub fn from_tensor(t: &TensorInfo<'a>, cols: usize, rows: usize) -> Result<Self, LoadError> {
        let shape_err = || {
            LoadError::Shape(format!(
                "tensor '{}' has shape {:?}, expected [{cols}, {rows}]",
                t.name, t.shape
            ))
        };
        if t.n_elements == 0 || cols == 0 || rows == 0 {
            return Err(LoadError::Shape(format!(
                "tensor '{}' has shape {:?}: a weight matrix needs at least one row and one column",
                t.name, t.shape
            )));
        }
        if t.row_len() != cols as u64
            || Some(t.n_elements) != (cols as u64).checked_mul(rows as u64)
        {
            return Err(shape_err());
        }
        if let Some(why) = t.ty.refusal() {
            return Err(LoadError::Unsupported(format!(
                "tensor '{}': {why}",
                t.name
            )));
        }
        // Readable is not enough: Q8_1 and Q8_K are activation formats, with no dot
        // product as weights (a matmul on one would only fill its output with NaN).
        if !llamay_kernels::supports(t.ty) {
            return Err(LoadError::Unsupported(format!(
                "tensor '{}': {} is an activation format, not a weight format; weight matrices may be {}",
                t.name,
                t.ty,
                weight_type_names()
            )));
        }
        let row_bytes = t.ty.bytes_for(cols as u64).ok_or_else(|| {
            LoadError::Shape(format!(
                "tensor '{}': {cols} columns is not a whole number of {} blocks",
                t.name, t.ty
            ))
        })? as usize;
        // The parser sized the tensor from its element count; a matrix's rows must cover
        // exactly those bytes, or a row read would run past them. (`data` is that size,
        // or empty in a header-only parse, which only shape checks see.)
        if row_bytes.checked_mul(rows) != usize::try_from(t.n_bytes).ok() {
            return Err(LoadError::Shape(format!(
                "tensor '{}': {} bytes of data for {rows} rows of {row_bytes} bytes",
                t.name, t.n_bytes
            )));
        }
        Ok(Matrix {
            name: t.name,
            ty: t.ty,
            data: t.data,
            rows,
            cols,
            row_bytes,
        })
    }

    /// Rows `range` of this matrix as a matrix of its own (zero copy): how a stacked
    /// projection (Phi-3's gate+up, fused QKV) is split at load.
    pub fn rows_slice(&self, range: Range<usize>) -> Matrix<'a> {
        // A header-only parse binds shapes without data (see `ReadData`): its parts are
        // empty too.
        let bytes = range.start * self.row_bytes..range.end * self.row_bytes;
        let data = self.data.get(bytes).unwrap_or_default();
        Matrix {
            rows: range.len(),
            data,
            ..*self
        }
    }

    /// Dequantises row `r` into `out` (length `cols`).
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        let bytes = &self.data[r * self.row_bytes..(r + 1) * self.row_bytes];
        // Shapes and types were checked at bind time, so this cannot fail.
        let _ = dequantize(self.ty, bytes, out);
    }
}

/// The types a weight matrix may have, for refusals.
fn weight_type_names() -> String {
    (llamay_formats::ALL_TYPES.iter())
        .filter(|&&t| t.is_readable() && llamay_kernels::supports(t))
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// How many threads compute; one per physical core by default.
#[derive(Clone, Copy, Debug)]
pub struct Threads(pub usize);

/// Runs `f` over `n` items split into contiguous ranges, one per pool thread; results
/// in range order.
pub fn parallel_ranges<T: Send>(
    n: usize,
    pool: &ThreadPool,
    f: impl Fn(Range<usize>) -> T + Sync,
) -> Vec<T> {
    let t = pool.n_threads().clamp(1, n.max(1));
    if t == 1 {
        return vec![f(0..n)];
    }
    let per = n.div_ceil(t);
    let results: Vec<Mutex<Option<T>>> = (0..t).map(|_| Mutex::new(None)).collect();
    pool.run(t, |i| {
        let out = f((i * per).min(n)..((i + 1) * per).min(n));
        if let Ok(mut slot) = results[i].lock() {
            *slot = Some(out);
        }
    });
    results
        .into_iter()
        .filter_map(|m| m.into_inner().ok().flatten())
        .collect()
}

/// `out = W a`: `a` is the activation quantised to `W`'s dot type, once per input (as
/// llama.cpp's CPU backend does; projections that share an input share it), then the
/// kernels' matmul runs. With `packed` (the same matrix, repacked at load) the packed
/// kernels compute it. `out` gets `a.n × W.rows` values; it is resized, not cleared:
/// the kernels write every value, so a buffer reused from layer to layer is neither
/// reallocated nor zeroed.
pub fn matmul_quantized(
    w: &Matrix<'_>,
    packed: Option<&PackedMatrix>,
    a: &QuantizedRows,
    out: &mut Vec<f32>,
    pool: &ThreadPool,
) {
    out.resize(a.n * w.rows, 0.0);
    match packed {
        Some(p) => llamay_kernels::matmul_packed(p, a, out, pool),
        None => llamay_kernels::matmul(w.ty, w.data, w.rows, w.cols, a, out, pool),
    }
}

/// A 1-D weight (norm scale, bias), dequantised to f32 at load: small and read often.
/// With `read == false` only the shape and type are checked and nothing is read.
pub fn vector(t: &TensorInfo<'_>, len: usize, read: bool) -> Result<Vec<f32>, LoadError> {
    if t.n_elements != len as u64 || len == 0 {
        return Err(LoadError::Shape(format!(
            "tensor '{}' has shape {:?}, expected [{len}]",
            t.name, t.shape
        )));
    }
    if let Some(why) = t.ty.refusal() {
        return Err(LoadError::Unsupported(format!(
            "tensor '{}': {why}",
            t.name
        )));
    }
    if !read {
        return Ok(Vec::new());
    }
    let mut v = vec![0f32; len];
    dequantize(t.ty, t.data, &mut v)
        .map_err(|e| LoadError::Unsupported(format!("tensor '{}': {e}", t.name)))?;
    Ok(v)
}
