//! The whole forward pass on the device against the CPU's, for every architecture row
//! and weight format: each model runs on the device (logits within a stated bound of
//! the CPU's, top-1 equal) or is declined by name — never a silent fall back. On
//! lavapipe in CI (`scripts/test` installs it).

use llamay_engine::device::{Device, DeviceBuf, DeviceCounters, DeviceError, DeviceMatrix, Op};
use llamay_engine::{
    ARCHITECTURES, BatchToken, Context, ContextParams, KvPrecision, Model, SeqId, Threads,
};
use llamay_formats::GgmlType;
use llamay_gguf::{GgufFile, Model as Gguf};
use llamay_synth::{ModelFile, Spec};
use llamay_vulkan::VulkanDevice;

mod common;

fn device() -> Option<Box<dyn Device>> {
    let index = common::device_index()?;
    Some(Box::new(
        VulkanDevice::open(index).expect("open the device"),
    ))
}

fn params() -> ContextParams {
    params_with(KvPrecision::F32)
}

fn params_with(kv: KvPrecision) -> ContextParams {
    ContextParams {
        kv_budget_tokens: Some(256),
        ..ContextParams::new(Threads(2), kv, 64)
    }
}

fn batch(seq: SeqId, tokens: &[u32], pos0: usize) -> Vec<BatchToken> {
    (tokens.iter().enumerate())
        .map(|(i, &token)| BatchToken {
            seq,
            token,
            pos: pos0 + i,
            logits: true,
        })
        .collect()
}

/// A prompt of 20 tokens as one batch, then three one-token steps: every position's
/// logits.
fn logits(ctx: &mut Context<'_>, n_vocab: usize) -> Vec<f32> {
    let s = ctx.new_sequence();
    let toks: Vec<u32> = (0..23).map(|i| ((i * 37 + 5) % n_vocab) as u32).collect();
    let mut out = ctx.decode(&batch(s, &toks[..20], 0)).unwrap().values;
    for (i, &t) in toks[20..].iter().enumerate() {
        out.extend(ctx.decode(&batch(s, &[t], 20 + i)).unwrap().values);
    }
    out
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

/// Bound on |device − CPU| per logit. The matmuls are the CPU's bits, given the same
/// activation; what differs is the rest of the block: norms sum in f32 (the CPU in
/// f64), the device's exp/tanh are not libm's, and attention folds its softmax in one
/// pass per head rather than in the CPU's tiles. Each differs in the last bits of f32,
/// and a last-bit difference ahead of a Q8_0 activation rounding can flip one rounding
/// step, and what that step moves grows with the format's coarseness: measured up to
/// 0.031 on the 4- to 8-bit formats and 0.061 on Q2_K (these logits span about ±3),
/// while the mean stays under 0.01 (most positions differ in the last bits only; the
/// largest, 0.0092, through the f16 cache on gemma2 Q4_K, whose soft-capped scores the
/// f16 query rounding moves most).
const MAX_DIFF: f32 = 0.1;
const MEAN_DIFF: f32 = 0.015;

#[test]
fn every_row_and_format_runs_on_the_device_or_is_declined_by_name() {
    let Some(probe) = device() else { return };
    eprintln!("device: {}", probe.describe());
    drop(probe);
    // Every format the device runs (the quantised ones giving the CPU's bits, the float
    // ones summing in f32).
    let formats: Vec<GgmlType> = (common::QUANTISED.into_iter())
        .chain([GgmlType::F32, GgmlType::F16, GgmlType::BF16])
        .collect();
    let (mut ran, mut declined, mut worst, mut worst_mean) = (0, 0, 0f32, 0f32);
    for arch in ARCHITECTURES {
        for (i, &ty) in formats.iter().enumerate() {
            let spec = Spec {
                ty,
                all_optional: i % 2 == 0,
                seed: 3 + i as u64,
                ..Spec::new(arch)
            };
            let bytes = ModelFile::new(&spec).write().unwrap();
            let gguf = Gguf::single(GgufFile::parse(&bytes).unwrap());
            let m = Model::load(&gguf, Threads(2)).unwrap();
            let dev = device().unwrap();
            // The f16 cache on every other format (the CPU's f16 cache beside it).
            let kv = if i % 2 == 1 {
                KvPrecision::F16
            } else {
                KvPrecision::F32
            };
            let why = m.device_unsupported(kv);
            let declined_matrices = m.device_declined_matrices(&*dev);
            let what = format!("{} {ty} {}", arch.name, kv.name());
            match m.context_on(params_with(kv), dev) {
                Err(e) => {
                    // Declined by name: each block feature the device lacks is in the
                    // refusal, and there is at least one.
                    assert!(!why.is_empty(), "{what}: refused without a reason: {e}");
                    let msg = e.to_string();
                    for w in &why {
                        assert!(msg.contains(w.as_str()), "{what}: {msg} lacks {w}");
                    }
                    declined += 1;
                    eprintln!("{what:18} declined: {msg}");
                }
                Ok(mut on_dev) => {
                    assert!(why.is_empty(), "{what}: ran though {why:?}");
                    let n_vocab = m.config().n_vocab;
                    let mut cpu = m.context(params_with(kv)).unwrap();
                    let want = logits(&mut cpu, n_vocab);
                    let got = logits(&mut on_dev, n_vocab);
                    assert_eq!(got.len(), want.len());
                    let (mut max, mut sum) = (0f32, 0f64);
                    for (p, (g, w)) in got.chunks(n_vocab).zip(want.chunks(n_vocab)).enumerate() {
                        for (a, b) in g.iter().zip(w) {
                            assert!(a.is_finite(), "{what}: position {p}: {a}");
                            max = max.max((a - b).abs());
                            sum += f64::from((a - b).abs());
                        }
                        // Top-1 equal wherever the CPU's choice is not within the bound
                        // of a tie.
                        let top = argmax(w);
                        let runner = (0..n_vocab)
                            .filter(|&j| j != top)
                            .map(|j| w[j])
                            .fold(f32::MIN, f32::max);
                        if w[top] - runner > 2.0 * MAX_DIFF {
                            assert_eq!(argmax(g), top, "{what}: position {p}");
                        }
                    }
                    let mean = (sum / got.len() as f64) as f32;
                    assert!(
                        max <= MAX_DIFF,
                        "{what}: max |device - CPU| {max} over {MAX_DIFF}"
                    );
                    assert!(
                        mean <= MEAN_DIFF,
                        "{what}: mean |device - CPU| {mean} over {MEAN_DIFF}"
                    );
                    worst = worst.max(max);
                    worst_mean = worst_mean.max(mean);
                    ran += 1;
                    // Each declined matrix names its format and why; shown once per reason.
                    let mut reasons: Vec<&str> = (declined_matrices.iter())
                        .filter_map(|d| d.split_once(": ").map(|(_, why)| why))
                        .collect();
                    reasons.dedup();
                    eprintln!(
                        "{what:18} max |diff| {max:.2e} mean {mean:.2e}; {} matrices on the CPU {reasons:?}",
                        declined_matrices.len()
                    );
                }
            }
        }
    }
    eprintln!(
        "{ran} ran on the device (worst max |diff| {worst:.2e}, worst mean {worst_mean:.2e}), {declined} declined by name"
    );
    assert!(ran > 0);
}

/// A decode step with every matrix on the device is one submission and reads back
/// only the logits.
#[test]
fn a_decode_step_is_one_submission_and_reads_only_the_logits() {
    let Some(dev) = device() else { return };
    let arch = ARCHITECTURES.iter().find(|a| a.name == "llama").unwrap();
    common::with_synthetic(arch, GgmlType::Q8_0, |m| {
        let mut ctx = m.context_on(params(), dev).unwrap();
        let n_vocab = m.config().n_vocab;
        let s = ctx.new_sequence();
        ctx.decode(&batch(s, &[1, 2, 3, 4], 0)).unwrap();
        for pos in 4..8 {
            let before = ctx.device_counters().unwrap();
            let l = ctx.decode(&batch(s, &[pos as u32], pos)).unwrap();
            let after = ctx.device_counters().unwrap();
            assert_eq!(l.values.len(), n_vocab);
            assert_eq!(
                after.submissions - before.submissions,
                1,
                "submissions per step"
            );
            assert_eq!(
                after.bytes_read - before.bytes_read,
                (n_vocab * 4) as u64,
                "bytes read back"
            );
        }
    });
}

/// 70 tokens (past the first page), fork, one token on each branch (the fork's first
/// write copies the shared last page), then the original cut back to 66 (within what its
/// sliding window keeps for a rollback) and given another token: every step's logits.
fn fork_script(ctx: &mut Context<'_>, n_vocab: usize) -> Vec<f32> {
    let toks: Vec<u32> = (0..70).map(|i| ((i * 13 + 1) % n_vocab) as u32).collect();
    ctx.kv_mut().keep_for_rollback(8);
    let a = ctx.new_sequence();
    ctx.decode(&batch(a, &toks, 0)).unwrap();
    let b = ctx.kv_mut().fork(a).unwrap();
    let mut out = ctx.decode(&batch(b, &[3], 70)).unwrap().values;
    out.extend(ctx.decode(&batch(a, &[5], 70)).unwrap().values);
    ctx.kv_mut().truncate(a, 66).unwrap();
    out.extend(ctx.decode(&batch(a, &[7, 8], 66)).unwrap().values);
    out.extend(ctx.decode(&batch(b, &[9], 71)).unwrap().values);
    out
}

/// Fork (shared pages, copy on write at the first write), truncate and redecode on the
/// device give what they give on the CPU; snapshots of device pages round-trip.
#[test]
fn fork_truncate_copy_on_write_and_snapshots_work_with_device_pages() {
    let Some(dev) = device() else { return };
    let arch = ARCHITECTURES.iter().find(|a| a.name == "gemma3").unwrap();
    common::with_synthetic(arch, GgmlType::Q8_0, |m| {
        let n_vocab = m.config().n_vocab;
        let p = ContextParams {
            kv_budget_tokens: Some(512),
            ..ContextParams::new(Threads(2), KvPrecision::F32, 128)
        };
        let want = fork_script(&mut m.context(p).unwrap(), n_vocab);
        let mut on_dev = m.context_on(p, dev).unwrap();
        let got = fork_script(&mut on_dev, n_vocab);
        let max = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max <= MAX_DIFF, "max |device - CPU| {max}");
        drop(on_dev);

        // A snapshot of device pages (f32 and f16) loads into a CPU context and into
        // another device context, and each continues as the original does: the other
        // device context bit for bit, the CPU within the bound.
        for kv in [KvPrecision::F32, KvPrecision::F16] {
            let p = ContextParams {
                kv_budget_tokens: Some(512),
                ..ContextParams::new(Threads(2), kv, 128)
            };
            let mut a = m.context_on(p, device().unwrap()).unwrap();
            let s = a.new_sequence();
            let toks: Vec<u32> = (0..70).map(|i| ((i * 11 + 2) % n_vocab) as u32).collect();
            a.decode(&batch(s, &toks, 0)).unwrap();
            let snap = a.save_sequence(s).unwrap();
            let next = |ctx: &mut Context<'_>, s| ctx.decode(&batch(s, &[4], 70)).unwrap().values;
            let want = next(&mut a, s);
            let mut b = m.context_on(p, device().unwrap()).unwrap();
            let sb = b.load_sequence(&snap).unwrap();
            assert_eq!(
                next(&mut b, sb),
                want,
                "{kv:?}: a device context continuing the snapshot"
            );
            let mut c = m.context(p).unwrap();
            let sc = c.load_sequence(&snap).unwrap();
            let got = next(&mut c, sc);
            let max = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                max <= MAX_DIFF,
                "{kv:?}: the CPU continuing the device's snapshot: {max}"
            );
        }
    });
}

/// What does not fit the device's memory is refused before anything is placed, naming
/// both sizes.
#[test]
fn a_model_larger_than_the_device_is_refused_naming_both_sizes() {
    let Some(dev) = device() else { return };
    let arch = ARCHITECTURES.iter().find(|a| a.name == "llama").unwrap();
    let bytes = ModelFile::new(&Spec::new(arch)).write().unwrap();
    let gguf = Gguf::single(GgufFile::parse(&bytes).unwrap());
    let m = Model::load(&gguf, Threads(2)).unwrap();
    let memory = dev.memory_bytes();
    // A KV pool of more positions than the device's memory holds.
    let c = m.config();
    let per_position = (c.n_layer * (c.k_dim() + c.v_dim()) * 4) as u64;
    let positions = (memory / per_position + 1) as usize * 2;
    let p = ContextParams {
        kv_budget_tokens: Some(positions),
        ..ContextParams::new(Threads(2), KvPrecision::F32, 64)
    };
    let e = m.context_on(p, dev).err().expect("refused").to_string();
    assert!(
        e.contains("GiB; this model needs") && e.contains("KV cache"),
        "{e}"
    );
}

/// The device, binding at most `limit` values per buffer in the KV cache's eyes: how a
/// test splits a small model's cache over several buffers, as a large model's is split
/// on a real device (every other call goes to the device as it is).
struct BindingLimit {
    dev: Box<dyn Device>,
    limit: usize,
}

impl Device for BindingLimit {
    fn describe(&self) -> String {
        self.dev.describe()
    }
    fn declines(&self, ty: GgmlType) -> Option<String> {
        self.dev.declines(ty)
    }
    fn max_buffer_len(&self) -> usize {
        self.limit
    }
    fn alloc(&mut self, len: usize, what: &str) -> Result<DeviceBuf, DeviceError> {
        self.dev.alloc(len, what)
    }
    fn free(&mut self, buf: DeviceBuf) {
        self.dev.free(buf)
    }
    fn upload_matrix(
        &mut self,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<DeviceMatrix, DeviceError> {
        self.dev.upload_matrix(name, ty, rows, cols, bytes)
    }
    fn write_f32(&mut self, b: DeviceBuf, off: usize, v: &[f32]) -> Result<(), DeviceError> {
        self.dev.write_f32(b, off, v)
    }
    fn write_u32(&mut self, b: DeviceBuf, off: usize, v: &[u32]) -> Result<(), DeviceError> {
        self.dev.write_u32(b, off, v)
    }
    fn read(&mut self, b: DeviceBuf, off: usize, out: &mut [f32]) -> Result<(), DeviceError> {
        self.dev.read(b, off, out)
    }
    fn run(&mut self, op: &Op) -> Result<(), DeviceError> {
        self.dev.run(op)
    }
    fn copy(
        &mut self,
        src: DeviceBuf,
        src_offset: usize,
        dst: DeviceBuf,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        self.dev.copy(src, src_offset, dst, dst_offset, len)
    }
    fn counters(&self) -> DeviceCounters {
        self.dev.counters()
    }
    fn memory_bytes(&self) -> u64 {
        self.dev.memory_bytes()
    }
}

/// A KV cache split over as many buffers as the kernels bind (a device whose binding
/// limit is smaller than the cache: lavapipe's 128 MiB under a serve's default pool of
/// Gemma) gives the bits one buffer gives — fork, copy on write across parts, truncate,
/// snapshots — and one that needs more buffers is refused naming the sizes.
#[test]
fn a_kv_cache_split_over_buffers_gives_the_bits_of_one() {
    use llamay_engine::device::CACHE_PARTS;
    let Some(_) = device() else { return };
    let arch = ARCHITECTURES.iter().find(|a| a.name == "gemma3").unwrap();
    common::with_synthetic(arch, GgmlType::Q8_0, |m| {
        let c = m.config();
        let n_vocab = c.n_vocab;
        for kv in [KvPrecision::F32, KvPrecision::F16] {
            let p = ContextParams {
                kv_budget_tokens: Some(512),
                ..ContextParams::new(Threads(2), kv, 128)
            };
            let words = |dim: usize| match kv {
                KvPrecision::F16 => dim.div_ceil(2),
                _ => dim,
            };
            let page_words = 64 * words(c.k_dim().max(c.v_dim()));
            let pages = 512usize.div_ceil(64) * c.n_layer;
            let per_part = pages.div_ceil(CACHE_PARTS);
            assert!(per_part < pages, "the cache splits");
            let limited = |pages_per_part: usize| -> Box<dyn Device> {
                Box::new(BindingLimit {
                    dev: device().unwrap(),
                    limit: pages_per_part * page_words,
                })
            };
            let want = fork_script(&mut m.context_on(p, device().unwrap()).unwrap(), n_vocab);
            let mut split = m.context_on(p, limited(per_part)).unwrap();
            assert_eq!(fork_script(&mut split, n_vocab), want, "{kv:?}");
            // A snapshot from split pages continues bit for bit in one buffer.
            let s = split.kv().sequences().next().unwrap();
            let snap = split.save_sequence(s).unwrap();
            let mut one = m.context_on(p, device().unwrap()).unwrap();
            let s1 = one.load_sequence(&snap).unwrap();
            let len = one.kv().len(s1).unwrap();
            let next = |ctx: &mut Context<'_>, s| ctx.decode(&batch(s, &[4], len)).unwrap().values;
            assert_eq!(next(&mut one, s1), next(&mut split, s), "{kv:?}: snapshot");

            let e = m
                .context_on(p, limited(per_part - 1))
                .err()
                .expect("refused");
            let e = e.to_string();
            assert!(
                e.contains("MiB per buffer") && e.contains("more than the 8 buffers"),
                "{e}"
            );
        }
    });
}
