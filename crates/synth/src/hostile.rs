//! Hostile variants of valid models, driven by fuzzer bytes: every variant is a
//! well-formed container (the writer made it), so what it tests is the loader and the
//! forward pass behind the parser. [`exercise`] is the oracle both the fuzz target and
//! the seeded test sweep run.

use crate::{Dims, ModelFile, RopeFactors, Spec};
use llamay_engine::arch::Output;
use llamay_engine::{ARCHITECTURES, BatchToken, ContextParams, KvPrecision, Model, Threads};
use llamay_formats::GgmlType;
use llamay_gguf::{Array, GgufFile, Model as Gguf, Value};

/// Bytes consumed one at a time; zeros once they run out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn pick<'t, T>(&mut self, items: &'t [T]) -> &'t T {
        &items[self.byte() as usize % items.len()]
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Dimensions a mutation may give a tensor: degenerate, off by one, huge.
const DIMS: &[u64] = &[
    0,
    1,
    2,
    15,
    16,
    17,
    31,
    32,
    33,
    64,
    256,
    1 << 20,
    u32::MAX as u64,
];

/// Keys a mutation may add (prefixed by the architecture name).
const EXTRA_KEYS: &[&str] = &[
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.attn_factor",
    "rope.scale_linear",
    "rope.freq_base_swa",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "expert_count",
];

/// Names a mutation may give an extra tensor.
const EXTRA_TENSORS: &[&str] = &[
    "output.weight",
    "output.bias",
    "position_embd.weight",
    "rope_freqs.weight",
    "rope_factors_long.weight",
    "blk.0.attn_q_norm.weight",
    "blk.0.attn_qkv.bias",
    "blk.0.ffn_gate.weight",
    "blk.1.attn_norm.weight",
    "blk.9.attn_norm.weight",
    "blk.0.unknown.weight",
];

fn hostile_value(b: u8) -> Value<'static> {
    match b % 22 {
        0 => Value::U32(0),
        1 => Value::U32(1),
        2 => Value::U32(u32::MAX),
        3 => Value::U64(u64::MAX),
        4 => Value::U64(1 << 40),
        5 => Value::I32(-1),
        6 => Value::F32(f32::NAN),
        7 => Value::F32(-1.0),
        8 => Value::F32(f32::INFINITY),
        9 => Value::F32(0.0),
        10 => Value::F32(1e30),
        11 => Value::String("yarn".into()),
        12 => Value::String("linear".into()),
        13 => Value::String("longrope".into()),
        14 => Value::String("".into()),
        15 => Value::Array(Array::from_u32s(&[1, 2])),
        16 => Value::Array(Array::from_u32s(&[])),
        17 => Value::Array(
            Array::from_values(llamay_gguf::ValueType::Bool, &[Value::Bool(true)])
                .unwrap_or_else(|| Array::from_u32s(&[])),
        ),
        18 => Value::Bool(true),
        19 => Value::U32(3),
        20 => Value::U32(7),
        _ => Value::F32(4.0),
    }
}

/// The weight formats a variant starts from: every readable type (the loader must
/// take them all) and a refused one.
const TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::MXFP4,
    GgmlType::Q8_K,
    GgmlType::IQ1_S,
];

/// A hostile variant: the file's bytes and what it was made from.
#[derive(Debug)]
pub struct HostileModel {
    pub bytes: Vec<u8>,
    pub arch: &'static str,
    pub ty: GgmlType,
}

/// Above this many bytes of tensor data a variant is not built (fuzzing speed).
const MAX_BYTES: u64 = 16 << 20;

/// A valid model of a row chosen by `data`, then up to 8 hostile mutations of its
/// shapes, types, metadata and tensor set. `None` when the mutations ask for something
/// the writer refuses (a row length the type's block does not divide, a duplicate name)
/// or for too many bytes.
pub fn hostile(data: &[u8]) -> Option<HostileModel> {
    let mut input = Input(data);
    let arch = input.pick(ARCHITECTURES);
    let flags = input.byte();
    let ty = *input.pick(TYPES);
    let mut dims = if ty.block_size() > 32 {
        Dims {
            n_embd: 256,
            n_ff: 256,
            n_head: 2,
            head_dim: 128,
            ..Dims::TINY
        }
    } else {
        Dims::TINY
    };
    let shape = input.byte();
    if shape & 1 != 0 {
        dims.n_head_kv = dims.n_head;
    }
    if shape & 2 != 0 {
        dims.n_layer = 2;
    }
    let spec = Spec {
        arch,
        dims,
        ty,
        all_optional: flags & 1 != 0,
        rope_factors: match (flags >> 1) % 3 {
            0 => RopeFactors::None,
            1 => RopeFactors::Fixed,
            _ => RopeFactors::LongShort,
        },
        seed: u64::from(flags),
    };
    let mut file = ModelFile::new(&spec);
    for _ in 0..8 {
        if input.is_empty() {
            break;
        }
        mutate(&mut file, arch.name, &mut input);
    }
    let total = file.tensors.iter().try_fold(0u64, |acc, t| {
        let n = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        acc.checked_add(t.ty.bytes_for(n)?)
    })?;
    if total > MAX_BYTES {
        return None;
    }
    let bytes = file.write().ok()?;
    Some(HostileModel {
        bytes,
        arch: arch.name,
        ty,
    })
}

fn mutate(file: &mut ModelFile, arch: &str, input: &mut Input<'_>) {
    let (op, a, b) = (input.byte(), input.byte() as usize, input.byte());
    let nt = file.tensors.len();
    let nk = file.metadata.len();
    match op % 8 {
        0 if nt > 0 => {
            file.tensors.remove(a % nt);
        }
        1 if nt > 0 => {
            let t = &mut file.tensors[a % nt];
            let i = b as usize % t.shape.len().max(1);
            if let Some(d) = t.shape.get_mut(i) {
                *d = *input.pick(DIMS);
            }
        }
        2 if nt > 0 => {
            let all = llamay_formats::ALL_TYPES;
            file.tensors[a % nt].ty = all[b as usize % all.len()];
        }
        3 if nk > 0 => file.metadata[a % nk].1 = hostile_value(b),
        4 if nk > 0 => {
            file.metadata.remove(a % nk);
        }
        5 if nt > 0 => {
            let mut t = file.tensors[a % nt].clone();
            t.name = EXTRA_TENSORS[b as usize % EXTRA_TENSORS.len()].to_string();
            file.tensors.push(t);
        }
        6 => {
            let k = format!("{arch}.{}", EXTRA_KEYS[a % EXTRA_KEYS.len()]);
            file.metadata.retain(|(key, _)| *key != k);
            file.metadata.push((k, hostile_value(b)));
        }
        7 if nt > 0 => {
            let t = &mut file.tensors[a % nt];
            if b & 1 == 0 && t.shape.len() < 4 {
                t.shape.push(*input.pick(DIMS));
            } else if t.shape.len() > 1 {
                t.shape.pop();
            }
        }
        _ => {}
    }
}

/// What a model file did under [`exercise`].
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Refused at load, with this message (check and load agreed on it).
    Refused(String),
    /// Loaded, and a batch decoded (to logits; an encoder's to hidden states).
    Decoded,
}

/// The oracle: parse (the writer's output must parse), `Model::check`, `Model::load`
/// (the two must agree, error for error), then one batch of up to two tokens through a
/// fresh cache, which must succeed and give one row of logits per token. Panics (a
/// fuzz finding) when any of that fails to hold.
pub fn exercise(bytes: &[u8]) -> Outcome {
    let file = GgufFile::parse(bytes).expect("a container the writer made parses");
    let gguf = Gguf::single(file);
    let checked = Model::check(&gguf);
    let loaded = Model::load(&gguf, Threads(1));
    let model = match (checked, loaded) {
        (Ok(_), Ok(m)) => m,
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "check and load refuse differently");
            return Outcome::Refused(a.to_string());
        }
        (Ok(_), Err(e)) => panic!("check accepted what load refused: {e}"),
        (Err(e), Ok(_)) => panic!("load accepted what check refused: {e}"),
    };
    let c = model.config();
    let n = c.n_ctx_train.min(2);
    let mut ctx = model
        .context(ContextParams::new(Threads(1), KvPrecision::F32, n))
        .unwrap_or_else(|e| panic!("a loaded model refused an f32 context: {e}"));
    let seq = ctx.new_sequence();
    let batch: Vec<BatchToken> = (0..n)
        .map(|pos| BatchToken {
            seq,
            token: (pos % c.n_vocab) as u32,
            pos,
            logits: true,
        })
        .collect();
    // An encoder gives its hidden states (embeddings), a decoder logits.
    let (values, width) = if c.arch.output == Output::Embeddings {
        let h = ctx.hidden(&batch);
        (h.map(|h| h.values), c.n_embd)
    } else {
        (ctx.decode(&batch).map(|l| l.values), c.n_vocab)
    };
    let values = values.unwrap_or_else(|e| panic!("a loaded model refused a valid batch: {e}"));
    assert_eq!(values.len(), n * width);
    // The weights are finite and small (see `tensor_bytes`), so NaN outputs mean a
    // computation was skipped: the kernels' answer to shapes that do not match.
    assert!(
        values.iter().all(|v| !v.is_nan()),
        "a loaded model gave NaN outputs"
    );
    // A decoder's cache holds the batch; an encoder keeps nothing.
    let kept = if c.causal { n } else { 0 };
    assert_eq!(ctx.kv().len(seq), Ok(kept));
    Outcome::Decoded
}
