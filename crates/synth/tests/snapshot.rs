//! KV snapshots: a round trip continues bit-identically (sliding-window rows included),
//! and every corruption class is refused by name with nothing loaded.

use llamay_engine::{
    BatchToken, Context, ContextParams, KvPrecision, Model, SeqId, SnapshotError, Threads,
};
use llamay_formats::GgmlType;
use llamay_gguf::{GgufFile, Model as Gguf};
use llamay_synth::{Dims, ModelFile, Spec};
use sha2::{Digest, Sha256};

fn spec(arch: &str, n_layer: u64) -> Spec {
    Spec {
        ty: GgmlType::Q8_0,
        dims: Dims {
            n_ctx: 512,
            n_layer,
            ..Dims::SMALL
        },
        ..Spec::new(llamay_engine::arch::find(arch).unwrap())
    }
}

fn with_model<T>(spec: &Spec, f: impl FnOnce(&Model<'_>) -> T) -> T {
    let bytes = ModelFile::new(spec).write().unwrap();
    let gguf = Gguf::single(GgufFile::parse(&bytes).unwrap());
    f(&Model::load(&gguf, Threads(2)).unwrap())
}

fn context<'m>(m: &'m Model<'m>, kv: KvPrecision) -> Context<'m> {
    m.context(ContextParams::new(Threads(2), kv, 512)).unwrap()
}

fn run(ctx: &mut Context<'_>, seq: SeqId, toks: &[u32]) -> Vec<f32> {
    let pos0 = ctx.kv().len(seq).unwrap();
    let batch: Vec<BatchToken> = (toks.iter().enumerate())
        .map(|(i, &token)| BatchToken {
            seq,
            token,
            pos: pos0 + i,
            logits: true,
        })
        .collect();
    ctx.decode(&batch).unwrap().values
}

fn tokens(n: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + salt) % 64) as u32).collect()
}

#[test]
fn a_snapshot_round_trip_continues_bit_identically() {
    for arch in ["llama", "gemma3"] {
        for kv in [
            KvPrecision::F32,
            KvPrecision::F16,
            KvPrecision::Vq8,
            KvPrecision::Q8,
        ] {
            with_model(&spec(arch, 2), |m| {
                let mut a = context(m, kv);
                let s = a.new_sequence();
                // Past the window of Dims::SMALL and several pages, ending mid-page.
                run(&mut a, s, &tokens(150, 3));
                let snap = a.save_sequence(s).unwrap();
                let want = run(&mut a, s, &tokens(20, 7));
                // Into a fresh context of the same model.
                let mut b = context(m, kv);
                let r = b.load_sequence(&snap).unwrap();
                assert_eq!(b.kv().tokens(r).unwrap(), &tokens(150, 3)[..]);
                let got = run(&mut b, r, &tokens(20, 7));
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{arch} {kv:?}: the restored sequence continues differently"
                );
            });
        }
    }
}

/// Recomputes the trailing checksum, so a test can alter a field and reach the check
/// behind the checksum.
fn reseal(mut b: Vec<u8>) -> Vec<u8> {
    let n = b.len() - 32;
    let sum = Sha256::digest(&b[..n]);
    b[n..].copy_from_slice(&sum);
    b
}

#[test]
fn every_corruption_is_refused_by_name_and_loads_nothing() {
    let sp = spec("gemma3", 2);
    with_model(&sp, |m| {
        let mut ctx = context(m, KvPrecision::F32);
        let s = ctx.new_sequence();
        run(&mut ctx, s, &tokens(100, 1));
        let snap = ctx.save_sequence(s).unwrap();
        let before = ctx.kv().usage();
        let n_seqs = ctx.kv().sequences().count();
        let mut refuse = |bytes: &[u8], want: &dyn Fn(&SnapshotError) -> bool, what: &str| {
            let err = ctx.load_sequence(bytes).expect_err(what);
            assert!(want(&err), "{what}: {err}");
            assert!(!err.to_string().is_empty());
            assert_eq!(ctx.kv().usage(), before, "{what}: pages changed");
            assert_eq!(
                ctx.kv().sequences().count(),
                n_seqs,
                "{what}: a sequence appeared"
            );
        };
        // Every cut: the header fields one byte at a time, then through the data.
        let header = 8 + 4 + 32 + 1 + 16 + 8 + 400 + 8;
        let cuts = (0..header + 64)
            .chain((header..snap.len()).step_by(997))
            .chain([snap.len() - 1]);
        for cut in cuts {
            refuse(
                &snap[..cut],
                &|e| matches!(e, SnapshotError::Truncated(_) | SnapshotError::NotASnapshot),
                &format!("cut at {cut}"),
            );
        }
        // Any altered byte in the body: the checksum.
        for at in [60, 500, snap.len() / 2, snap.len() - 40] {
            let mut b = snap.clone();
            b[at] ^= 0x10;
            refuse(
                &b,
                &|e| !matches!(e, SnapshotError::Truncated(_)),
                &format!("byte {at} altered"),
            );
        }
        let mut b = snap.clone();
        b[97] ^= 1;
        refuse(
            &b,
            &|e| *e == SnapshotError::Checksum,
            "a token bit flipped",
        );
        let mut b = snap.clone();
        b.push(0);
        refuse(
            &b,
            &|e| matches!(e, SnapshotError::Trailing(1)),
            "trailing byte",
        );
        let mut b = snap.clone();
        b[0] = b'X';
        refuse(&b, &|e| *e == SnapshotError::NotASnapshot, "magic");
        let mut b = snap.clone();
        b[8] = 9;
        refuse(
            &reseal(b),
            &|e| matches!(e, SnapshotError::Version(9)),
            "version",
        );
        let mut b = snap.clone();
        b[12] ^= 0xff;
        refuse(
            &reseal(b),
            &|e| matches!(e, SnapshotError::OtherModel { .. }),
            "identity",
        );
        let mut b = snap.clone();
        b[44] = 3;
        refuse(
            &reseal(b),
            &|e| matches!(e, SnapshotError::OtherPrecision { .. }),
            "precision",
        );
        let mut b = snap.clone();
        b[49] = 3; // layer count
        refuse(
            &reseal(b),
            &|e| {
                matches!(
                    e,
                    SnapshotError::Mismatch {
                        what: "layer count",
                        ..
                    }
                )
            },
            "layers",
        );
        // A token outside the vocabulary (first token).
        let mut b = snap.clone();
        b[69..73].copy_from_slice(&64u32.to_le_bytes());
        refuse(
            &reseal(b),
            &|e| {
                matches!(
                    e,
                    SnapshotError::BadToken {
                        token: 64,
                        pos: 0,
                        ..
                    }
                )
            },
            "token",
        );
        // A token count beyond the context, and one the bytes cannot hold.
        let mut b = snap.clone();
        b[61..69].copy_from_slice(&u64::MAX.to_le_bytes());
        refuse(
            &reseal(b),
            &|e| matches!(e, SnapshotError::TooLong { .. }),
            "count",
        );
        let mut b = snap.clone();
        b[61..69].copy_from_slice(&101u64.to_le_bytes());
        refuse(
            &reseal(b),
            &|e| !matches!(e, SnapshotError::Checksum),
            "count + 1",
        );
        // A page count the sequence does not hold.
        let mut b = snap.clone();
        let at = 69 + 400;
        let pages = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        b[at..at + 8].copy_from_slice(&(pages + 1).to_le_bytes());
        refuse(
            &reseal(b),
            &|e| matches!(e, SnapshotError::PageCount { layer: 0, .. }),
            "pages",
        );
        // Another model of the same shape, and another precision.
        with_model(
            &Spec {
                seed: sp.seed + 1,
                ..sp
            },
            |other| {
                let mut o = context(other, KvPrecision::F32);
                assert!(matches!(
                    o.load_sequence(&snap),
                    Err(SnapshotError::OtherModel { .. })
                ));
            },
        );
        let mut q = context(m, KvPrecision::Q8);
        assert!(matches!(
            q.load_sequence(&snap),
            Err(SnapshotError::OtherPrecision { .. })
        ));
        // The untouched snapshot still loads.
        ctx.load_sequence(&snap).unwrap();
    });
}
