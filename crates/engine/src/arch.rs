//! The architecture table: one row per declared `general.architecture` name. A row says
//! how the one generic block (forward.rs) runs that family; adding a dense family is
//! adding a row here and, if its metadata is lossy, a line in config.rs; a mixture of
//! experts is a row whose `experts` names its router's rules.
//! Facts from llama.cpp b11434 (`src/llama-arch.cpp`, `src/models/*.cpp`).

/// Normalisation before attention / feed-forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// RMSNorm with weight (eps from `attention.layer_norm_rms_epsilon`).
    Rms,
    /// LayerNorm with weight and bias (eps from `attention.layer_norm_epsilon`).
    Layer,
}

/// How rotary position embedding pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama's "normal" mode.
    Interleaved,
    /// Halves (i, i + n_rot/2): GPT-NeoX mode.
    Neox,
    /// No rotary embedding (learned absolute positions instead).
    None,
}

/// The feed-forward network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnKind {
    /// down(silu(gate(x)) * up(x))
    SwiGlu,
    /// down(gelu(gate(x)) * up(x))
    GeGlu,
    /// down(gelu(up(x))), with biases where present
    Gelu,
    /// Phi-3: `ffn_up` holds gate and up stacked; down(silu(first half) * second half)
    SwiGluStacked,
    /// gpt-oss's clipped SwiGLU (ggml's `swiglu_oai`, α = 1.702, limit 7):
    /// down(g·σ(α·g) · (u + 1)) with g = min(gate(x), 7), u = clamp(up(x), −7, 7).
    SwiGluOai,
}

/// How a router's logits become the weights of the experts it picks (llama.cpp's
/// `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over every expert, then the top k by probability.
    Softmax,
    /// The top k by raw logit, then a softmax over those k alone (`SOFTMAX_WEIGHT`:
    /// gpt-oss).
    SoftmaxOfTopK,
}

/// A mixture of experts in place of the dense feed-forward network: a router picks
/// `expert_used_count` of `expert_count` experts per token (both from the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeSpec {
    pub gating: Gating,
    /// The picked experts' weights are divided by their sum (llama.cpp's `norm_w`).
    pub normalize_weights: bool,
    /// Experts are `expert_feed_forward_length` wide (else feed_forward_length /
    /// expert_used_count, as Qwen's loaders); false: feed_forward_length (Mixtral).
    pub width_key: bool,
    /// A shared expert every token runs, scaled by sigmoid(`ffn_gate_inp_shexp` · x),
    /// `expert_shared_feed_forward_length` wide (else feed_forward_length): Qwen2-MoE.
    pub shared_expert: bool,
    /// The router (`ffn_gate_inp.bias`) and every expert projection
    /// (`ffn_{gate,up,down}_exps.bias`, one row per expert) have biases: gpt-oss.
    pub biases: bool,
}

/// Whether a family's feed-forward network is a mixture of experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Experts {
    /// Always dense (an `expert_count` key is ignored, as llama.cpp's loader does).
    Never,
    /// A mixture when the file's `expert_count` is above 0 (Mixtral is `llama`).
    WhenCounted(MoeSpec),
    /// Always a mixture; `expert_count` is required.
    Always(MoeSpec),
}

/// How attention and feed-forward outputs reach the residual stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residual {
    /// x = x + attn(attn_norm(x)); x = x + ffn(ffn_norm(x))
    Sequential,
    /// x = x + attn(n_a(x)) + ffn(n_f(x)), the norms as `ParallelNorms` says.
    Parallel(ParallelNorms),
    /// Sequential in a layer with `ffn_norm`; in one without, parallel with attention's
    /// norm shared (StableLM 2 12B: llama.cpp decides per layer by the tensor).
    SequentialIfFfnNorm,
    /// Post-norm (BERT): x = attn_output_norm(x + attn(x)); x = layer_output_norm(x +
    /// ffn(x)); no norm before either.
    PostNorm,
}

/// What a model computes from its last layer's states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// `output_norm`, then logits through `output` (or the tied token embeddings).
    Logits,
    /// An encoder (BERT): the hidden states themselves, pooled into embeddings as the
    /// file's `pooling_type` says. Its input adds token-type embeddings
    /// (`token_types`, type 0) and a LayerNorm (`token_embd_norm`); attention is
    /// bidirectional unless the file's `attention.causal` says otherwise; a sequence is
    /// encoded whole, in one batch; there is no output norm and no output projection.
    Embeddings,
}

/// Which norms feed a parallel block's attention and feed-forward network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParallelNorms {
    /// `attn_norm` feeds both (Phi-2).
    Shared,
    /// `attn_norm` feeds attention, `ffn_norm` the network (GPT-NeoX).
    Separate,
    /// `attn_norm` feeds the network, and attention too unless the layer has
    /// `attn_norm_2`, which then feeds attention (Falcon 7B; Falcon 40B/180B).
    SharedUnlessAttnNorm2,
}

/// Per-head norms on Q and K after projection, before rope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// RMSNorm, one `[head_dim]` weight for every head; required (Qwen3, Gemma 3).
    SharedRms,
    /// LayerNorm without bias, a `[head_dim, n_head]` weight (one per head), where the
    /// file has `attn_q_norm`/`attn_k_norm` (StableLM 2 12B; absent in 1.6B/3B).
    PerHeadLayerIfPresent,
}

/// Which layers use the sliding window (when the file sets one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwaPattern {
    /// Every layer is global.
    None,
    /// Of each group of `n` layers, the first `n - 1` are sliding, the last global
    /// (llama.cpp `set_swa_pattern(n, dense_first = false)`), unless the file gives
    /// `attention.sliding_window_pattern`.
    LastOfGroup(u32),
}

/// How the sliding-window layers rope (when a row has them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwaRope {
    /// As the global layers (any `rope.freq_base_swa` key is ignored, as llama.cpp's
    /// loader does for these families).
    Same,
    /// As the global layers, scaling included, but with the file's
    /// `rope.freq_base_swa` as base where it has one (gpt-oss).
    SameUnlessBaseKey,
    /// Their own base (`rope.freq_base_swa`, default 10000), never scaled (Gemma 3).
    OwnBaseUnscaled,
}

/// Which positions a token attends to, unless the file's `attention.causal` says
/// otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Its own and the earlier ones (a decoder).
    Causal,
    /// Every position of its sequence, which is given whole (an encoder).
    Bidirectional,
}

/// Extra logits in each softmax's denominator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sinks {
    None,
    /// A learned logit per head (`attn_sinks`, `[n_head]`) that takes weight from the
    /// keys and gives no value (gpt-oss).
    PerHead,
}

/// How a family's attention runs, beyond the shapes its file gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSpec {
    pub mask: Mask,
    pub sinks: Sinks,
    /// Which layers slide (when the file sets a window), and how they rope.
    pub window: SwaPattern,
    pub window_rope: SwaRope,
}

const CAUSAL: AttentionSpec = AttentionSpec {
    mask: Mask::Causal,
    sinks: Sinks::None,
    window: SwaPattern::None,
    window_rope: SwaRope::Same,
};

/// Where Q, K and V come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkvLayout {
    /// Whichever the file holds, as llama.cpp's `create_tensor_qkv`: one `attn_qkv`
    /// (with an `attn_qkv.bias`, or legacy separate `attn_{q,k,v}.bias`), else
    /// `attn_q`, `attn_k`, `attn_v` (each with an optional bias).
    FusedOrSeparate,
    /// One `attn_qkv` projection, rows Q then K then V (GPT-2, Falcon, GPT-NeoX).
    Fused,
}

/// One architecture.
#[derive(Clone, Copy, Debug)]
pub struct ArchSpec {
    /// The `general.architecture` value.
    pub name: &'static str,
    /// What models it covers (for `llamay coverage`).
    pub covers: &'static str,
    pub norm: NormKind,
    pub rope: RopeStyle,
    pub qkv: QkvLayout,
    pub qk_norm: QkNorm,
    pub ffn: FfnKind,
    /// Whether the FFN is a mixture of experts (then `ffn` is each expert's kind).
    pub experts: Experts,
    pub residual: Residual,
    /// Token embeddings are multiplied by sqrt(n_embd) (Gemma).
    pub embed_scale_sqrt: bool,
    /// Extra RMS norms on the attention and feed-forward outputs (Gemma 2/3).
    pub post_norms: bool,
    pub attention: AttentionSpec,
    /// Learned absolute position embeddings (`position_embd`), GPT-2.
    pub learned_positions: bool,
    /// The norm before a sequential block's feed-forward network (`blk.N.<name>`):
    /// `ffn_norm`, or gpt-oss's `post_attention_norm`.
    pub ffn_norm: &'static str,
    /// Attention scale is 1/sqrt(key_length) (Gemma: query_pre_attn_scalar).
    pub scale_by_key_length: bool,
    pub output: Output,
}

const BASE: ArchSpec = ArchSpec {
    name: "",
    covers: "",
    norm: NormKind::Rms,
    rope: RopeStyle::Interleaved,
    qkv: QkvLayout::FusedOrSeparate,
    qk_norm: QkNorm::None,
    ffn: FfnKind::SwiGlu,
    experts: Experts::Never,
    residual: Residual::Sequential,
    embed_scale_sqrt: false,
    post_norms: false,
    attention: CAUSAL,
    learned_positions: false,
    ffn_norm: "ffn_norm",
    scale_by_key_length: false,
    output: Output::Logits,
};

/// Every architecture this build runs.
pub const ARCHITECTURES: &[ArchSpec] = &[
    ArchSpec {
        name: "llama",
        covers: "Llama 1-3, most fine-tunes; Mixtral (with expert_count)",
        experts: Experts::WhenCounted(MoeSpec {
            gating: Gating::Softmax,
            normalize_weights: true,
            width_key: false,
            shared_expert: false,
            biases: false,
        }),
        ..BASE
    },
    ArchSpec {
        name: "mistral",
        covers: "Mistral (declared as its own name)",
        ..BASE
    },
    ArchSpec {
        name: "azmx",
        covers: "AZMX One and Code",
        ..BASE
    },
    ArchSpec {
        name: "qwen2",
        covers: "Qwen 2, 2.5",
        rope: RopeStyle::Neox,
        ..BASE
    },
    ArchSpec {
        name: "qwen3",
        covers: "Qwen 3",
        rope: RopeStyle::Neox,
        qk_norm: QkNorm::SharedRms,
        ..BASE
    },
    ArchSpec {
        name: "qwen2moe",
        covers: "Qwen1.5-MoE, Qwen2-MoE",
        rope: RopeStyle::Neox,
        experts: Experts::Always(MoeSpec {
            gating: Gating::Softmax,
            normalize_weights: false,
            width_key: true,
            shared_expert: true,
            biases: false,
        }),
        ..BASE
    },
    ArchSpec {
        name: "qwen3moe",
        covers: "Qwen3-MoE",
        rope: RopeStyle::Neox,
        qk_norm: QkNorm::SharedRms,
        experts: Experts::Always(MoeSpec {
            gating: Gating::Softmax,
            normalize_weights: true,
            width_key: true,
            shared_expert: false,
            biases: false,
        }),
        ..BASE
    },
    ArchSpec {
        name: "gemma",
        covers: "Gemma 1",
        rope: RopeStyle::Neox,
        ffn: FfnKind::GeGlu,
        embed_scale_sqrt: true,
        scale_by_key_length: true,
        ..BASE
    },
    ArchSpec {
        name: "gemma2",
        covers: "Gemma 2",
        rope: RopeStyle::Neox,
        ffn: FfnKind::GeGlu,
        embed_scale_sqrt: true,
        post_norms: true,
        attention: AttentionSpec {
            window: SwaPattern::LastOfGroup(2),
            ..CAUSAL
        },
        scale_by_key_length: true,
        ..BASE
    },
    ArchSpec {
        name: "gemma3",
        covers: "Gemma 3 (text)",
        rope: RopeStyle::Neox,
        qk_norm: QkNorm::SharedRms,
        ffn: FfnKind::GeGlu,
        embed_scale_sqrt: true,
        post_norms: true,
        attention: AttentionSpec {
            window: SwaPattern::LastOfGroup(6),
            window_rope: SwaRope::OwnBaseUnscaled,
            ..CAUSAL
        },
        scale_by_key_length: true,
        ..BASE
    },
    ArchSpec {
        name: "phi3",
        covers: "Phi-3, Phi-3.5",
        rope: RopeStyle::Neox,
        ffn: FfnKind::SwiGluStacked,
        ..BASE
    },
    ArchSpec {
        name: "stablelm",
        covers: "StableLM 2 (1.6B, 3B; 12B with per-head q/k norms and a parallel block)",
        norm: NormKind::Layer,
        rope: RopeStyle::Neox,
        qk_norm: QkNorm::PerHeadLayerIfPresent,
        residual: Residual::SequentialIfFfnNorm,
        ..BASE
    },
    ArchSpec {
        name: "gpt2",
        covers: "GPT-2",
        norm: NormKind::Layer,
        rope: RopeStyle::None,
        qkv: QkvLayout::Fused,
        ffn: FfnKind::Gelu,
        learned_positions: true,
        ..BASE
    },
    ArchSpec {
        name: "falcon",
        covers: "Falcon 7B; 40B and 180B (attn_norm_2)",
        norm: NormKind::Layer,
        rope: RopeStyle::Neox,
        qkv: QkvLayout::Fused,
        ffn: FfnKind::Gelu,
        residual: Residual::Parallel(ParallelNorms::SharedUnlessAttnNorm2),
        ..BASE
    },
    ArchSpec {
        name: "gptneox",
        covers: "Pythia, GPT-NeoX",
        norm: NormKind::Layer,
        rope: RopeStyle::Neox,
        qkv: QkvLayout::Fused,
        ffn: FfnKind::Gelu,
        residual: Residual::Parallel(ParallelNorms::Separate),
        ..BASE
    },
    ArchSpec {
        name: "bert",
        covers: "BERT sentence embedders (all-MiniLM, BGE, ...): mean, CLS or last-token pooling; cross-encoder rerankers (rank pooling through the classification head)",
        norm: NormKind::Layer,
        rope: RopeStyle::None,
        ffn: FfnKind::Gelu,
        residual: Residual::PostNorm,
        attention: AttentionSpec {
            mask: Mask::Bidirectional,
            ..CAUSAL
        },
        learned_positions: true,
        output: Output::Embeddings,
        ..BASE
    },
    ArchSpec {
        name: "gpt-oss",
        covers: "gpt-oss 20B/120B (MXFP4 experts, attention sinks, alternating sliding window)",
        rope: RopeStyle::Neox,
        ffn: FfnKind::SwiGluOai,
        experts: Experts::Always(MoeSpec {
            gating: Gating::SoftmaxOfTopK,
            normalize_weights: false,
            width_key: true,
            shared_expert: false,
            biases: true,
        }),
        attention: AttentionSpec {
            sinks: Sinks::PerHead,
            window: SwaPattern::LastOfGroup(2),
            window_rope: SwaRope::SameUnlessBaseKey,
            ..CAUSAL
        },
        ffn_norm: "post_attention_norm",
        ..BASE
    },
    ArchSpec {
        name: "phi2",
        covers: "Phi-2",
        norm: NormKind::Layer,
        rope: RopeStyle::Neox,
        ffn: FfnKind::Gelu,
        residual: Residual::Parallel(ParallelNorms::Shared),
        ..BASE
    },
];

/// Families refused by name, with the reason.
pub const REFUSED: &[(&str, &str)] = &[
    (
        "azmx-ocr",
        "the seeds name only a CTC head over a script alphabet: no tensor names, shapes, alphabet or blank-index keys, and no public file to read them off; a layout invented here would match no real file (its encoder graph is out of scope as well)",
    ),
    (
        "mamba",
        "state-space models are not implemented (declined rather than approximated)",
    ),
    (
        "mamba2",
        "state-space models are not implemented (declined rather than approximated)",
    ),
    ("jamba", "hybrid state-space models are not implemented"),
    ("falcon-h1", "hybrid state-space models are not implemented"),
    ("rwkv6", "recurrent models are not implemented"),
    ("rwkv7", "recurrent models are not implemented"),
    ("clip", "vision encoders are not implemented on any backend"),
    ("mllama", "vision models are not implemented"),
    (
        "deepseek2",
        "multi-head latent attention caches one compressed latent per position, which changes what a KV page holds",
    ),
    (
        "deepseek3",
        "multi-head latent attention caches one compressed latent per position, which changes what a KV page holds",
    ),
];

pub fn find(name: &str) -> Option<&'static ArchSpec> {
    ARCHITECTURES.iter().find(|a| a.name == name)
}

pub fn names() -> Vec<&'static str> {
    ARCHITECTURES.iter().map(|a| a.name).collect()
}
