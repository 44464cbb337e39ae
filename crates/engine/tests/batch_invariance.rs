//! Batch invariance, the server's promise (issue 14): a sequence's logits are the same
//! bits whatever else its batch carries — other sequences' prompts or decode tokens,
//! and however its own prompt was cut into chunks. Checked on the real Gemma 3 270M
//! file (every kernel set runs it), on the mixture-of-experts fixtures (a token's
//! experts run over whichever rows picked them) and on synthetic files of every weight
//! format.
//!
//! Needs the model: `LLAMAY_GEMMA=$(scripts/fetch-models)` (scripts/test sets it).

mod common;

use llamay_engine::{BatchToken, Context, ContextParams, KvPrecision, Model, Threads};

fn prompt(seed: u32, n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| {
            // Ids 2.. below the vocabulary (and 20,000).
            (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 40_503) >> 7)
                % (vocab.min(20_000) - 2)
                + 2
        })
        .collect()
}

/// Greedy-decodes `steps` tokens after `tokens`, alone, prefilling in `chunk`s: the
/// logits row after every step.
fn alone(
    model: &Model<'_>,
    kv: KvPrecision,
    tokens: &[u32],
    chunk: usize,
    steps: usize,
) -> Vec<Vec<f32>> {
    let mut ctx = model
        .context(ContextParams::new(Threads(2), kv, 512))
        .unwrap();
    let s = ctx.new_sequence();
    let mut rows = Vec::new();
    let mut last = Vec::new();
    for (c, part) in tokens.chunks(chunk).enumerate() {
        let batch: Vec<BatchToken> = part
            .iter()
            .enumerate()
            .map(|(i, &t)| BatchToken {
                seq: s,
                token: t,
                pos: c * chunk + i,
                logits: c * chunk + i + 1 == tokens.len(),
            })
            .collect();
        let out = ctx.decode(&batch).unwrap();
        if !out.is_empty() {
            last = out.row(0).to_vec();
        }
    }
    rows.push(last.clone());
    for _ in 0..steps {
        let id = argmax(&last);
        let pos = ctx.kv().len(s).unwrap();
        let out = ctx
            .decode(&[BatchToken {
                seq: s,
                token: id,
                pos,
                logits: true,
            }])
            .unwrap();
        last = out.row(0).to_vec();
        rows.push(last.clone());
    }
    rows
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The same as `alone` for `target`, but every step's batch also carries `others`:
/// one other sequence decoding and another prefilling its prompt in chunks of 7.
fn crowded(
    model: &Model<'_>,
    kv: KvPrecision,
    target: &[u32],
    chunk: usize,
    steps: usize,
    others: [&[u32]; 2],
) -> Vec<Vec<f32>> {
    let mut ctx: Context<'_> = model
        .context(ContextParams::new(Threads(2), kv, 512))
        .unwrap();
    let s = ctx.new_sequence();
    let busy = ctx.new_sequence();
    let late = ctx.new_sequence();
    // `busy` has its prompt in before the target starts.
    let b: Vec<BatchToken> = others[0]
        .iter()
        .enumerate()
        .map(|(i, &t)| BatchToken {
            seq: busy,
            token: t,
            pos: i,
            logits: i + 1 == others[0].len(),
        })
        .collect();
    let mut busy_next = argmax(ctx.decode(&b).unwrap().row(0));
    let mut late_done = 0usize;
    let mut rows = Vec::new();
    let mut last = Vec::new();
    let mut pushed = 0usize;
    let step = |ctx: &mut Context<'_>,
                mine: Vec<BatchToken>,
                busy_next: &mut u32,
                late_done: &mut usize|
     -> Option<Vec<f32>> {
        let mut batch = Vec::new();
        let bpos = ctx.kv().len(busy).unwrap();
        batch.push(BatchToken {
            seq: busy,
            token: *busy_next,
            pos: bpos,
            logits: true,
        });
        let late_part: Vec<BatchToken> = others[1]
            .iter()
            .enumerate()
            .skip(*late_done)
            .take(7)
            .map(|(i, &t)| BatchToken {
                seq: late,
                token: t,
                pos: i,
                logits: false,
            })
            .collect();
        *late_done += late_part.len();
        let n_mine = mine.len();
        let want_mine = mine.iter().any(|t| t.logits);
        // Interleave: busy, half of mine, the late prompt's chunk, the rest of mine.
        let (a, bb) = mine.split_at(n_mine / 2);
        batch.extend_from_slice(a);
        batch.extend(late_part);
        batch.extend_from_slice(bb);
        let out = ctx.decode(&batch).unwrap();
        *busy_next = argmax(out.row(0));
        want_mine.then(|| out.row(1).to_vec())
    };
    while pushed < target.len() {
        let n = chunk.min(target.len() - pushed);
        let mine: Vec<BatchToken> = (pushed..pushed + n)
            .map(|i| BatchToken {
                seq: s,
                token: target[i],
                pos: i,
                logits: i + 1 == target.len(),
            })
            .collect();
        pushed += n;
        if let Some(r) = step(&mut ctx, mine, &mut busy_next, &mut late_done) {
            last = r;
        }
    }
    rows.push(last.clone());
    for _ in 0..steps {
        let id = argmax(&last);
        let pos = ctx.kv().len(s).unwrap();
        last = step(
            &mut ctx,
            vec![BatchToken {
                seq: s,
                token: id,
                pos,
                logits: true,
            }],
            &mut busy_next,
            &mut late_done,
        )
        .unwrap();
        rows.push(last.clone());
    }
    rows
}

fn check(model: &Model<'_>, kv: KvPrecision, what: &str) {
    let vocab = model.config().n_vocab as u32;
    let target = prompt(1, 45, vocab);
    let others = [prompt(2, 30, vocab), prompt(3, 60, vocab)];
    let reference = alone(model, kv, &target, 512, 8);
    for chunk in [1, 16] {
        let a = alone(model, kv, &target, chunk, 8);
        let same = a.iter().zip(&reference).position(|(x, y)| x != y);
        assert_eq!(
            same, None,
            "{what} {kv:?}: prefill in chunks of {chunk} changed the logits at step {same:?}"
        );
    }
    for chunk in [5, 23] {
        let c = crowded(model, kv, &target, chunk, 8, [&others[0], &others[1]]);
        let same = c.iter().zip(&reference).position(|(x, y)| x != y);
        if let Some(i) = same {
            let d = c[i]
                .iter()
                .zip(&reference[i])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            panic!(
                "{what} {kv:?}: batched with others (chunks of {chunk}) changed the logits at step {i} (max diff {d})"
            );
        }
    }
}

#[test]
fn gemma_logits_do_not_depend_on_the_batch() {
    let Some(path) =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
    else {
        return;
    };
    let model = Model::open(&path, Threads(2)).unwrap();
    for kv in [KvPrecision::F16, KvPrecision::Q8] {
        check(&model, kv, "gemma");
    }
}

/// A mixture runs each expert over the rows that picked it, so a row's neighbours in
/// that matmul change with the batch: its result must not.
#[test]
fn mixture_logits_do_not_depend_on_the_batch() {
    for name in [
        "llama-moe-Q4_K.gguf",
        "qwen2moe-Q8_0.gguf",
        "qwen3moe-F16.gguf",
    ] {
        let model = Model::open(&common::fixture(name), Threads(2)).unwrap();
        check(&model, KvPrecision::F16, name);
    }
}
