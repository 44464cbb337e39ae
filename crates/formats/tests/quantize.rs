//! `quantize` behaviour beyond the reference bytes: refusals, round-trip error bounds,
//! and no panics on arbitrary bytes or values.

use llamay_formats::{
    ALL_TYPES, FormatError, GgmlType, dequantize, quantize, quantize_mxfp4_for_fixtures,
    quantize_weighted, requires_imatrix,
};
use proptest::prelude::*;

/// xorshift64* with Box–Muller: a fixed Gaussian stream without a rand dependency.
struct Gauss(u64);

impl Gauss {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn next(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

fn gaussian(n: usize) -> Vec<f32> {
    let mut g = Gauss(0x5EED_1234_ABCD_0001);
    (0..n).map(|_| g.next()).collect()
}

/// Root-mean-square error of quantise→dequantise, on 64 Ki unit Gaussians.
fn round_trip_rmse(ty: GgmlType) -> f64 {
    let x = gaussian(65_536);
    let bytes = if ty == GgmlType::MXFP4 {
        quantize_mxfp4_for_fixtures(&x).unwrap()
    } else {
        quantize(ty, &x).unwrap()
    };
    let mut y = vec![0.0f32; x.len()];
    dequantize(ty, &bytes, &mut y).unwrap();
    let se: f64 = x
        .iter()
        .zip(&y)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    (se / x.len() as f64).sqrt()
}

/// Measured RMSE per written type (docs/formats.md has the table); each bound is the
/// measurement plus 10%, so a regression in a quantiser's search shows up here.
const RMSE: &[(&str, f64)] = &[
    ("F32", 0.0),
    ("F16", 0.000210),
    ("BF16", 0.001666),
    ("Q4_0", 0.086880),
    ("Q4_1", 0.078964),
    ("Q5_0", 0.043012),
    ("Q5_1", 0.038161),
    ("Q8_0", 0.005399),
    ("Q8_1", 0.005399),
    ("Q2_K", 0.299072),
    ("Q3_K", 0.152184),
    ("Q4_K", 0.072029),
    ("Q5_K", 0.036477),
    ("Q6_K", 0.017900),
    ("Q8_K", 0.007080),
    ("MXFP4", 0.115291),
    ("IQ4_NL", 0.076512),
    ("IQ4_XS", 0.077125),
    ("IQ3_XXS", 0.215944),
    ("IQ3_S", 0.167038),
    ("IQ2_S", 0.266646),
];

/// Measured with uniform weights (plus 10% in the check), for the types that cannot be
/// made without them (IQ2_XXS, IQ2_XS).
const RMSE_IMATRIX_ONLY: &[(&str, f64)] = &[("IQ2_XXS", 0.346004), ("IQ2_XS", 0.301682)];

#[test]
fn round_trip_error_is_bounded() {
    let mut report = String::new();
    let mut bad = Vec::new();
    for &(name, measured) in RMSE {
        let ty = GgmlType::from_name(name).unwrap();
        let rmse = round_trip_rmse(ty);
        report += &format!("| {name} | {rmse:.6} |\n");
        if rmse > measured * 1.1 + 1e-9 {
            bad.push(format!(
                "{name}: rmse {rmse:.6} above bound {:.6}",
                measured * 1.1
            ));
        }
    }
    eprintln!("{report}");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn non_finite_input_is_refused_by_name() {
    for ty in ALL_TYPES.iter().copied().filter(|t| t.is_writable()) {
        let n = ty.block_size() as usize;
        for (bad, what) in [
            (f32::NAN, "NaN"),
            (f32::INFINITY, "+inf"),
            (f32::NEG_INFINITY, "-inf"),
        ] {
            let mut x = vec![0.5f32; n];
            x[n - 1] = bad;
            let e = quantize(ty, &x).unwrap_err();
            assert_eq!(
                e,
                FormatError::NonFinite {
                    ty,
                    index: n - 1,
                    what
                }
            );
            assert!(e.to_string().contains(what), "{e}");
        }
    }
    let e = quantize_mxfp4_for_fixtures(&[f32::NAN; 32]).unwrap_err();
    assert!(e.to_string().contains("NaN"), "{e}");
}

#[test]
fn partial_blocks_are_refused() {
    let e = quantize(GgmlType::Q4_K, &[0.0; 300]).unwrap_err();
    assert!(matches!(e, FormatError::PartialInput { .. }), "{e}");
    let e = quantize(GgmlType::IQ3_S, &[0.0; 300]).unwrap_err();
    assert!(matches!(e, FormatError::PartialInput { .. }), "{e}");
    assert!(quantize(GgmlType::Q8_0, &[0.0; 33]).is_err());
    assert!(quantize_mxfp4_for_fixtures(&[0.0; 31]).is_err());
    assert_eq!(quantize(GgmlType::Q8_0, &[]).unwrap(), Vec::<u8>::new());
}

#[test]
fn unwritable_and_refused_types_are_never_written() {
    for ty in ALL_TYPES.iter().copied().filter(|t| !t.is_writable()) {
        let x = vec![0.0f32; ty.block_size() as usize];
        let e = quantize(ty, &x).unwrap_err();
        if ty.is_readable() {
            assert_eq!(ty, GgmlType::MXFP4, "the one readable type never written");
            assert_eq!(e, FormatError::NotWritable { ty });
            assert!(
                e.to_string().contains("never writes it") && e.to_string().contains("IQ3_XXS"),
                "{e}"
            );
        } else {
            assert_eq!(e, FormatError::Refused(ty.refusal().unwrap()));
        }
    }
}

#[test]
fn weighted_quantisation_refuses_bad_shapes_and_weights() {
    let x = gaussian(512);
    let w = vec![1.0f32; 256];
    let e = quantize_weighted(GgmlType::Q4_K, &x, 256, Some(&w[..255])).unwrap_err();
    assert_eq!(
        e,
        FormatError::WeightsLength {
            ty: GgmlType::Q4_K,
            n_weights: 255,
            n_per_row: 256
        }
    );
    assert!(
        e.to_string().contains("255") && e.to_string().contains("256"),
        "{e}"
    );
    for (bad, what) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "+inf"),
        (f32::NEG_INFINITY, "-inf"),
    ] {
        let mut w = w.clone();
        w[7] = bad;
        let e = quantize_weighted(GgmlType::Q5_K, &x, 256, Some(&w)).unwrap_err();
        assert_eq!(
            e,
            FormatError::NonFiniteWeight {
                ty: GgmlType::Q5_K,
                index: 7,
                what
            }
        );
        assert!(e.to_string().contains("importance weight 7"), "{e}");
    }
    let mut nan_x = x.clone();
    nan_x[300] = f32::NAN;
    assert!(matches!(
        quantize_weighted(GgmlType::Q4_0, &nan_x, 256, Some(&w)).unwrap_err(),
        FormatError::NonFinite { index: 300, .. }
    ));
    for n_per_row in [0, 100, 32] {
        let e = quantize_weighted(GgmlType::Q6_K, &x, n_per_row, None).unwrap_err();
        assert!(matches!(e, FormatError::BadRowLength { .. }), "{e}");
    }
    let e = quantize_weighted(GgmlType::Q4_0, &x[..480], 256, Some(&w)).unwrap_err();
    assert!(matches!(e, FormatError::PartialRow { .. }), "{e}");
    let e = quantize_weighted(GgmlType::MXFP4, &x, 256, Some(&w)).unwrap_err();
    assert_eq!(
        e,
        FormatError::NotWritable {
            ty: GgmlType::MXFP4
        }
    );
    assert!(matches!(
        quantize_weighted(GgmlType::IQ1_S, &x, 256, Some(&w)).unwrap_err(),
        FormatError::Refused(_)
    ));
    assert_eq!(
        quantize_weighted(GgmlType::Q4_0, &[], 256, Some(&w)).unwrap(),
        Vec::<u8>::new()
    );
}

#[test]
fn requires_imatrix_is_ggmls_list() {
    let need: Vec<&str> = ALL_TYPES
        .iter()
        .filter(|&&t| requires_imatrix(t))
        .map(|t| t.name())
        .collect();
    assert_eq!(need, ["IQ2_XXS", "IQ2_XS", "IQ1_S"]);
    let x = gaussian(256);
    for ty in [GgmlType::IQ2_XXS, GgmlType::IQ2_XS] {
        assert!(ty.is_writable());
        for e in [
            quantize(ty, &x).unwrap_err(),
            quantize_weighted(ty, &x, 256, None).unwrap_err(),
        ] {
            assert_eq!(e, FormatError::ImatrixRequired { ty });
            assert!(e.to_string().contains("importance matrix"), "{e}");
        }
        assert!(quantize_weighted(ty, &x, 256, Some(&[1.0; 256])).is_ok());
    }
}

/// Where llama.cpp's grid searches abort (a value whose square overflows: no neighbour
/// has a finite error), llamay refuses with an error instead of writing bytes.
#[test]
fn lattice_quantisers_refuse_where_ggml_aborts() {
    let mut x = gaussian(256);
    x[5] = 1e30;
    for ty in [GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ2_S] {
        let e = quantize(ty, &x).unwrap_err();
        assert!(
            matches!(e, FormatError::QuantiserAborts { .. }),
            "{ty}: {e}"
        );
        assert!(e.to_string().contains("aborts"), "{e}");
    }
}

/// Uniform weights are not "no weights": ggml's weighted searches differ from the
/// reference ones (other weight formulas and searches), so the bytes differ, but the
/// round-trip error stays that of a sensible quantiser.
#[test]
fn weighted_round_trip_error_is_close_to_the_reference() {
    let x = gaussian(65_536);
    let w = vec![1.0f32; 4096];
    for &(name, measured) in RMSE.iter().chain(RMSE_IMATRIX_ONLY) {
        let ty = GgmlType::from_name(name).unwrap();
        if ty == GgmlType::MXFP4 {
            continue;
        }
        let bytes = quantize_weighted(ty, &x, 4096, Some(&w)).unwrap();
        let mut y = vec![0.0f32; x.len()];
        dequantize(ty, &bytes, &mut y).unwrap();
        let se: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum();
        let rmse = (se / x.len() as f64).sqrt();
        assert!(
            rmse <= measured * 1.1 + 1e-9,
            "{name}: weighted rmse {rmse:.6} vs reference {measured:.6}"
        );
    }
}

fn readable() -> Vec<GgmlType> {
    ALL_TYPES
        .iter()
        .copied()
        .filter(|t| t.is_readable())
        .collect()
}

fn writable() -> Vec<GgmlType> {
    ALL_TYPES
        .iter()
        .copied()
        .filter(|t| t.is_writable())
        .collect()
}

/// The i-quants with ggml's grid searches, which abort on some extreme inputs.
fn is_lattice(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, IQ3_XXS | IQ3_S | IQ2_S | IQ2_XS | IQ2_XXS)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any bit pattern is a valid block: dequantisation never panics.
    #[test]
    fn dequantize_never_panics(
        ty in proptest::sample::select(readable()),
        n_blocks in 0usize..4,
        seed in any::<u64>(),
    ) {
        let ts = ty.type_size() as usize;
        let mut s = seed | 1;
        let bytes: Vec<u8> = (0..n_blocks * ts).map(|_| {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            (s >> 24) as u8
        }).collect();
        let mut out = vec![0.0f32; n_blocks * ty.block_size() as usize];
        prop_assert!(dequantize(ty, &bytes, &mut out).is_ok());
        // wrong lengths are errors, not panics
        if ts > 1 {
            let mut out2 = vec![0.0f32; out.len()];
            prop_assert!(dequantize(ty, &bytes[..bytes.len().saturating_sub(1)], &mut out2).is_err() || bytes.is_empty());
        }
    }

    /// Quantisation of any finite values gives whole blocks that dequantise to the
    /// input's length.
    #[test]
    fn quantize_then_dequantize_keeps_the_length(
        ty in proptest::sample::select(writable()),
        values in proptest::collection::vec(
            prop_oneof![any::<f32>().prop_filter("finite", |v| v.is_finite()), -4.0f32..4.0], 512),
        n_blocks in 0usize..3,
    ) {
        let n = ty.block_size() as usize * n_blocks;
        let x = &values[..n.min(values.len())];
        let x: Vec<f32> = x.iter().copied().cycle().take(n).collect();
        let bytes = match quantize(ty, &x) {
            Ok(b) => b,
            // IQ2_XXS/IQ2_XS need an imatrix; the grid searches refuse where ggml aborts
            Err(FormatError::ImatrixRequired { .. }) if requires_imatrix(ty) => return Ok(()),
            Err(FormatError::QuantiserAborts { .. }) if is_lattice(ty) => return Ok(()),
            Err(e) => panic!("{ty}: {e}"),
        };
        prop_assert_eq!(bytes.len() as u64, ty.bytes_for(n as u64).unwrap());
        let mut y = vec![0.0f32; n];
        prop_assert!(dequantize(ty, &bytes, &mut y).is_ok());
    }

    /// Weighted quantisation of any finite values with any finite weights (zero,
    /// negative, tiny, huge) gives whole rows and never panics.
    #[test]
    fn quantize_weighted_never_panics(
        ty in proptest::sample::select(writable()),
        values in proptest::collection::vec(
            prop_oneof![any::<f32>().prop_filter("finite", |v| v.is_finite()), -4.0f32..4.0], 512),
        weights in proptest::collection::vec(
            prop_oneof![any::<f32>().prop_filter("finite", |v| v.is_finite()), 0.0f32..10.0,
                        Just(0.0f32)], 256),
        n_rows in 0usize..3,
    ) {
        let n_per_row = 256;
        let x: Vec<f32> = values.iter().copied().cycle().take(n_per_row * n_rows).collect();
        let bytes = match quantize_weighted(ty, &x, n_per_row, Some(&weights)) {
            Ok(b) => b,
            Err(FormatError::QuantiserAborts { .. }) if is_lattice(ty) => return Ok(()),
            Err(e) => panic!("{ty}: {e}"),
        };
        prop_assert_eq!(bytes.len() as u64, ty.bytes_for(x.len() as u64).unwrap());
        let mut y = vec![0.0f32; x.len()];
        prop_assert!(dequantize(ty, &bytes, &mut y).is_ok());
    }
}
