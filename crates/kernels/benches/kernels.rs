//! GEMV (2048 x 2048) GB/s of weight bytes per format, and GFLOP/s of a 64-token matmul,
//! portable vs each SIMD set this CPU has, and the packed (repacked-at-load) kernels of
//! each set that has them (`packed-avx512amx`, `packed-avx512vnni`, `packed-avxvnni`, `packed-avx2`). Run: `cargo bench -p llamay-kernels`.
//! Criterion's "elem/s" on the matmul group are FLOP/s (2·rows·cols·tokens per call).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use llamay_formats::GgmlType::{self, *};
use llamay_kernels::{KernelSet, ThreadPool, matmul_packed, matmul_with, pack_with, quantize_rows};
use std::time::Duration;

const ROWS: usize = 2048;
const COLS: usize = 2048;

fn rng_bytes(n: usize, seed: &mut u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed as u8
        })
        .collect()
}

/// Random blocks with small finite f16 scales.
fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let ts = ty.type_size() as usize;
    let mut w = rng_bytes(rows * cols / ty.block_size() as usize * ts, &mut seed);
    let fields: &[usize] = match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_K => &[0, 2],
        Q6_K => &[208],
        _ => &[],
    };
    let d = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    for blk in w.chunks_exact_mut(ts) {
        for &at in fields {
            blk[at..at + 2].copy_from_slice(&d);
        }
        if ty == MXFP4 {
            // E8M0 exponent: 2^-7, a weight scale of the size gpt-oss's have.
            blk[0] = 120;
        }
    }
    w
}

fn activations(ty: GgmlType, n: usize, pool: &ThreadPool) -> llamay_kernels::QuantizedRows {
    activations_of(ty, n, COLS, pool)
}

fn activations_of(
    ty: GgmlType,
    n: usize,
    cols: usize,
    pool: &ThreadPool,
) -> llamay_kernels::QuantizedRows {
    let x: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    quantize_rows(ty.vec_dot_type(), &x, cols, pool)
}

/// The matrix packed for every packed kernel set this CPU runs.
fn packed(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    pool: &ThreadPool,
) -> Vec<(KernelSet, llamay_kernels::PackedMatrix)> {
    (KernelSet::available().into_iter())
        .filter_map(|set| Some((set, pack_with(set, ty, w, rows, cols, pool)?)))
        .collect()
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One thread and all of them (once, on a one-CPU machine: criterion refuses an id twice).
fn thread_counts() -> Vec<usize> {
    let mut counts = vec![1, threads()];
    counts.dedup();
    counts
}

fn gemv(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemv_2048x2048");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    for nt in thread_counts() {
        let pool = ThreadPool::new(nt);
        for ty in [Q4_K, Q8_0, Q6_K, Q5_0, Q4_0, MXFP4] {
            let w = weights(ty, ROWS, COLS);
            let a = activations(ty, 1, &pool);
            let mut out = vec![0f32; ROWS];
            g.throughput(Throughput::Bytes(w.len() as u64));
            for set in KernelSet::available() {
                let id = BenchmarkId::new(format!("{ty}/{}", set.name()), format!("{nt}t"));
                g.bench_function(id, |b| {
                    b.iter(|| matmul_with(set, ty, &w, ROWS, COLS, &a, &mut out, &pool))
                });
            }
            for (set, p) in packed(ty, &w, ROWS, COLS, &pool) {
                let id = BenchmarkId::new(format!("{ty}/packed-{}", set.name()), format!("{nt}t"));
                g.bench_function(id, |b| b.iter(|| matmul_packed(&p, &a, &mut out, &pool)));
            }
        }
    }
    g.finish();
}

fn prefill(c: &mut Criterion) {
    const TOKENS: usize = 64;
    let mut g = c.benchmark_group("matmul_64tok_2048x2048");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10);
    let pool = ThreadPool::new(threads());
    for ty in [Q4_K, Q8_0, Q6_K, Q5_0, Q4_0, MXFP4] {
        let w = weights(ty, ROWS, COLS);
        let a = activations(ty, TOKENS, &pool);
        let mut out = vec![0f32; ROWS * TOKENS];
        g.throughput(Throughput::Elements((2 * ROWS * COLS * TOKENS) as u64));
        for set in KernelSet::available() {
            let id = BenchmarkId::new(format!("{ty}/{}", set.name()), format!("{}t", threads()));
            g.bench_function(id, |b| {
                b.iter(|| matmul_with(set, ty, &w, ROWS, COLS, &a, &mut out, &pool))
            });
        }
        for (set, p) in packed(ty, &w, ROWS, COLS, &pool) {
            let id = BenchmarkId::new(
                format!("{ty}/packed-{}", set.name()),
                format!("{}t", threads()),
            );
            g.bench_function(id, |b| b.iter(|| matmul_packed(&p, &a, &mut out, &pool)));
        }
    }
    g.finish();
}

/// The packed kernels on a 512-token prefill of Llama-3.2-1B's FFN shapes (gate/up:
/// 8192 × 2048; down: 2048 × 8192), where weights and activations outgrow L2.
fn prefill_model_shapes(c: &mut Criterion) {
    const TOKENS: usize = 512;
    let mut g = c.benchmark_group("matmul_512tok_ffn");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10);
    let pool = ThreadPool::new(threads());
    for (ty, rows, cols) in [(Q4_K, 8192, 2048), (Q4_K, 2048, 8192), (Q6_K, 2048, 8192)] {
        let w = weights(ty, rows, cols);
        let a = activations_of(ty, TOKENS, cols, &pool);
        let mut out = vec![0f32; rows * TOKENS];
        g.throughput(Throughput::Elements((2 * rows * cols * TOKENS) as u64));
        for (set, p) in packed(ty, &w, rows, cols, &pool) {
            let id = BenchmarkId::new(
                format!("{ty}/packed-{}/{rows}x{cols}", set.name()),
                threads(),
            );
            g.bench_function(id, |b| b.iter(|| matmul_packed(&p, &a, &mut out, &pool)));
        }
    }
    g.finish();
}

/// The output matrices that dominate a decode step's bytes, far larger than the caches:
/// Gemma 3 270M's tied Q8_0 embedding (262,144 × 640) and the 1B shape's Q6_K one
/// (128,256 × 2048); and a Q4_K matrix of 72 MiB. GB/s here against `scripts/membw` is how close a kernel gets to the
/// bandwidth floor; the 2048² group above measures it from cache.
fn gemv_output_matrix(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemv_output");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10);
    for (ty, rows, cols) in [
        (Q8_0, 262_144, 640),
        (Q6_K, 128_256, 2048),
        (Q4_K, 32_768, 4096),
    ] {
        let w = weights(ty, rows, cols);
        let mut out = vec![0f32; rows];
        g.throughput(Throughput::Bytes(w.len() as u64));
        for nt in thread_counts() {
            let pool = ThreadPool::new(nt);
            let a = activations_of(ty, 1, cols, &pool);
            for (set, p) in packed(ty, &w, rows, cols, &pool) {
                let id = BenchmarkId::new(format!("{ty}/packed-{}/{rows}x{cols}", set.name()), nt);
                g.bench_function(id, |b| b.iter(|| matmul_packed(&p, &a, &mut out, &pool)));
            }
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    gemv,
    prefill,
    prefill_model_shapes,
    gemv_output_matrix
);
criterion_main!(benches);
