//! The device backend: the seam's operations (`backend::Backend`) as [`Op`]s recorded
//! on a [`Device`]. A context made with [`Model::context_on`] places the model's
//! weights on the device (each matrix whose format the device takes; the others stay
//! on the host and run on the CPU, per matrix), and its KV pool's pages live there
//! (the pool keeps the books on the host: which page holds which positions, copy on
//! write). A step uploads its embedding rows, rope angles and page targets, records
//! every block step, and reads back only the rows it returns.

use crate::Model;
use crate::arch::{FfnKind, NormKind, RopeStyle};
use crate::attention::Slot;
use crate::backend::Backend;
use crate::context::{Context, ContextError, ContextParams};
use crate::cpu::MatmulInput;
use crate::device::{
    CACHE_PARTS, CacheBufs, CacheType, Device, DeviceBuf, DeviceError, DeviceMatrix, Glu, NormOp,
    Op, Unary,
};
use crate::forward::Scratch;
use crate::kv::{KvPool, KvPrecision, PAGE, SeqId, first_seen};
use crate::weights::{Ffn, HeadNorm, Layer, Linear, Norm};
use llamay_kernels::ThreadPool;
use std::collections::HashMap;

/// Rows of f32 values on the device: a buffer grown as needed (never shrunk), and the
/// values the last operation wrote.
#[derive(Default)]
pub(crate) struct DevAct {
    buf: Option<DeviceBuf>,
    cap: usize,
    len: usize,
}

/// What a context keeps on its device.
pub(crate) struct DeviceState {
    dev: Box<dyn Device>,
    /// Weight matrices on the device, by the address of their bytes in the file (a
    /// `Linear` borrows them for the model's life, so the address names it).
    matrices: HashMap<usize, DeviceMatrix>,
    /// Norm weights, biases and sinks, by the address of their host copy.
    vectors: HashMap<usize, DeviceBuf>,
    /// The KV pool's pages: `budget × PAGE` rows of k_dim (v_dim) values, f32 or f16,
    /// split over buffers the device can bind.
    k_cache: CacheBufs,
    v_cache: CacheBufs,
    cache: CacheType,
    /// ggml's f16 GELU table (see `Op::Unary`).
    gelu: DeviceBuf,
    /// The forward pass's rows (taken out while a step runs).
    pub(crate) scratch: Scratch<DevAct>,
    up: DevAct,
    gate: DevAct,
    /// Step inputs: rope angles, KV targets, page tables, attention slots, the rows
    /// asked for.
    angles: DevAct,
    angles_swa: DevAct,
    targets: DevAct,
    tables: DevAct,
    slots: DevAct,
    index: DevAct,
    /// The CPU's share: matrices the device declined.
    act: MatmulInput,
}

const GIB: f64 = (1u64 << 30) as f64;

/// The block features the device path declines, as `device_unsupported` and
/// `arch_on_device` name them.
const ENCODER: &str = "an encoder: its attention over a batch's own pages runs on the CPU";
const MIXTURE: &str = "a mixture of experts: the device has no expert routing yet";

/// Whether an architecture row runs on a device, in words (docs/arch-coverage.md's
/// column); the file decides the rest (`Model::device_unsupported`).
pub fn arch_on_device(arch: &crate::ArchSpec) -> String {
    use crate::arch::{Experts, Output};
    match (arch.output, arch.experts) {
        (Output::Embeddings, _) => format!("declined: {ENCODER}"),
        (_, Experts::Always(_)) => format!("declined: {MIXTURE}"),
        (_, Experts::WhenCounted(_)) => {
            format!("runs dense; with expert_count, declined: {MIXTURE}")
        }
        (_, Experts::Never) => "runs".into(),
    }
}

/// What the device's pages hold for a context's KV precision (`None`: not on a device).
fn cache_type(kv: KvPrecision) -> Option<CacheType> {
    match kv {
        KvPrecision::F32 => Some(CacheType::F32),
        KvPrecision::F16 => Some(CacheType::F16),
        _ => None,
    }
}

/// Why a model does not run on a device, before anything is placed there.
impl Model<'_> {
    /// The block features of this model (with a KV cache of `kv`) that the device path
    /// does not run, by name; empty when the whole block runs there. Weight formats
    /// are not among them: a matrix whose format the device declines runs on the CPU
    /// (see [`Model::device_declined_matrices`]).
    pub fn device_unsupported(&self, kv: KvPrecision) -> Vec<String> {
        let cfg = &self.config;
        let mut why = Vec::new();
        if !cfg.causal {
            why.push(format!("{} is {ENCODER}", cfg.arch.name));
        }
        if self
            .weights
            .layers
            .iter()
            .any(|l| matches!(l.ffn, Ffn::Moe(_)))
        {
            why.push(MIXTURE.into());
        }
        if cache_type(kv).is_none() {
            why.push(format!(
                "a {} KV cache: the device's pages hold f32 or f16 (--kv f32, --kv f16)",
                kv.name()
            ));
        }
        if cfg.head_dim_v > 512 {
            why.push(format!(
                "value heads of {} (the device holds 512)",
                cfg.head_dim_v
            ));
        }
        why
    }

    /// The matrices `dev` declines, as "tensor: reason": these run on the CPU.
    pub fn device_declined_matrices(&self, dev: &dyn Device) -> Vec<String> {
        (self.weights.linears())
            .filter_map(|l| {
                dev.declines(l.w.ty)
                    .map(|why| format!("{}: {why}", l.w.name))
            })
            .collect()
    }

    /// The bytes of the matrices `dev` declines (they stay in host memory).
    pub fn device_declined_bytes(&self, dev: &dyn Device) -> u64 {
        (self.weights.linears())
            .filter(|l| dev.declines(l.w.ty).is_some())
            .map(|l| l.w.data.len() as u64)
            .sum()
    }

    /// A context whose forward pass runs on `dev`: the model's weights are placed
    /// there (each matrix the device declines stays on the CPU), and so are the KV
    /// pool's pages. Refused, naming why, when the block uses what the device does not
    /// run ([`Model::device_unsupported`]).
    pub fn context_on(
        &self,
        p: ContextParams,
        mut dev: Box<dyn Device>,
    ) -> Result<Context<'_>, ContextError> {
        let why = self.device_unsupported(p.kv);
        if !why.is_empty() {
            return Err(ContextError::Device(format!(
                "{} does not run this model: {}",
                dev.describe(),
                why.join("; ")
            )));
        }
        let mut ctx = self.context(p)?;
        let failed = |e: DeviceError| ContextError::Device(e.to_string());
        // What the device will hold, checked before anything is placed: a model that
        // does not fit is refused naming both sizes (its layers are not split between
        // the device and the CPU).
        let cache = cache_type(p.kv).expect("refused above");
        let c = &self.config;
        let pages = ctx.kv.page_budget().max(1);
        let page_words = (PAGE * cache.words(c.k_dim()), PAGE * cache.words(c.v_dim()));
        let kv_bytes = (pages * (page_words.0 + page_words.1)) as u64 * 4;
        // The matrices the device takes, each once (a tied output is the embedding).
        let mut seen = std::collections::HashSet::new();
        let placed: Vec<&Linear<'_>> = (self.weights.linears())
            .filter(|l| dev.declines(l.w.ty).is_none() && seen.insert(l.w.data.as_ptr() as usize))
            .collect();
        let weight_bytes: u64 = placed.iter().map(|l| l.w.data.len() as u64).sum();
        let need = weight_bytes + kv_bytes;
        if need > dev.memory_bytes() {
            return Err(ContextError::Device(format!(
                "{} has {:.2} GiB; this model needs {:.2} GiB there ({:.2} GiB of weights, {:.2} GiB of KV cache: -c sizes it)",
                dev.describe(),
                dev.memory_bytes() as f64 / GIB,
                need as f64 / GIB,
                weight_bytes as f64 / GIB,
                kv_bytes as f64 / GIB
            )));
        }
        let pages_per_part = cache_split(pages, page_words.0.max(page_words.1), &*dev)
            .map_err(ContextError::Device)?;
        let mut matrices = HashMap::new();
        for l in placed {
            let m = dev
                .upload_matrix(l.w.name, l.w.ty, l.w.rows, l.w.cols, l.w.data)
                .map_err(failed)?;
            matrices.insert(l.w.data.as_ptr() as usize, m);
        }
        let mut vectors = HashMap::new();
        for v in self.weights.vectors() {
            let key = v.as_ptr() as usize;
            if v.is_empty() || vectors.contains_key(&key) {
                continue;
            }
            let buf = dev
                .alloc(v.len(), "a norm weight or bias")
                .map_err(failed)?;
            dev.write_f32(buf, 0, v).map_err(failed)?;
            vectors.insert(key, buf);
        }
        let mut place = |words, what| {
            alloc_cache(&mut *dev, pages, pages_per_part, words, what).map_err(failed)
        };
        let k_cache = place(page_words.0, "the KV cache's keys (-c sizes it)")?;
        let v_cache = place(page_words.1, "the KV cache's values (-c sizes it)")?;
        let table = crate::ops::gelu_table();
        let words: Vec<u32> = (table.chunks(2))
            .map(|p| u32::from(p[0]) | u32::from(p[1]) << 16)
            .collect();
        let gelu = dev.alloc(words.len(), "the GELU table").map_err(failed)?;
        dev.write_u32(gelu, 0, &words).map_err(failed)?;
        ctx.kv.contents_on_device();
        ctx.device = Some(Box::new(DeviceState {
            dev,
            matrices,
            vectors,
            k_cache,
            v_cache,
            cache,
            gelu,
            scratch: Scratch::default(),
            up: DevAct::default(),
            gate: DevAct::default(),
            angles: DevAct::default(),
            angles_swa: DevAct::default(),
            targets: DevAct::default(),
            tables: DevAct::default(),
            slots: DevAct::default(),
            index: DevAct::default(),
            act: MatmulInput::default(),
        }));
        Ok(ctx)
    }
}

impl DeviceState {
    /// The device's row as f32 (f16 pages widened, exactly).
    fn decode_row(&self, words: &[f32]) -> Vec<f32> {
        match self.cache {
            CacheType::F32 => words.to_vec(),
            CacheType::F16 => (words.iter())
                .flat_map(|w| {
                    let b = w.to_bits();
                    [b as u16, (b >> 16) as u16].map(|h| half::f16::from_bits(h).to_f32())
                })
                .collect(),
        }
    }

    /// A row for the device's cache (f16 pages: rounded as the host's f16 pages are).
    fn encode_row(&self, row: &[f32]) -> Vec<u32> {
        match self.cache {
            CacheType::F32 => row.iter().map(|v| v.to_bits()).collect(),
            CacheType::F16 => (row.chunks_exact(2))
                .map(|p| {
                    let h = |v: f32| u32::from(half::f16::from_f32(v).to_bits());
                    h(p[0]) | h(p[1]) << 16
                })
                .collect(),
        }
    }

    /// Copies the pages of sequence `s` from the device into the pool's host pages
    /// (what a snapshot reads).
    pub(crate) fn pages_to_host(
        &mut self,
        kv: &mut KvPool,
        cfg: &crate::Config,
        s: SeqId,
    ) -> Result<(), crate::KvError> {
        let (kd, vd) = (cfg.k_dim(), cfg.v_dim());
        let (kw, vw) = (self.cache.words(kd), self.cache.words(vd));
        let failed = |e: DeviceError| crate::KvError::Device(e.to_string());
        for id in kv.pages_of_seq(s)? {
            let (mut k, mut v) = (vec![0f32; PAGE * kw], vec![0f32; PAGE * vw]);
            let (kb, ko) = self.k_cache.locate(id as usize, PAGE * kw);
            let (vb, vo) = self.v_cache.locate(id as usize, PAGE * vw);
            self.dev.read(kb, ko, &mut k).map_err(failed)?;
            self.dev.read(vb, vo, &mut v).map_err(failed)?;
            for slot in 0..PAGE {
                let kr = self.decode_row(&k[slot * kw..(slot + 1) * kw]);
                let vr = self.decode_row(&v[slot * vw..(slot + 1) * vw]);
                kv.store_mut().write(id, slot, &kr, &vr);
            }
        }
        Ok(())
    }

    /// Copies the pages of sequence `s` from the pool's host pages to the device (after
    /// a snapshot was loaded into them).
    pub(crate) fn pages_to_device(
        &mut self,
        kv: &KvPool,
        cfg: &crate::Config,
        s: SeqId,
    ) -> Result<(), crate::KvError> {
        let (kw, vw) = (self.cache.words(cfg.k_dim()), self.cache.words(cfg.v_dim()));
        let failed = |e: DeviceError| crate::KvError::Device(e.to_string());
        for id in kv.pages_of_seq(s)? {
            let (mut k, mut v) = (Vec::with_capacity(PAGE * kw), Vec::with_capacity(PAGE * vw));
            for slot in 0..PAGE {
                let (kr, vr) = kv.read_row(id, slot);
                k.extend(self.encode_row(&kr));
                v.extend(self.encode_row(&vr));
            }
            let (kb, ko) = self.k_cache.locate(id as usize, PAGE * kw);
            let (vb, vo) = self.v_cache.locate(id as usize, PAGE * vw);
            self.dev.write_u32(kb, ko, &k).map_err(failed)?;
            self.dev.write_u32(vb, vo, &v).map_err(failed)?;
        }
        Ok(())
    }

    /// What the device has done (submissions, bytes read back).
    pub(crate) fn counters(&self) -> crate::device::DeviceCounters {
        self.dev.counters()
    }

    pub(crate) fn describe(&self) -> String {
        self.dev.describe()
    }
}

/// Pages per buffer when `pages` pages of at most `page_words` words are split over
/// buffers `dev` can bind; refused, naming the sizes, when that takes more than
/// [`CACHE_PARTS`] buffers.
fn cache_split(pages: usize, page_words: usize, dev: &dyn Device) -> Result<usize, String> {
    let limit = dev.max_buffer_len();
    let per_part = limit / page_words.max(1);
    let mib = |words: usize| words as f64 * 4.0 / (1u64 << 20) as f64;
    if per_part == 0 || pages.div_ceil(per_part) > CACHE_PARTS {
        return Err(format!(
            "{} binds at most {:.0} MiB per buffer; this KV cache needs {:.0} MiB for its keys or values, more than the {CACHE_PARTS} buffers a cache is split over (lower -c, or --parallel)",
            dev.describe(),
            mib(limit),
            mib(pages * page_words)
        ));
    }
    Ok(per_part.min(pages))
}

/// One of the caches: `pages` pages of `page_words` words, `pages_per_part` to a buffer.
fn alloc_cache(
    dev: &mut dyn Device,
    pages: usize,
    pages_per_part: usize,
    page_words: usize,
    what: &str,
) -> Result<CacheBufs, DeviceError> {
    let first = dev.alloc(pages_per_part.min(pages) * page_words, what)?;
    let mut parts = [first; CACHE_PARTS];
    for (i, part) in parts.iter_mut().enumerate().skip(1) {
        let held = (i * pages_per_part).min(pages);
        let n = pages_per_part.min(pages - held);
        if n > 0 {
            *part = dev.alloc(n * page_words, what)?;
        }
    }
    Ok(CacheBufs {
        parts,
        pages_per_part,
    })
}

/// Grows `a` to hold `len` values (contents not kept) and marks `len` of them.
fn ensure(
    dev: &mut dyn Device,
    a: &mut DevAct,
    len: usize,
    what: &str,
) -> Result<DeviceBuf, DeviceError> {
    match a.buf {
        Some(b) if a.cap >= len => {
            a.len = len;
            Ok(b)
        }
        old => {
            if let Some(b) = old {
                dev.free(b);
            }
            // Round up so that a growing batch does not reallocate every step.
            let cap = len.max(1).next_power_of_two();
            let b = dev.alloc(cap, what)?;
            *a = DevAct {
                buf: Some(b),
                cap,
                len,
            };
            Ok(b)
        }
    }
}

fn upload_u32(
    dev: &mut dyn Device,
    a: &mut DevAct,
    values: &[u32],
    what: &str,
) -> Result<(), DeviceError> {
    let b = ensure(dev, a, values.len(), what)?;
    dev.write_u32(b, 0, values)
}

/// The step's inputs a device needs beyond the embedding rows.
pub(crate) struct StepPlan<'s> {
    pub seqs: &'s [SeqId],
    pub slots: &'s [Slot],
    /// Per layer, each batch token's (page, slot).
    pub targets: &'s [Vec<(u32, usize)>],
    pub angles: &'s [(f32, f32)],
    pub angles_swa: Option<&'s [(f32, f32)]>,
    pub index: &'s [usize],
}

/// One step on the device.
pub(crate) struct OnDevice<'s, 'm> {
    pub model: &'m Model<'m>,
    pub pool: &'s ThreadPool,
    st: &'s mut DeviceState,
    n: usize,
    /// The first failure; every later operation is skipped and `run` returns it.
    pub err: Option<DeviceError>,
}

impl<'s, 'm> OnDevice<'s, 'm> {
    /// Uploads the step's inputs: copy-on-write page copies, KV targets, page tables,
    /// attention slots, rope angles.
    pub(crate) fn begin(
        model: &'m Model<'m>,
        pool: &'s ThreadPool,
        st: &'s mut DeviceState,
        kv: &mut KvPool,
        plan: &StepPlan<'_>,
    ) -> Result<OnDevice<'s, 'm>, DeviceError> {
        let cfg = &model.config;
        let n_layer = cfg.n_layer;
        let n = plan.slots.len();
        let dev = &mut *st.dev;
        let (kd, vd) = (st.cache.words(cfg.k_dim()), st.cache.words(cfg.v_dim()));
        for (from, to) in kv.take_copies() {
            for (cache, words) in [(st.k_cache, PAGE * kd), (st.v_cache, PAGE * vd)] {
                let (fb, fo) = cache.locate(from as usize, words);
                let (tb, to) = cache.locate(to as usize, words);
                dev.copy(fb, fo, tb, to, words)?;
            }
        }
        let targets: Vec<u32> = (plan.targets.iter().flatten())
            .map(|&(page, slot)| (page as usize * PAGE + slot) as u32)
            .collect();
        upload_u32(dev, &mut st.targets, &targets, "the step's KV targets")?;
        // Per layer and sequence, its page table; per layer and token, (table offset,
        // first position seen, end).
        let (mut tables, mut slots) = (Vec::new(), Vec::with_capacity(n_layer * n * 3));
        for il in 0..n_layer {
            let window = kv.window(il);
            let mut offsets = Vec::with_capacity(plan.seqs.len());
            for &s in plan.seqs {
                offsets.push(tables.len() as u32);
                // A released page is never read (it is outside every window).
                tables.extend(kv.table(s, il).iter().map(|p| p.unwrap_or(0)));
            }
            for sl in plan.slots {
                slots.extend([
                    offsets[sl.seq],
                    first_seen(sl.pos, window) as u32,
                    sl.end as u32,
                ]);
            }
        }
        upload_u32(dev, &mut st.tables, &tables, "the step's page tables")?;
        upload_u32(dev, &mut st.slots, &slots, "the step's attention slots")?;
        let flat = |a: &[(f32, f32)]| -> Vec<f32> { a.iter().flat_map(|&(c, s)| [c, s]).collect() };
        if !plan.angles.is_empty() {
            let b = ensure(dev, &mut st.angles, plan.angles.len() * 2, "rope angles")?;
            dev.write_f32(b, 0, &flat(plan.angles))?;
        }
        if let Some(a) = plan.angles_swa {
            let b = ensure(dev, &mut st.angles_swa, a.len() * 2, "rope angles")?;
            dev.write_f32(b, 0, &flat(a))?;
        }
        let index: Vec<u32> = plan.index.iter().map(|&i| i as u32).collect();
        upload_u32(dev, &mut st.index, &index, "the rows asked for")?;
        Ok(OnDevice {
            model,
            pool,
            st,
            n,
            err: None,
        })
    }

    /// Runs `f` unless an earlier step failed; keeps the first failure.
    fn step(&mut self, f: impl FnOnce(&mut DeviceState) -> Result<(), DeviceError>) {
        if self.err.is_none()
            && let Err(e) = f(self.st)
        {
            self.err = Some(e);
        }
    }

    fn vector(st: &DeviceState, v: &[f32]) -> Result<DeviceBuf, DeviceError> {
        (st.vectors.get(&(v.as_ptr() as usize)).copied())
            .ok_or_else(|| DeviceError::Failed("a weight vector is not on the device".into()))
    }
}

fn buf(a: &DevAct) -> Result<DeviceBuf, DeviceError> {
    a.buf
        .ok_or_else(|| DeviceError::Failed("an activation was read before it was written".into()))
}

fn norm_op(kind: NormKind) -> NormOp {
    match kind {
        NormKind::Rms => NormOp::Rms,
        NormKind::Layer => NormOp::Layer,
    }
}

/// A normalisation's parameters, as host vectors the device holds copies of.
struct NormArgs<'a> {
    kind: NormOp,
    w: &'a [f32],
    /// The weight row of row `r` is row `r % w_rows` (per-head norms).
    w_rows: usize,
    b: Option<&'a [f32]>,
    eps: f32,
}

impl<'a> NormArgs<'a> {
    fn of(norm: &'a Norm, kind: NormKind, eps: f32) -> Self {
        NormArgs {
            kind: norm_op(kind),
            w: &norm.weight,
            w_rows: 1,
            b: norm.bias.as_deref(),
            eps,
        }
    }

    /// The post-norms': RMS by `w`, no bias.
    fn rms(w: &'a [f32], eps: f32) -> Self {
        NormArgs {
            kind: NormOp::Rms,
            w,
            w_rows: 1,
            b: None,
            eps,
        }
    }
}

/// `out = norm(x)` for rows of `cols` on the device (`out` may be `x`).
fn record_norm(
    st: &mut DeviceState,
    x: &DevAct,
    out: DeviceBuf,
    cols: usize,
    a: NormArgs<'_>,
) -> Result<(), DeviceError> {
    let w = Some(OnDevice::vector(st, a.w)?);
    let b = a.b.map(|b| OnDevice::vector(st, b)).transpose()?;
    st.dev.run(&Op::Norm {
        kind: a.kind,
        x: buf(x)?,
        out,
        rows: x.len / cols,
        cols,
        w,
        w_rows: a.w_rows,
        b,
        eps: a.eps,
    })
}

/// `out = W x + b` on the device, or on the CPU where the device declined `W`.
fn record_linear(
    st: &mut DeviceState,
    pool: &ThreadPool,
    l: &Linear<'_>,
    x: &DevAct,
    out: &mut DevAct,
) -> Result<(), DeviceError> {
    let n = x.len / l.w.cols;
    let xb = buf(x)?;
    let ob = ensure(&mut *st.dev, out, n * l.w.rows, "a projection's output")?;
    let bias =
        l.b.as_deref()
            .map(|b| OnDevice::vector(st, b))
            .transpose()?;
    if let Some(&w) = st.matrices.get(&(l.w.data.as_ptr() as usize)) {
        return st.dev.run(&Op::Matmul {
            w,
            x: xb,
            n,
            out: ob,
            bias,
        });
    }
    // The device declined this matrix's format: the CPU computes it (a read and a
    // write, so this step is no longer one submission).
    let mut host = vec![0f32; x.len];
    st.dev.read(xb, 0, &mut host)?;
    let mut y = Vec::new();
    crate::cpu::linear(l, &host, &mut st.act, &mut y, pool);
    st.dev.write_f32(ob, 0, &y)
}

impl Backend for OnDevice<'_, '_> {
    type Act = DevAct;
    /// 32 rows of a 262144-token vocabulary's logits are 32 MiB: within every device's
    /// binding limit (lavapipe's is 128 MiB).
    const HEAD_ROWS: usize = 32;

    fn load(&mut self, rows: Vec<f32>, x: &mut DevAct) {
        self.step(|st| {
            let b = ensure(&mut *st.dev, x, rows.len(), "the residual stream")?;
            st.dev.write_f32(b, 0, &rows)
        });
    }

    fn norm(&mut self, x: &mut DevAct, norm: &Norm, kind: NormKind, eps: f32, cols: usize) {
        self.step(|st| {
            let b = buf(x)?;
            record_norm(st, x, b, cols, NormArgs::of(norm, kind, eps))
        });
    }

    fn norm_into(
        &mut self,
        x: &DevAct,
        out: &mut DevAct,
        norm: Option<&Norm>,
        kind: NormKind,
        eps: f32,
        cols: usize,
    ) {
        self.step(|st| {
            let ob = ensure(&mut *st.dev, out, x.len, "a normalised row")?;
            match norm {
                Some(n) => record_norm(st, x, ob, cols, NormArgs::of(n, kind, eps)),
                None => st.dev.copy(buf(x)?, 0, ob, 0, x.len),
            }
        });
    }

    fn rms(&mut self, x: &mut DevAct, w: &[f32], eps: f32, cols: usize) {
        self.step(|st| {
            let b = buf(x)?;
            record_norm(st, x, b, cols, NormArgs::rms(w, eps))
        });
    }

    fn head_norm(&mut self, x: &mut DevAct, n: &HeadNorm, eps: f32, hd: usize) {
        self.step(|st| {
            let b = buf(x)?;
            let args = NormArgs {
                kind: norm_op(n.kind),
                w: &n.weight,
                w_rows: if n.per_head { n.weight.len() / hd } else { 1 },
                b: None,
                eps,
            };
            record_norm(st, x, b, hd, args)
        });
    }

    fn linears(&mut self, ls: &[&Linear<'_>], x: &DevAct, outs: &mut [&mut DevAct]) {
        let pool = self.pool;
        for (l, out) in ls.iter().zip(outs.iter_mut()) {
            self.step(|st| record_linear(st, pool, l, x, out));
        }
    }

    fn rope(&mut self, x: &mut DevAct, dim: usize, swa: bool) {
        let cfg = &self.model.config;
        let neox = match cfg.arch.rope {
            RopeStyle::None => return,
            RopeStyle::Neox => true,
            RopeStyle::Interleaved => false,
        };
        let (hd, n_rot, n) = (cfg.head_dim_k, cfg.n_rot, self.n);
        self.step(|st| {
            let angles = match (&st.angles_swa, swa) {
                (a, true) if a.buf.is_some() => buf(a)?,
                _ => buf(&st.angles)?,
            };
            st.dev.run(&Op::Rope {
                x: buf(x)?,
                n,
                dim,
                hd,
                n_rot,
                angles,
                neox,
            })
        });
    }

    fn attention(
        &mut self,
        il: usize,
        q: &DevAct,
        k: &DevAct,
        v: &DevAct,
        _swa: bool,
        sinks: Option<&[f32]>,
        out: &mut DevAct,
    ) {
        let cfg = &self.model.config;
        let n = self.n;
        let shape = cfg.attention_shape();
        self.step(|st| {
            st.dev.run(&Op::KvWrite {
                k: buf(k)?,
                v: buf(v)?,
                n,
                k_dim: cfg.k_dim(),
                v_dim: cfg.v_dim(),
                targets: buf(&st.targets)?,
                targets_offset: il * n,
                k_cache: st.k_cache,
                v_cache: st.v_cache,
                cache: st.cache,
            })?;
            let sinks = sinks.map(|s| OnDevice::vector(st, s)).transpose()?;
            let ob = ensure(
                &mut *st.dev,
                out,
                n * cfg.n_head * cfg.head_dim_v,
                "attention's output",
            )?;
            st.dev.run(&Op::Attention {
                q: buf(q)?,
                n,
                k_cache: st.k_cache,
                v_cache: st.v_cache,
                cache: st.cache,
                tables: buf(&st.tables)?,
                slots: buf(&st.slots)?,
                slots_offset: il * 3 * n,
                shape,
                sinks,
                out: ob,
            })
        });
    }

    fn add(&mut self, x: &mut DevAct, y: &DevAct, z: Option<&DevAct>) {
        self.step(|st| {
            let z = z.map(buf).transpose()?;
            st.dev.run(&Op::Add {
                x: buf(x)?,
                y: buf(y)?,
                y_len: x.len,
                z,
                n: x.len,
            })
        });
    }

    fn ffn(&mut self, layer: &Layer<'_>, h: &DevAct, out: &mut DevAct) {
        let cfg = &self.model.config;
        let Ffn::Dense(ffn) = &layer.ffn else {
            // `context_on` refuses mixtures before a step can reach one.
            self.err = Some(DeviceError::Failed(
                "a mixture of experts on the device".into(),
            ));
            return;
        };
        let pool = self.pool;
        let kind = cfg.arch.ffn;
        self.step(|st| {
            let mut up = std::mem::take(&mut st.up);
            let mut gate = std::mem::take(&mut st.gate);
            let r = (|| {
                match (kind, &ffn.gate) {
                    (FfnKind::Gelu, _) | (_, None) => {
                        record_linear(st, pool, &ffn.up, h, &mut up)?;
                        if kind == FfnKind::Gelu {
                            let x = buf(&up)?;
                            st.dev.run(&Op::Unary {
                                op: Unary::Gelu,
                                x,
                                n: up.len,
                                table: Some(st.gelu),
                            })?;
                        }
                    }
                    (_, Some(g)) => {
                        record_linear(st, pool, &ffn.up, h, &mut up)?;
                        record_linear(st, pool, g, h, &mut gate)?;
                        let op = match kind {
                            FfnKind::GeGlu => Glu::Geglu,
                            FfnKind::SwiGluOai => Glu::SwigluOai,
                            _ => Glu::Swiglu,
                        };
                        st.dev.run(&Op::Glu {
                            op,
                            up: buf(&up)?,
                            gate: buf(&gate)?,
                            n: up.len,
                            table: Some(st.gelu),
                        })?;
                    }
                }
                record_linear(st, pool, &ffn.down, &up, out)?;
                if let Some(w) = &layer.post_ffn_norm {
                    let b = buf(out)?;
                    record_norm(st, out, b, cfg.n_embd, NormArgs::rms(w, cfg.norm_eps))?;
                }
                Ok(())
            })();
            (st.up, st.gate) = (up, gate);
            r
        });
    }

    fn gather(
        &mut self,
        x: &DevAct,
        _index: &[usize],
        run: std::ops::Range<usize>,
        cols: usize,
        out: &mut DevAct,
    ) {
        self.step(|st| {
            let ob = ensure(&mut *st.dev, out, run.len() * cols, "the rows asked for")?;
            st.dev.run(&Op::Gather {
                x: buf(x)?,
                index: buf(&st.index)?,
                index_offset: run.start,
                rows: run.len(),
                cols,
                out: ob,
            })
        });
    }

    fn softcap(&mut self, x: &mut DevAct, c: f32) {
        self.step(|st| {
            st.dev.run(&Op::Unary {
                op: Unary::Softcap(c),
                x: buf(x)?,
                n: x.len,
                table: None,
            })
        });
    }

    fn read(&mut self, x: &mut DevAct) -> Vec<f32> {
        let mut host = vec![0f32; x.len];
        self.step(|st| st.dev.read(buf(x)?, 0, &mut host));
        host
    }
}
