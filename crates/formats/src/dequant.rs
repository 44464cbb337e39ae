//! Portable dequantisation: blocks of a type's bytes to f32, exactly as llama.cpp
//! defines each format.

use crate::{FormatError, GgmlType};
use half::{bf16, f16};

/// Dequantises `data` (whole blocks of `ty`) into `out`, which must hold exactly the
/// number of values the blocks carry.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), FormatError> {
    if let Some(why) = ty.refusal() {
        return Err(FormatError::Refused(why));
    }
    let type_size = ty.type_size();
    if data.len() as u64 % type_size != 0 {
        return Err(FormatError::PartialBlock { ty, n_bytes: data.len(), type_size });
    }
    let have = data.len() as u64 / type_size * ty.block_size();
    if have != out.len() as u64 {
        return Err(FormatError::LengthMismatch { ty, n_bytes: data.len(), have, want: out.len() });
    }
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => return Err(FormatError::NotImplemented { ty }),
    }
    Ok(())
}
