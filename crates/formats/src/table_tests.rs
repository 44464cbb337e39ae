//! Pins every i-quant table entry: FNV-1a 64 over each entry widened to i64 (8 bytes,
//! little-endian), with the checksums computed by Python straight from llama.cpp
//! b11434's `ggml-common.h`, independently of the generated Rust source.

use crate::tables::*;

fn fnv1a(values: &[i64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in values {
        for byte in v.to_le_bytes() {
            h ^= byte as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[test]
fn table_checksums() {
    let tables: Vec<(Vec<i64>, usize, u64, &str)> = vec![
        (
            KMASK_IQ2XS.iter().map(|&v| v as i64).collect(),
            8,
            0xef949dab85a7ab1a,
            "KMASK_IQ2XS",
        ),
        (
            KSIGNS_IQ2XS.iter().map(|&v| v as i64).collect(),
            128,
            0x99c8e1a72458bf25,
            "KSIGNS_IQ2XS",
        ),
        (
            IQ2XXS_GRID.iter().map(|&v| v as i64).collect(),
            256,
            0xbb4ee025b5ac6e8e,
            "IQ2XXS_GRID",
        ),
        (
            IQ2XS_GRID.iter().map(|&v| v as i64).collect(),
            512,
            0xc9b1ee61e79909bd,
            "IQ2XS_GRID",
        ),
        (
            IQ2S_GRID.iter().map(|&v| v as i64).collect(),
            1024,
            0x123edd38a3b62b90,
            "IQ2S_GRID",
        ),
        (
            IQ3XXS_GRID.iter().map(|&v| v as i64).collect(),
            256,
            0x01ae59a5620eb195,
            "IQ3XXS_GRID",
        ),
        (
            IQ3S_GRID.iter().map(|&v| v as i64).collect(),
            512,
            0x4f8359025ec9ac49,
            "IQ3S_GRID",
        ),
        (
            KVALUES_IQ4NL.iter().map(|&v| v as i64).collect(),
            16,
            0x70d7bc144bb438fb,
            "KVALUES_IQ4NL",
        ),
        (
            KVALUES_MXFP4.iter().map(|&v| v as i64).collect(),
            16,
            0x0c5e07495aa71cb2,
            "KVALUES_MXFP4",
        ),
    ];
    for (values, len, sum, name) in tables {
        assert_eq!(values.len(), len, "{name}");
        assert_eq!(fnv1a(&values), sum, "{name}");
    }
}
