//! SIMD vs portable, portable vs a dequantise-and-dot f64 reference, quantize_rows vs
//! llamay_formats, matmul vs a naive loop.
//!
//! Stated bounds (eps = f32::EPSILON):
//! - K-quants (Q2_K..Q6_K) and MXFP4: every SIMD kernel is bit-identical to portable
//!   (exact i32 block or super-block sums, the same float steps in the same order).
//! - 32-blocks (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0): |simd − portable| ≤ 4·eps·(nb+8)·Σ_b |dot_b|
//!   (dot_b = the portable dot of block b alone): only the f32 accumulation order differs.
//! - F32/F16/BF16: |simd − portable| ≤ 4·eps·(n+8)·Σ|x_i·y_i|.
//! - portable vs reference: |portable − ref| ≤ 32·eps·(nb+2)·Σ_i (|w_i| + M_b)·|a_i|,
//!   M_b the largest |w| of the element's block (covers min-term cancellation), plus
//!   for Q4_1/Q5_1 Σ_b |m_b|·|Σ a|·2^-11 (Q8_1's `s` is stored as f16).

use llamay_formats::{GgmlType, GgmlType::*};
use llamay_kernels::*;
use proptest::prelude::*;

mod common;
use common::Rng;

const WEIGHT_TYPES: &[GgmlType] = &[
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
    IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, MXFP4,
];

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// Positions of the f16 scales in a block of `ty`.
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// Random bytes for `cols` values of `ty`, with finite scales of moderate size.
fn random_row(ty: GgmlType, cols: usize, rng: &mut Rng) -> Vec<u8> {
    match ty {
        F32 => (0..cols).flat_map(|_| rng.f32().to_le_bytes()).collect(),
        F16 => (0..cols).flat_map(|_| f16_bytes(rng.f32())).collect(),
        BF16 => (0..cols)
            .flat_map(|_| ((rng.f32().to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let ts = ty.type_size() as usize;
            let nb = cols / ty.block_size() as usize;
            let mut b = rng.bytes(nb * ts);
            for blk in b.chunks_exact_mut(ts) {
                for &at in scale_fields(ty) {
                    blk[at..at + 2].copy_from_slice(&f16_bytes(rng.f32() * 0.01));
                }
                if ty == MXFP4 {
                    blk[0] = 110 + (rng.next() % 20) as u8;
                }
            }
            b
        }
    }
}

fn random_f32(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.f32() * 3.0).collect()
}

fn deq(ty: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    llamay_formats::dequantize(ty, b, &mut v).unwrap();
    v
}

fn activation(wty: GgmlType, cols: usize, rng: &mut Rng, pool: &ThreadPool) -> QuantizedRows {
    quantize_rows(wty.vec_dot_type(), &random_f32(cols, rng), cols, pool)
}

/// The formats whose SIMD kernels are bit-identical to portable.
fn is_exact(ty: GgmlType) -> bool {
    matches!(ty, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | MXFP4)
}

fn check_simd(ty: GgmlType, nb: usize, seed: u64, pool: &ThreadPool) {
    let mut rng = Rng(seed | 1);
    let cols = nb * ty.block_size().max(32) as usize;
    let w = random_row(ty, cols, &mut rng);
    let a = activation(ty, cols, &mut rng, pool);
    let p = vec_dot_with(KernelSet::Portable, ty, &w, &a.data, cols);
    assert!(p.is_finite(), "{ty}: portable {p}");
    for set in KernelSet::available() {
        if set == KernelSet::Portable || !set.has_kernel(ty) {
            continue;
        }
        let s = vec_dot_with(set, ty, &w, &a.data, cols);
        if is_exact(ty) {
            assert_eq!(
                s.to_bits(),
                p.to_bits(),
                "{ty} {set:?} nb={nb}: {s} vs portable {p}"
            );
            continue;
        }
        let eps = f32::EPSILON as f64;
        // Both paths sum exact integer products per block; they differ in how the
        // scaled partial sums are added in f32 (SIMD keeps 8 lanes), so the error is
        // bounded by the magnitude of the element products, not of the result, which
        // can cancel. (Q4_1/Q5_1 also add their min term, bounded the same way.)
        let (x, y) = (deq(ty, &w, cols), deq(ty.vec_dot_type(), &a.data, cols));
        let mag: f64 = x.iter().zip(&y).map(|(a, b)| (a * b).abs() as f64).sum();
        let bound = 4.0 * eps * (cols as f64 + 8.0) * mag;
        let diff = (s as f64 - p as f64).abs();
        assert!(
            diff <= bound,
            "{ty} {set:?} nb={nb}: {s} vs portable {p}, diff {diff} > {bound}"
        );
    }
}

fn check_reference(ty: GgmlType, nb: usize, seed: u64, pool: &ThreadPool) {
    let mut rng = Rng(seed | 1);
    let bs = ty.block_size() as usize;
    let cols = nb * bs.max(32);
    // Quantised values where llamay writes the type without an importance matrix
    // (IQ2_XXS and IQ2_XS need one), random blocks elsewhere.
    let quantised = (ty.is_writable() && bs > 1)
        .then(|| {
            let x: Vec<f32> = random_f32(cols, &mut rng)
                .iter()
                .map(|v| v * 0.05)
                .collect();
            llamay_formats::quantize(ty, &x).ok()
        })
        .flatten();
    let w = quantised.unwrap_or_else(|| random_row(ty, cols, &mut rng));
    let a = activation(ty, cols, &mut rng, pool);
    let (wv, av) = (deq(ty, &w, cols), deq(a.ty, &a.data, cols));
    let reference: f64 = wv.iter().zip(&av).map(|(x, y)| *x as f64 * *y as f64).sum();
    let blk = bs.max(32);
    let mut mag = 0.0f64;
    for (wb, ab) in wv.chunks(blk).zip(av.chunks(blk)) {
        let m = wb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
        mag += wb
            .iter()
            .zip(ab)
            .map(|(x, y)| (x.abs() as f64 + m) * y.abs() as f64)
            .sum::<f64>();
    }
    let p = vec_dot_with(KernelSet::Portable, ty, &w, &a.data, cols) as f64;
    let mut bound = 32.0 * f32::EPSILON as f64 * (nb as f64 + 2.0) * mag;
    if matches!(ty, Q4_1 | Q5_1) {
        // Q8_1 stores s = f16(d·Σq) with the f32 d, while the activation dequantises
        // with f16(d): the min term m·s carries both roundings (2 × 2^-11 relative).
        let ts = ty.type_size() as usize;
        for (b, ab) in av.chunks(32).enumerate() {
            let m = half::f16::from_le_bytes([w[b * ts + 2], w[b * ts + 3]]).to_f32() as f64;
            let sa: f64 = ab.iter().map(|v| *v as f64).sum();
            bound += m.abs() * (sa.abs() + 1e-30) * (2.0 / 2048.0);
        }
    }
    assert!(
        (p - reference).abs() <= bound,
        "{ty} nb={nb}: portable {p} vs reference {reference} (bound {bound})"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn simd_equals_portable(seed in any::<u64>(), nb in 1usize..9) {
        let pool = ThreadPool::new(1);
        for &ty in WEIGHT_TYPES {
            check_simd(ty, nb, seed, &pool);
        }
    }

    #[test]
    fn portable_matches_dequantised_reference(seed in any::<u64>(), nb in 1usize..6) {
        let pool = ThreadPool::new(1);
        for &ty in WEIGHT_TYPES {
            check_reference(ty, nb, seed, &pool);
        }
    }

    #[test]
    fn quantize_rows_equals_llama_cpp_cpu(seed in any::<u64>(), nb in 1usize..4, n in 1usize..5) {
        let pool = ThreadPool::new(3);
        let mut rng = Rng(seed | 1);
        for ty in [Q8_0, Q8_1, Q8_K, F16, BF16, F32] {
            let cols = nb * 256;
            let mut x = random_f32(n * cols, &mut rng);
            if seed % 3 == 0 { x[..cols].fill(0.0); }
            let q = quantize_rows(ty, &x, cols, &pool);
            prop_assert_eq!(q.n, n);
            let want = match ty {
                Q8_0 | Q8_1 => x86_q8(ty, &x),
                _ => llamay_formats::quantize(ty, &x).unwrap(),
            };
            prop_assert_eq!(&q.data, &want, "{}", ty);
            // Into a reused buffer holding other bytes (longer, then shorter): the same.
            let mut reused = QuantizedRows { ty: F32, cols: 1, n: 0, data: vec![0xA5; n * cols * 4 + 7] };
            quantize_rows_into(ty, &x, cols, &pool, &mut reused);
            prop_assert_eq!((reused.ty, reused.cols, reused.n), (ty, cols, n));
            prop_assert_eq!(&reused.data, &want, "{} reused", ty);
            reused.data.iter_mut().for_each(|b| *b = !*b);
            quantize_rows_into(ty, &x, cols, &pool, &mut reused);
            prop_assert_eq!(&reused.data, &want, "{} reused twice", ty);
        }
    }
}

#[test]
fn float_simd_handles_tails() {
    let pool = ThreadPool::new(1);
    let mut rng = Rng(99);
    for ty in [F32, F16, BF16] {
        for cols in [1usize, 7, 8, 9, 31, 33, 100, 257] {
            let w = random_row(ty, cols, &mut rng);
            let a = quantize_rows(ty, &random_f32(cols, &mut rng), cols, &pool);
            let p = vec_dot_with(KernelSet::Portable, ty, &w, &a.data, cols);
            for set in KernelSet::available() {
                let s = vec_dot_with(set, ty, &w, &a.data, cols);
                assert!(
                    (s - p).abs() <= 1e-5 * (1.0 + p.abs()) * cols as f32,
                    "{ty} {set:?} {cols}: {s} vs {p}"
                );
            }
        }
    }
}

/// MXFP4 at every exponent byte (0..=255: the two subnormal scales, overflow to
/// infinity at the top) and every block count up to 20 (the SIMD kernels work in runs of
/// blocks with a tail): each SIMD set's dot has the portable bits (NaN where portable's
/// is NaN, from infinities of both signs).
#[test]
fn mxfp4_simd_is_exact_at_every_exponent() {
    let pool = ThreadPool::new(1);
    let mut rng = Rng(0x4D58);
    for nb in 1..=20usize {
        let cols = 32 * nb;
        for first in (0..256usize).step_by(nb.max(8)) {
            let mut w = rng.bytes(17 * nb);
            for (b, blk) in w.chunks_exact_mut(17).enumerate() {
                blk[0] = ((first + b) % 256) as u8;
            }
            // Large activations overflow at the top exponents, small ones give
            // subnormal scales and products at the bottom.
            for scale in [1e3f32, 1e-3] {
                let x: Vec<f32> = (0..cols).map(|_| rng.f32() * scale).collect();
                let a = quantize_rows(Q8_0, &x, cols, &pool);
                let p = vec_dot_with(KernelSet::Portable, MXFP4, &w, &a.data, cols);
                for set in KernelSet::available() {
                    let s = vec_dot_with(set, MXFP4, &w, &a.data, cols);
                    assert!(
                        s.to_bits() == p.to_bits() || (s.is_nan() && p.is_nan()),
                        "{set:?} nb={nb} e from {first} scale {scale}: {s} vs portable {p}"
                    );
                }
            }
        }
    }
}

#[test]
fn large_quantised_activation_rows_go_through_the_pool() {
    let pool = ThreadPool::new(4);
    let mut rng = Rng(5);
    let cols = 4096;
    let x = random_f32(40 * cols, &mut rng);
    for ty in [Q8_0, Q8_1, Q8_K] {
        let q = quantize_rows(ty, &x, cols, &pool);
        let want = if ty == Q8_K {
            llamay_formats::quantize(ty, &x).unwrap()
        } else {
            x86_q8(ty, &x)
        };
        assert!(q.data == want, "{ty}");
    }
}

#[test]
fn matmul_equals_naive_loop() {
    let pool = ThreadPool::new(3);
    let mut rng = Rng(7);
    for &ty in WEIGHT_TYPES {
        let cols = 512;
        for (rows, n) in [(37usize, 1usize), (64, 5), (19, 70)] {
            let w: Vec<u8> = (0..rows)
                .flat_map(|_| random_row(ty, cols, &mut rng))
                .collect();
            let x = random_f32(n * cols, &mut rng);
            let a = quantize_rows(ty.vec_dot_type(), &x, cols, &pool);
            let wrb = w.len() / rows;
            for set in KernelSet::available() {
                let mut out = vec![f32::NAN; rows * n];
                matmul_with(set, ty, &w, rows, cols, &a, &mut out, &pool);
                for t in 0..n {
                    for r in 0..rows {
                        let want =
                            vec_dot_with(set, ty, &w[r * wrb..(r + 1) * wrb], a.row(t), cols);
                        assert_eq!(
                            out[t * rows + r].to_bits(),
                            want.to_bits(),
                            "{ty} {set:?} r={r} t={t}"
                        );
                    }
                }
            }
        }
    }
}

/// F16 weights run through register tiles of rows × tokens (x86): every (row, token)
/// dot gives the bits `vec_dot` gives it alone, whatever tile or task it falls in —
/// rows, tokens and columns off the tile and vector widths included.
#[test]
fn f16_tiles_equal_single_dots_with_tails() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(16);
    for (rows, n, cols) in [
        (7usize, 3usize, 13usize),
        (33, 1, 384),
        (18, 37, 100),
        (5, 2, 7),
    ] {
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(F16, cols, &mut rng))
            .collect();
        let a = quantize_rows(F16, &random_f32(n * cols, &mut rng), cols, &pool);
        for set in KernelSet::available() {
            let mut out = vec![f32::NAN; rows * n];
            matmul_with(set, F16, &w, rows, cols, &a, &mut out, &pool);
            for t in 0..n {
                for r in 0..rows {
                    let want = vec_dot_with(
                        set,
                        F16,
                        &w[r * 2 * cols..(r + 1) * 2 * cols],
                        a.row(t),
                        cols,
                    );
                    assert_eq!(
                        out[t * rows + r].to_bits(),
                        want.to_bits(),
                        "{set:?} {rows}x{cols} n={n} r={r} t={t}"
                    );
                }
            }
        }
    }
}

#[test]
fn kvalue_tables_match_formats() {
    // IQ4_NL block with d = 1 and nibbles 0..15 / 15..0.
    let mut b = vec![0u8; 18];
    b[0..2].copy_from_slice(&f16_bytes(1.0));
    for j in 0..16 {
        b[2 + j] = j as u8 | ((15 - j as u8) << 4);
    }
    let v = deq(IQ4_NL, &b, 32);
    let w: Vec<u8> = b.clone();
    // A Q8_0 activation that is one-hot at element j picks kvalue j.
    let pool = ThreadPool::new(1);
    for j in 0..32 {
        let mut x = vec![0f32; 32];
        x[j] = 1.0;
        let a = quantize_rows(Q8_0, &x, 32, &pool);
        let d = vec_dot(IQ4_NL, &w, &a.data, 32);
        let ay = deq(Q8_0, &a.data, 32)[j];
        assert_eq!(d, v[j] * ay, "element {j}");
    }
}

#[test]
fn bad_shapes_give_nan_not_panic() {
    let w = vec![0u8; 144];
    let a = vec![0u8; 292];
    assert!(vec_dot(Q4_K, &w, &a, 256).is_finite());
    assert!(vec_dot(Q4_K, &w[..100], &a, 256).is_nan());
    assert!(vec_dot(Q4_K, &w, &a[..10], 256).is_nan());
    assert!(vec_dot(Q4_K, &w, &a, 100).is_nan());
    assert!(vec_dot(IQ1_S, &w, &a, 256).is_nan());
    assert!(vec_dot(Q8_K, &a, &a, 256).is_nan());
    assert!(!supports(Q8_K) && supports(IQ3_S));
}

#[cfg(not(debug_assertions))]
#[test]
fn matmul_shape_mismatch_fills_nan() {
    let pool = ThreadPool::new(2);
    let a = quantize_rows(Q8_K, &[0.5; 256], 256, &pool);
    let mut out = vec![0.0; 4];
    matmul(Q4_K, &[0u8; 144], 4, 256, &a, &mut out, &pool);
    assert!(out.iter().all(|v| v.is_nan()));
}

#[test]
fn kernel_set_is_named() {
    let names = [
        "portable",
        "avx2",
        "avxvnni",
        "avx512vnni",
        "avx512amx",
        "neon",
        "neon-dotprod",
        "neon-i8mm",
    ];
    assert!(names.contains(&kernel_set()));
    assert!(KernelSet::Portable.is_available());
    // The script that runs these tests on a chosen CPU (scripts/test-aarch64, under
    // qemu) says which set that CPU must get.
    if let Ok(want) = std::env::var("LLAMAY_EXPECT_KERNEL_SET")
        && !want.is_empty()
    {
        assert_eq!(kernel_set(), want);
    }
}

/// Every format with an x86 SIMD kernel has one in each SIMD set (x86 and aarch64).
#[test]
fn simd_sets_cover_the_block_formats() {
    for set in KernelSet::available() {
        if set == KernelSet::Portable {
            continue;
        }
        for ty in [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4,
        ] {
            assert!(set.has_kernel(ty), "{set:?} {ty}");
        }
        for ty in [IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S] {
            assert!(!set.has_kernel(ty), "{set:?} {ty}");
        }
    }
}

/// ggml-cpu's x86 `quantize_row_q8_0` / `quantize_row_q8_1`, written out independently:
/// d = amax/127 stored as f16, q = round-half-even(x * (127/amax)), s = f16(d * Σq).
/// For finite products only (the random inputs below); ggml's own bytes, non-finite
/// products included, are `q8_activation_quantisers_equal_ggml_cpus_bytes`'s.
fn x86_q8(ty: llamay_formats::GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in x.chunks(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let q: Vec<i8> = block
            .iter()
            .map(|v| (v * id).round_ties_even() as i8)
            .collect();
        out.extend(half::f16::from_f32(d).to_le_bytes());
        if ty == Q8_1 {
            let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
            out.extend(half::f16::from_f32(d * sum as f32).to_le_bytes());
        }
        out.extend(q.iter().map(|&v| v as u8));
    }
    out
}

#[test]
fn q8_k_keeps_the_first_value_of_largest_magnitude_and_halves_round_to_even() {
    let pool = ThreadPool::new(1);
    let mut x: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) / 256.0).collect();
    x[3] = -2.0;
    x[7] = 2.0;
    // 127/2 · v = k + 0.5 exactly for these: ties.
    x[10] = 1.0 / 127.0;
    x[11] = 3.0 / 127.0;
    let q = quantize_rows(Q8_K, &x, 256, &pool);
    assert_eq!(q.data, llamay_formats::quantize(Q8_K, &x).unwrap());
    let q = quantize_rows(Q8_0, &x[..32], 32, &pool);
    assert_eq!(q.data, x86_q8(Q8_0, &x[..32]));
}

/// Q8_K keeps the sign of the *first* value of largest magnitude (ggml's scalar loop):
/// with +m and −m both present, whichever comes first sets the scale's sign.
#[test]
fn q8_k_scale_takes_the_first_largest_magnitude() {
    let pool = ThreadPool::new(1);
    for (first, second) in [(5usize, 200usize), (200, 5), (0, 255), (255, 0), (9, 10)] {
        for sign in [1.0f32, -1.0] {
            let mut x: Vec<f32> = (0..256)
                .map(|i| ((i * 37) % 19) as f32 / 10.0 - 0.9)
                .collect();
            x[first] = 3.0 * sign;
            x[second] = -3.0 * sign;
            let q = quantize_rows(Q8_K, &x, 256, &pool);
            let want = llamay_formats::quantize(Q8_K, &x).unwrap();
            assert_eq!(q.data, want, "first {first} sign {sign}");
        }
    }
}

/// The Q8_0/Q8_1 activation quantisers against bytes ggml-cpu itself produced
/// (tests/data/q8_{0,1}-cpu.bin, scripts/gen-q8-cpu-vectors: llama.cpp b11434's
/// `quantize_row_q8_0/1`, x86 native build) from the format suite's 52 rows of
/// Gaussian and adversarial values (zeros, denormals, outliers, f16 overflow).
#[test]
fn q8_activation_quantisers_equal_ggml_cpus_bytes() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let input = std::fs::read(data.join("../../../formats/tests/data/quant-input.f32")).unwrap();
    let x: Vec<f32> = input
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let pool = ThreadPool::new(2);
    for (ty, file) in [(Q8_0, "q8_0-cpu.bin"), (Q8_1, "q8_1-cpu.bin")] {
        let want = std::fs::read(data.join(file)).unwrap();
        let got = quantize_rows(ty, &x, 256, &pool);
        assert_eq!(got.data.len(), want.len(), "{ty}");
        let block = if ty == Q8_0 { 34 } else { 36 };
        for (i, (g, w)) in got.data.chunks(block).zip(want.chunks(block)).enumerate() {
            assert_eq!(g, w, "{ty} block {i} (row {})", i / 8);
        }
    }
}
