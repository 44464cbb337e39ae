//! Decode state on synthetic models of every row: the equalities prefix reuse rests on
//! (one token at a time equals one batch, bit for bit; truncate-then-redecode equals a
//! fresh sequence; continuing a fork equals continuing the original), ids of another
//! context refused, and a batch interrupted by a panic leaving its sequence whole.
//!
//! scripts/test runs this file under every kernel set (portable, AVX2, AVX-VNNI, AVX-512
//! VNNI, AMX where the CPU has them; NEON under qemu is the kernels crate's own run).

use llamay_engine::arch::Output;
use llamay_engine::{
    ARCHITECTURES, BatchToken, Context, ContextParams, DecodeError, KvPrecision, Model, SeqId,
    Threads,
};
use llamay_formats::GgmlType;
use llamay_gguf::{GgufFile, Model as Gguf};
use llamay_synth::{Dims, ModelFile, Spec};

/// The rows that decode to logits: the equalities below are a decoder's (an encoder
/// reads a sequence whole: `an_encoder_reads_each_sequence_whole`).
fn decoders() -> impl Iterator<Item = &'static llamay_engine::ArchSpec> {
    ARCHITECTURES.iter().filter(|a| a.output == Output::Logits)
}

fn with_model<T>(spec: &Spec, f: impl FnOnce(&Model<'_>) -> T) -> T {
    let bytes = ModelFile::new(spec).write().unwrap();
    let gguf = Gguf::single(GgufFile::parse(&bytes).unwrap());
    let m = Model::load(&gguf, Threads(2)).unwrap();
    f(&m)
}

fn context<'m>(m: &'m Model<'m>, threads: usize, kv: KvPrecision, n_ctx: usize) -> Context<'m> {
    let params = ContextParams {
        kv_budget_tokens: Some(4 * n_ctx.max(llamay_engine::PAGE)),
        ..ContextParams::new(Threads(threads), kv, n_ctx)
    };
    m.context(params).unwrap()
}

fn batch(seq: SeqId, tokens: &[u32], pos0: usize) -> Vec<BatchToken> {
    (tokens.iter().enumerate())
        .map(|(i, &token)| BatchToken {
            seq,
            token,
            pos: pos0 + i,
            logits: true,
        })
        .collect()
}

fn tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 5) % n_vocab) as u32).collect()
}

/// Logits of `toks` fed as one batch after what `seq` holds.
fn run(ctx: &mut Context<'_>, seq: SeqId, toks: &[u32]) -> Vec<f32> {
    let pos0 = ctx.kv().len(seq).unwrap();
    ctx.decode(&batch(seq, toks, pos0)).unwrap().values
}

fn assert_same_bits(a: &[f32], b: &[f32], n: usize, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (a, b)) in a.chunks(n).zip(b.chunks(n)).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: position {i} differs (max diff {})",
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        );
    }
}

/// Tokens past the 16-position key tile and the 64-token activation tiles, so the
/// batch path crosses every tile edge the one-token path does not.
const N_TOKENS: usize = 40;

/// One token at a time and one batch of `n_tokens`, compared at every position.
fn compare_one_by_one_with_batch(spec: &Spec, threads: usize, kv: KvPrecision, n_tokens: usize) {
    let n_ctx = spec.dims.n_ctx as usize;
    with_model(spec, |m| {
        let mut ctx = context(m, threads, kv, n_ctx);
        let toks = tokens(n_tokens, m.config().n_vocab);
        let s = ctx.new_sequence();
        let whole = run(&mut ctx, s, &toks);
        let c = ctx.new_sequence();
        let mut single = Vec::new();
        for &t in &toks {
            single.extend(run(&mut ctx, c, &[t]));
        }
        let what = format!("{} {} {threads} threads, {kv:?}", spec.arch.name, spec.ty);
        assert_same_bits(&whole, &single, m.config().n_vocab, &what);
    });
}

#[test]
fn one_token_at_a_time_equals_one_batch_bit_for_bit() {
    for arch in decoders() {
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
                compare_one_by_one_with_batch(&spec, threads, KvPrecision::F32, N_TOKENS);
            }
        }
        // The other precisions, once per row.
        for kv in [KvPrecision::F16, KvPrecision::Vq8, KvPrecision::Q8] {
            let spec = Spec {
                ty: GgmlType::Q8_0,
                ..Spec::new(arch)
            };
            compare_one_by_one_with_batch(&spec, 2, kv, N_TOKENS);
        }
    }
}

/// Past the depth where one-token decode splits its KV range across threads (a few
/// hundred positions with few KV heads) and across a sliding window.
#[test]
fn one_token_at_a_time_equals_one_batch_at_depth() {
    for name in ["llama", "gemma3"] {
        for kv in [KvPrecision::F32, KvPrecision::Q8] {
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
            compare_one_by_one_with_batch(&spec, 2, kv, 700);
        }
    }
}

#[test]
fn truncate_then_redecode_equals_a_fresh_sequence() {
    for arch in decoders() {
        let spec = Spec {
            ty: GgmlType::Q8_0,
            ..Spec::new(arch)
        };
        with_model(&spec, |m| {
            let n = m.config().n_vocab;
            let mut ctx = context(m, 2, KvPrecision::F32, 64);
            let toks = tokens(24, n);
            let s = ctx.new_sequence();
            let fresh = run(&mut ctx, s, &toks);
            let c = ctx.new_sequence();
            // Another continuation first, then cut back to the shared prefix of 9.
            let mut other = toks[..9].to_vec();
            other.extend(tokens(11, n).iter().map(|t| (t + 1) % n as u32));
            run(&mut ctx, c, &other);
            ctx.kv_mut().truncate(c, 9).unwrap();
            assert_eq!(ctx.kv().len(c), Ok(9));
            let again = run(&mut ctx, c, &toks[9..]);
            assert_eq!(again, fresh[9 * n..], "{}", arch.name);
        });
    }
}

/// A fork continues exactly as its parent would, however far the parent has gone on
/// since (and on sliding-window rows, past the window, without recomputing anything);
/// the parent is untouched by the fork's writes.
#[test]
fn continuing_a_fork_equals_continuing_the_original_bit_for_bit() {
    for arch in decoders() {
        for kv in [KvPrecision::F32, KvPrecision::Q8] {
            let spec = Spec {
                ty: GgmlType::Q4_K,
                dims: Dims {
                    n_ctx: 512,
                    ..Dims::SMALL
                },
                ..Spec::new(arch)
            };
            with_model(&spec, |m| {
                let n = m.config().n_vocab;
                let mut ctx = context(m, 2, kv, 512);
                // A prefix past Dims::SMALL's window and several pages, ending mid-page.
                let prefix = tokens(203, n);
                let (tail_a, tail_b) = (tokens(30, n), tokens(45, n)[15..].to_vec());
                let parent = ctx.new_sequence();
                run(&mut ctx, parent, &prefix);
                let fork = ctx.kv_mut().fork(parent).unwrap();
                let used = ctx.kv().usage().pages_used;
                // The parent goes on first (its partial page copied on write) ...
                let parent_a = run(&mut ctx, parent, &tail_a);
                assert!(ctx.kv().usage().pages_used > used);
                // ... and the fork continues as if it were the parent at the fork point.
                let fork_a = run(&mut ctx, fork, &tail_a);
                let what = format!("{} {kv:?}", arch.name);
                assert_same_bits(&parent_a, &fork_a, n, &what);
                // A second, different continuation of a fresh fork matches a fresh run.
                let fresh = ctx.new_sequence();
                let mut all = prefix.clone();
                all.extend(&tail_b);
                let want = run(&mut ctx, fresh, &all);
                let again = ctx.kv_mut().fork(fork).unwrap();
                ctx.kv_mut().free(fork).unwrap();
                ctx.kv_mut().truncate(again, prefix.len()).unwrap();
                let got = run(&mut ctx, again, &tail_b);
                assert_same_bits(&got, &want[prefix.len() * n..], n, &what);
                for s in [parent, fresh, again] {
                    ctx.kv_mut().free(s).unwrap();
                }
                assert_eq!(ctx.kv().usage().pages_used, 0, "{what}: pages leaked");
            });
        }
    }
}

#[test]
fn a_sequence_of_another_context_is_refused() {
    let llama = Spec::new(&ARCHITECTURES[0]);
    with_model(&llama, |m| {
        let mut a = context(m, 1, KvPrecision::F32, 8);
        let mut b = context(m, 1, KvPrecision::F32, 8);
        let theirs = b.new_sequence();
        let r = a.decode(&batch(theirs, &[1], 0));
        assert_eq!(r.err(), Some(DecodeError::UnknownSequence { seq: theirs }));
        assert_eq!(b.kv().len(theirs), Ok(0));
        let freed = a.new_sequence();
        a.kv_mut().free(freed).unwrap();
        assert!(a.decode(&batch(freed, &[1], 0)).is_err());
        assert!(a.kv_mut().fork(freed).is_err());
    });
}

/// A panic in a kernel mid-batch (after some layers wrote their keys and values) leaves
/// the sequence at its committed length: the rows past it are rewritten by the next
/// batch, so decoding simply goes on, and equals a run that was never interrupted.
#[test]
fn a_batch_interrupted_by_a_panic_leaves_its_sequence_whole() {
    let spec = Spec {
        ty: GgmlType::Q8_0,
        ..Spec::new(&ARCHITECTURES[0])
    };
    with_model(&spec, |m| {
        let n = m.config().n_vocab;
        let toks = tokens(6, n);
        let mut ctx = context(m, 2, KvPrecision::F32, 16);
        let s = ctx.new_sequence();
        let fresh = run(&mut ctx, s, &toks);
        let t = ctx.new_sequence();
        run(&mut ctx, t, &toks[..3]);
        llamay_engine::fault::panic_at_layer(1);
        let interrupted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ctx.decode(&batch(t, &toks[3..], 3))
        }));
        assert!(interrupted.is_err(), "the injected fault did not fire");
        assert_eq!(ctx.kv().len(t), Ok(3));
        let resumed = run(&mut ctx, t, &toks[3..]);
        assert_eq!(resumed, fresh[3 * n..]);
    });
}

/// An encoder (bert) reads a sequence whole: its states are the same bits alone or
/// batched with another sequence, a second batch on a sequence is refused by name, and
/// it has no logits to give.
#[test]
fn an_encoder_reads_each_sequence_whole() {
    let encoders: Vec<_> = (ARCHITECTURES.iter())
        .filter(|a| a.output == Output::Embeddings)
        .collect();
    assert!(!encoders.is_empty());
    for arch in encoders {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
            let spec = Spec {
                ty,
                ..Spec::new(arch)
            };
            with_model(&spec, |m| {
                let n = m.config().n_vocab;
                let toks = tokens(N_TOKENS, n);
                let other = tokens(7, n);
                let mut ctx = context(m, 2, KvPrecision::F32, 64);
                let a = ctx.new_sequence();
                let alone = ctx.hidden(&batch(a, &toks, 0)).unwrap().values;
                let (b, c) = (ctx.new_sequence(), ctx.new_sequence());
                let mut both = batch(b, &other, 0);
                both.extend(batch(c, &toks, 0));
                let h = ctx.hidden(&both).unwrap();
                let e = m.config().n_embd;
                assert_same_bits(&alone, &h.values[other.len() * e..], e, arch.name);
                // No KV cache: the batches attended over their own keys and values,
                // and the context never held a page.
                let usage = ctx.kv().usage();
                assert_eq!(
                    (
                        usage.pages_total,
                        usage.pages_allocated,
                        ctx.kv().len(a).unwrap()
                    ),
                    (0, 0, 0),
                    "{}: an encoder's context holds no KV",
                    arch.name
                );
                let more = ctx.hidden(&batch(a, &toks[..1], N_TOKENS));
                assert!(
                    matches!(more, Err(DecodeError::EncoderNeedsWholeSequence { .. })),
                    "{}: a second batch on an encoded sequence",
                    arch.name
                );
                let d = ctx.new_sequence();
                assert!(matches!(
                    ctx.decode(&batch(d, &toks, 0)),
                    Err(DecodeError::EncoderHasNoLogits { .. })
                ));
            });
        }
    }
}
