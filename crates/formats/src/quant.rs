//! Portable quantisation: f32 values to blocks of a writable type, byte-identical to
//! llama.cpp's `ggml_quantize_chunk`: without an importance matrix the reference
//! quantisers (`quantize_row_*_ref`; the i-quants their `quantize_row_*_impl` without
//! weights), with one the importance-weighted `quantize_row_*_impl`s that
//! `llama-quantize --imatrix` runs.

use crate::fp16::f32_to_f16;
use crate::{FormatError, GgmlType, iquants, kquants, legacy};

/// One block's values to its bytes; the caller guarantees both lengths.
type QuantFn = fn(&[f32], &mut [u8]);

/// Quantises `src` (a whole number of blocks of `ty`) to `ty`'s bytes.
///
/// Refuses non-finite values: the reference quantisers turn them into garbage scales
/// that poison whole blocks, so a model with NaN/inf weights is an error, not a file.
/// IQ2_XXS and IQ2_XS need importance weights (`ImatrixRequired`; see
/// [`quantize_weighted`]), and the lattice i-quants refuse (`QuantiserAborts`) inputs on
/// which ggml's grid searches abort.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, FormatError> {
    if let Some(why) = ty.refusal() {
        return Err(FormatError::Refused(why));
    }
    if !ty.is_writable() {
        return Err(FormatError::NotWritable { ty });
    }
    check_input(ty, src)?;
    if let Some(f) = lattice_quantiser(ty) {
        if requires_imatrix(ty) {
            return Err(FormatError::ImatrixRequired { ty });
        }
        return run_lattice(ty, src, None, f);
    }
    use GgmlType::*;
    let block: QuantFn = match ty {
        F32 => return Ok(src.iter().flat_map(|v| v.to_le_bytes()).collect()),
        F16 => {
            return Ok(src
                .iter()
                .flat_map(|&v| f32_to_f16(v).to_le_bytes())
                .collect());
        }
        BF16 => {
            return Ok(src
                .iter()
                .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
                .collect());
        }
        Q4_0 => legacy::quant_q4_0,
        Q4_1 => legacy::quant_q4_1,
        Q5_0 => legacy::quant_q5_0,
        Q5_1 => legacy::quant_q5_1,
        Q8_0 => legacy::quant_q8_0,
        Q8_1 => legacy::quant_q8_1,
        Q2_K => kquants::quant_q2_k,
        Q3_K => kquants::quant_q3_k,
        Q4_K => kquants::quant_q4_k,
        Q5_K => kquants::quant_q5_k,
        Q6_K => kquants::quant_q6_k,
        Q8_K => kquants::quant_q8_k,
        IQ4_NL => |x, b| iquants::quant_iq4_nl(x, b, None),
        IQ4_XS => |x, b| iquants::quant_iq4_xs(x, b, None),
        _ => return Err(FormatError::NotWritable { ty }),
    };
    Ok(run_blocks(ty, src, block))
}

/// A weighted quantiser: one block with the importance weights of its columns; the
/// legacy types also take their row's mean square (`sigma2`), which their `_impl`s
/// compute over the whole row rather than the block.
#[derive(Clone, Copy)]
enum Weighted {
    Block(fn(&[f32], &mut [u8], &[f32])),
    Legacy(fn(&[f32], &mut [u8], &[f32], f32)),
}

/// Quantises whole rows of `n_per_row` values as `ggml_quantize_chunk` does with an
/// importance matrix: `weights` (one per column, the same for every row, as llama.cpp
/// passes a tensor's imatrix entry) steer the scale searches of Q4_0 Q4_1 Q5_0 Q5_1,
/// the K-quants Q2_K..Q6_K and the i-quants IQ4_NL IQ4_XS IQ3_XXS IQ3_S IQ2_S IQ2_XS
/// IQ2_XXS. Types whose ggml quantiser ignores the
/// weights (F32 F16 BF16 Q8_0, and Q8_1/Q8_K) give what [`quantize`] gives. With
/// `None` this is exactly [`quantize`] (`ggml_quantize_chunk` without an imatrix).
///
/// Refuses non-finite values and non-finite weights (llama.cpp refuses an imatrix with
/// NaN or inf); zero and negative weights are accepted, as ggml accepts them. The
/// lattice i-quants refuse (`QuantiserAborts`) the inputs on which ggml's grid searches
/// abort, e.g. a value whose square overflows.
pub fn quantize_weighted(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    weights: Option<&[f32]>,
) -> Result<Vec<u8>, FormatError> {
    if let Some(why) = ty.refusal() {
        return Err(FormatError::Refused(why));
    }
    if !ty.is_writable() {
        return Err(FormatError::NotWritable { ty });
    }
    let block_size = ty.block_size();
    if n_per_row == 0 || !(n_per_row as u64).is_multiple_of(block_size) {
        return Err(FormatError::BadRowLength {
            ty,
            n_per_row,
            block_size,
        });
    }
    if !src.len().is_multiple_of(n_per_row) {
        return Err(FormatError::PartialRow {
            ty,
            n_values: src.len(),
            n_per_row,
        });
    }
    check_input(ty, src)?;
    let Some(qw) = weights else {
        return quantize(ty, src);
    };
    if qw.len() != n_per_row {
        return Err(FormatError::WeightsLength {
            ty,
            n_weights: qw.len(),
            n_per_row,
        });
    }
    if let Some(index) = qw.iter().position(|v| !v.is_finite()) {
        return Err(FormatError::NonFiniteWeight {
            ty,
            index,
            what: non_finite_name(qw[index]),
        });
    }
    if let Some(f) = lattice_quantiser(ty) {
        return run_lattice(ty, src, Some(qw), f);
    }
    use GgmlType::*;
    use Weighted::{Block, Legacy};
    let quant = match ty {
        Q4_0 => Legacy(legacy::quant_q4_0_w),
        Q4_1 => Legacy(legacy::quant_q4_1_w),
        Q5_0 => Legacy(legacy::quant_q5_0_w),
        Q5_1 => Legacy(legacy::quant_q5_1_w),
        Q2_K => Block(kquants::quant_q2_k_w),
        Q3_K => Block(kquants::quant_q3_k_w),
        Q4_K => Block(kquants::quant_q4_k_w),
        Q5_K => Block(kquants::quant_q5_k_w),
        Q6_K => Block(kquants::quant_q6_k_w),
        IQ4_NL => Block(|x, b, qw| iquants::quant_iq4_nl(x, b, Some(qw))),
        IQ4_XS => Block(|x, b, qw| iquants::quant_iq4_xs(x, b, Some(qw))),
        // ggml's quantisers for these take no weights (Q8_0's ignores them).
        _ => return quantize(ty, src),
    };
    Ok(run_weighted_rows(ty, src, qw, quant))
}

/// Whether llama.cpp refuses to make `ty` without an importance matrix
/// (`ggml_quantize_requires_imatrix`: IQ2_XXS, IQ2_XS, IQ1_S). [`quantize`] refuses
/// them, and so does [`quantize_weighted`] without weights.
pub fn requires_imatrix(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ1_S)
}

/// Quantises to MXFP4 with llama.cpp's `quantize_row_mxfp4_ref`. For building test
/// fixtures only: MXFP4 is a read-only type and `llamay quantize` does not offer it.
pub fn quantize_mxfp4_for_fixtures(src: &[f32]) -> Result<Vec<u8>, FormatError> {
    check_input(GgmlType::MXFP4, src)?;
    Ok(run_blocks(GgmlType::MXFP4, src, legacy::quant_mxfp4))
}

fn non_finite_name(value: f32) -> &'static str {
    if value.is_nan() {
        "NaN"
    } else if value > 0.0 {
        "+inf"
    } else {
        "-inf"
    }
}

fn check_input(ty: GgmlType, src: &[f32]) -> Result<(), FormatError> {
    let block_size = ty.block_size();
    if !(src.len() as u64).is_multiple_of(block_size) {
        return Err(FormatError::PartialInput {
            ty,
            n_values: src.len(),
            block_size,
        });
    }
    if let Some(index) = src.iter().position(|v| !v.is_finite()) {
        let what = non_finite_name(src[index]);
        return Err(FormatError::NonFinite { ty, index, what });
    }
    Ok(())
}

fn run_blocks(ty: GgmlType, src: &[f32], block: QuantFn) -> Vec<u8> {
    let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
    let mut out = vec![0u8; src.len() / bs * ts];
    for (x, b) in src.chunks_exact(bs).zip(out.chunks_exact_mut(ts)) {
        block(x, b);
    }
    out
}

/// Rows of `qw.len()` values, each block with its columns' weights.
fn run_weighted_rows(ty: GgmlType, src: &[f32], qw: &[f32], quant: Weighted) -> Vec<u8> {
    let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
    let n_per_row = qw.len();
    let mut out = vec![0u8; src.len() / bs * ts];
    for (row, out_row) in src
        .chunks_exact(n_per_row)
        .zip(out.chunks_exact_mut(n_per_row / bs * ts))
    {
        let blocks = row
            .chunks_exact(bs)
            .zip(out_row.chunks_exact_mut(ts))
            .zip(qw.chunks_exact(bs));
        match quant {
            Weighted::Block(f) => blocks.for_each(|((x, b), w)| f(x, b, w)),
            Weighted::Legacy(f) => {
                let sigma2 = legacy::row_sigma2(row);
                blocks.for_each(|((x, b), w)| f(x, b, w, sigma2));
            }
        }
    }
    out
}

/// A lattice i-quant's super-block quantiser: values, bytes, the block's weights.
type LatticeFn = fn(&[f32], &mut [u8], Option<&[f32]>) -> Result<(), iquants::Abort>;

/// The lattice i-quants (ggml's grid searches): IQ3_XXS, IQ3_S, IQ2_S with or without
/// weights; IQ2_XXS, IQ2_XS only with them.
fn lattice_quantiser(ty: GgmlType) -> Option<LatticeFn> {
    use GgmlType::*;
    Some(match ty {
        IQ3_XXS => iquants::quant_iq3_xxs,
        IQ3_S => iquants::quant_iq3_s,
        IQ2_S => iquants::quant_iq2_s,
        IQ2_XS => |x, b, qw| iquants::quant_iq2_xs(x, b, qw.expect("weights checked")),
        IQ2_XXS => |x, b, qw| iquants::quant_iq2_xxs(x, b, qw.expect("weights checked")),
        _ => return None,
    })
}

/// Super-blocks of `src`, with `qw` (one weight per column of a row of `qw.len()`) or
/// without. Where ggml's quantiser would abort, an error names it.
fn run_lattice(
    ty: GgmlType,
    src: &[f32],
    qw: Option<&[f32]>,
    f: LatticeFn,
) -> Result<Vec<u8>, FormatError> {
    let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
    let mut out = vec![0u8; src.len() / bs * ts];
    let aborts = |a: iquants::Abort| FormatError::QuantiserAborts { ty, why: a.0 };
    match qw {
        None => {
            for (x, b) in src.chunks_exact(bs).zip(out.chunks_exact_mut(ts)) {
                f(x, b, None).map_err(aborts)?;
            }
        }
        Some(qw) => {
            let n_per_row = qw.len();
            for (row, out_row) in src
                .chunks_exact(n_per_row)
                .zip(out.chunks_exact_mut(n_per_row / bs * ts))
            {
                let blocks = row
                    .chunks_exact(bs)
                    .zip(out_row.chunks_exact_mut(ts))
                    .zip(qw.chunks_exact(bs));
                for ((x, b), w) in blocks {
                    f(x, b, Some(w)).map_err(aborts)?;
                }
            }
        }
    }
    Ok(out)
}

/// ggml's `GGML_FP32_TO_BF16`: round to nearest even (NaN cannot reach here).
fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}
