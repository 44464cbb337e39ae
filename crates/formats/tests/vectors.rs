//! Test vectors from independent implementations (see tests/data/README.md):
//! dequantisation against gguf-py's numpy, quantisation against llama.cpp's C reference
//! quantisers and its importance-weighted quantisers. All must match bit for bit.

use llamay_formats::{
    FormatError, GgmlType, dequantize, quantize, quantize_mxfp4_for_fixtures, quantize_weighted,
};
use std::path::PathBuf;

fn data(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

const READABLE: [&str; 23] = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "Q8_K", "MXFP4", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
    "IQ3_S",
];

/// The types with a vector without weights (IQ2_XXS and IQ2_XS need an imatrix).
const WRITTEN: [&str; 20] = [
    "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "Q8_K", "MXFP4", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_S",
];

/// The types whose ggml quantiser takes importance weights.
const WEIGHTED: [&str; 16] = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
    "IQ3_XXS", "IQ3_S", "IQ2_S", "IQ2_XS", "IQ2_XXS",
];

/// Quantises `input` one row of `n_per_row` at a time with `quant`. A row where the
/// quantiser refuses because llama.cpp's aborts comes out as the vectors' marker for
/// such rows: all 0xFF bytes.
fn by_rows(
    ty: GgmlType,
    input: &[f32],
    n_per_row: usize,
    quant: impl Fn(&[f32]) -> Result<Vec<u8>, FormatError>,
) -> Vec<u8> {
    let row_bytes = ty.bytes_for(n_per_row as u64).unwrap() as usize;
    let mut out = Vec::with_capacity(input.len() / n_per_row * row_bytes);
    for row in input.chunks_exact(n_per_row) {
        match quant(row) {
            Ok(b) => out.extend_from_slice(&b),
            Err(FormatError::QuantiserAborts { .. }) => {
                out.extend(std::iter::repeat_n(0xFF, row_bytes))
            }
            Err(e) => panic!("{ty}: {e}"),
        }
    }
    out
}

fn input_row_names() -> Vec<String> {
    String::from_utf8(data("quant-input.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Appends `what: row r (name)` for every row of `got` that differs from `want`.
fn diff_rows(what: &str, names: &[String], got: &[u8], want: &[u8], failures: &mut Vec<String>) {
    assert_eq!(got.len(), want.len(), "{what}");
    let row = want.len() / names.len();
    for (r, row_name) in names.iter().enumerate() {
        // The rows holding 1e30 overflow f32 in the weighted and i-quant searches: the
        // scales come out NaN from inf − inf, and a NaN made by an invalid operation
        // has the host's default sign (negative on x86, positive on ARM, RISC-V,
        // POWER, s390x), in C as in Rust. The vectors are x86's; elsewhere those
        // garbage blocks are the host's own C bytes, not x86's.
        if !cfg!(target_arch = "x86_64") && row_name.contains("1e30") {
            continue;
        }
        if got[r * row..(r + 1) * row] != want[r * row..(r + 1) * row] {
            failures.push(format!("{what}: row {r} ({row_name})"));
        }
    }
}

#[test]
fn dequantisation_matches_gguf_py_bit_for_bit() {
    for name in READABLE {
        let ty = GgmlType::from_name(name).unwrap();
        let blocks = data(&format!("dequant-{name}.blocks"));
        let want = f32s(&data(&format!("dequant-{name}.f32")));
        let mut got = vec![0.0f32; want.len()];
        dequantize(ty, &blocks, &mut got).unwrap();
        let mut bad = 0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let same = if ty == GgmlType::F16 && g.is_nan() && w.is_nan() {
                // numpy keeps a signalling NaN's quiet bit clear; ggml (and we) set it.
                (g.to_bits() | 0x0040_0000) == (w.to_bits() | 0x0040_0000)
            } else {
                g.to_bits() == w.to_bits()
            };
            if !same {
                if bad < 5 {
                    eprintln!(
                        "{name}[{i}]: got {g:e} ({:#x}) want {w:e} ({:#x})",
                        g.to_bits(),
                        w.to_bits()
                    );
                }
                bad += 1;
            }
        }
        assert_eq!(bad, 0, "{name}: {bad} of {} values differ", want.len());
    }
}

#[test]
fn quantisation_matches_llama_cpp_reference_bytes() {
    let input = f32s(&data("quant-input.f32"));
    let names = input_row_names();
    let mut failures = Vec::new();
    for name in WRITTEN {
        let ty = GgmlType::from_name(name).unwrap();
        let want = data(&format!("quant-{name}.bin"));
        let got = if ty == GgmlType::MXFP4 {
            quantize_mxfp4_for_fixtures(&input).unwrap()
        } else {
            by_rows(ty, &input, 256, |x| quantize(ty, x))
        };
        diff_rows(name, &names, &got, &want, &mut failures);
        if ty != GgmlType::MXFP4 {
            // without weights, quantize_weighted is quantize (ggml_quantize_chunk, no imatrix)
            for n_per_row in [256, 512] {
                let mut got = by_rows(ty, &input, n_per_row, |x| {
                    quantize_weighted(ty, x, n_per_row, None)
                });
                // A row of 512 aborts where either of its halves does.
                let (row, half) = (
                    got.len() * n_per_row / input.len(),
                    want.len() / names.len(),
                );
                for (g, w) in got.chunks_exact_mut(row).zip(want.chunks_exact(row)) {
                    let marked = |b: &[u8]| b.iter().all(|&v| v == 0xFF);
                    if marked(g) && w.chunks_exact(half).any(marked) {
                        g.copy_from_slice(w);
                    }
                }
                diff_rows(
                    &format!("{name} quantize_weighted(None, {n_per_row})"),
                    &names,
                    &got,
                    &want,
                    &mut failures,
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} rows differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn weighted_quantisation_matches_llama_cpp_imatrix_bytes() {
    let input = f32s(&data("quant-input.f32"));
    let names = input_row_names();
    let weights = f32s(&data("quant-weights.f32"));
    assert_eq!(weights.len(), 256);
    // rows of 512: two input rows each, the weights followed by their reverse
    let names512: Vec<String> = names
        .chunks_exact(2)
        .map(|p| format!("{} | {}", p[0], p[1]))
        .collect();
    let weights512: Vec<f32> = weights
        .iter()
        .chain(weights.iter().rev())
        .copied()
        .collect();
    let mut failures = Vec::new();
    for name in WEIGHTED {
        let ty = GgmlType::from_name(name).unwrap();
        let got = by_rows(ty, &input, 256, |x| {
            quantize_weighted(ty, x, 256, Some(&weights))
        });
        let want = data(&format!("wquant-{name}.bin"));
        diff_rows(name, &names, &got, &want, &mut failures);
        if !llamay_formats::requires_imatrix(ty) {
            assert_ne!(
                got,
                by_rows(ty, &input, 256, |x| quantize(ty, x)),
                "{name}: the weights changed nothing"
            );
        }
        let got = by_rows(ty, &input, 512, |x| {
            quantize_weighted(ty, x, 512, Some(&weights512))
        });
        let want = data(&format!("wquant512-{name}.bin"));
        diff_rows(
            &format!("{name} (512 per row)"),
            &names512,
            &got,
            &want,
            &mut failures,
        );
    }
    assert!(
        failures.is_empty(),
        "{} rows differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn types_without_a_weighted_quantiser_ignore_the_weights() {
    let input = f32s(&data("quant-input.f32"));
    let weights = f32s(&data("quant-weights.f32"));
    for name in ["F32", "F16", "BF16", "Q8_0", "Q8_1", "Q8_K"] {
        let ty = GgmlType::from_name(name).unwrap();
        assert_eq!(
            quantize_weighted(ty, &input, 256, Some(&weights)).unwrap(),
            quantize(ty, &input).unwrap(),
            "{name}"
        );
    }
}
