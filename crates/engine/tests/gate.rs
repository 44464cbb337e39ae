//! The per-family gate (shared/seeds/adding-architectures.txt): config synthesis,
//! strict load, a long EOS-suppressed greedy decode that stays in range and finite, and
//! clear errors for bad input. Runs on the generated fixtures (scripts/gen-arch-fixtures).

mod common;

use common::fixture;
use llamay_engine::sample::argmax;
use llamay_engine::{
    BatchToken, ContextParams, DecodeError, KvPrecision, LoadError, Model, Threads,
};
use llamay_formats::GgmlType;
use llamay_gguf::{GgufFile, GgufWriter, MappedModel, Value};
use llamay_synth::TempPath;
use serde_json::Value as Json;
use std::borrow::Cow;
use std::path::Path;

fn doc() -> Json {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch-fixtures.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn with_model<T>(path: &Path, f: impl FnOnce(Result<Model<'_>, LoadError>) -> T) -> T {
    let mapped = MappedModel::open(path).unwrap();
    let gguf = mapped.parse().unwrap();
    f(Model::load(&gguf, Threads(2)))
}

#[test]
fn config_synthesis_per_family() {
    let d = doc();
    for (arch, info) in d["architectures"].as_object().unwrap() {
        let md = &info["metadata"];
        let key = |k: &str| {
            md.get(format!("{arch}.{k}"))
                .and_then(Json::as_u64)
                .map(|v| v as usize)
        };
        with_model(&fixture(&format!("{arch}-F32.gguf")), |m| {
            let c = m.unwrap_or_else(|e| panic!("{arch}: {e}")).config().clone();
            assert_eq!(c.arch.name, arch);
            assert_eq!(c.n_embd, key("embedding_length").unwrap(), "{arch}");
            assert_eq!(c.n_layer, key("block_count").unwrap(), "{arch}");
            assert_eq!(c.n_head, key("attention.head_count").unwrap(), "{arch}");
            assert_eq!(
                c.n_head_kv,
                key("attention.head_count_kv").unwrap_or(c.n_head),
                "{arch}"
            );
            assert_eq!(c.n_ff, key("feed_forward_length").unwrap(), "{arch}");
            let head_dim = key("attention.key_length").unwrap_or(c.n_embd / c.n_head);
            assert_eq!(c.head_dim_k, head_dim, "{arch}");
            assert_eq!(
                c.n_rot,
                key("rope.dimension_count").unwrap_or(head_dim),
                "{arch}"
            );
            assert_eq!(c.n_vocab, 320, "{arch}: vocabulary from the embedding rows");
            assert_eq!(c.n_ctx_train, 256, "{arch}");
            // The lossy parts, filled by llama.cpp's rules.
            match arch.as_str() {
                "gemma3" => {
                    assert_eq!(
                        c.swa_layers,
                        [true, true, true, true, true, false],
                        "5 sliding + 1 global"
                    );
                    assert_eq!(c.n_swa, 4);
                    assert_eq!(
                        c.rope_swa.base, 10_000.0,
                        "local layers default to base 10000"
                    );
                    assert_eq!(c.attn_scale, 1.0 / 8.0, "1/sqrt(key_length)");
                }
                "gemma2" => {
                    assert_eq!(c.swa_layers, [true, false], "every other layer slides");
                    assert!(
                        c.attn_softcap.is_some() && c.final_softcap.is_some(),
                        "gemma2 softcaps"
                    );
                }
                "qwen2moe" | "qwen3moe" => {
                    let m = c.moe.expect("a mixture");
                    assert_eq!((m.n_expert, m.n_expert_used), (8, 2), "{arch}");
                    assert_eq!(m.n_ff_exp, 256, "{arch}: expert_feed_forward_length");
                    assert_eq!(m.spec.shared_expert, arch == "qwen2moe");
                    assert_eq!(m.spec.normalize_weights, arch == "qwen3moe");
                    if arch == "qwen2moe" {
                        assert_eq!(m.n_ff_shexp, 512, "expert_shared_feed_forward_length");
                    }
                }
                "gpt-oss" => {
                    assert_eq!(c.swa_layers, [true, false], "every other layer slides");
                    assert_eq!(c.n_swa, 4);
                    assert_eq!(c.rope_swa, c.rope, "sliding layers rope (and scale) alike");
                    assert_eq!(c.rope.ext_factor, 1.0, "YaRN");
                    assert_eq!(c.q_dim(), 512, "n_head × key_length, not n_embd");
                    let m = c.moe.expect("a mixture");
                    assert_eq!((m.n_expert, m.n_expert_used), (8, 4));
                    assert!(m.spec.biases && !m.spec.normalize_weights);
                    assert_eq!(m.spec.gating, llamay_engine::arch::Gating::SoftmaxOfTopK);
                }
                "stablelm" | "phi2" => assert!(c.n_rot < c.head_dim_k, "{arch}: partial rotary"),
                _ => assert!(c.swa_layers.iter().all(|s| !s), "{arch}: no sliding window"),
            }
        });
    }
}

#[test]
fn long_greedy_decode_stays_in_range_and_finite() {
    let d = doc();
    for arch in d["architectures"].as_object().unwrap().keys() {
        for ty in ["F16", "Q4_K"] {
            with_model(&fixture(&format!("{arch}-{ty}.gguf")), |m| {
                let m = m.unwrap();
                let n_ctx = m.config().n_ctx_train;
                let mut ctx = m
                    .context(ContextParams::new(Threads(2), KvPrecision::F32, n_ctx))
                    .unwrap();
                let s0 = ctx.new_sequence();
                let mut token = 1u32;
                // EOS is never chosen: it is masked out, so decoding runs to the context.
                for pos in 0..n_ctx {
                    let l = ctx
                        .decode(&[BatchToken {
                            seq: s0,
                            token,
                            pos,
                            logits: true,
                        }])
                        .unwrap();
                    let row = l.row(0);
                    assert!(
                        row.iter().all(|v| v.is_finite()),
                        "{arch}-{ty}: non-finite logit at {pos}"
                    );
                    let mut masked = row.to_vec();
                    masked[2] = f32::NEG_INFINITY;
                    token = argmax(&masked);
                    assert!((token as usize) < m.config().n_vocab && token != 2);
                }
                assert_eq!(ctx.kv().len(s0).unwrap(), n_ctx);
                let err = ctx.decode(&[BatchToken {
                    seq: s0,
                    token,
                    pos: n_ctx,
                    logits: true,
                }]);
                assert!(
                    matches!(err, Err(DecodeError::ContextFull { .. })),
                    "{arch}: {:?}",
                    err.err()
                );
            });
        }
    }
}

/// Metadata and tensors of a fixture being rewritten.
type Kvs = Vec<(String, Value<'static>)>;
type Tensors = Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>;

/// Rewrites the llama F32 fixture with `edit` applied to its metadata and tensors.
fn rewritten(name: &str, edit: impl Fn(&mut Kvs, &mut Tensors)) -> TempPath {
    rewritten_from("llama-F32.gguf", name, edit)
}

/// Rewrites fixture `src` with `edit` applied to its metadata and tensors.
fn rewritten_from(src: &str, name: &str, edit: impl Fn(&mut Kvs, &mut Tensors)) -> TempPath {
    let bytes = std::fs::read(fixture(src)).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    let mut kvs: Vec<(String, Value<'static>)> = f
        .metadata
        .iter()
        .map(|(k, v)| (k.to_string(), leak_value(v)))
        .collect();
    let mut tensors: Vec<_> = f
        .tensors
        .iter()
        .map(|t| (t.name.to_string(), t.ty, t.shape.clone(), t.data.to_vec()))
        .collect();
    edit(&mut kvs, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in &kvs {
        w.add_kv(k, v.clone()).unwrap();
    }
    for (n, ty, shape, _) in &tensors {
        w.add_tensor(n, *ty, shape).unwrap();
    }
    let out = TempPath::new(&format!("gate-{name}"));
    let mut file = std::fs::File::create(&out).unwrap();
    w.write(&mut file, |i| Ok(Cow::Owned(tensors[i].3.clone())))
        .unwrap();
    out
}

/// Values that borrow the file's bytes, leaked so the rewritten file can outlive them.
fn leak_value(v: &Value<'_>) -> Value<'static> {
    match v {
        Value::String(s) => Value::String(llamay_gguf::GgufStr(Box::leak(
            s.as_bytes().to_vec().into_boxed_slice(),
        ))),
        Value::Array(a) => match a.as_strings() {
            Some(items) => Value::Array(llamay_gguf::Array::strings(
                items
                    .iter()
                    .map(|s| {
                        llamay_gguf::GgufStr(Box::leak(s.as_bytes().to_vec().into_boxed_slice()))
                    })
                    .collect(),
            )),
            None => Value::Array(
                llamay_gguf::Array::from_values(a.elem_type(), &a.iter().collect::<Vec<_>>())
                    .unwrap(),
            ),
        },
        Value::U8(x) => Value::U8(*x),
        Value::I8(x) => Value::I8(*x),
        Value::U16(x) => Value::U16(*x),
        Value::I16(x) => Value::I16(*x),
        Value::U32(x) => Value::U32(*x),
        Value::I32(x) => Value::I32(*x),
        Value::F32(x) => Value::F32(*x),
        Value::Bool(x) => Value::Bool(*x),
        Value::U64(x) => Value::U64(*x),
        Value::I64(x) => Value::I64(*x),
        Value::F64(x) => Value::F64(*x),
    }
}

fn load_error(path: &Path) -> LoadError {
    with_model(path, |m| m.err().expect("load should fail"))
}

fn set_arch(kvs: &mut [(String, Value<'static>)], name: &'static str) {
    for (k, v) in kvs.iter_mut() {
        if k == "general.architecture" {
            *v = Value::String(name.into());
        }
    }
}

#[test]
fn mixtures_are_checked_by_name() {
    let c = with_model(&fixture("llama-moe-F32.gguf"), |m| {
        m.unwrap().config().clone()
    });
    let m = c.moe.expect("llama with expert_count is a mixture");
    assert_eq!((m.n_expert, m.n_expert_used, m.n_ff_exp), (8, 2, c.n_ff));
    assert!(m.spec.normalize_weights && !m.spec.shared_expert);
    let dense = with_model(&fixture("llama-F32.gguf"), |m| m.unwrap().config().clone());
    assert!(dense.moe.is_none(), "no expert_count: dense");

    let moe = "llama-moe-F32.gguf";
    let p = rewritten_from(moe, "noexps.gguf", |_, t| {
        t.retain(|(n, ..)| n != "blk.1.ffn_up_exps.weight")
    });
    assert_eq!(
        load_error(&p),
        LoadError::MissingTensor("blk.1.ffn_up_exps.weight".into())
    );
    // Same element count, experts on the wrong axis.
    let p = rewritten_from(moe, "expaxis.gguf", |_, t| {
        let g = (t.iter_mut())
            .find(|(n, ..)| n == "blk.0.ffn_gate_exps.weight")
            .unwrap();
        g.2 = vec![256, 8, 256];
    });
    let e = load_error(&p);
    assert!(
        matches!(&e, LoadError::Shape(s) if s.contains("blk.0.ffn_gate_exps.weight")),
        "{e}"
    );
    let p = rewritten_from(moe, "routerbias.gguf", |_, t| {
        t.push((
            "blk.0.ffn_gate_inp.bias".into(),
            GgmlType::F32,
            vec![8],
            vec![0; 32],
        ))
    });
    assert_eq!(load_error(&p).unread(), ["blk.0.ffn_gate_inp.bias"]);
    let set = |key: &'static str, v: u32| {
        move |kv: &mut Kvs, _: &mut Tensors| {
            kv.retain(|(k, _)| k != key);
            kv.push((key.into(), Value::U32(v)));
        }
    };
    let p = rewritten_from(moe, "overused.gguf", set("llama.expert_used_count", 9));
    let e = load_error(&p).to_string();
    assert!(e.contains("8 experts with 9 used"), "{e}");
    let p = rewritten_from(moe, "groups.gguf", set("llama.expert_group_count", 2));
    let e = load_error(&p);
    assert!(
        matches!(&e, LoadError::Unsupported(s) if s.contains("grouped expert routing")),
        "{e}"
    );
    let p = rewritten_from("qwen3moe-F32.gguf", "nocount.gguf", |kv, _| {
        kv.retain(|(k, _)| k != "qwen3moe.expert_count")
    });
    let e = load_error(&p).to_string();
    assert!(
        e.contains("qwen3moe.expert_count") && e.contains("mixture of experts"),
        "{e}"
    );
}

/// The optional tensors of llama.cpp's loaders (docs/arch-coverage.md, "Optional
/// tensors") load where whole and are refused by name where half there.
#[test]
fn optional_tensors_load_whole_or_are_refused_by_name() {
    for f in [
        "llama-fused-qkv-biases-F32.gguf",
        "qwen2-fused-qkv-F32.gguf",
        "phi2-split-qkv-F32.gguf",
        "falcon-attn-norm-2-F32.gguf",
        "stablelm-qk-norm-parallel-F32.gguf",
    ] {
        with_model(&fixture(f), |m| assert!(m.is_ok(), "{f}: {:?}", m.err()));
    }
    // A fused weight with one of the three legacy separate biases: llama.cpp would load
    // it and add none; refused.
    let p = rewritten_from("qwen2-fused-qkv-F32.gguf", "somebias.gguf", |_, t| {
        t.retain(|(n, ..)| n != "blk.1.attn_k.bias" && n != "blk.1.attn_v.bias")
    });
    let e = load_error(&p).to_string();
    assert!(e.contains("blk.1") && e.contains("1 of the three"), "{e}");
    // Falcon 40B's second norm: its bias alone is read by nothing.
    let p = rewritten_from("falcon-attn-norm-2-F32.gguf", "norm2bias.gguf", |_, t| {
        t.retain(|(n, ..)| n != "blk.0.attn_norm_2.weight")
    });
    assert_eq!(load_error(&p).unread(), ["blk.0.attn_norm_2.bias"]);
    // StableLM 2 12B's per-head norms are [head_dim, n_head]: one head's worth is wrong.
    let p = rewritten_from(
        "stablelm-qk-norm-parallel-F32.gguf",
        "qnorm.gguf",
        |_, t| {
            let q = (t.iter_mut())
                .find(|(n, ..)| n == "blk.0.attn_q_norm.weight")
                .unwrap();
            q.2 = vec![64];
            q.3.truncate(64 * 4);
        },
    );
    let e = load_error(&p);
    assert!(
        matches!(&e, LoadError::Shape(s) if s.contains("blk.0.attn_q_norm.weight")),
        "{e}"
    );
}

#[test]
fn strict_load_refuses_by_name() {
    let p = rewritten("missing.gguf", |_, t| {
        t.retain(|(n, ..)| n != "blk.1.ffn_down.weight")
    });
    assert_eq!(
        load_error(&p),
        LoadError::MissingTensor("blk.1.ffn_down.weight".into())
    );

    let p = rewritten("extra.gguf", |_, t| {
        t.push((
            "blk.0.mystery.weight".into(),
            GgmlType::F32,
            vec![4],
            vec![0; 16],
        ))
    });
    let e = load_error(&p);
    assert_eq!(e.unread(), ["blk.0.mystery.weight"]);
    assert!(e.to_string().contains("blk.0.mystery.weight"), "{e}");

    let p = rewritten("shape.gguf", |_, t| {
        let q = t
            .iter_mut()
            .find(|(n, ..)| n == "blk.0.attn_q.weight")
            .unwrap();
        q.2 = vec![128, 512];
    });
    assert!(matches!(load_error(&p), LoadError::Shape(s) if s.contains("blk.0.attn_q.weight")));

    let p = rewritten("mamba.gguf", |kv, _| set_arch(kv, "mamba"));
    let e = load_error(&p);
    assert!(matches!(e, LoadError::Refused { .. }), "{e}");
    assert!(
        e.to_string().contains("mamba") && e.to_string().contains("llama"),
        "{e}"
    );

    let p = rewritten("deepseek.gguf", |kv, _| set_arch(kv, "deepseek2"));
    assert!(load_error(&p).to_string().contains("latent attention"));
    // The declared row not built is a refusal, with its reason.
    let p = rewritten("azmx-ocr.gguf", |kv, _| set_arch(kv, "azmx-ocr"));
    let e = load_error(&p);
    assert!(
        matches!(e, LoadError::Refused { .. }) && e.to_string().contains("CTC head"),
        "azmx-ocr: {e}"
    );

    // bert runs: a decoder's tensors under its name lack the encoder's learned
    // positions (and its input norm after them).
    let p = rewritten("bert.gguf", |kv, _| {
        set_arch(kv, "bert");
        for (k, _) in kv.iter_mut() {
            if let Some(rest) = k.strip_prefix("llama.") {
                *k = format!("bert.{rest}");
            }
        }
    });
    let e = load_error(&p);
    assert!(
        matches!(&e, LoadError::MissingTensor(t) if t == "position_embd.weight"),
        "{e}"
    );

    let p = rewritten("unknown.gguf", |kv, _| set_arch(kv, "frobnicator"));
    let e = load_error(&p);
    assert!(
        matches!(e, LoadError::UnknownArchitecture { .. }) && e.to_string().contains("frobnicator"),
        "{e}"
    );

    // Rope factors: LongRoPE's two sets come together, and not beside rope_freqs; an
    // unknown scaling type is refused by name.
    let factors = |name: &str| (name.to_string(), GgmlType::F32, vec![32], vec![0u8; 128]);
    let p = rewritten("longonly.gguf", |_, t| {
        t.push(factors("rope_factors_long.weight"))
    });
    assert_eq!(
        load_error(&p),
        LoadError::MissingTensor("rope_factors_short.weight".into())
    );
    let p = rewritten("bothkinds.gguf", |_, t| {
        t.push(factors("rope_freqs.weight"));
        t.push(factors("rope_factors_long.weight"));
        t.push(factors("rope_factors_short.weight"));
    });
    assert!(
        load_error(&p)
            .to_string()
            .contains("rope_freqs.weight and LongRoPE")
    );
    let p = rewritten("ntk.gguf", |kv, _| {
        kv.push((
            "llama.rope.scaling.type".into(),
            Value::String("ntk".into()),
        ))
    });
    let e = load_error(&p).to_string();
    assert!(e.contains("'ntk'") && e.contains("yarn"), "{e}");

    let p = rewritten("nohead.gguf", |kv, _| {
        kv.retain(|(k, _)| k != "llama.attention.head_count")
    });
    assert!(
        load_error(&p)
            .to_string()
            .contains("llama.attention.head_count")
    );
}

#[test]
fn bad_decode_input_is_an_error_and_changes_nothing() {
    with_model(&fixture("llama-Q8_0.gguf"), |m| {
        let m = m.unwrap();
        let mut ctx = m
            .context(ContextParams::new(Threads(2), KvPrecision::F32, 8))
            .unwrap();
        let s0 = ctx.new_sequence();
        let t = |token, pos| BatchToken {
            seq: s0,
            token,
            pos,
            logits: true,
        };
        assert_eq!(ctx.decode(&[]).err(), Some(DecodeError::EmptyBatch));
        assert!(matches!(
            ctx.decode(&[t(320, 0)]),
            Err(DecodeError::TokenOutOfRange { token: 320, .. })
        ));
        assert!(matches!(
            ctx.decode(&[t(1, 1)]),
            Err(DecodeError::BadPosition { .. })
        ));
        let gone = ctx.new_sequence();
        ctx.kv_mut().free(gone).unwrap();
        let bad_seq = BatchToken {
            seq: gone,
            ..t(1, 0)
        };
        assert!(matches!(
            ctx.decode(&[bad_seq]),
            Err(DecodeError::UnknownSequence { .. })
        ));
        // A batch whose second token is bad appends nothing.
        assert!(ctx.decode(&[t(1, 0), t(u32::MAX, 1)]).is_err());
        assert_eq!(ctx.kv().len(s0).unwrap(), 0);
        ctx.decode(&[t(1, 0), t(5, 1)]).unwrap();
        assert_eq!(ctx.kv().len(s0).unwrap(), 2);
    });
}

#[test]
fn two_sequences_in_one_batch_equal_two_separate_runs() {
    with_model(&fixture("qwen3-Q4_K.gguf"), |m| {
        let m = m.unwrap();
        let a = [1u32, 40, 41, 42, 43];
        let b = [1u32, 300, 200, 100];
        let solo = |ids: &[u32]| {
            let mut ctx = m
                .context(ContextParams::new(Threads(2), KvPrecision::F32, 16))
                .unwrap();
            let s0 = ctx.new_sequence();
            let batch: Vec<_> = ids
                .iter()
                .enumerate()
                .map(|(i, &t)| BatchToken {
                    seq: s0,
                    token: t,
                    pos: i,
                    logits: true,
                })
                .collect();
            ctx.decode(&batch).unwrap().values
        };
        let mut ctx = m
            .context(ContextParams::new(Threads(2), KvPrecision::F32, 16))
            .unwrap();
        let (s0, s1) = (ctx.new_sequence(), ctx.new_sequence());
        let mut batch = Vec::new();
        for (i, &t) in a.iter().enumerate() {
            batch.push(BatchToken {
                seq: s0,
                token: t,
                pos: i,
                logits: true,
            });
        }
        for (i, &t) in b.iter().enumerate() {
            batch.push(BatchToken {
                seq: s1,
                token: t,
                pos: i,
                logits: true,
            });
        }
        let joint = ctx.decode(&batch).unwrap();
        let n = m.config().n_vocab;
        let (sa, sb) = (solo(&a), solo(&b));
        let joint_a = &joint.values[..a.len() * n];
        let joint_b = &joint.values[a.len() * n..];
        // The activation rounding is per token, so sequences do not interact at all.
        assert_eq!(joint_a, &sa[..]);
        assert_eq!(joint_b, &sb[..]);
    });
}
