//! The packed (16-row interleaved) GEMM/GEMV of every packed kernel set this CPU runs
//! (AMX, AVX-512 VNNI, AVX-VNNI, AVX2; NEON i8mm and dotprod) against the portable kernels: random blocks (every byte
//! random, scales finite; MXFP4 also at every exponent byte), every token-tile size and several group counts. The packed kernels form the same exact integer block sums and
//! the same float steps in the same order, so the results must be *equal*.

use llamay_formats::{GgmlType, GgmlType::*};
use llamay_kernels::*;

mod common;
use common::Rng;

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// Random weight bytes with finite f16 scales (all other bytes random). MXFP4's E8M0
/// exponents: the two subnormal scales (0, 1), 2, or 100..160 (finite products).
fn random_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let ts = ty.type_size() as usize;
    let nb = rows * cols / ty.block_size() as usize;
    let mut w: Vec<u8> = (0..nb * ts).map(|_| rng.next() as u8).collect();
    let scales: &[usize] = match ty {
        Q4_K | Q5_K => &[0, 2],
        Q6_K => &[208],
        MXFP4 => &[],
        _ => &[0],
    };
    for blk in w.chunks_exact_mut(ts) {
        for &at in scales {
            blk[at..at + 2].copy_from_slice(&f16_bytes(rng.f32() * 0.01));
        }
        if ty == MXFP4 {
            blk[0] = match rng.next() % 8 {
                e @ 0..=2 => e as u8,
                _ => 100 + (rng.next() % 60) as u8,
            };
        }
    }
    w
}

const PACKED: &[GgmlType] = &[Q8_0, Q4_0, Q5_0, MXFP4, Q4_K, Q5_K, Q6_K];

/// The sets with packed kernels that this CPU runs (possibly none).
fn packed_sets() -> Vec<KernelSet> {
    // Q4_K packs under every set that packs at all.
    let sets: Vec<_> = (KernelSet::ALL.into_iter())
        .filter(|&s| packable_with(s, Q4_K, 16, 256))
        .collect();
    if sets.is_empty() {
        eprintln!("skipped: this CPU has no packed kernels (they need AVX2 or VNNI)");
    }
    sets
}

#[test]
fn packed_matmul_equals_portable() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for (set, &ty) in packed_sets()
        .into_iter()
        .flat_map(|s| PACKED.iter().map(move |t| (s, t)))
    {
        let bs = ty.block_size() as usize;
        for &(rows, nblocks) in &[(16, 1), (48, 3), (32, 8), (160, 2)] {
            let cols = nblocks * bs;
            let w = random_weights(ty, rows, cols, &mut rng);
            let Some(p) = pack_with(set, ty, &w, rows, cols, &pool) else {
                assert!(ty == Q8_0 && set == KernelSet::NeonDotprod);
                continue;
            };
            // `pack` follows the active set (LLAMAY_CPU can cap it below VNNI).
            assert_eq!(
                pack(ty, &w, rows, cols, &pool).is_some(),
                packable(ty, rows, cols)
            );
            assert_eq!((p.rows(), p.cols(), p.ty()), (rows, cols, ty));
            // 16, 17, 64 and 70 take AMX tiles of 16 tokens where the CPU has them.
            for &n in &[1usize, 2, 3, 7, 8, 9, 16, 17, 64, 70] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32() * 4.0).collect();
                assert_packed_equals_portable(set, &p, &w, &x, n, &pool);
            }
            // The AVX-512 sets' own one-token pass, where one-token K-quant tiles would
            // take the AVX-VNNI kernels on this CPU.
            let own =
                pack_with(set, ty, &w, rows, cols, &pool).map(|p| p.with_own_one_token_kernels());
            let x: Vec<f32> = (0..cols).map(|_| rng.f32() * 4.0).collect();
            assert_packed_equals_portable(set, &own.unwrap(), &w, &x, 1, &pool);
        }
    }
}

/// Several matrices by the same activations in one region (`matmul_packed_many`, a
/// layer's q, k and v) give each matrix's own product, bit for bit: of one type and of
/// two (Q4_K and Q6_K read the same Q8_K rows), of different heights, at one token and
/// at several.
#[test]
fn packed_matmuls_in_one_region_equal_each_alone() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(0x51);
    let cols = 512;
    for set in packed_sets() {
        let mats: Vec<(Vec<u8>, PackedMatrix)> = [(Q4_K, 160), (Q6_K, 32), (Q4_K, 48)]
            .into_iter()
            .map(|(ty, rows)| {
                let w = random_weights(ty, rows, cols, &mut rng);
                let p = pack_with(set, ty, &w, rows, cols, &pool).expect("K-quants pack");
                (w, p)
            })
            .collect();
        for n in [1usize, 3, 17] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32() * 4.0).collect();
            let a = quantize_rows(Q4_K.vec_dot_type(), &x, cols, &pool);
            let mut outs: Vec<Vec<f32>> = mats
                .iter()
                .map(|(_, p)| vec![f32::NAN; n * p.rows()])
                .collect();
            let mut jobs: Vec<(&PackedMatrix, &mut [f32])> = (mats.iter())
                .zip(outs.iter_mut())
                .map(|((_, p), o)| (p, &mut o[..]))
                .collect();
            matmul_packed_many(&mut jobs, &a, &pool);
            for ((_, p), got) in mats.iter().zip(&outs) {
                let mut alone = vec![f32::NAN; n * p.rows()];
                matmul_packed(p, &a, &mut alone, &pool);
                let same = got
                    .iter()
                    .zip(&alone)
                    .all(|(g, e)| g.to_bits() == e.to_bits());
                assert!(same, "{set:?} {} rows {} n {n}", p.ty(), p.rows());
            }
        }
    }
}

/// Quantises `x` (n rows) and asserts the packed product equals the portable one, bit
/// for bit.
fn assert_packed_equals_portable(
    set: KernelSet,
    p: &PackedMatrix,
    w: &[u8],
    x: &[f32],
    n: usize,
    pool: &ThreadPool,
) {
    let (ty, rows, cols) = (p.ty(), p.rows(), p.cols());
    let a = quantize_rows(ty.vec_dot_type(), x, cols, pool);
    let mut want = vec![0f32; n * rows];
    matmul_with(KernelSet::Portable, ty, w, rows, cols, &a, &mut want, pool);
    let mut got = vec![f32::NAN; n * rows];
    matmul_packed(p, &a, &mut got, pool);
    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            e.to_bits(),
            "{set:?} {ty} rows {rows} cols {cols} n {n}: token {} row {}: packed {g} vs portable {e}",
            i / rows,
            i % rows
        );
    }
}

/// The integer sums at their bounds: every quant and scale byte at an extreme (all bits
/// set, none, or the sign bit), activations of one sign and full scale. The AVX-512
/// K-quant kernels sum scale products in f32 on the argument that these stay exact
/// below 2²⁴; this is where that argument would break.
#[test]
fn packed_matmul_equals_portable_at_extremes() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(0x5EED);
    let (rows, nblocks) = (32, 2);
    for (set, &ty) in packed_sets()
        .into_iter()
        .flat_map(|s| PACKED.iter().map(move |t| (s, t)))
    {
        let cols = nblocks * ty.block_size() as usize;
        for fill in [0xFFu8, 0x00, 0x80, 0x7F] {
            let mut w = random_weights(ty, rows, cols, &mut rng);
            let ts = ty.type_size() as usize;
            let scales: &[usize] = match ty {
                Q4_K | Q5_K => &[0, 1, 2, 3],
                Q6_K => &[208, 209],
                MXFP4 => &[0],
                _ => &[0, 1],
            };
            for blk in w.chunks_exact_mut(ts) {
                for (i, b) in blk.iter_mut().enumerate() {
                    if !scales.contains(&i) {
                        *b = fill;
                    }
                }
            }
            let Some(p) = pack_with(set, ty, &w, rows, cols, &pool) else {
                continue;
            };
            let own =
                pack_with(set, ty, &w, rows, cols, &pool).map(|p| p.with_own_one_token_kernels());
            // 1 token: the one-token passes (both, see `packed_matmul_equals_portable`);
            // 9: register tiles only; 32: two AMX tiles where the CPU has them.
            for (sign, n) in [
                (1.0f32, 1),
                (-1.0, 1),
                (1.0, 9),
                (-1.0, 9),
                (1.0, 32),
                (-1.0, 32),
            ] {
                let x: Vec<f32> = (0..n * cols)
                    // Full scale, one smaller value per 32 so that the sums are odd
                    // (even ones would survive a rounding to 2 ulp unchanged).
                    .map(|i| sign * if i % 32 == 5 { 0.9 } else { 1.0 })
                    .collect();
                assert_packed_equals_portable(set, &p, &w, &x, n, &pool);
                if n == 1 {
                    assert_packed_equals_portable(set, own.as_ref().unwrap(), &w, &x, n, &pool);
                }
            }
        }
    }
}

/// MXFP4 at every exponent byte (row r, block b: 16r + b), with activations large enough
/// that the top exponents overflow and small enough that the bottom ones give subnormal
/// scales and products: the packed bits are portable's (NaN where portable's is NaN).
#[test]
fn packed_mxfp4_equals_portable_at_every_exponent() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(0xE8);
    let (rows, nb) = (16, 16);
    let cols = 32 * nb;
    let mut w = rng.bytes(rows * nb * 17);
    for (i, blk) in w.chunks_exact_mut(17).enumerate() {
        blk[0] = i as u8;
    }
    for set in packed_sets() {
        let p = pack_with(set, MXFP4, &w, rows, cols, &pool).expect("MXFP4 packs");
        for scale in [1e3f32, 1.0, 1e-3] {
            for n in [1usize, 5, 16] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32() * scale).collect();
                let a = quantize_rows(Q8_0, &x, cols, &pool);
                let mut want = vec![0f32; n * rows];
                matmul_with(
                    KernelSet::Portable,
                    MXFP4,
                    &w,
                    rows,
                    cols,
                    &a,
                    &mut want,
                    &pool,
                );
                let mut got = vec![0f32; n * rows];
                matmul_packed(&p, &a, &mut got, &pool);
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()),
                        "{set:?} scale {scale} n {n}: token {} row {}: packed {g} vs portable {e}",
                        i / rows,
                        i % rows
                    );
                }
            }
        }
    }
}

#[test]
fn source_rows_are_the_file_bytes() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(7);
    for (set, &ty) in packed_sets()
        .into_iter()
        .flat_map(|s| PACKED.iter().map(move |t| (s, t)))
    {
        let (rows, cols) = (32, 3 * ty.block_size() as usize);
        let rb = ty.bytes_for(cols as u64).unwrap() as usize;
        // Every byte random (scales too): the layout must be a bijection on bytes.
        let w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
        let Some(p) = pack_with(set, ty, &w, rows, cols, &pool) else {
            assert!(ty == Q8_0 && set == KernelSet::NeonDotprod);
            continue;
        };
        let mut row = vec![0u8; rb];
        for r in 0..rows {
            assert!(p.source_row(r, &mut row));
            assert_eq!(row, w[r * rb..(r + 1) * rb], "{ty} row {r}");
        }
        assert!(!p.source_row(rows, &mut row));
        assert!(!p.source_row(0, &mut row[..rb - 1]));
    }
}

#[test]
fn pack_refuses_what_it_cannot_lay_out() {
    let pool = ThreadPool::new(1);
    // Rows not a multiple of 16, a format without a layout, a short buffer.
    let w = vec![0u8; 34 * 17];
    assert!(pack(Q8_0, &w, 17, 32, &pool).is_none());
    assert!(pack(Q5_1, &vec![0u8; 24 * 16], 16, 32, &pool).is_none());
    assert!(pack(Q8_0, &w[..34 * 15], 16, 32, &pool).is_none());
    assert!(!packable(F32, 16, 32));
}
