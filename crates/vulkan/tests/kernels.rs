//! The device's kernels against the CPU's, on whatever Vulkan device this machine has
//! (lavapipe in CI: `scripts/test` installs mesa-vulkan-drivers). Bits, not bounds:
//! the kernels fold in the CPU kernels' order, so any difference is a bug.

use llamay_formats::GgmlType;
use llamay_kernels::{KernelSet, QuantizedRows, ThreadPool};
use llamay_vulkan::{Gpu, VulkanError};

mod common;

/// The device to test on (see `common::device_index`).
fn gpu() -> Option<Gpu> {
    let gpu = Gpu::open(common::device_index()?).expect("open the device");
    eprintln!("device: {}", gpu.info().describe());
    Some(gpu)
}

/// `W · A` on the CPU's portable kernels, the activation quantised by the CPU's own
/// quantiser to the weight's dot type.
fn cpu_matmul(ty: GgmlType, wq: &[u8], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f32> {
    let dot = ty.vec_dot_type();
    let mut a = QuantizedRows {
        ty: dot,
        cols,
        n,
        data: vec![0u8; n * dot.bytes_for(cols as u64).unwrap() as usize],
    };
    assert!(llamay_kernels::quantize_row(dot, x, &mut a.data));
    let mut want = vec![0f32; n * rows];
    llamay_kernels::matmul_with(
        KernelSet::Portable,
        ty,
        wq,
        rows,
        cols,
        &a,
        &mut want,
        &ThreadPool::new(1),
    );
    want
}

/// Deterministic values with the shapes activations have: mostly small, some large,
/// a zero block, exact ties of the rounding (k + 0.5 steps of amax/127).
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    };
    let mut x: Vec<f32> = (0..n)
        .map(|i| next() * if i % 97 == 0 { 40.0 } else { 1.5 })
        .collect();
    if n >= 64 {
        x[32..64].fill(0.0);
    }
    if n >= 96 {
        // amax 127 in the block: id = 1, so k + 0.5 is a tie of round-half-even.
        x[64] = 127.0;
        for (j, v) in x[65..96].iter_mut().enumerate() {
            *v = j as f32 - 15.5;
        }
    }
    x
}

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn quantize_q8_0_gives_ggml_cpus_bytes() -> Result<(), VulkanError> {
    let Some(mut gpu) = gpu() else { return Ok(()) };
    let (n, cols) = (5, 256);
    let x = activations(n * cols, 7);
    let xb = gpu.buffer((x.len() * 4) as u64, "x")?;
    gpu.write(xb, 0, &f32_bytes(&x))?;
    let mut q = gpu.q8_rows(n, cols)?;
    gpu.quantize(GgmlType::Q8_0, xb, 0, n, cols, &mut q)?;
    let blocks = n * cols / 32;
    let mut scales = vec![0f32; blocks];
    gpu.read_f32(q.scales, 0, &mut scales)?;
    let mut quants = vec![0u8; blocks * 32];
    gpu.read(q.quants, 0, &mut quants)?;
    let mut cpu = vec![0u8; blocks * 34];
    assert!(llamay_kernels::quantize_row(GgmlType::Q8_0, &x, &mut cpu));
    for b in 0..blocks {
        let block = &cpu[b * 34..(b + 1) * 34];
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        assert_eq!(scales[b].to_bits(), d.to_bits(), "block {b}: scale");
        assert_eq!(
            &quants[b * 32..(b + 1) * 32],
            &block[2..],
            "block {b}: values"
        );
    }
    Ok(())
}

/// Both matmul paths — packed 4x8-bit integer dot products (where the device has
/// VK_KHR_shader_integer_dot_product: lavapipe does) and the plain one — give the CPU
/// kernels' bits.
#[test]
fn matmul_equals_the_cpu_kernels_bit_for_bit() -> Result<(), VulkanError> {
    let Some(index) = common::device_index() else {
        return Ok(());
    };
    for integer_dot in [true, false] {
        let mut gpu = Gpu::open_with(index, integer_dot)?;
        let has = gpu
            .info()
            .extensions
            .contains(&llamay_vulkan::INTEGER_DOT_PRODUCT);
        assert_eq!(
            gpu.integer_dot(),
            integer_dot && has,
            "{}",
            gpu.info().describe()
        );
        eprintln!("integer dot products: {}", gpu.integer_dot());
        matmuls_equal_the_cpu(&mut gpu)?;
    }
    Ok(())
}

fn matmuls_equal_the_cpu(gpu: &mut Gpu) -> Result<(), VulkanError> {
    let (rows, cols) = (70, 320);
    for ty in common::QUANTISED {
        let (rows, cols) = if ty.block_size() == 256 {
            (70, 512)
        } else {
            (rows, cols)
        };
        let dot = ty.vec_dot_type();
        for n in [1, 3] {
            let w = activations(rows * cols, 11 + ty.id() as u64);
            let wq = llamay_formats::quantize(ty, &w).expect("a written type");
            let x = activations(n * cols, 3 + n as u64);
            let dm = gpu.upload_matrix("w", ty, rows, cols, &wq)?;
            let xb = gpu.buffer((x.len() * 4) as u64, "x")?;
            gpu.write(xb, 0, &f32_bytes(&x))?;
            let mut q = gpu.q8_rows(n, cols)?;
            gpu.quantize(dot, xb, 0, n, cols, &mut q)?;
            // Output at an offset, to prove the offset is honoured.
            let out = gpu.buffer(((8 + n * rows) * 4) as u64, "out")?;
            gpu.matmul(&dm, &q, out, 8)?;
            let mut got = vec![0f32; n * rows];
            gpu.read_f32(out, 8, &mut got)?;

            let want = cpu_matmul(ty, &wq, rows, cols, &x, n);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{ty} n={n}: output {i}: device {g}, CPU {w}"
                );
            }
            for b in [dm.parts[0].0, xb, out, q.scales, q.quants] {
                gpu.free(b)?;
            }
        }
    }
    Ok(())
}

#[test]
fn work_is_submitted_once_per_flush_and_declines_name_the_format() -> Result<(), VulkanError> {
    let Some(mut gpu) = gpu() else { return Ok(()) };
    let (rows, cols) = (64, 64);
    let wq = llamay_formats::quantize(GgmlType::Q8_0, &activations(rows * cols, 1)).unwrap();
    let dm = gpu.upload_matrix("w", GgmlType::Q8_0, rows, cols, &wq)?;
    let xb = gpu.buffer((cols * 4) as u64, "x")?;
    gpu.write(xb, 0, &f32_bytes(&activations(cols, 2)))?;
    let mut q = gpu.q8_rows(1, cols)?;
    let out = gpu.buffer((rows * 4) as u64, "out")?;
    let before = gpu.stats();
    // Ten projections recorded, one read: one submission, only the outputs read back.
    for _ in 0..10 {
        gpu.quantize(GgmlType::Q8_0, xb, 0, 1, cols, &mut q)?;
        gpu.matmul(&dm, &q, out, 0)?;
    }
    let mut got = vec![0f32; rows];
    gpu.read_f32(out, 0, &mut got)?;
    let after = gpu.stats();
    assert_eq!(after.submissions - before.submissions, 1);
    assert_eq!(after.dispatches - before.dispatches, 20);
    assert_eq!(after.bytes_read - before.bytes_read, (rows * 4) as u64);

    let err = gpu
        .upload_matrix("blk.0.ffn_down.weight", GgmlType::IQ4_XS, 1, 256, &[0; 136])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("blk.0.ffn_down.weight") && err.contains("IQ4_XS") && err.contains("i-quant"),
        "{err}"
    );
    let err = gpu
        .upload_matrix("output.weight", GgmlType::MXFP4, 1, 256, &[0; 136])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("output.weight") && err.contains("MXFP4") && err.contains("Q4_K"),
        "{err}"
    );
    Ok(())
}

/// Float matrices (F32, F16, BF16) read the f32 activations, rounded to the weight's dot
/// type as the CPU rounds them, and sum in f32 where the CPU's portable kernel sums in
/// f64: within 1e-6 of the sum of |products|, not bits.
#[test]
fn float_matmuls_agree_with_the_cpu_within_rounding() -> Result<(), VulkanError> {
    let Some(mut gpu) = gpu() else { return Ok(()) };
    let (rows, cols, n) = (70, 320, 3);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let w = activations(rows * cols, 21 + ty.id() as u64);
        let wq = llamay_formats::quantize(ty, &w).expect("a written type");
        let x = activations(n * cols, 22);
        let dm = gpu.upload_matrix("w", ty, rows, cols, &wq)?;
        let xb = gpu.buffer((x.len() * 4) as u64, "x")?;
        gpu.write(xb, 0, &f32_bytes(&x))?;
        let out = gpu.buffer((n * rows * 4) as u64, "out")?;
        gpu.matmul_float(&dm, xb, n, out, 0)?;
        let mut got = vec![0f32; n * rows];
        gpu.read_f32(out, 0, &mut got)?;
        let want = cpu_matmul(ty, &wq, rows, cols, &x, n);
        for t in 0..n {
            for r in 0..rows {
                let scale: f32 = (0..cols)
                    .map(|c| (w[r * cols + c] * x[t * cols + c]).abs())
                    .sum();
                let (g, e) = (got[t * rows + r], want[t * rows + r]);
                assert!(
                    (g - e).abs() <= 1e-6 * scale.max(1.0),
                    "{ty} t={t} r={r}: device {g}, CPU {e}"
                );
            }
        }
    }
    Ok(())
}

/// Attention over a paged cache against a plain softmax on the host: up to 200
/// positions over non-contiguous pages, each page in a buffer of its own (a cache split
/// over bindings), GQA, head sizes 64 to 512, soft-cap, a window (first position > 0),
/// sinks.
#[test]
fn attention_over_pages_equals_a_plain_softmax() -> Result<(), llamay_engine::device::DeviceError> {
    use llamay_engine::device::{AttentionShape, CACHE_PARTS, CacheBufs, Device, Op};
    if gpu().is_none() {
        return Ok(());
    }
    let mut dev = llamay_vulkan::VulkanDevice::open(0).expect("open");
    for (hd, n_head, n_kv, softcap, window, sinks) in [
        (64, 4, 2, None, None, false),
        (128, 8, 2, Some(20.0f32), Some(50usize), false),
        (256, 4, 1, None, None, true),
        (512, 2, 1, None, Some(130), false),
    ] {
        let n = 200;
        let (kd, qd) = (n_kv * hd, n_head * hd);
        let q = activations(n * qd, 5 + hd as u64);
        let k = activations(n * kd, 6 + hd as u64);
        let v = activations(n * kd, 7 + hd as u64);
        let sink: Vec<f32> = (0..n_head).map(|h| h as f32 - 1.5).collect();
        // Positions p live on page tables[p / 64], pages laid out in reverse order.
        let pages = n.div_ceil(64);
        let tables: Vec<u32> = (0..pages as u32).rev().collect();
        let mut kc = vec![0f32; pages * 64 * kd];
        let mut vc = vec![0f32; pages * 64 * kd];
        for p in 0..n {
            let row = tables[p / 64] as usize * 64 + p % 64;
            kc[row * kd..(row + 1) * kd].copy_from_slice(&k[p * kd..(p + 1) * kd]);
            vc[row * kd..(row + 1) * kd].copy_from_slice(&v[p * kd..(p + 1) * kd]);
        }
        let first = |t: usize| window.map_or(0, |w| (t + 1).saturating_sub(w));
        let slots: Vec<u32> = (0..n)
            .flat_map(|t| [0, first(t) as u32, t as u32 + 1])
            .collect();
        let mut up = |x: &[f32]| -> Result<_, _> {
            let b = dev.alloc(x.len(), "x")?;
            dev.write_f32(b, 0, x).map(|()| b)
        };
        // One page to a part: a tile of positions reads from two buffers where it
        // crosses a page.
        let mut split = |c: &[f32]| -> Result<CacheBufs, _> {
            let parts = c
                .chunks(64 * kd)
                .map(&mut up)
                .collect::<Result<Vec<_>, _>>()?;
            let mut bufs = [parts[0]; CACHE_PARTS];
            bufs[..parts.len()].copy_from_slice(&parts);
            Ok(CacheBufs {
                parts: bufs,
                pages_per_part: 1,
            })
        };
        let (kb, vb) = (split(&kc)?, split(&vc)?);
        let (qb, sb) = (up(&q)?, up(&sink)?);
        let tb = dev.alloc(tables.len(), "tables")?;
        dev.write_u32(tb, 0, &tables)?;
        let slb = dev.alloc(slots.len(), "slots")?;
        dev.write_u32(slb, 0, &slots)?;
        let ob = dev.alloc(n * qd, "out")?;
        let scale = 1.0 / (hd as f32).sqrt();
        let shape = AttentionShape {
            n_head,
            n_head_kv: n_kv,
            head_dim_k: hd,
            head_dim_v: hd,
            scale,
            softcap,
        };
        dev.run(&Op::Attention {
            q: qb,
            n,
            k_cache: kb,
            v_cache: vb,
            cache: llamay_engine::device::CacheType::F32,
            tables: tb,
            slots: slb,
            slots_offset: 0,
            shape,
            sinks: sinks.then_some(sb),
            out: ob,
        })?;
        let mut got = vec![0f32; n * qd];
        dev.read(ob, 0, &mut got)?;
        let mut worst = 0f64;
        for t in 0..n {
            for h in 0..n_head {
                let kvh = h / (n_head / n_kv);
                let qh = &q[t * qd + h * hd..][..hd];
                let scores: Vec<f64> = (first(t)..=t)
                    .map(|p| {
                        let kh = &k[p * kd + kvh * hd..][..hd];
                        let s = qh
                            .iter()
                            .zip(kh)
                            .map(|(a, b)| f64::from(a * b))
                            .sum::<f64>()
                            * f64::from(scale);
                        softcap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh())
                    })
                    .collect();
                let mut max = scores.iter().cloned().fold(f64::MIN, f64::max);
                if sinks {
                    max = max.max(f64::from(sink[h]));
                }
                let mut sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                if sinks {
                    sum += (f64::from(sink[h]) - max).exp();
                }
                for d in 0..hd {
                    let o: f64 = (first(t)..=t)
                        .zip(&scores)
                        .map(|(p, s)| (s - max).exp() * f64::from(v[p * kd + kvh * hd + d]))
                        .sum::<f64>()
                        / sum;
                    worst = worst.max((o - f64::from(got[t * qd + h * hd + d])).abs());
                }
            }
        }
        // f32 products and an online softmax against f64 throughout: relative to the
        // values' size (some are 40× the rest), measured ≤ 7e-6.
        let vmax = v.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
        assert!(
            worst < 2e-5 * vmax,
            "head {hd}: max |device - host| {worst} (values up to {vmax})"
        );
    }
    Ok(())
}
