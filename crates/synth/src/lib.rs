//! Synthetic GGUF models for any row of the architecture table: valid containers
//! written through the gguf writer, with the tensors a file of that family carries
//! (and, on request, every optional one the loader accepts), random weights in a chosen
//! format, and the metadata the config reads. [`hostile`] turns fuzzer bytes into
//! variants of them with hostile shapes, types, metadata and tensor sets, so that a fuzz
//! target spends its time past the container parser, in `Model::check`, `Model::load`
//! and `decode`.
//!
//! The tensor lists are written here from the row's fields and llama.cpp's names
//! (`src/llama-arch.cpp`), not taken from the engine's binder: a binder that asks for a
//! tensor this file lacks, or leaves one of its tensors unread, fails the tests.

mod hostile;
pub mod reference;
mod scratch;

pub use hostile::{HostileModel, Outcome, exercise, hostile};
pub use scratch::TempPath;

use llamay_engine::arch::{
    ArchSpec, Experts, FfnKind, MoeSpec, NormKind, Output, ParallelNorms, QkNorm, QkvLayout,
    Residual, RopeStyle, Sinks, SwaPattern,
};
use llamay_formats::GgmlType;
use llamay_gguf::{GgufWriter, Value, WriteError};
use std::borrow::Cow;

/// A model's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub n_embd: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    pub n_ff: u64,
    pub n_layer: u64,
    pub n_vocab: u64,
    pub n_ctx: u64,
}

impl Dims {
    /// Small enough to load in milliseconds, wide enough (rows of 256) for every block
    /// format, K-quants included.
    pub const SMALL: Dims = Dims {
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 256,
        n_layer: 2,
        n_vocab: 64,
        n_ctx: 64,
    };

    /// Tiny (rows of 32): for the legacy block formats and fast fuzzing.
    pub const TINY: Dims = Dims {
        n_embd: 32,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 16,
        n_ff: 64,
        n_layer: 1,
        n_vocab: 16,
        n_ctx: 16,
    };
}

/// Which rope-factor tensors the file carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeFactors {
    None,
    /// `rope_freqs.weight` (Llama 3.1).
    Fixed,
    /// `rope_factors_long/short.weight` (Phi-3 LongRoPE).
    LongShort,
}

/// What to build.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub arch: &'static ArchSpec,
    pub dims: Dims,
    /// The format of the weight matrices (1-D tensors are F32, as llama.cpp writes them).
    pub ty: GgmlType,
    /// Every optional tensor the family may carry: a bias on every projection and
    /// LayerNorm, an untied `output.weight` with its bias.
    pub all_optional: bool,
    pub rope_factors: RopeFactors,
    /// Seed of the random weights.
    pub seed: u64,
}

impl Spec {
    pub fn new(arch: &'static ArchSpec) -> Spec {
        Spec {
            arch,
            dims: Dims::SMALL,
            ty: GgmlType::F32,
            all_optional: false,
            rope_factors: RopeFactors::None,
            seed: 1,
        }
    }
}

/// One tensor of a file to write.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDef {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order, ne0 first.
    pub shape: Vec<u64>,
    /// Whether the family's loader accepts the file without it.
    pub optional: bool,
}

/// A model file before it is written: metadata and tensor declarations.
#[derive(Clone, Debug)]
pub struct ModelFile {
    pub metadata: Vec<(String, Value<'static>)>,
    pub tensors: Vec<TensorDef>,
    pub seed: u64,
}

impl ModelFile {
    pub fn new(spec: &Spec) -> ModelFile {
        ModelFile {
            metadata: metadata(spec.arch, &spec.dims),
            tensors: tensors(spec),
            seed: spec.seed,
        }
    }

    /// The container's bytes. Weights are uniform random in ±0.1 (1-D weights near 1),
    /// quantised to each tensor's type where it is writable; other readable types get
    /// random blocks; refused types get random bytes.
    pub fn write(&self) -> Result<Vec<u8>, WriteError> {
        let mut w = GgufWriter::new();
        for (k, v) in &self.metadata {
            w.add_kv(k, v.clone())?;
        }
        for t in &self.tensors {
            w.add_tensor(&t.name, t.ty, &t.shape)?;
        }
        let mut rng = Rng(self.seed ^ 0x9E37_79B9_7F4A_7C15);
        let mut out = Vec::new();
        w.write(&mut out, |i| {
            let t = &self.tensors[i];
            Ok(Cow::Owned(tensor_bytes(t, &mut rng)))
        })?;
        Ok(out)
    }
}

/// A small deterministic generator (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn tensor_bytes(t: &TensorDef, rng: &mut Rng) -> Vec<u8> {
    let n: u64 = t.shape.iter().product();
    let n_bytes = t.ty.bytes_for(n).unwrap_or(0) as usize;
    let one_d = t.shape.len() == 1;
    if t.ty.is_writable() {
        let values: Vec<f32> = (0..n)
            .map(|_| {
                let r = rng.unit();
                if one_d { 1.0 + 0.1 * r } else { 0.1 * r }
            })
            .collect();
        if let Ok(bytes) = llamay_formats::quantize(t.ty, &values) {
            return bytes;
        }
    }
    // Random blocks, kept finite and small (`exercise` takes NaN logits for a skipped
    // computation): 16-bit scale fields stay below 2 by clearing the top exponent bits
    // of every other byte; MXFP4's byte scales stay near 1.
    let mut bytes: Vec<u8> = (0..n_bytes).map(|_| rng.next_u64() as u8).collect();
    for pair in bytes.chunks_exact_mut(2) {
        pair[1] &= 0x3F;
    }
    if t.ty == GgmlType::MXFP4 {
        // Each block starts with an E8M0 scale (2^(e - 127); 255 is NaN): near 1.
        let block = t.ty.type_size() as usize;
        for b in bytes.chunks_exact_mut(block) {
            b[0] = 120 + (b[0] & 7);
        }
    }
    bytes
}

fn key(arch: &ArchSpec, k: &str) -> String {
    format!("{}.{k}", arch.name)
}

/// Experts in a synthetic mixture (2 used per token).
const N_EXPERT: u64 = 4;

/// The mixture a file of `arch` carries: the rows that are always one (`llama`'s
/// optional mixture is written dense).
fn mixture(arch: &ArchSpec) -> Option<MoeSpec> {
    match arch.experts {
        Experts::Always(m) => Some(m),
        Experts::Never | Experts::WhenCounted(_) => None,
    }
}

/// The metadata a file of `arch` with shape `d` carries.
pub fn metadata(arch: &'static ArchSpec, d: &Dims) -> Vec<(String, Value<'static>)> {
    let u = |v: u64| Value::U32(v as u32);
    let mut kv = vec![
        (
            "general.architecture".to_string(),
            Value::String(arch.name.into()),
        ),
        (key(arch, "context_length"), u(d.n_ctx)),
        (key(arch, "embedding_length"), u(d.n_embd)),
        (key(arch, "block_count"), u(d.n_layer)),
        (key(arch, "feed_forward_length"), u(d.n_ff)),
        (key(arch, "attention.head_count"), u(d.n_head)),
        (key(arch, "attention.head_count_kv"), u(d.n_head_kv)),
        (key(arch, "attention.key_length"), u(d.head_dim)),
        (key(arch, "attention.value_length"), u(d.head_dim)),
    ];
    if arch.rope != RopeStyle::None {
        kv.push((key(arch, "rope.dimension_count"), u(d.head_dim)));
        kv.push((key(arch, "rope.freq_base"), Value::F32(10_000.0)));
    }
    match arch.norm {
        NormKind::Rms => kv.push((
            key(arch, "attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        )),
        NormKind::Layer => kv.push((key(arch, "attention.layer_norm_epsilon"), Value::F32(1e-5))),
    }
    if let SwaPattern::LastOfGroup(_) = arch.attention.window {
        kv.push((key(arch, "attention.sliding_window"), u(8)));
    }
    if let Some(m) = mixture(arch) {
        kv.push((key(arch, "expert_count"), u(N_EXPERT)));
        kv.push((key(arch, "expert_used_count"), u(2)));
        if m.width_key {
            kv.push((key(arch, "expert_feed_forward_length"), u(d.n_ff)));
        }
        if m.shared_expert {
            kv.push((key(arch, "expert_shared_feed_forward_length"), u(d.n_ff)));
        }
    }
    kv.extend(vocabulary(d.n_vocab));
    kv
}

/// A SentencePiece vocabulary of `n` tokens (`<unk>`, `<s>`, `</s>`, then `▁t3`,
/// `▁t4`, ...), so that the CLI can load the tokenizer too. The pieces are made once
/// (metadata values borrow `'static` strings); a vocabulary larger than that table is
/// cut to it.
fn vocabulary(n: u64) -> Vec<(String, Value<'static>)> {
    use llamay_gguf::{Array, GgufStr};
    static PIECES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let table = PIECES.get_or_init(|| {
        (0..4096)
            .map(|i| match i {
                0 => "<unk>".to_string(),
                1 => "<s>".to_string(),
                2 => "</s>".to_string(),
                _ => format!("\u{2581}t{i}"),
            })
            .collect()
    });
    let n = n.min(table.len() as u64);
    let pieces: Vec<&'static str> = table[..n as usize].iter().map(String::as_str).collect();
    let types: Vec<i32> = (0..n).map(|i| if i < 3 { 3 } else { 1 }).collect();
    let scores: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    vec![
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::strings(
                pieces.into_iter().map(GgufStr::from).collect(),
            )),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::from_f32s(&scores)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::from_i32s(&types)),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
    ]
}

/// The tensors a file of `spec` carries, in llama.cpp's order.
pub fn tensors(spec: &Spec) -> Vec<TensorDef> {
    let (arch, d, ty) = (spec.arch, &spec.dims, spec.ty);
    let opt = spec.all_optional;
    let mut out = Vec::new();
    let mut add = |name: String, shape: Vec<u64>, optional: bool| {
        // Norm weights and biases are F32 whatever their rank (StableLM's per-head
        // [head_dim, n_head] norms, gpt-oss's [n_ff, n_expert] expert biases).
        let ty = if shape.len() == 1 || name.ends_with("_norm.weight") || name.ends_with(".bias") {
            GgmlType::F32
        } else {
            ty
        };
        out.push(TensorDef {
            name,
            ty,
            shape,
            optional,
        });
    };
    let e = d.n_embd;
    let layer_norm = arch.norm == NormKind::Layer;
    // A norm: weight, and for LayerNorm its bias (optional in the loader).
    let norm = |add: &mut dyn FnMut(String, Vec<u64>, bool), name: &str| {
        add(format!("{name}.weight"), vec![e], false);
        if layer_norm {
            add(format!("{name}.bias"), vec![e], true);
        }
    };
    // A norm the loader takes where present (written with every optional tensor).
    let optional_norm = |add: &mut dyn FnMut(String, Vec<u64>, bool), name: &str| {
        if opt {
            add(format!("{name}.weight"), vec![e], true);
            if layer_norm {
                add(format!("{name}.bias"), vec![e], true);
            }
        }
    };
    let linear = |add: &mut dyn FnMut(String, Vec<u64>, bool), name: &str, cols: u64, rows: u64| {
        add(format!("{name}.weight"), vec![cols, rows], false);
        if opt {
            add(format!("{name}.bias"), vec![rows], true);
        }
    };
    add("token_embd.weight".into(), vec![e, d.n_vocab], false);
    if arch.learned_positions {
        add("position_embd.weight".into(), vec![e, d.n_ctx], false);
    }
    let encoder = arch.output == Output::Embeddings;
    if encoder {
        add("token_types.weight".into(), vec![e, 2], true);
        norm(&mut add, "token_embd_norm");
    } else {
        norm(&mut add, "output_norm");
    }
    if opt && !encoder {
        // Untied output: optional itself (the embedding is used without it).
        add("output.weight".into(), vec![e, d.n_vocab], true);
        add("output.bias".into(), vec![d.n_vocab], true);
    }
    let half = d.head_dim / 2;
    match spec.rope_factors {
        RopeFactors::None => {}
        RopeFactors::Fixed => add("rope_freqs.weight".into(), vec![half], true),
        RopeFactors::LongShort => {
            add("rope_factors_long.weight".into(), vec![half], true);
            add("rope_factors_short.weight".into(), vec![half], true);
        }
    }
    let (qd, kvd) = (d.n_head * d.head_dim, d.n_head_kv * d.head_dim);
    for il in 0..d.n_layer {
        let p = |s: &str| format!("blk.{il}.{s}");
        if arch.residual != Residual::PostNorm {
            norm(&mut add, &p("attn_norm"));
        }
        match arch.qkv {
            QkvLayout::FusedOrSeparate => {
                linear(&mut add, &p("attn_q"), e, qd);
                linear(&mut add, &p("attn_k"), e, kvd);
                linear(&mut add, &p("attn_v"), e, kvd);
            }
            QkvLayout::Fused => linear(&mut add, &p("attn_qkv"), e, qd + 2 * kvd),
        }
        match arch.qk_norm {
            QkNorm::None => {}
            QkNorm::SharedRms => {
                add(p("attn_q_norm.weight"), vec![d.head_dim], false);
                add(p("attn_k_norm.weight"), vec![d.head_dim], false);
            }
            QkNorm::PerHeadLayerIfPresent if opt => {
                add(p("attn_q_norm.weight"), vec![d.head_dim, d.n_head], true);
                add(p("attn_k_norm.weight"), vec![d.head_dim, d.n_head_kv], true);
            }
            QkNorm::PerHeadLayerIfPresent => {}
        }
        linear(&mut add, &p("attn_output"), qd, e);
        if arch.attention.sinks == Sinks::PerHead {
            add(p("attn_sinks.weight"), vec![d.n_head], false);
        }
        if arch.post_norms {
            add(p("post_attention_norm.weight"), vec![e], false);
        }
        match arch.residual {
            Residual::Sequential => norm(&mut add, &p(arch.ffn_norm)),
            Residual::Parallel(ParallelNorms::Separate) => norm(&mut add, &p("ffn_norm")),
            // The usual shape (StableLM 2 1.6B/3B) has it.
            Residual::SequentialIfFfnNorm => {
                add(p("ffn_norm.weight"), vec![e], true);
                add(p("ffn_norm.bias"), vec![e], true);
            }
            Residual::Parallel(ParallelNorms::SharedUnlessAttnNorm2) => {
                optional_norm(&mut add, &p("attn_norm_2"));
            }
            Residual::Parallel(ParallelNorms::Shared) => {}
            Residual::PostNorm => {
                norm(&mut add, &p("attn_output_norm"));
                norm(&mut add, &p("layer_output_norm"));
            }
        }
        match (mixture(arch), arch.ffn) {
            (Some(m), _) => {
                // Stacked experts and the router, with a bias each where the row says.
                let (f, n) = (d.n_ff, N_EXPERT);
                add(p("ffn_gate_inp.weight"), vec![e, n], false);
                if m.biases {
                    add(p("ffn_gate_inp.bias"), vec![n], false);
                }
                for (s, cols, rows) in [("gate", e, f), ("up", e, f), ("down", f, e)] {
                    add(
                        p(&format!("ffn_{s}_exps.weight")),
                        vec![cols, rows, n],
                        false,
                    );
                    if m.biases {
                        add(p(&format!("ffn_{s}_exps.bias")), vec![rows, n], false);
                    }
                }
                if m.shared_expert {
                    add(p("ffn_gate_inp_shexp.weight"), vec![e], false);
                    add(p("ffn_gate_shexp.weight"), vec![e, f], false);
                    add(p("ffn_up_shexp.weight"), vec![e, f], false);
                    add(p("ffn_down_shexp.weight"), vec![f, e], false);
                }
            }
            (None, FfnKind::SwiGlu | FfnKind::GeGlu | FfnKind::SwiGluOai) => {
                linear(&mut add, &p("ffn_gate"), e, d.n_ff);
                linear(&mut add, &p("ffn_up"), e, d.n_ff);
            }
            (None, FfnKind::Gelu) => linear(&mut add, &p("ffn_up"), e, d.n_ff),
            (None, FfnKind::SwiGluStacked) => linear(&mut add, &p("ffn_up"), e, 2 * d.n_ff),
        }
        if mixture(arch).is_none() {
            linear(&mut add, &p("ffn_down"), d.n_ff, e);
        }
        if arch.post_norms {
            add(p("post_ffw_norm.weight"), vec![e], false);
        }
    }
    out
}
