//! Portable dequantisation: blocks of a type's bytes to f32, exactly as llama.cpp
//! defines each format.

use crate::{FormatError, GgmlType, iquants, kquants, legacy};

/// One block's bytes to its values; the caller guarantees both lengths.
type BlockFn = fn(&[u8], &mut [f32]);

/// The block dequantiser of a quantised type; `None` for the plain float types and the
/// refused ones.
fn block_fn(ty: GgmlType) -> Option<BlockFn> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => legacy::dequant_q4_0,
        Q4_1 => legacy::dequant_q4_1,
        Q5_0 => legacy::dequant_q5_0,
        Q5_1 => legacy::dequant_q5_1,
        Q8_0 => legacy::dequant_q8_0,
        Q8_1 => legacy::dequant_q8_1,
        MXFP4 => legacy::dequant_mxfp4,
        Q2_K => kquants::dequant_q2_k,
        Q3_K => kquants::dequant_q3_k,
        Q4_K => kquants::dequant_q4_k,
        Q5_K => kquants::dequant_q5_k,
        Q6_K => kquants::dequant_q6_k,
        Q8_K => kquants::dequant_q8_k,
        IQ2_XXS => iquants::dequant_iq2_xxs,
        IQ2_XS => iquants::dequant_iq2_xs,
        IQ2_S => iquants::dequant_iq2_s,
        IQ3_XXS => iquants::dequant_iq3_xxs,
        IQ3_S => iquants::dequant_iq3_s,
        IQ4_NL => iquants::dequant_iq4_nl,
        IQ4_XS => iquants::dequant_iq4_xs,
        _ => return None,
    })
}

/// Dequantises `data` (whole blocks of `ty`) into `out`, which must hold exactly the
/// number of values the blocks carry.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), FormatError> {
    if let Some(why) = ty.refusal() {
        return Err(FormatError::Refused(why));
    }
    let type_size = ty.type_size();
    if !(data.len() as u64).is_multiple_of(type_size) {
        return Err(FormatError::PartialBlock {
            ty,
            n_bytes: data.len(),
            type_size,
        });
    }
    let have = data.len() as u64 / type_size * ty.block_size();
    if have != out.len() as u64 {
        return Err(FormatError::LengthMismatch {
            ty,
            n_bytes: data.len(),
            have,
            want: out.len(),
        });
    }
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = crate::fp16::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                // ggml widens bf16 by a plain shift, keeping NaN payloads as they are.
                *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        _ => {
            let f = block_fn(ty).ok_or(FormatError::NotImplemented { ty })?;
            let (ts, bs) = (type_size as usize, ty.block_size() as usize);
            for (b, y) in data.chunks_exact(ts).zip(out.chunks_exact_mut(bs)) {
                f(b, y);
            }
        }
    }
    Ok(())
}
