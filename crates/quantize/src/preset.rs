//! llama-quantize's presets: the file types (`llama_ftype`) it takes by name, and the
//! type each tensor gets under one — llama.cpp b11434's `src/llama-quant.cpp`
//! (`llama_tensor_get_type`, `llama_tensor_get_type_impl`, `tensor_type_fallback`,
//! `tensor_allows_quantization`), as tables and one rule per tensor category.

use llamay_formats::GgmlType;

/// A `llama_ftype` llamay writes: the plain ones and the K-quant mixtures.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ftype {
    AllF32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q2_K_S,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ2_M,
    IQ3_XXS,
    IQ3_XS,
    IQ3_S,
    IQ3_M,
}

use Ftype as F;

/// Each file type: its `llama_ftype` number and the type its tensors default to
/// (`llama_ftype_get_default_type`).
const FTYPES: &[(Ftype, u32, GgmlType)] = &[
    (F::AllF32, 0, GgmlType::F32),
    (F::F16, 1, GgmlType::F16),
    (F::Q4_0, 2, GgmlType::Q4_0),
    (F::Q4_1, 3, GgmlType::Q4_1),
    (F::Q8_0, 7, GgmlType::Q8_0),
    (F::Q5_0, 8, GgmlType::Q5_0),
    (F::Q5_1, 9, GgmlType::Q5_1),
    (F::Q2_K, 10, GgmlType::Q2_K),
    (F::Q3_K_S, 11, GgmlType::Q3_K),
    (F::Q3_K_M, 12, GgmlType::Q3_K),
    (F::Q3_K_L, 13, GgmlType::Q3_K),
    (F::Q4_K_S, 14, GgmlType::Q4_K),
    (F::Q4_K_M, 15, GgmlType::Q4_K),
    (F::Q5_K_S, 16, GgmlType::Q5_K),
    (F::Q5_K_M, 17, GgmlType::Q5_K),
    (F::Q6_K, 18, GgmlType::Q6_K),
    (F::Q2_K_S, 21, GgmlType::Q2_K),
    (F::IQ4_NL, 25, GgmlType::IQ4_NL),
    (F::IQ4_XS, 30, GgmlType::IQ4_XS),
    (F::IQ2_XXS, 19, GgmlType::IQ2_XXS),
    (F::IQ2_XS, 20, GgmlType::IQ2_XS),
    (F::IQ3_XS, 22, GgmlType::IQ3_S),
    (F::IQ3_XXS, 23, GgmlType::IQ3_XXS),
    (F::IQ3_S, 26, GgmlType::IQ3_S),
    (F::IQ3_M, 27, GgmlType::IQ3_S),
    // IQ2_S's tensors default to IQ2_XS, IQ2_M's to IQ2_S (llama.cpp's table).
    (F::IQ2_S, 28, GgmlType::IQ2_XS),
    (F::IQ2_M, 29, GgmlType::IQ2_S),
    (F::BF16, 32, GgmlType::BF16),
];

/// llama-quantize's names (its `QUANT_OPTIONS`, aliases included) for what llamay
/// writes; `COPY` is F32's number with nothing converted.
pub const NAMES: &[(&str, Ftype)] = &[
    ("Q4_0", F::Q4_0),
    ("Q4_1", F::Q4_1),
    ("Q5_0", F::Q5_0),
    ("Q5_1", F::Q5_1),
    ("Q2_K", F::Q2_K),
    ("Q2_K_S", F::Q2_K_S),
    ("Q3_K", F::Q3_K_M),
    ("Q3_K_S", F::Q3_K_S),
    ("Q3_K_M", F::Q3_K_M),
    ("Q3_K_L", F::Q3_K_L),
    ("Q4_K", F::Q4_K_M),
    ("Q4_K_S", F::Q4_K_S),
    ("Q4_K_M", F::Q4_K_M),
    ("Q5_K", F::Q5_K_M),
    ("Q5_K_S", F::Q5_K_S),
    ("Q5_K_M", F::Q5_K_M),
    ("Q6_K", F::Q6_K),
    ("IQ2_XXS", F::IQ2_XXS),
    ("IQ2_XS", F::IQ2_XS),
    ("IQ2_S", F::IQ2_S),
    ("IQ2_M", F::IQ2_M),
    ("IQ3_XXS", F::IQ3_XXS),
    ("IQ3_S", F::IQ3_S),
    ("IQ3_M", F::IQ3_M),
    ("IQ3_XS", F::IQ3_XS),
    ("IQ4_NL", F::IQ4_NL),
    ("IQ4_XS", F::IQ4_XS),
    ("Q8_0", F::Q8_0),
    ("F16", F::F16),
    ("BF16", F::BF16),
    ("F32", F::AllF32),
    ("COPY", F::AllF32),
];

/// llama-quantize's names for what llamay does not write (the 1-bit i-quants, ternary,
/// MXFP4, the 1- and 2-bit block types): their quantisers are not proven byte-identical
/// to llama.cpp's.
const NOT_WRITTEN: &[&str] = &[
    "Q1_0",
    "Q2_0",
    "MXFP4_MOE",
    "IQ1_S",
    "IQ1_M",
    "TQ1_0",
    "TQ2_0",
    "NVFP4",
];

impl Ftype {
    fn row(self) -> &'static (Ftype, u32, GgmlType) {
        FTYPES
            .iter()
            .find(|r| r.0 == self)
            .expect("every Ftype has a row")
    }

    /// The `general.file_type` value (`llama_ftype`).
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// The type a tensor gets before the preset's rules.
    pub fn default_type(self) -> GgmlType {
        self.row().2
    }

    /// Parses a name as llama-quantize does (`try_parse_ftype`: a name, any case, or
    /// the number). Returns the file type and whether it is `COPY`.
    /// llama-quantize's name for it.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, f)| *f == self)
            .map_or("?", |(n, _)| n)
    }

    pub fn parse(s: &str) -> Result<(Ftype, bool), String> {
        let upper = s.to_ascii_uppercase();
        if let Some((name, f)) = NAMES.iter().find(|(n, _)| *n == upper) {
            return Ok((*f, *name == "COPY"));
        }
        if let Ok(n) = s.parse::<u32>()
            && let Some((f, _, _)) = FTYPES.iter().find(|r| r.1 == n)
        {
            return Ok((*f, false));
        }
        let names = NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" ");
        if NOT_WRITTEN.contains(&upper.as_str()) {
            return Err(format!(
                "{upper}: llamay does not write the 1-bit i-quants, ternary, MXFP4 or 1-/2-bit block types (its quantisers are only those proven byte-identical to llama.cpp's); it writes: {names}"
            ));
        }
        Err(format!(
            "unknown quantisation type '{s}'; llamay writes: {names}"
        ))
    }
}

/// `ggml_is_quantized`: every type but the plain float and integer ones.
pub fn is_quantized(t: GgmlType) -> bool {
    use GgmlType as T;
    !matches!(
        t,
        T::F32 | T::F16 | T::BF16 | T::I8 | T::I16 | T::I32 | T::I64 | T::F64
    )
}

/// The model's shape facts the rules read (`llama_hparams`, `llm_type`, `llm_arch`).
#[derive(Clone, Debug, Default)]
pub struct ModelFacts {
    pub arch: String,
    /// `{arch}.block_count` (llama.cpp's `n_layer_all`).
    pub n_layer: u32,
    /// `{arch}.expert_count` (0 for a dense model).
    pub n_expert: u32,
    /// Query heads per key/value head in layer 0 (0 when it has no key/value heads).
    pub n_gqa: u32,
    /// llama.cpp names the model `LLM_TYPE_70B` (see `SEVENTY_B`).
    pub is_70b: bool,
    /// The architecture gets llama.cpp's Falcon rules (see `FALCON_RULES`).
    pub falcon_rules: bool,
}

/// The architectures whose loader calls a depth `LLM_TYPE_70B` (llama.cpp's
/// `src/models/*.cpp`): (architecture, block count, whether Llama's exceptions apply —
/// 80 blocks are 65B when every head has its own key/value head, and an 8-expert model
/// is typed by its experts instead).
const SEVENTY_B: &[(&str, u32, bool)] = &[
    ("llama", 80, true),
    ("qwen2", 80, false),
    ("deci", 80, false),
    ("olmo", 80, false),
    ("jais2", 68, false),
];

/// The architectures llama-quant.cpp compares with `LLM_ARCH_FALCON`: the output always
/// Q8_0, its own ffn_down and attn_output rules.
const FALCON_RULES: &[&str] = &["falcon"];

impl ModelFacts {
    /// The facts, with what llama.cpp derives from them by architecture.
    pub fn new(arch: &str, n_layer: u32, n_expert: u32, n_gqa: u32) -> Self {
        let is_70b = SEVENTY_B.iter().any(|&(a, blocks, llama_exceptions)| {
            a == arch && blocks == n_layer && !(llama_exceptions && (n_expert == 8 || n_gqa == 1))
        });
        ModelFacts {
            arch: arch.to_string(),
            n_layer,
            n_expert,
            n_gqa,
            is_70b,
            falcon_rules: FALCON_RULES.contains(&arch),
        }
    }
}

/// Broad tensor roles (`tensor_get_category`): the first that matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

/// (name fragment, category) in llama.cpp's order of tests.
const CATEGORY_BY_FRAGMENT: &[(&str, Category)] = &[
    ("attn_qkv.weight", Category::AttnQkv),
    ("attn_kv_b.weight", Category::AttnKvB),
    ("attn_v.weight", Category::AttnV),
    ("attn_k.weight", Category::AttnK),
    ("attn_q.weight", Category::AttnQ),
    ("attn_output.weight", Category::AttnOutput),
    ("ffn_up", Category::FfnUp),
    ("ffn_gate", Category::FfnGate),
    ("ffn_down", Category::FfnDown),
];

/// llama.cpp's `tensor_name_match_token_embd`.
pub(crate) fn is_token_embedding(name: &str) -> bool {
    category(name) == Category::TokenEmbd
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        return Category::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Category::TokenEmbd;
    }
    CATEGORY_BY_FRAGMENT
        .iter()
        .find(|(f, _)| name.contains(f))
        .map_or(Category::Other, |(_, c)| *c)
}

impl Category {
    /// The attention-value-like roles (more sensitive to quantisation).
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttnV | Category::AttnQkv | Category::AttnKvB
        )
    }
}

/// Name fragments llama.cpp never quantises (norms, routers, special projections,
/// recurrent state parameters, multimodal position tables), from
/// `tensor_allows_quantization`.
const NEVER_QUANTISED: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// More fragments, for one architecture only.
const NEVER_QUANTISED_IN: &[(&str, &[&str])] = &[(
    "glm5-next",
    &[
        "hc_",
        "indexer.attn_q_b",
        "indexer.attn_k",
        "indexer.proj",
        "indexer_compressor_gate",
        "indexer_compressor_ape",
        "ssm_f_a.weight",
        "ssm_f_b.weight",
        "ssm_g_a.weight",
        "ssm_g_b.weight",
        "ssm_beta.weight",
        "attn_kv_a_mqa.weight",
        "attn_k_b.weight",
        "attn_v_b.weight",
    ],
)];

/// Whole names never quantised (BERT's position and token-type tables).
const NEVER_QUANTISED_NAMES: &[&str] = &["position_embd.weight", "token_types.weight"];

/// ggml's `ggml_n_dims`: trailing dimensions of 1 do not count.
pub(crate) fn n_dims(shape: &[u64]) -> usize {
    shape.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1)
}

/// Whether llama-quantize would quantise this tensor at all (`COPY` quantises none).
pub fn allows_quantization(arch: &str, name: &str, shape: &[u64], leave_output: bool) -> bool {
    // llama.cpp tests `name.rfind("weight") == name.size() - 6`: for a five-byte name
    // both sides are npos, so such a name counts as a weight.
    let weight = name.ends_with("weight") || name.len() == 5;
    let arch_specific = NEVER_QUANTISED_IN
        .iter()
        .filter(|(a, _)| *a == arch)
        .flat_map(|(_, f)| f.iter());
    n_dims(shape) >= 2
        && weight
        && !(leave_output && name == "output.weight")
        && !NEVER_QUANTISED
            .iter()
            .chain(arch_specific)
            .any(|f| name.contains(f))
        && !NEVER_QUANTISED_NAMES.contains(&name)
}

/// llama.cpp's fallback when the row length is not a multiple of the type's block
/// (`tensor_type_fallback`), for the types llamay writes; F16 when the fallback does
/// not fit either.
fn fallback(ty: GgmlType, ne0: u64) -> GgmlType {
    if ne0.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let to = match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        other => other,
    };
    if ne0.is_multiple_of(to.block_size()) {
        to
    } else {
        GgmlType::F16
    }
}

/// llama.cpp's `tensor_requires_imatrix`: the 1-, 2- and IQ3_XXS-bit i-quants, and a Q2_K matrix of
/// a Q2_K_S file, the embedding and the output excepted.
pub(crate) fn requires_imatrix(name: &str, to: GgmlType, ftype: Ftype) -> bool {
    use GgmlType as T;
    let needs = match to {
        T::IQ3_XXS | T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ1_M | T::IQ1_S => true,
        T::Q2_K => ftype == Ftype::Q2_K_S,
        _ => false,
    };
    needs && !matches!(category(name), Category::Output | Category::TokenEmbd)
}

/// What the user asked for beside the file type (llama-quantize's flags).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--pure`: every quantisable tensor gets the default type.
    pub pure: bool,
    /// `--leave-output-tensor`.
    pub leave_output: bool,
    /// `--output-tensor-type`.
    pub output: Option<GgmlType>,
    /// `--token-embedding-type`.
    pub token_embedding: Option<GgmlType>,
    /// `--tensor-type PATTERN=TYPE`, first match wins (a regex searched in the name,
    /// the pattern lower-cased as llama-quantize does).
    pub tensor_types: Vec<(regex::Regex, GgmlType)>,
}

impl Overrides {
    /// `--tensor-type PATTERN=TYPE`, the pattern lower-cased as llama-quantize does.
    pub fn add_tensor_type(&mut self, s: &str) -> Result<(), String> {
        let (pattern, ty) = s
            .split_once('=')
            .filter(|(p, t)| !p.is_empty() && !t.is_empty())
            .ok_or_else(|| format!("--tensor-type '{s}': expected PATTERN=TYPE"))?;
        let re = regex::Regex::new(&pattern.to_ascii_lowercase()).map_err(|e| {
            format!("--tensor-type '{s}': the pattern is not a regex this build reads: {e}")
        })?;
        self.tensor_types
            .push((re, parse_type("--tensor-type", ty)?));
        Ok(())
    }
}

/// A type named by a flag (llama-quantize's `parse_ggml_type`: a type name in any case),
/// one that llamay writes.
pub fn parse_type(flag: &str, s: &str) -> Result<GgmlType, String> {
    match GgmlType::from_name(&s.to_ascii_uppercase()) {
        Some(t) if t.is_writable() => Ok(t),
        Some(t) => Err(format!("{flag} {s}: llamay does not write {t}")),
        None => Err(format!("{flag}: unknown type '{s}'")),
    }
}

/// The state llama.cpp keeps while it walks the tensors in its order
/// (`quantize_state_impl`): counters of the roles seen so far.
pub struct Planner<'a> {
    ftype: Ftype,
    copy: bool,
    facts: &'a ModelFacts,
    overrides: &'a Overrides,
    has_imatrix: bool,
    tied_embeddings: bool,
    n_attention_wv: u32,
    n_ffn_down: u32,
    i_attention_wv: u32,
    i_ffn_down: u32,
    i_ffn_gate: u32,
    i_ffn_up: u32,
}

impl<'a> Planner<'a> {
    /// `names` are every tensor's, in the order they will be planned (llama.cpp counts
    /// the attention-value tensors and looks for `output.weight` first).
    pub fn new<'n>(
        ftype: Ftype,
        copy: bool,
        facts: &'a ModelFacts,
        overrides: &'a Overrides,
        names: impl Iterator<Item = &'n str>,
    ) -> Self {
        let (mut n_attention_wv, mut n_ffn_down) = (0, 0);
        let mut tied_embeddings = true;
        for name in names {
            let c = category(name);
            n_attention_wv += u32::from(c.is_attn_v());
            n_ffn_down += u32::from(c == Category::FfnDown);
            tied_embeddings &= c != Category::Output;
        }
        Planner {
            ftype,
            copy,
            facts,
            overrides,
            has_imatrix: false,
            tied_embeddings,
            n_attention_wv,
            n_ffn_down,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
        }
    }

    /// Plans under an importance matrix (some ffn_down and attn_v rules depend on it).
    pub fn with_imatrix(mut self, has: bool) -> Self {
        self.has_imatrix = has;
        self
    }

    /// The type of the next tensor (call in llama.cpp's tensor order: the counters
    /// advance as its do). `Err` names a tensor whose layer cannot be read where the
    /// rules need it.
    pub fn plan(&mut self, name: &str, shape: &[u64], from: GgmlType) -> Result<GgmlType, String> {
        let arch = self.facts.arch.as_str();
        if self.copy || !allows_quantization(arch, name, shape, self.overrides.leave_output) {
            return Ok(from);
        }
        let cat = category(name);
        if let Some(t) = self.overrides.token_embedding
            && cat == Category::TokenEmbd
        {
            // per_layer_token_embd follows --token-embedding-type unless a --tensor-type
            // names it.
            let named = name == "per_layer_token_embd.weight"
                && self
                    .overrides
                    .tensor_types
                    .iter()
                    .any(|(re, _)| re.is_match(name));
            if !named {
                return Ok(t);
            }
        }
        if let Some(t) = self.overrides.output
            && cat == Category::Output
        {
            return Ok(t);
        }
        let default = self.ftype.default_type();
        if !is_quantized(default) {
            return Ok(default);
        }
        let manual = self
            .overrides
            .tensor_types
            .iter()
            .find(|(re, _)| re.is_match(name));
        let ty = match manual {
            Some((_, t)) => *t,
            None if self.overrides.pure => default,
            None => self.mixture(default, name, shape, cat)?,
        };
        Ok(fallback(ty, shape.first().copied().unwrap_or(1)))
    }

    /// `llama_tensor_get_type_impl` for the file types llamay writes.
    fn mixture(
        &mut self,
        default: GgmlType,
        name: &str,
        shape: &[u64],
        cat: Category,
    ) -> Result<GgmlType, String> {
        use GgmlType as T;
        let f = self.ftype;
        let facts = self.facts;
        let falcon = facts.falcon_rules;
        let mut ty = default;
        if cat == Category::Output || (self.tied_embeddings && cat == Category::TokenEmbd) {
            if let Some(t) = self.overrides.output {
                return Ok(t);
            }
            let nx = shape.first().copied().unwrap_or(1);
            if falcon || nx % default.block_size() != 0 {
                ty = T::Q8_0;
            } else if matches!(f, F::IQ2_XXS | F::IQ2_XS | F::IQ3_XXS | F::IQ2_S | F::IQ2_M) {
                ty = T::Q5_K;
            } else if ty != T::Q8_0 {
                ty = T::Q6_K;
            }
            return Ok(ty);
        }
        if cat == Category::TokenEmbd {
            return Ok(match f {
                F::IQ2_XXS | F::IQ2_XS => T::Q2_K,
                F::IQ2_S | F::IQ2_M | F::IQ3_XXS => T::IQ3_S,
                _ => ty,
            });
        }
        if matches!(f, F::IQ2_XXS | F::IQ2_XS | F::IQ2_S | F::IQ2_M) {
            return Ok(self.two_bit(f, cat, ty));
        }
        if cat.is_attn_v() {
            let gqa4 = facts.n_gqa >= 4;
            ty = match f {
                F::Q2_K if gqa4 => T::Q4_K,
                F::Q2_K => T::Q3_K,
                F::Q2_K_S if gqa4 => T::Q4_K,
                F::IQ3_XXS if gqa4 => T::Q4_K,
                F::IQ3_XXS if !self.has_imatrix => T::IQ3_S,
                F::IQ3_XXS => T::IQ3_XXS,
                F::IQ3_XS | F::IQ3_S if gqa4 => T::Q4_K,
                F::IQ3_M => T::Q4_K,
                F::Q3_K_M if self.i_attention_wv < 2 => T::Q5_K,
                F::Q3_K_M => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                F::Q4_K_M | F::Q5_K_M
                    if use_more_bits(self.i_attention_wv, self.n_attention_wv) =>
                {
                    T::Q6_K
                }
                F::IQ4_NL | F::IQ4_XS if gqa4 => T::Q5_K,
                F::Q4_K_S if self.i_attention_wv < 4 => T::Q5_K,
                _ => ty,
            };
            if facts.is_70b && matches!(ty, T::Q3_K | T::Q4_K) {
                ty = T::Q5_K;
            }
            if facts.n_expert == 8 {
                ty = T::Q8_0;
            }
            self.i_attention_wv += 1;
            return Ok(ty);
        }
        match cat {
            Category::AttnK if facts.n_expert == 8 => ty = T::Q8_0,
            Category::AttnK | Category::AttnQ => {
                ty = match f {
                    F::IQ3_XS => T::IQ3_XXS,
                    F::IQ3_XXS => T::IQ2_S,
                    _ => ty,
                }
            }
            Category::FfnDown => {
                let (i, n) = self.layer(self.i_ffn_down, name)?;
                ty = match f {
                    F::Q2_K => T::Q3_K,
                    F::Q2_K_S if i < n / 8 => T::Q4_K,
                    F::Q2_K_S => ty,
                    F::IQ3_XXS if !self.has_imatrix && i < n / 8 => T::Q4_K,
                    F::IQ3_XXS if !self.has_imatrix => T::Q3_K,
                    F::Q3_K_M if i < n / 16 => T::Q5_K,
                    F::Q3_K_M if !falcon || use_more_bits(i, n) => T::Q4_K,
                    F::Q3_K_M => T::Q3_K,
                    F::IQ3_M if i < n / 8 || (facts.n_expert == 8 && use_more_bits(i, n)) => {
                        T::Q4_K
                    }
                    F::Q3_K_L if falcon => T::Q4_K,
                    F::Q3_K_L => T::Q5_K,
                    F::Q4_K_M if falcon && i < n / 16 => T::Q6_K,
                    F::Q4_K_M if falcon && use_more_bits(i, n) => T::Q5_K,
                    F::Q4_K_M if falcon => T::Q4_K,
                    F::Q4_K_M if use_more_bits(i, n) => T::Q6_K,
                    F::IQ4_NL | F::IQ4_XS if i < n / 8 && !self.has_imatrix => T::Q5_K,
                    F::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                    F::Q4_K_S if !falcon && i < n / 8 => T::Q5_K,
                    F::Q4_0 if self.has_imatrix && i < n / 8 => T::Q4_1,
                    F::Q5_0 if self.has_imatrix && i < n / 8 => T::Q5_1,
                    _ => ty,
                };
                self.i_ffn_down += 1;
            }
            Category::AttnOutput if !falcon => {
                if facts.n_expert == 8 {
                    if matches!(
                        f,
                        F::Q2_K
                            | F::Q3_K_S
                            | F::Q3_K_M
                            | F::Q4_K_S
                            | F::Q4_K_M
                            | F::IQ4_NL
                            | F::IQ4_XS
                            | F::IQ3_XS
                            | F::IQ3_XXS
                            | F::IQ3_S
                            | F::IQ3_M
                    ) {
                        ty = T::Q5_K;
                    }
                } else {
                    ty = match f {
                        F::Q2_K => T::Q3_K,
                        F::IQ3_XXS => T::IQ3_S,
                        F::Q3_K_M | F::IQ3_M => T::Q4_K,
                        F::Q3_K_L => T::Q5_K,
                        _ => ty,
                    };
                }
            }
            Category::AttnOutput if f == F::Q3_K_L => ty = T::Q4_K,
            Category::AttnQkv => {
                ty = match f {
                    F::Q3_K_M | F::Q3_K_L | F::IQ3_M => T::Q4_K,
                    F::Q4_K_M => T::Q5_K,
                    F::Q5_K_M => T::Q6_K,
                    _ => ty,
                };
            }
            Category::FfnGate | Category::FfnUp => {
                let counter = match cat {
                    Category::FfnGate => &mut self.i_ffn_gate,
                    _ => &mut self.i_ffn_up,
                };
                let at = *counter;
                *counter += 1;
                let (i, n) = self.layer(at, name)?;
                if f == F::IQ3_XS && i >= n / 8 && i < 7 * n / 8 {
                    ty = T::IQ3_XXS;
                }
            }
            _ => {}
        }
        Ok(ty)
    }

    /// The 2-bit i-quant presets' own branch of llama.cpp's rules (IQ2_XXS, IQ2_XS,
    /// IQ2_S, IQ2_M): attn_v, 8-expert attn_k, the first eighth of ffn_down (by its
    /// counter) and attn_output; everything else keeps the default.
    fn two_bit(&mut self, f: Ftype, cat: Category, default: GgmlType) -> GgmlType {
        use GgmlType as T;
        let facts = self.facts;
        let s_or_m = matches!(f, F::IQ2_S | F::IQ2_M);
        let low = if s_or_m { T::IQ3_S } else { T::Q2_K };
        if cat.is_attn_v() {
            self.i_attention_wv += 1;
            return if facts.n_gqa >= 4 || facts.n_expert >= 4 {
                T::Q4_K
            } else {
                low
            };
        }
        match cat {
            Category::AttnK if facts.n_expert == 8 => T::Q4_K,
            Category::FfnDown => {
                let first_eighth = self.i_ffn_down < self.n_ffn_down / 8;
                self.i_ffn_down += 1;
                if first_eighth { low } else { default }
            }
            Category::AttnOutput if facts.n_expert == 8 => T::Q5_K,
            Category::AttnOutput if s_or_m => T::IQ3_S,
            _ => default,
        }
    }

    /// (layer, layers) for a per-layer rule: the role's counter, or for a mixture of
    /// experts the `blk.N.` in the name (llama.cpp: experts are not stored in layer
    /// order).
    fn layer(&self, counter: u32, name: &str) -> Result<(u32, u32), String> {
        let n = self.facts.n_layer;
        if self.facts.n_expert <= 1 {
            return Ok((counter, n));
        }
        let i = layer_of(name)
            .ok_or_else(|| format!("failed to determine the layer of tensor '{name}'"))?;
        if i < 0 || i >= i64::from(n) {
            return Err(format!(
                "bad layer {i} for tensor '{name}': must be in [0, {n})"
            ));
        }
        Ok((i as u32, n))
    }
}

/// llama.cpp's "more bits here" layers: the first and last eighth and every third
/// between.
fn use_more_bits(i: u32, n: u32) -> bool {
    let (i, n) = (i64::from(i), i64::from(n));
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// `sscanf(name, "blk.%d.", &i)`: the layer number of a `blk.N.` name, as `%d` reads
/// it (optional sign, digits).
pub fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (sign, digits) = match rest.as_bytes().first() {
        Some(b'-') => (-1, &rest[1..]),
        Some(b'+') => (1, &rest[1..]),
        _ => (1, rest),
    };
    let end = digits.bytes().take_while(u8::is_ascii_digit).count();
    if end == 0 {
        return None;
    }
    digits[..end].parse::<i64>().ok().map(|v| sign * v)
}

/// `--prune-layers` (llama.cpp's `remap_layer`): a tensor of a pruned block is left out;
/// a later block takes the next free number, in the order tensors are met.
pub struct Pruning {
    pruned: Vec<u32>,
    /// Block → its new number, `None` when pruned.
    mapped: std::collections::BTreeMap<u64, Option<u64>>,
    next: u64,
}

impl Pruning {
    pub fn new(pruned: &[u32]) -> Self {
        let mut pruned = pruned.to_vec();
        pruned.sort_unstable();
        pruned.dedup();
        Pruning {
            pruned,
            mapped: Default::default(),
            next: 0,
        }
    }

    /// The tensor's name in the output, or `None` when its block is pruned.
    pub fn rename(&mut self, name: &str) -> Option<String> {
        let Some(&first) = self.pruned.first() else {
            return Some(name.to_string());
        };
        // The first `blk.<digits>.` anywhere in the name, as llama.cpp's regex finds it.
        let Some((at, digits)) = name.match_indices("blk.").find_map(|(at, _)| {
            let rest = &name[at + 4..];
            let n = rest.bytes().take_while(u8::is_ascii_digit).count();
            (n > 0 && rest[n..].starts_with('.')).then(|| (at + 4, &rest[..n]))
        }) else {
            return Some(name.to_string());
        };
        let blk: u64 = digits.parse().ok()?;
        let new = *self.mapped.entry(blk).or_insert_with(|| {
            if self.pruned.iter().any(|&p| u64::from(p) == blk) {
                None
            } else if blk < u64::from(first) {
                self.next = blk + 1;
                Some(blk)
            } else {
                self.next += 1;
                Some(self.next - 1)
            }
        });
        new.map(|n| format!("{}{n}{}", &name[..at], &name[at + digits.len()..]))
    }

    /// The output's block count, when blocks were pruned.
    pub fn block_count(&self) -> Option<u32> {
        (!self.pruned.is_empty()).then_some(self.next as u32)
    }
}

/// llama.cpp's tensor order (`weight_name_comparer`): by the `blk.N.` layer (-1 for
/// none), then by name, bytewise.
pub fn tensor_order(a: &str, b: &str) -> std::cmp::Ordering {
    let layer =
        |n: &str| layer_of(n).map_or(-1, |l| l.clamp(i64::from(i32::MIN), i64::from(i32::MAX)));
    layer(a)
        .cmp(&layer(b))
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(n_layer: u32, n_gqa: u32) -> ModelFacts {
        ModelFacts::new("llama", n_layer, 0, n_gqa)
    }

    fn plan_all(ftype: Ftype, facts: &ModelFacts, names: &[(&str, &[u64])]) -> Vec<GgmlType> {
        let o = Overrides::default();
        let mut p = Planner::new(ftype, false, facts, &o, names.iter().map(|(n, _)| *n));
        names
            .iter()
            .map(|(n, s)| p.plan(n, s, GgmlType::F32).unwrap())
            .collect()
    }

    #[test]
    fn names_parse_as_llama_quantize_reads_them() {
        assert_eq!(Ftype::parse("q4_k").unwrap(), (F::Q4_K_M, false));
        assert_eq!(Ftype::parse("Q5_K").unwrap(), (F::Q5_K_M, false));
        assert_eq!(Ftype::parse("15").unwrap(), (F::Q4_K_M, false));
        assert_eq!(Ftype::parse("COPY").unwrap(), (F::AllF32, true));
        assert_eq!(F::Q4_K_M.id(), 15);
        assert_eq!(F::Q2_K_S.id(), 21);
        assert!(
            Ftype::parse("TQ1_0")
                .unwrap_err()
                .contains("does not write the 1-bit i-quants")
        );
        assert!(Ftype::parse("Q8_K").unwrap_err().contains("unknown"));
    }

    #[test]
    fn q4_k_m_bumps_attn_v_and_ffn_down_on_the_more_bits_layers() {
        // 8 layers: use_more_bits is true for layers 0, 3, 6, 7.
        let names: Vec<String> = (0..8)
            .flat_map(|i| {
                [
                    format!("blk.{i}.attn_v.weight"),
                    format!("blk.{i}.ffn_down.weight"),
                ]
            })
            .collect();
        let list: Vec<(&str, &[u64])> = names
            .iter()
            .map(|n| (n.as_str(), &[256u64, 256][..]))
            .collect();
        let got = plan_all(F::Q4_K_M, &facts(8, 1), &list);
        let more = [0, 3, 6, 7];
        for (i, pair) in got.chunks(2).enumerate() {
            let want = if more.contains(&i) {
                GgmlType::Q6_K
            } else {
                GgmlType::Q4_K
            };
            assert_eq!(pair, [want, want], "layer {i}");
        }
    }

    #[test]
    fn output_and_tied_embeddings_get_q6_k_or_q8_0() {
        let list: &[(&str, &[u64])] = &[
            ("token_embd.weight", &[256, 64]),
            ("blk.0.attn_q.weight", &[256, 256]),
        ];
        assert_eq!(
            plan_all(F::Q4_0, &facts(1, 1), list),
            [GgmlType::Q6_K, GgmlType::Q4_0]
        );
        assert_eq!(plan_all(F::Q8_0, &facts(1, 1), list)[0], GgmlType::Q8_0);
        // Untied: the embedding keeps the default, the output gets Q6_K.
        let list: &[(&str, &[u64])] = &[
            ("output.weight", &[256, 64]),
            ("token_embd.weight", &[256, 64]),
        ];
        assert_eq!(
            plan_all(F::Q4_0, &facts(1, 1), list),
            [GgmlType::Q6_K, GgmlType::Q4_0]
        );
        // A row the default's block does not divide: Q8_0, then the fallback.
        let list: &[(&str, &[u64])] = &[("output.weight", &[96, 64])];
        assert_eq!(plan_all(F::Q4_K_M, &facts(1, 1), list), [GgmlType::Q8_0]);
    }

    #[test]
    fn order_is_by_layer_then_bytes() {
        let mut v = vec![
            "output.weight",
            "blk.10.a",
            "blk.2.b",
            "blk.2.a",
            "token_embd.weight",
            "blk.x",
        ];
        v.sort_by(|a, b| tensor_order(a, b));
        assert_eq!(
            v,
            [
                "blk.x",
                "output.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
        assert_eq!(layer_of("blk.-3.x"), Some(-3));
        assert_eq!(layer_of("blk.7"), Some(7));
    }

    #[test]
    fn allows_quantization_follows_llama_quantize() {
        let q = |n: &str, s: &[u64]| allows_quantization("llama", n, s, false);
        assert!(q("blk.0.attn_q.weight", &[256, 256]));
        assert!(!q("blk.0.attn_norm.weight", &[256, 256]));
        assert!(!q("blk.0.attn_q.bias", &[256, 2]));
        assert!(!q("blk.0.ffn_gate_inp.weight", &[256, 8]));
        assert!(!q("position_embd.weight", &[256, 64]));
        assert!(!q("x.weight", &[256, 1]));
        assert!(q("abcde", &[256, 4]));
        assert!(!allows_quantization(
            "llama",
            "output.weight",
            &[256, 64],
            true
        ));
    }

    #[test]
    fn fallbacks_follow_llama_quantize() {
        assert_eq!(fallback(GgmlType::Q4_K, 640), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q5_K, 640), GgmlType::Q5_1);
        assert_eq!(fallback(GgmlType::Q6_K, 640), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q2_K, 640), GgmlType::Q4_0);
        assert_eq!(fallback(GgmlType::Q4_K, 100), GgmlType::F16);
        assert_eq!(fallback(GgmlType::Q8_0, 100), GgmlType::F16);
    }
}
