//! Config synthesis: hyper-parameters rebuilt from a file's metadata (and tensor shapes
//! where metadata is lossy). Only the loader reads metadata keys (invariant 4); this
//! module is where it does.

use crate::LoadError;
use crate::arch::{ArchSpec, Experts, Mask, MoeSpec, NormKind, Output, SwaPattern, SwaRope};
use crate::rope::{RopeParams, RopeScaling};
use llamay_gguf::{Metadata, Model as Gguf, Value};

/// Everything the forward pass needs to know about a model's shape.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: &'static ArchSpec,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Per-head dimension of Q and K.
    pub head_dim_k: usize,
    /// Per-head dimension of V.
    pub head_dim_v: usize,
    pub n_ff: usize,
    pub norm_eps: f32,
    /// Rotated dimensions per head (partial rotary when < head_dim_k).
    pub n_rot: usize,
    /// Rope of the full-attention layers.
    pub rope: RopeParams,
    /// Rope of the sliding-window layers (Gemma 3: its own base, never scaled).
    pub rope_swa: RopeParams,
    pub rope_scaling: RopeScaling,
    /// The context the model was trained at before rope scaling
    /// (`rope.scaling.original_context_length`, else `context_length`).
    pub n_ctx_orig: usize,
    /// Sliding window size in tokens (0 = none).
    pub n_swa: usize,
    /// Which layers use the sliding window.
    pub swa_layers: Vec<bool>,
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// The mixture of experts, when the FFN is one.
    pub moe: Option<MoeConfig>,
    /// Whether a token sees only the positions up to its own (`attention.causal`, else
    /// the row's `attention.mask`).
    pub causal: bool,
    /// How an encoder's token states become one embedding (`pooling_type`).
    pub pooling: Pooling,
    /// Outputs of a cross-encoder's classification head (`classifier.output_labels`).
    pub n_cls_out: usize,
}

/// How a sequence's final hidden states become one embedding (llama.cpp's
/// `llama_pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The average over the sequence's tokens.
    Mean,
    /// The first token's state ([CLS]).
    Cls,
    /// The last token's state.
    Last,
    /// A cross-encoder's relevance (rerank): the first token's state through the
    /// classification head (`Weights::classifier`), as llama.cpp's rank pooling.
    Rank,
}

impl Pooling {
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }

    /// `--pooling` / a file's name for it.
    pub fn parse(name: &str) -> Option<Pooling> {
        match name {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            "rank" => Some(Pooling::Rank),
            _ => None,
        }
    }

    /// Pools `rows` (a sequence's states, `n_embd` each, in order) into `out` (for
    /// `Rank`, the state the classification head reads).
    pub fn apply(self, rows: &[f32], n_embd: usize, out: &mut Vec<f32>) {
        out.clear();
        let n = rows.len() / n_embd.max(1);
        if n == 0 {
            out.resize(n_embd, 0.0);
            return;
        }
        match self {
            Pooling::Cls | Pooling::Rank => out.extend_from_slice(&rows[..n_embd]),
            Pooling::Last => out.extend_from_slice(&rows[(n - 1) * n_embd..n * n_embd]),
            Pooling::Mean => {
                out.resize(n_embd, 0.0);
                for row in rows.chunks_exact(n_embd) {
                    out.iter_mut().zip(row).for_each(|(o, v)| *o += v);
                }
                let inv = 1.0 / n as f32;
                out.iter_mut().for_each(|o| *o *= inv);
            }
        }
    }
}

/// `pooling_type`'s values (llama.cpp's enum), for an encoder.
fn pooling_of(key: &str, v: Option<usize>) -> Result<Pooling, LoadError> {
    match v {
        // Absent, or "none" (per-token states): mean, as an embedder is used.
        None | Some(0) | Some(1) => Ok(Pooling::Mean),
        Some(2) => Ok(Pooling::Cls),
        Some(3) => Ok(Pooling::Last),
        Some(4) => Ok(Pooling::Rank),
        Some(n) => Err(LoadError::Metadata(format!(
            "'{key}' is {n}; llama.cpp's pooling types are 0 (none) to 4 (rank)"
        ))),
    }
}

/// A mixture of experts' shape: the row's rules with the file's counts.
#[derive(Clone, Copy, Debug)]
pub struct MoeConfig {
    pub spec: MoeSpec,
    pub n_expert: usize,
    /// Experts each token uses (top-k).
    pub n_expert_used: usize,
    /// Each expert's hidden width.
    pub n_ff_exp: usize,
    /// The shared expert's hidden width (when the row has one).
    pub n_ff_shexp: usize,
}

/// llama.cpp's LLAMA_MAX_EXPERTS.
const MAX_EXPERTS: usize = 512;

impl MoeConfig {
    fn from_keys(
        arch: &ArchSpec,
        k: &Keys<'_, '_>,
        n_ff: usize,
    ) -> Result<Option<MoeConfig>, LoadError> {
        let n_expert = k.count("expert_count")?.unwrap_or(0);
        let spec = match arch.experts {
            Experts::Never => return Ok(None),
            Experts::WhenCounted(_) if n_expert == 0 => return Ok(None),
            Experts::WhenCounted(spec) | Experts::Always(spec) => spec,
        };
        if n_expert == 0 {
            return Err(LoadError::Metadata(format!(
                "'{}' is missing or 0; {} is a mixture of experts",
                k.key("expert_count"),
                arch.name
            )));
        }
        let n_expert_used = k.count("expert_used_count")?.unwrap_or(0);
        if n_expert > MAX_EXPERTS || n_expert_used == 0 || n_expert_used > n_expert {
            return Err(LoadError::Metadata(format!(
                "{n_expert} experts with {n_expert_used} used per token: a mixture has 1 to {MAX_EXPERTS} experts and uses 1 to all of them"
            )));
        }
        if k.count("expert_group_count")?.unwrap_or(0) > 1 {
            return Err(LoadError::Unsupported(format!(
                "'{}' above 1: grouped expert routing (DeepSeek's) is not implemented",
                k.key("expert_group_count")
            )));
        }
        let n_ff_exp = match k.count("expert_feed_forward_length")? {
            Some(n) if spec.width_key && n > 0 => n,
            _ if spec.width_key => n_ff / n_expert_used,
            _ => n_ff,
        };
        let n_ff_shexp = match k.count("expert_shared_feed_forward_length")? {
            Some(n) if n > 0 => n,
            _ => n_ff,
        };
        if n_ff_exp == 0 || n_ff_exp > MAX_DIM || n_ff_shexp > MAX_DIM {
            return Err(LoadError::Metadata(format!(
                "implausible expert widths {n_ff_exp}/{n_ff_shexp}"
            )));
        }
        Ok(Some(MoeConfig {
            spec,
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shexp,
        }))
    }
}

/// A count from the file as `usize`, refused by name where it does not fit (a 32-bit
/// build).
fn to_usize(key: &str, v: u64) -> Result<usize, LoadError> {
    usize::try_from(v).map_err(|_| {
        LoadError::Unsupported(format!(
            "metadata key '{key}' is {v}, beyond what this {}-bit build addresses",
            usize::BITS
        ))
    })
}

fn md_err(e: llamay_gguf::MetadataTypeError) -> LoadError {
    LoadError::Metadata(e.to_string())
}

struct Keys<'m, 'a> {
    md: &'m Metadata<'a>,
    arch: &'static str,
}

impl Keys<'_, '_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// An unsigned count; per-layer arrays must be uniform (this build runs uniform
    /// layers only).
    fn count(&self, k: &str) -> Result<Option<usize>, LoadError> {
        let key = self.key(k);
        match self.md.get(&key) {
            Some(Value::Array(a)) => {
                let vals: Vec<u64> = a.iter().filter_map(|v| v.as_u64()).collect();
                match vals.first() {
                    Some(&first) if vals.len() == a.len() && vals.iter().all(|&v| v == first) => {
                        to_usize(&key, first).map(Some)
                    }
                    _ => Err(LoadError::Unsupported(format!(
                        "metadata key '{key}' varies per layer; this build runs models whose layers are uniform"
                    ))),
                }
            }
            _ => (self.md.get_u64(&key).map_err(md_err)?)
                .map(|v| to_usize(&key, v))
                .transpose(),
        }
    }

    fn required(&self, k: &str) -> Result<usize, LoadError> {
        self.count(k)?
            .ok_or_else(|| LoadError::Metadata(format!("missing required key '{}'", self.key(k))))
    }

    /// A float that must be finite and positive when present (see [`positive`]).
    fn positive(&self, k: &str) -> Result<Option<f32>, LoadError> {
        positive(&self.key(k), self.float(k)?)
    }

    fn float(&self, k: &str) -> Result<Option<f32>, LoadError> {
        Ok(self
            .md
            .get_f64(&self.key(k))
            .map_err(md_err)?
            .map(|v| v as f32))
    }
}

/// Upper bounds that keep a hostile file from asking for absurd allocations.
const MAX_DIM: usize = 1 << 20;
const MAX_LAYERS: usize = 1 << 12;
/// Context lengths beyond this are not a real model's (llama.cpp holds them in a u32;
/// the longest real ones are around 10M).
const MAX_CTX: usize = 1 << 31;
/// Token ids are u32 everywhere (tokenizer, batch, samplers).
const MAX_VOCAB: u64 = u32::MAX as u64;

/// A float that must be finite and positive (a base, a scale, a cap): NaN or a sign
/// error there gives NaN logits, a quietly wrong model, not an error.
fn positive(key: &str, v: Option<f32>) -> Result<Option<f32>, LoadError> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => Err(LoadError::Metadata(format!(
            "'{key}' is {x}; it must be a finite positive number"
        ))),
        _ => Ok(v),
    }
}

impl Config {
    pub fn from_gguf(arch: &'static ArchSpec, gguf: &Gguf<'_>) -> Result<Config, LoadError> {
        let md = gguf.metadata();
        let k = Keys {
            md,
            arch: arch.name,
        };
        let n_embd = k.required("embedding_length")?;
        let n_layer = k.required("block_count")?;
        let n_head = k.required("attention.head_count")?;
        let n_head_kv = k.count("attention.head_count_kv")?.unwrap_or(n_head);
        let n_ff = k.required("feed_forward_length")?;
        if n_embd == 0 || n_head == 0 || n_head_kv == 0 || n_layer == 0 || n_ff == 0 {
            return Err(LoadError::Metadata("embedding length, block count, head counts and feed-forward length must be positive".into()));
        }
        if n_embd > MAX_DIM || n_ff > MAX_DIM || n_layer > MAX_LAYERS || n_head > n_embd {
            return Err(LoadError::Metadata(format!(
                "implausible shape: n_embd {n_embd}, n_ff {n_ff}, n_layer {n_layer}, n_head {n_head}"
            )));
        }
        if n_head % n_head_kv != 0 {
            return Err(LoadError::Metadata(format!(
                "head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        let head_dim_k = k.count("attention.key_length")?.unwrap_or(n_embd / n_head);
        let head_dim_v = k
            .count("attention.value_length")?
            .unwrap_or(n_embd / n_head);
        if head_dim_k == 0 || head_dim_v == 0 || head_dim_k > MAX_DIM || head_dim_v > MAX_DIM {
            return Err(LoadError::Metadata(format!(
                "implausible head dimensions {head_dim_k}/{head_dim_v}"
            )));
        }
        let n_rot = k.count("rope.dimension_count")?.unwrap_or(head_dim_k);
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(LoadError::Metadata(format!(
                "rope.dimension_count {n_rot} must be even and at most the head dimension {head_dim_k}"
            )));
        }
        let eps_key = match arch.norm {
            NormKind::Rms => "attention.layer_norm_rms_epsilon",
            NormKind::Layer => "attention.layer_norm_epsilon",
        };
        let norm_eps = k.float(eps_key)?.unwrap_or(1e-5);
        if !(norm_eps.is_finite() && norm_eps >= 0.0) {
            return Err(LoadError::Metadata(format!(
                "'{}' is {norm_eps}; it must be a finite number, zero or more",
                k.key(eps_key)
            )));
        }
        let ctx = |key: &str| -> Result<Option<usize>, LoadError> {
            match k.count(key)? {
                Some(n) if n > MAX_CTX => Err(LoadError::Metadata(format!(
                    "'{}' is {n}, beyond any real model's context (at most {MAX_CTX})",
                    k.key(key)
                ))),
                n => Ok(n),
            }
        };
        let n_ctx_train = ctx("context_length")?.unwrap_or(2048);
        if n_ctx_train == 0 {
            return Err(LoadError::Metadata(format!(
                "'{}' is 0",
                k.key("context_length")
            )));
        }
        let n_ctx_orig = ctx("rope.scaling.original_context_length")?
            .filter(|&n| n > 0)
            .unwrap_or(n_ctx_train);
        let factor = match k.float("rope.scaling.factor")? {
            Some(f) => Some(f),
            None => k.float("rope.scale_linear")?,
        };
        let kind = md.get_str(&k.key("rope.scaling.type")).map_err(md_err)?;
        let rope_scaling = RopeScaling::parse(kind, factor)
            .map_err(|e| LoadError::Metadata(format!("{}.{e}", arch.name)))?;
        let attn_factor = k.positive("rope.scaling.attn_factor")?.unwrap_or(1.0);
        let rope_base = k.positive("rope.freq_base")?.unwrap_or(10_000.0);
        let rope = RopeParams::new(
            n_rot,
            rope_base,
            rope_scaling.freq_scale(),
            rope_scaling,
            attn_factor,
            n_ctx_orig,
        );
        // llama.cpp's rope_freq_base/scale_train_swa, as each family's loader sets them.
        let rope_swa = match arch.attention.window_rope {
            SwaRope::Same => rope,
            SwaRope::SameUnlessBaseKey => match k.positive("rope.freq_base_swa")? {
                Some(base) => RopeParams::new(
                    n_rot,
                    base,
                    rope_scaling.freq_scale(),
                    rope_scaling,
                    attn_factor,
                    n_ctx_orig,
                ),
                None => rope,
            },
            SwaRope::OwnBaseUnscaled => {
                let base = k.positive("rope.freq_base_swa")?.unwrap_or(10_000.0);
                RopeParams::new(n_rot, base, 1.0, rope_scaling, attn_factor, n_ctx_orig)
            }
        };

        let n_swa = match arch.attention.window {
            SwaPattern::None => 0,
            SwaPattern::LastOfGroup(_) => k.count("attention.sliding_window")?.unwrap_or(0),
        };
        let swa_layers = match (arch.attention.window, n_swa) {
            (SwaPattern::LastOfGroup(default_n), n) if n > 0 => {
                let pattern = match md.get(&k.key("attention.sliding_window_pattern")) {
                    Some(Value::Array(a)) => {
                        let v: Vec<bool> = a.iter().filter_map(|v| v.as_bool()).collect();
                        if v.len() != n_layer {
                            return Err(LoadError::Metadata(format!(
                                "attention.sliding_window_pattern has {} entries for {n_layer} layers",
                                v.len()
                            )));
                        }
                        Some(v)
                    }
                    _ => None,
                };
                match pattern {
                    Some(v) => v,
                    None => {
                        let n = k
                            .count("attention.sliding_window_pattern")?
                            .unwrap_or(default_n as usize);
                        (0..n_layer).map(|il| n == 0 || il % n < n - 1).collect()
                    }
                }
            }
            _ => vec![false; n_layer],
        };

        // Gemma 2/3 27B scale by n_embd / n_head instead of the key length
        // (gemma_pytorch's query_pre_attn_scalar; llama.cpp keys it on the layer count).
        let is_gemma_27b = matches!(arch.name, "gemma2" | "gemma3") && matches!(n_layer, 46 | 62);
        let attn_scale = if arch.scale_by_key_length && !is_gemma_27b {
            1.0 / (head_dim_k as f32).sqrt()
        } else if is_gemma_27b {
            1.0 / ((n_embd / n_head) as f32).sqrt()
        } else {
            1.0 / (head_dim_k as f32).sqrt()
        };
        // 0 means "no cap", as in llama.cpp's converters.
        let softcap = |key: &str| -> Result<Option<f32>, LoadError> {
            positive(&k.key(key), k.float(key)?.filter(|&c| c != 0.0))
        };
        let attn_softcap = softcap("attn_logit_softcapping")?;
        let final_softcap = softcap("final_logit_softcapping")?;

        let embd = gguf
            .tensor("token_embd.weight")
            .ok_or_else(|| LoadError::MissingTensor("token_embd.weight".into()))?;
        if embd.row_len() != n_embd as u64 {
            return Err(LoadError::Shape(format!(
                "token_embd.weight rows have {} values, embedding_length is {n_embd}",
                embd.row_len()
            )));
        }
        // The vocabulary is the embedding's rows: every dimension past the first.
        let n_vocab = embd.n_elements / embd.row_len().max(1);
        if n_vocab == 0 || n_vocab > MAX_VOCAB {
            return Err(LoadError::Shape(format!(
                "token_embd.weight has shape {:?}: {n_vocab} tokens (a vocabulary has 1 to {MAX_VOCAB})",
                embd.shape
            )));
        }
        let n_vocab = n_vocab as usize;
        let moe = MoeConfig::from_keys(arch, &k, n_ff)?;
        let encoder = arch.output == Output::Embeddings;
        let causal = match md.get(&k.key("attention.causal")) {
            Some(v) => v.as_bool().ok_or_else(|| {
                LoadError::Metadata(format!("'{}' is not a bool", k.key("attention.causal")))
            })?,
            None => arch.attention.mask == Mask::Causal,
        };
        if !causal && !encoder {
            return Err(LoadError::Unsupported(format!(
                "'{}' is false: bidirectional attention in a model with logits is not implemented (encoders run)",
                k.key("attention.causal")
            )));
        }
        let pooling = pooling_of(&k.key("pooling_type"), k.count("pooling_type")?)?;
        // A classifier's outputs: one per label (llama.cpp's n_cls_out), else one.
        let n_cls_out = match md.get(&k.key("classifier.output_labels")) {
            Some(Value::Array(a)) if !a.is_empty() && a.len() <= MAX_DIM => a.len(),
            _ => 1,
        };
        Ok(Config {
            arch,
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff,
            norm_eps,
            n_rot,
            rope,
            rope_swa,
            rope_scaling,
            n_ctx_orig,
            n_swa,
            swa_layers,
            attn_scale,
            attn_softcap,
            final_softcap,
            moe,
            causal,
            pooling,
            n_cls_out,
        })
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim_k
    }

    /// One layer's attention heads, scale and soft-cap (the CPU's and a device's).
    pub fn attention_shape(&self) -> crate::device::AttentionShape {
        crate::device::AttentionShape {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim_k: self.head_dim_k,
            head_dim_v: self.head_dim_v,
            scale: self.attn_scale,
            softcap: self.attn_softcap,
        }
    }

    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_k
    }

    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }
}
