//! Decode state on synthetic models of every row: the equalities prefix reuse rests on
//! (one token at a time equals one batch, bit for bit; truncate-then-redecode equals a
//! fresh cache), caches of another model refused, and a batch interrupted by a panic
//! leaving its caches refused rather than shifted.
//!
//! scripts/test runs this file under every kernel set (portable, AVX2, AVX-VNNI, AVX-512
//! VNNI, AMX where the CPU has them; NEON under qemu is the kernels crate's own run).

use llamay_engine::{ARCHITECTURES, BatchToken, DecodeError, KvCache, Model, Threads};
use llamay_formats::GgmlType;
use llamay_gguf::{GgufFile, Model as Gguf};
use llamay_synth::{Dims, ModelFile, Spec};

fn with_model<T>(spec: &Spec, threads: usize, f: impl FnOnce(&Model<'_>) -> T) -> T {
    let bytes = ModelFile::new(spec).write().unwrap();
    let gguf = Gguf::single(GgufFile::parse(&bytes).unwrap());
    let m = Model::load(&gguf, Threads(threads)).unwrap();
    f(&m)
}

fn batch(tokens: &[u32], pos0: usize) -> Vec<BatchToken> {
    (tokens.iter().enumerate())
        .map(|(i, &token)| BatchToken {
            seq: 0,
            token,
            pos: pos0 + i,
            logits: true,
        })
        .collect()
}

fn tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 5) % n_vocab) as u32).collect()
}

/// Logits of `toks` fed as one batch after `prefix` (itself one batch).
fn run(m: &Model<'_>, cache: &mut KvCache, toks: &[u32]) -> Vec<f32> {
    let pos0 = cache.len();
    m.decode(std::slice::from_mut(cache), &batch(toks, pos0))
        .unwrap()
        .values
}

/// Tokens past the 16-position key tile and the 64-token activation tiles, so the
/// batch path crosses every tile edge the one-token path does not.
const N_TOKENS: usize = 40;

/// One token at a time and one batch of `n_tokens`, compared at every position.
fn compare_one_by_one_with_batch(spec: &Spec, threads: usize, n_tokens: usize) {
    let (arch, ty) = (spec.arch, spec.ty);
    let n_ctx = spec.dims.n_ctx as usize;
    with_model(spec, threads, |m| {
        let toks = tokens(n_tokens, m.config().n_vocab);
        let whole = run(m, &mut m.new_cache(n_ctx), &toks);
        let mut c = m.new_cache(n_ctx);
        let mut single = Vec::new();
        for &t in &toks {
            single.extend(run(m, &mut c, &[t]));
        }
        let n = m.config().n_vocab;
        for (i, (a, b)) in whole.chunks(n).zip(single.chunks(n)).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{} {ty} {threads} threads: position {i} differs (max diff {})",
                arch.name,
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max)
            );
        }
    });
}

#[test]
fn one_token_at_a_time_equals_one_batch_bit_for_bit() {
    for arch in ARCHITECTURES {
        for ty in [
            GgmlType::F32,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            for threads in [1, 2] {
                let spec = Spec {
                    ty,
                    dims: Dims {
                        n_ctx: 128,
                        ..Dims::SMALL
                    },
                    ..Spec::new(arch)
                };
                compare_one_by_one_with_batch(&spec, threads, N_TOKENS);
            }
        }
    }
}

/// Past the depth where one-token decode splits its KV range across threads (a few
/// hundred positions with few KV heads) and across a sliding window.
#[test]
fn one_token_at_a_time_equals_one_batch_at_depth() {
    for name in ["llama", "gemma3"] {
        let spec = Spec {
            ty: GgmlType::Q8_0,
            dims: Dims {
                n_ctx: 1024,
                n_head_kv: 1,
                n_layer: 1,
                ..Dims::SMALL
            },
            ..Spec::new(llamay_engine::arch::find(name).unwrap())
        };
        compare_one_by_one_with_batch(&spec, 2, 700);
    }
}

#[test]
fn truncate_then_redecode_equals_a_fresh_cache() {
    for arch in ARCHITECTURES {
        let spec = Spec {
            ty: GgmlType::Q8_0,
            ..Spec::new(arch)
        };
        with_model(&spec, 2, |m| {
            let n = m.config().n_vocab;
            let toks = tokens(24, n);
            let fresh = run(m, &mut m.new_cache(64), &toks);
            let mut c = m.new_cache(64);
            // Another continuation first, then cut back to the shared prefix of 9.
            let mut other = toks[..9].to_vec();
            other.extend(tokens(11, n).iter().map(|t| (t + 1) % n as u32));
            run(m, &mut c, &other);
            c.truncate(9);
            assert_eq!(c.len(), 9);
            let again = run(m, &mut c, &toks[9..]);
            assert_eq!(again, fresh[9 * n..], "{}", arch.name);
        });
    }
}

#[test]
fn a_cache_of_another_model_or_shape_is_refused() {
    let llama = Spec::new(&ARCHITECTURES[0]);
    let other_shape = Spec {
        dims: Dims {
            n_layer: 3,
            ..Dims::SMALL
        },
        ..llama
    };
    with_model(&llama, 1, |a| {
        with_model(&llama, 1, |twin| {
            with_model(&other_shape, 1, |b| {
                for foreign in [twin.new_cache(8), b.new_cache(8)] {
                    let mut caches = vec![foreign];
                    let r = a.decode(&mut caches, &batch(&[1], 0));
                    assert!(
                        matches!(r, Err(DecodeError::ForeignCache { seq: 0, .. })),
                        "{:?}",
                        r.err()
                    );
                    assert_eq!(caches[0].len(), 0);
                }
            })
        })
    });
}

/// Today's code appends each layer's rows and commits at the end, so a panic in a
/// kernel left the caches a layer ahead in some layers: the next batch landed at the
/// wrong positions, silently.
#[test]
fn a_batch_interrupted_by_a_panic_leaves_its_caches_refused_until_truncated() {
    let spec = Spec {
        ty: GgmlType::Q8_0,
        ..Spec::new(&ARCHITECTURES[0])
    };
    with_model(&spec, 2, |m| {
        let n = m.config().n_vocab;
        let toks = tokens(6, n);
        let fresh = run(m, &mut m.new_cache(16), &toks);
        let mut caches = [m.new_cache(16), m.new_cache(16)];
        m.decode(&mut caches[..1], &batch(&toks[..3], 0)).unwrap();
        llamay_engine::fault::panic_at_layer(1);
        let interrupted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            m.decode(&mut caches[..1], &batch(&toks[3..], 3))
        }));
        assert!(interrupted.is_err(), "the injected fault did not fire");
        assert_eq!(caches[0].len(), 3);
        assert_eq!(
            m.decode(&mut caches[..1], &batch(&toks[3..], 3)).err(),
            Some(DecodeError::Interrupted { seq: 0 })
        );
        // The untouched sequence and the model itself are fine.
        run(m, &mut caches[1], &toks[..2]);
        // Truncating to what was committed makes the cache whole again.
        caches[0].truncate(3);
        let resumed = run(m, &mut caches[0], &toks[3..]);
        assert_eq!(resumed, fresh[3 * n..]);
    });
}
