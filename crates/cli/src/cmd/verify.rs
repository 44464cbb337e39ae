//! `llamay verify`: how much a quantised KV cache moves this file's output. For each
//! precision, the mean over every position of a real text of the total-variation
//! distance between the next-token distribution computed with the exact cache and with
//! the quantised one — the probability a sampler notices. The bound is 5%; a teeth row
//! runs the same comparison with a 1-bit cache, which must fail, so the bound is never
//! vacuous (see ../shared/seeds/models-and-formats.txt, "The KV cache, in three
//! precisions").

use crate::ModelArg;
use crate::session;
use anyhow::{Context as _, bail};
use llamay_engine::{BatchToken, Context, ContextParams, KvPrecision, SeqId};
use llamay_gguf::MappedModel;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Text to run (default: a built-in English passage).
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// Quantised precisions to measure, comma-separated.
    #[arg(long, default_value = "vq8,q8", value_delimiter = ',')]
    kv: Vec<String>,
    /// Most tokens of the text to run (default: all of it, up to 2048 and the model's
    /// training context).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    #[arg(short = 't', long)]
    threads: Option<usize>,
}

/// The bound on the mean total-variation distance.
const BOUND: f64 = 0.05;
/// Tokens per decode call (the logits of a chunk are compared, then dropped).
const CHUNK: usize = 64;
const DEFAULT_MAX_TOKENS: usize = 2048;

/// Written for this purpose (plain, varied English: narrative, numbers, a list, a
/// little dialogue), so `verify MODEL` alone measures something real.
const PASSAGE: &str = "The harbour town woke slowly that autumn. Fishing boats came in \
before dawn, their decks stacked with crates of mackerel and the odd lobster, and by \
seven the market hall was loud with prices called across the stalls. Mara ran the \
bakery on the corner of Rope Street, as her mother had for thirty-one years before \
her. She opened at six, sold the first loaves by half past, and kept a ledger in \
pencil because, she said, ink made mistakes permanent.\n\nOn the second Tuesday of \
October a letter arrived from the council. The old sea wall, built in 1887 and \
repaired in 1953, would be replaced. The work would take fourteen months, close the \
lower road, and cost a little over four million pounds. A public meeting was called \
for the following Thursday in the school gymnasium.\n\n\"They'll ruin the view,\" said \
old Tomas, who had not missed a meeting in forty years. \"They'll save the houses,\" \
answered the harbour master, a quiet woman named Ines who had watched the spring tides \
climb a little higher every year. Both of them were right, which is why the meeting \
lasted until eleven.\n\nIn the end the town agreed on three things. First, the new \
wall would follow the line of the old one, so the promenade would stay where it had \
always been. Second, the stones of the old wall would be numbered, stored, and used \
again for the steps down to the beach. Third, the bakery would stay open during the \
work, because, as someone pointed out to general laughter, nobody could be expected \
to argue about concrete on an empty stomach.\n\nWinter came early. The contractors \
set up their cabins on the car park and worked by floodlight when the days grew \
short. Children gathered at the fence after school to watch the cranes swing steel \
into place. Mara began baking an extra tray of rolls each morning and carried them \
down to the site in a wicker basket, and by January the foreman knew the price of \
every loaf in the shop. When the storms of February came, the half-built wall held, \
and the water that would once have reached the doors of Rope Street stopped a good \
ten metres short. The town measured the difference in photographs, in sandbags not \
needed, and in the simple fact that, for the first time in years, nobody's kitchen \
flooded.";

struct Row {
    precision: KvPrecision,
    seq: SeqId,
    sum: f64,
    max: f64,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    let mut measured = Vec::new();
    for name in &args.kv {
        let p = session::kv(name.trim())?;
        if matches!(p, KvPrecision::F32) {
            bail!(
                "--kv f32: f32 is the exact cache every row is compared against; give quantised precisions (f16, vq8, q8)"
            );
        }
        if !measured.contains(&p) {
            measured.push(p);
        }
    }
    let text = match &args.file {
        Some(f) => std::fs::read(f).with_context(|| format!("reading {}", f.display()))?,
        None => PASSAGE.as_bytes().to_vec(),
    };
    let max_tokens = match args.ctx_size {
        Some(0) => bail!("-c 0: run at least 2 tokens"),
        Some(n) if n > 1 << 20 => bail!("-c {n}: at most {} tokens", 1 << 20),
        Some(n) => n,
        None => DEFAULT_MAX_TOKENS,
    };
    let threads = session::threads(args.threads)?;
    let mapped = MappedModel::open(path)?;
    let gguf = mapped.parse()?;
    let (model, tok) = session::load(&mapped, &gguf, threads)?;
    let mut tokens = tok.encode(&text, true, false);
    // Past the training context the comparison would measure extrapolation, not the
    // cache (and a learned position table ends there).
    tokens.truncate(max_tokens.min(model.config().n_ctx_train));
    if tokens.len() < 2 {
        bail!(
            "the text is {} token(s); at least 2 are needed",
            tokens.len()
        );
    }
    let n = tokens.len();
    let make = |p: KvPrecision| -> anyhow::Result<Context<'_>> {
        model
            .context(ContextParams::new(threads, p, n))
            .map_err(anyhow::Error::from)
    };
    let mut exact = make(KvPrecision::F32)?;
    let exact_seq = exact.new_sequence();
    let mut rows: Vec<(Context<'_>, Row)> = Vec::new();
    for &p in measured.iter().chain(&[KvPrecision::OneBit]) {
        let mut ctx = make(p)?;
        let seq = ctx.new_sequence();
        rows.push((
            ctx,
            Row {
                precision: p,
                seq,
                sum: 0.0,
                max: 0.0,
            },
        ));
    }
    eprintln!(
        "verify: {n} tokens, {} precision(s) against the exact cache, plus the 1-bit teeth row",
        measured.len()
    );
    let mut p_exact = Vec::new();
    let mut p_other = Vec::new();
    for (c, chunk) in tokens.chunks(CHUNK).enumerate() {
        let base = c * CHUNK;
        let batch = |seq: SeqId| -> Vec<BatchToken> {
            (chunk.iter().enumerate())
                .map(|(i, &token)| BatchToken {
                    seq,
                    token,
                    pos: base + i,
                    logits: true,
                })
                .collect()
        };
        let want = exact.decode(&batch(exact_seq))?;
        for (ctx, row) in &mut rows {
            let got = ctx.decode(&batch(row.seq))?;
            for i in 0..chunk.len() {
                softmax(want.row(i), &mut p_exact);
                softmax(got.row(i), &mut p_other);
                let tv = 0.5
                    * p_exact
                        .iter()
                        .zip(&p_other)
                        .map(|(a, b)| (a - b).abs())
                        .sum::<f64>();
                row.sum += tv;
                row.max = row.max.max(tv);
            }
        }
    }

    let cfg = model.config();
    let (kd, vd, nl) = (cfg.k_dim(), cfg.v_dim(), cfg.n_layer);
    let f32_bytes = KvPrecision::F32.bytes_per_position(kd, vd) * nl;
    let mut out = crate::out::stdout();
    writeln!(
        out,
        "| precision | KV bytes/token | of f32 | mean TV | max TV | bound | verdict |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---|")?;
    writeln!(
        out,
        "| f32 | {f32_bytes} | 100% | 0 (reference) | 0 | | exact |"
    )?;
    let mut recommended = "f32";
    let mut teeth_ok = true;
    for (_, row) in &rows {
        let mean = row.sum / n as f64;
        let pass = mean <= BOUND;
        let teeth = row.precision == KvPrecision::OneBit;
        let bytes = row.precision.bytes_per_position(kd, vd) * nl;
        let verdict = match (teeth, pass) {
            (false, true) => "PASS",
            (false, false) => "FAIL",
            (true, false) => "FAIL (teeth: must fail, and does)",
            (true, true) => "PASS — the teeth row passed: the bound is vacuous on this file",
        };
        if teeth && pass {
            teeth_ok = false;
        }
        if row.precision == KvPrecision::Vq8 && pass {
            recommended = "vq8";
        }
        let name = if teeth {
            "1-bit (teeth)"
        } else {
            row.precision.name()
        };
        writeln!(
            out,
            "| {name} | {bytes} | {:.0}% | {:.2}% | {:.2}% | {:.0}% | {verdict} |",
            100.0 * bytes as f64 / f32_bytes as f64,
            100.0 * mean,
            100.0 * row.max,
            100.0 * BOUND,
        )?;
    }
    writeln!(out)?;
    let why = match recommended {
        "vq8" => "vq8 clears the bound at about 2/3 of f32's memory",
        _ if measured.contains(&KvPrecision::Vq8) => {
            "vq8 moves the output past the bound on this file"
        }
        _ => "vq8 was not measured (add it to --kv)",
    };
    writeln!(out, "recommended: --kv {recommended} ({why})")?;
    out.flush()?;
    if !teeth_ok {
        bail!(
            "the 1-bit teeth row passed the bound: this text cannot tell a healthy cache from a destroyed one; use a longer or more varied text (-f)"
        );
    }
    Ok(())
}

/// `out = softmax(logits)` in f64.
fn softmax(logits: &[f32], out: &mut Vec<f64>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    out.clear();
    out.extend(logits.iter().map(|&l| f64::from(l - max).exp()));
    let sum: f64 = out.iter().sum();
    out.iter_mut().for_each(|p| *p /= sum);
}
