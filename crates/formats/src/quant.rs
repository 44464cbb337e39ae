//! Portable quantisation: f32 values to blocks of a writable type, byte-identical to
//! llama.cpp's reference quantisers (`quantize_row_*_ref`, i.e. `llama-quantize`
//! without an importance matrix).

use crate::fp16::f32_to_f16;
use crate::{FormatError, GgmlType, kquants, legacy};

/// One block's values to its bytes; the caller guarantees both lengths.
type QuantFn = fn(&[f32], &mut [u8]);

/// Quantises `src` (a whole number of blocks of `ty`) to `ty`'s bytes.
///
/// Refuses non-finite values: the reference quantisers turn them into garbage scales
/// that poison whole blocks, so a model with NaN/inf weights is an error, not a file.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, FormatError> {
    if let Some(why) = ty.refusal() {
        return Err(FormatError::Refused(why));
    }
    if !ty.is_writable() {
        return Err(FormatError::NotWritable { ty });
    }
    check_input(ty, src)?;
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
        _ => return Err(FormatError::NotWritable { ty }),
    };
    Ok(run_blocks(ty, src, block))
}

/// Quantises to MXFP4 with llama.cpp's `quantize_row_mxfp4_ref`. For building test
/// fixtures only: MXFP4 is a read-only type and `llamay quantize` does not offer it.
pub fn quantize_mxfp4_for_fixtures(src: &[f32]) -> Result<Vec<u8>, FormatError> {
    check_input(GgmlType::MXFP4, src)?;
    Ok(run_blocks(GgmlType::MXFP4, src, legacy::quant_mxfp4))
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
        let value = src[index];
        let what = if value.is_nan() {
            "NaN"
        } else if value > 0.0 {
            "+inf"
        } else {
            "-inf"
        };
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

/// ggml's `GGML_FP32_TO_BF16`: round to nearest even (NaN cannot reach here).
fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}
