//! The ggml type table: every type id llama.cpp b11434 knows, with its block layout and
//! what llamay does with it. Facts from `ggml/include/ggml.h` and gguf-py's
//! `GGML_QUANT_SIZES`; one row per id so that adding a type is adding a row.

use std::fmt;

/// What llamay does with tensors of a type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Read (dequantised, computed on) and written (`quantize`/`quantize_weighted`).
    ReadWrite,
    /// Read only: weights of this type run, but llamay never writes them.
    ReadOnly,
    /// A valid ggml type that llamay refuses, with the reason.
    Refused(&'static str),
}

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $blck:literal, $size:expr, $support:expr; )*) => {
        /// A ggml tensor type that a GGUF file may declare.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        pub enum GgmlType { $( $variant = $id, )* }

        /// The whole table, in id order.
        pub const ALL_TYPES: &[GgmlType] = &[ $( GgmlType::$variant, )* ];

        impl GgmlType {
            fn row(self) -> (&'static str, u64, u64, Support) {
                match self { $( GgmlType::$variant => ($name, $blck, $size, $support), )* }
            }

            fn from_known_id(id: u32) -> Option<Self> {
                match id { $( $id => Some(GgmlType::$variant), )* _ => None }
            }
        }
    };
}

const QK_K: u64 = 256;
const I_QUANT: &str = "llamay reads the i-quants IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S, not the 1-bit ones";
const TERNARY: &str = "ternary formats (TQ1_0/TQ2_0) are not implemented";
const INTEGER: &str = "integer tensors are not model weights llamay runs";
const NEWER: &str = "this format is newer than llamay's format set";

ggml_types! {
    F32 = 0, "F32", 1, 4, Support::ReadWrite;
    F16 = 1, "F16", 1, 2, Support::ReadWrite;
    Q4_0 = 2, "Q4_0", 32, 2 + 16, Support::ReadWrite;
    Q4_1 = 3, "Q4_1", 32, 2 + 2 + 16, Support::ReadWrite;
    Q5_0 = 6, "Q5_0", 32, 2 + 4 + 16, Support::ReadWrite;
    Q5_1 = 7, "Q5_1", 32, 2 + 2 + 4 + 16, Support::ReadWrite;
    Q8_0 = 8, "Q8_0", 32, 2 + 32, Support::ReadWrite;
    Q8_1 = 9, "Q8_1", 32, 2 + 2 + 32, Support::ReadWrite;
    Q2_K = 10, "Q2_K", 256, 2 + 2 + QK_K / 16 + QK_K / 4, Support::ReadWrite;
    Q3_K = 11, "Q3_K", 256, 2 + QK_K / 4 + QK_K / 8 + 12, Support::ReadWrite;
    Q4_K = 12, "Q4_K", 256, 2 + 2 + QK_K / 2 + 12, Support::ReadWrite;
    Q5_K = 13, "Q5_K", 256, 2 + 2 + QK_K / 2 + QK_K / 8 + 12, Support::ReadWrite;
    Q6_K = 14, "Q6_K", 256, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16, Support::ReadWrite;
    Q8_K = 15, "Q8_K", 256, 4 + QK_K + QK_K / 8, Support::ReadWrite;
    IQ2_XXS = 16, "IQ2_XXS", 256, 2 + QK_K / 4, Support::ReadWrite;
    IQ2_XS = 17, "IQ2_XS", 256, 2 + QK_K / 4 + QK_K / 32, Support::ReadWrite;
    IQ3_XXS = 18, "IQ3_XXS", 256, 2 + QK_K / 4 + QK_K / 8, Support::ReadWrite;
    IQ1_S = 19, "IQ1_S", 256, 2 + QK_K / 8 + QK_K / 16, Support::Refused(I_QUANT);
    IQ4_NL = 20, "IQ4_NL", 32, 2 + 16, Support::ReadWrite;
    IQ3_S = 21, "IQ3_S", 256, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, Support::ReadWrite;
    IQ2_S = 22, "IQ2_S", 256, 2 + QK_K / 4 + QK_K / 16, Support::ReadWrite;
    IQ4_XS = 23, "IQ4_XS", 256, 2 + 2 + QK_K / 2 + QK_K / 64, Support::ReadWrite;
    I8 = 24, "I8", 1, 1, Support::Refused(INTEGER);
    I16 = 25, "I16", 1, 2, Support::Refused(INTEGER);
    I32 = 26, "I32", 1, 4, Support::Refused(INTEGER);
    I64 = 27, "I64", 1, 8, Support::Refused(INTEGER);
    F64 = 28, "F64", 1, 8, Support::Refused("F64 weights are not supported; convert to F32");
    IQ1_M = 29, "IQ1_M", 256, QK_K / 8 + QK_K / 16 + QK_K / 32, Support::Refused(I_QUANT);
    BF16 = 30, "BF16", 1, 2, Support::ReadWrite;
    TQ1_0 = 34, "TQ1_0", 256, 2 + 4 * 13, Support::Refused(TERNARY);
    TQ2_0 = 35, "TQ2_0", 256, 2 + 64, Support::Refused(TERNARY);
    MXFP4 = 39, "MXFP4", 32, 1 + 16, Support::ReadOnly;
    NVFP4 = 40, "NVFP4", 64, 4 + 32, Support::Refused(NEWER);
    Q1_0 = 41, "Q1_0", 128, 2 + 16, Support::Refused(NEWER);
    Q2_0 = 42, "Q2_0", 64, 2 + 16, Support::Refused(NEWER);
}

/// Type ids that ggml once had and removed from GGUF files.
const REMOVED_IDS: &[(u32, &str)] = &[
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

/// Why a type id does not name a type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TypeIdError {
    #[error(
        "tensor type id {id} ({name}) was removed from ggml and cannot be read; re-quantise the model from its original weights"
    )]
    Removed { id: u32, name: &'static str },
    #[error("unknown tensor type id {id} (llama.cpp b11434 knows ids 0..=42)")]
    Unknown { id: u32 },
}

impl GgmlType {
    pub fn from_id(id: u32) -> Result<Self, TypeIdError> {
        if let Some(t) = Self::from_known_id(id) {
            return Ok(t);
        }
        match REMOVED_IDS.iter().find(|(i, _)| *i == id) {
            Some(&(id, name)) => Err(TypeIdError::Removed { id, name }),
            None => Err(TypeIdError::Unknown { id }),
        }
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// The ggml name (`Q4_K`), as llama.cpp and gguf-py print it.
    pub fn name(self) -> &'static str {
        self.row().0
    }

    /// Looks a type up by its ggml name, case-insensitively.
    pub fn from_name(name: &str) -> Option<Self> {
        ALL_TYPES
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements per block.
    pub fn block_size(self) -> u64 {
        self.row().1
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.row().2
    }

    /// The type llama.cpp quantises the activation to before a dot product with a
    /// weight of this type (ggml's `vec_dot_type`): the legacy 32-blocks pair with
    /// Q8_0 (Q8_1 for the ones with a min), the 256-blocks with Q8_K.
    pub fn vec_dot_type(self) -> GgmlType {
        use GgmlType::*;
        match self {
            Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Q8_0,
            Q4_1 | Q5_1 | Q8_1 => Q8_1,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS
            | IQ3_S | IQ4_XS => Q8_K,
            F16 => F16,
            BF16 => BF16,
            _ => F32,
        }
    }

    pub fn support(self) -> Support {
        self.row().3
    }

    pub fn is_readable(self) -> bool {
        !matches!(self.support(), Support::Refused(_))
    }

    pub fn is_writable(self) -> bool {
        self.support() == Support::ReadWrite
    }

    /// Bytes taken by `n_elements` elements laid out in one row, or `None` when the count
    /// is not a whole number of blocks or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        if !n_elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (n_elements / self.block_size()).checked_mul(self.type_size())
    }

    /// Why llamay refuses this type, naming what does work; `None` for readable types.
    pub fn refusal(self) -> Option<String> {
        match self.support() {
            Support::Refused(why) => Some(format!(
                "tensor type {} is not supported: {why}; readable types: {}",
                self.name(),
                readable_type_names().join(" ")
            )),
            _ => None,
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The names of every type llamay reads, in id order.
pub fn readable_type_names() -> Vec<&'static str> {
    ALL_TYPES
        .iter()
        .filter(|t| t.is_readable())
        .map(|t| t.name())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_three_readable_twenty_two_writable() {
        assert_eq!(readable_type_names().len(), 23);
        assert_eq!(ALL_TYPES.iter().filter(|t| t.is_writable()).count(), 22);
        assert!(GgmlType::IQ4_NL.is_writable() && GgmlType::IQ4_XS.is_writable());
        assert!(GgmlType::IQ2_XXS.is_writable() && GgmlType::IQ3_S.is_writable());
        assert!(!GgmlType::MXFP4.is_writable() && !GgmlType::IQ1_S.is_writable());
    }

    #[test]
    fn ids_round_trip_and_are_unique() {
        for &t in ALL_TYPES {
            assert_eq!(GgmlType::from_id(t.id()), Ok(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
    }

    #[test]
    fn removed_and_unknown_ids_are_named() {
        let e = GgmlType::from_id(31).unwrap_err();
        assert!(e.to_string().contains("Q4_0_4_4"), "{e}");
        let e = GgmlType::from_id(43).unwrap_err();
        assert!(e.to_string().contains("43"), "{e}");
    }

    #[test]
    fn refusals_name_the_type_and_what_works() {
        let r = GgmlType::IQ1_S.refusal().unwrap();
        assert!(r.contains("IQ1_S") && r.contains("Q4_K"), "{r}");
        assert!(GgmlType::Q4_K.refusal().is_none());
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
