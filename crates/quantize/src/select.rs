//! Which tensors get the target type: llama.cpp b11434's rules as tables.

use llamay_formats::GgmlType;

/// What `llamay quantize` writes. Presets (Q4_K_M, ...) arrive with the mixture issue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub ty: GgmlType,
}

/// Plain targets and the `general.file_type` (llama_ftype) llama-quantize records for
/// each: the K-quant names are llama-quantize's aliases of the _M presets.
const PLAIN: &[(GgmlType, u32)] = &[
    (GgmlType::F32, 0),
    (GgmlType::F16, 1),
    (GgmlType::BF16, 32),
    (GgmlType::Q4_0, 2),
    (GgmlType::Q4_1, 3),
    (GgmlType::Q5_0, 8),
    (GgmlType::Q5_1, 9),
    (GgmlType::Q8_0, 7),
    (GgmlType::Q2_K, 10),
    (GgmlType::Q3_K, 12),
    (GgmlType::Q4_K, 15),
    (GgmlType::Q5_K, 17),
    (GgmlType::Q6_K, 18),
];

/// llama.cpp preset names that are mixtures, not one type.
const PRESETS: &[&str] = &[
    "Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M",
];

impl Target {
    pub fn parse(name: &str) -> Result<Target, String> {
        let plain = || {
            PLAIN
                .iter()
                .map(|(t, _)| t.name())
                .collect::<Vec<_>>()
                .join(" ")
        };
        if let Some(ty) = GgmlType::from_name(name)
            && PLAIN.iter().any(|(t, _)| *t == ty)
        {
            return Ok(Target { ty });
        }
        let upper = name.to_ascii_uppercase();
        if upper.starts_with("IQ") || upper.starts_with("TQ") || upper == "MXFP4_MOE" {
            return Err(format!(
                "{upper}: llamay never writes i-quants, ternary or MXFP4 weights (it reads them); plain types: {}",
                plain()
            ));
        }
        if PRESETS.contains(&upper.as_str()) {
            return Err(format!(
                "{upper} is a mixture preset, which this build does not write yet; plain types: {}",
                plain()
            ));
        }
        Err(format!(
            "unknown quantisation type '{name}'; plain types: {}",
            plain()
        ))
    }

    pub fn file_type(self) -> u32 {
        PLAIN
            .iter()
            .find(|(t, _)| *t == self.ty)
            .map_or(0, |(_, f)| *f)
    }
}

/// Name fragments llama.cpp never quantises (routers, special projections, recurrent
/// state parameters), from `tensor_allows_quantization`.
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
];

/// Whole names never quantised.
const NEVER_QUANTISED_NAMES: &[&str] = &["position_embd.weight", "token_types.weight"];

fn allows_quantization(name: &str, shape: &[u64]) -> bool {
    let n_dims = shape.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    n_dims >= 2
        && name.ends_with("weight")
        && !NEVER_QUANTISED.iter().any(|f| name.contains(f))
        && !NEVER_QUANTISED_NAMES.contains(&name)
}

/// llama.cpp's fallback when the row length is not a multiple of the target's block.
fn fallback(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    }
}

/// The type tensor `name` gets, and a note when it is not the target.
pub fn tensor_plan(
    _arch: &str,
    name: &str,
    shape: &[u64],
    from: GgmlType,
    target: Target,
) -> (GgmlType, Option<String>) {
    if !allows_quantization(name, shape) {
        return (
            from,
            (from != target.ty).then(|| "kept: not a quantisable weight".to_string()),
        );
    }
    let ne0 = shape.first().copied().unwrap_or(1);
    let mut to = target.ty;
    let mut note = None;
    if ne0 % to.block_size() != 0 {
        to = fallback(to);
        if ne0 % to.block_size() != 0 {
            to = GgmlType::F16;
        }
        note = Some(format!(
            "row length {ne0} is not a multiple of {} for {}: fell back to {to}",
            target.ty.block_size(),
            target.ty
        ));
    }
    (to, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str, shape: &[u64], target: GgmlType) -> GgmlType {
        tensor_plan("llama", name, shape, GgmlType::F32, Target { ty: target }).0
    }

    #[test]
    fn selection_follows_llama_quantize() {
        assert_eq!(
            plan("blk.0.attn_q.weight", &[256, 256], GgmlType::Q4_K),
            GgmlType::Q4_K
        );
        assert_eq!(
            plan("blk.0.attn_norm.weight", &[256], GgmlType::Q4_K),
            GgmlType::F32
        );
        assert_eq!(
            plan("blk.0.attn_q.bias", &[256, 2], GgmlType::Q8_0),
            GgmlType::F32
        );
        assert_eq!(
            plan("blk.0.ffn_gate_inp.weight", &[256, 8], GgmlType::Q8_0),
            GgmlType::F32
        );
        assert_eq!(
            plan("position_embd.weight", &[256, 64], GgmlType::Q8_0),
            GgmlType::F32
        );
        // A matrix stored with a trailing 1 is still 1-D for ggml.
        assert_eq!(plan("x.weight", &[256, 1], GgmlType::Q8_0), GgmlType::F32);
    }

    #[test]
    fn fallbacks_follow_llama_quantize() {
        assert_eq!(plan("a.weight", &[640, 4], GgmlType::Q4_K), GgmlType::Q5_0);
        assert_eq!(plan("a.weight", &[640, 4], GgmlType::Q5_K), GgmlType::Q5_1);
        assert_eq!(plan("a.weight", &[640, 4], GgmlType::Q6_K), GgmlType::Q8_0);
        assert_eq!(plan("a.weight", &[640, 4], GgmlType::Q2_K), GgmlType::Q4_0);
        assert_eq!(plan("a.weight", &[100, 4], GgmlType::Q4_K), GgmlType::F16);
        assert_eq!(plan("a.weight", &[100, 4], GgmlType::Q8_0), GgmlType::F16);
    }

    #[test]
    fn targets() {
        assert_eq!(Target::parse("q8_0").unwrap().file_type(), 7);
        assert_eq!(Target::parse("Q4_K").unwrap().file_type(), 15);
        let e = Target::parse("Q4_K_M").unwrap_err();
        assert!(e.contains("mixture preset") && e.contains("Q8_0"), "{e}");
        assert!(
            Target::parse("IQ2_XS")
                .unwrap_err()
                .contains("never writes i-quants")
        );
        assert!(Target::parse("Q8_K").unwrap_err().contains("unknown"));
        assert!(Target::parse("nonsense").unwrap_err().contains("unknown"));
    }
}
