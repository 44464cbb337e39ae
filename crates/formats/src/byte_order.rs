//! Big-endian tensor data: the layout gguf-py's `gguf_convert_endian` writes (and
//! `GGUFWriter(endianess=BIG)` for float tensors), turned into the little-endian one
//! every kernel reads. Each format's multi-byte fields, per block, as that script
//! swaps them; a format it does not convert has no defined big-endian layout (ggml
//! reads some of their byte arrays as integers) and is refused by name.

use crate::GgmlType;

/// The fields of one block that are stored in the file's byte order: (offset, width).
/// `None`: no big-endian layout is defined for the format.
pub fn big_endian_fields(ty: GgmlType) -> Option<&'static [(usize, usize)]> {
    use GgmlType::*;
    Some(match ty {
        F32 => &[(0, 4)],
        F16 | BF16 => &[(0, 2)],
        // The f16 scale first.
        Q4_0 | Q8_0 => &[(0, 2)],
        // d and dmin; the 12 scale bytes are bytes.
        Q4_K => &[(0, 2), (2, 2)],
        // d, after 128 + 64 + 16 bytes.
        Q6_K => &[(208, 2)],
        // An E8M0 byte and nibbles: nothing to swap.
        MXFP4 => &[],
        _ => return None,
    })
}

/// The formats [`big_endian_fields`] defines, by name (for refusals).
pub const BIG_ENDIAN_FORMATS: &str = "F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q6_K, MXFP4";

/// Rewrites `data` (whole blocks of `ty`) from the big-endian layout to the
/// little-endian one, in place. `false` (nothing changed) where the format has no
/// big-endian layout or `data` is not whole blocks.
pub fn big_to_little_endian(ty: GgmlType, data: &mut [u8]) -> bool {
    let Some(fields) = big_endian_fields(ty) else {
        return false;
    };
    let size = ty.type_size() as usize;
    if !data.len().is_multiple_of(size) {
        return false;
    }
    for block in data.chunks_exact_mut(size) {
        for &(at, width) in fields {
            block[at..at + width].reverse();
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ALL_TYPES;

    #[test]
    fn fields_lie_inside_their_blocks() {
        for &ty in ALL_TYPES {
            for &(at, width) in big_endian_fields(ty).unwrap_or(&[]) {
                assert!(at + width <= ty.type_size() as usize, "{ty:?}");
            }
        }
    }

    #[test]
    fn swapped_blocks_decode_as_the_little_endian_ones() {
        // Each format's little-endian block, its big-endian form made by hand as
        // gguf_convert_endian makes it, and back.
        let q4k_le: Vec<u8> = (0..144).map(|i| (i * 7 + 3) as u8).collect();
        let mut be = q4k_le.clone();
        be.swap(0, 1);
        be.swap(2, 3);
        assert!(big_to_little_endian(GgmlType::Q4_K, &mut be));
        assert_eq!(be, q4k_le);
        let mut f32s: Vec<u8> = [1.5f32, -2.25]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        assert!(big_to_little_endian(GgmlType::F32, &mut f32s));
        assert_eq!(
            f32s,
            [1.5f32, -2.25]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>()
        );
        assert!(!big_to_little_endian(GgmlType::Q5_K, &mut [0; 176]));
        assert!(!big_to_little_endian(GgmlType::F16, &mut [0; 3]));
    }
}
