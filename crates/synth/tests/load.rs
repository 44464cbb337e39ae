//! Every path of `Model::check` and `Model::load` on every row of the table, on
//! synthetic files: with every optional tensor present, with each required tensor
//! missing, each shape wrong, each dimension zero, an extra tensor; and a seeded sweep of
//! hostile variants through the fuzz target's oracle.

use llamay_engine::{ARCHITECTURES, ArchSpec, LoadError, Model};
use llamay_formats::GgmlType;
use llamay_gguf::{GgufFile, Model as Gguf};
use llamay_synth::{Dims, ModelFile, Outcome, Rng, RopeFactors, Spec, exercise, hostile};

fn check(file: &ModelFile) -> Result<(), LoadError> {
    let bytes = file.write().expect("the writer takes the file");
    let gguf = Gguf::single(GgufFile::parse(&bytes).expect("parses"));
    Model::check(&gguf).map(|_| ())
}

fn spec(arch: &'static ArchSpec, all_optional: bool, rope_factors: RopeFactors) -> Spec {
    Spec {
        dims: Dims::TINY,
        all_optional,
        rope_factors,
        ..Spec::new(arch)
    }
}

/// Fails today's code on GPT-2, GPT-NeoX and Phi-2 (fused QKV with a bias: check split
/// bias data it never read, a panic).
#[test]
fn every_row_loads_and_decodes_with_every_optional_tensor() {
    for arch in ARCHITECTURES {
        let ropes: &[RopeFactors] = match arch.rope {
            llamay_engine::arch::RopeStyle::None => &[RopeFactors::None],
            _ => &[
                RopeFactors::None,
                RopeFactors::Fixed,
                RopeFactors::LongShort,
            ],
        };
        for &rope in ropes {
            for all_optional in [false, true] {
                for ty in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K] {
                    let dims = if ty == GgmlType::Q4_K {
                        Dims::SMALL
                    } else {
                        Dims::TINY
                    };
                    let s = Spec {
                        dims,
                        ty,
                        ..spec(arch, all_optional, rope)
                    };
                    let bytes = ModelFile::new(&s).write().unwrap();
                    let what = format!("{} {ty} optional={all_optional} {rope:?}", arch.name);
                    let out = std::panic::catch_unwind(|| exercise(&bytes))
                        .unwrap_or_else(|_| panic!("{what}: panicked"));
                    assert_eq!(out, Outcome::Decoded, "{what}");
                }
            }
        }
    }
}

#[test]
fn each_missing_required_tensor_is_named() {
    for arch in ARCHITECTURES {
        let full = ModelFile::new(&spec(arch, true, RopeFactors::None));
        for (i, t) in full.tensors.iter().enumerate() {
            let mut f = full.clone();
            f.tensors.remove(i);
            // An optional projection goes with its bias (a bias alone is unread).
            if let Some(stem) = t.name.strip_suffix(".weight").filter(|_| t.optional) {
                f.tensors.retain(|u| u.name != format!("{stem}.bias"));
            }
            let r = check(&f);
            if t.optional {
                assert!(
                    r.is_ok(),
                    "{} without optional {}: {r:?}",
                    arch.name,
                    t.name
                );
            } else {
                let e = r.expect_err(&format!("{} without {}", arch.name, t.name));
                assert!(
                    e.to_string().contains(&t.name),
                    "{} without {}: {e}",
                    arch.name,
                    t.name
                );
            }
        }
    }
}

#[test]
fn each_wrong_or_zero_dimension_is_an_error_naming_the_tensor() {
    for arch in ARCHITECTURES {
        let full = ModelFile::new(&spec(arch, true, RopeFactors::Fixed));
        for (i, t) in full.tensors.iter().enumerate() {
            for (d, value) in [(0, t.shape[0] + 32), (0, 0), (t.shape.len() - 1, 0)] {
                let mut f = full.clone();
                f.tensors[i].shape[d] = value;
                let what = format!("{} {} dim {d} = {value}", arch.name, t.name);
                let e = check(&f).expect_err(&what);
                assert!(e.to_string().contains(&t.name), "{what}: {e}");
            }
        }
    }
}

#[test]
fn an_unknown_tensor_is_named() {
    for arch in ARCHITECTURES {
        let mut f = ModelFile::new(&spec(arch, false, RopeFactors::None));
        let mut extra = f.tensors[0].clone();
        extra.name = "blk.0.attn_rel_b.weight".into();
        f.tensors.push(extra);
        let e = check(&f).expect_err(arch.name);
        assert_eq!(e.unread(), ["blk.0.attn_rel_b.weight"], "{}", arch.name);
    }
}

#[test]
fn hostile_metadata_values_are_errors_naming_the_key() {
    use llamay_gguf::Value;
    let arch = &ARCHITECTURES[0];
    let base = ModelFile::new(&spec(arch, false, RopeFactors::None));
    let cases: &[(&str, Value<'static>)] = &[
        ("llama.context_length", Value::U64(u64::MAX)),
        ("llama.context_length", Value::U32(0)),
        ("llama.rope.freq_base", Value::F32(f32::NAN)),
        ("llama.rope.freq_base", Value::F32(-1.0)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(f32::INFINITY),
        ),
        ("llama.final_logit_softcapping", Value::F32(-30.0)),
        ("llama.rope.scaling.factor", Value::F32(f32::NAN)),
    ];
    for (key, value) in cases {
        let mut f = base.clone();
        f.metadata.retain(|(k, _)| k != key);
        f.metadata.push((key.to_string(), value.clone()));
        let e = check(&f).expect_err(key);
        assert!(e.to_string().contains(key), "{key} = {value:?}: {e}");
    }
}

/// The fuzz target's inputs, seeded: random byte strings become hostile variants, and
/// every one either is refused at load (check and load agreeing) or decodes.
#[test]
fn seeded_hostile_models_are_refused_or_run_never_panic() {
    let mut rng = Rng(17);
    let (mut refused, mut decoded) = (0, 0);
    for _ in 0..1500 {
        let len = (rng.next_u64() % 40) as usize;
        let input: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let Some(m) = hostile(&input) else { continue };
        match std::panic::catch_unwind(|| exercise(&m.bytes)) {
            Ok(Outcome::Refused(_)) => refused += 1,
            Ok(Outcome::Decoded) => decoded += 1,
            Err(_) => panic!("input {input:?} ({} {}) panicked", m.arch, m.ty),
        }
    }
    eprintln!("hostile sweep: {refused} refused, {decoded} decoded");
    assert!(
        refused > 100 && decoded > 100,
        "{refused} refused, {decoded} decoded"
    );
}

/// Found by the model_load fuzz target: Q8_K (and Q8_1) are readable but are
/// activation formats; as weights the matmul had no kernel and filled NaN.
#[test]
fn activation_formats_as_weights_are_refused_by_name() {
    for ty in [GgmlType::Q8_K, GgmlType::Q8_1] {
        let s = Spec {
            ty,
            dims: Dims::SMALL,
            ..Spec::new(&ARCHITECTURES[0])
        };
        let e = check(&ModelFile::new(&s)).expect_err(&ty.to_string());
        let msg = e.to_string();
        assert!(
            msg.contains("token_embd.weight") && msg.contains("activation format"),
            "{msg}"
        );
    }
}
