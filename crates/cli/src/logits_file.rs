//! llama.cpp's base-logits file (`llama-perplexity --kl-divergence-base FILE`), written
//! and read byte-compatibly, and the statistics its `--kl-divergence` prints — so a
//! base file from either program can be scored by the other.
//!
//! Layout (little-endian, as llama.cpp writes it on every platform it runs on):
//! `_logits_`, `n_ctx: u32`, `n_vocab: i32`, `n_chunk: i32`, `n_chunk × n_ctx` tokens
//! (`i32`), then per chunk `n_ctx - 1 - n_ctx/2` rows of `nv = 2·⌈n_vocab/2⌉ + 4` `u16`:
//! the row's scale and minimum log-probability as two `f32`, then each token's
//! log-probability quantised to 16 bits above the minimum (the minimum floored at 16
//! below the maximum logit). The arithmetic below follows llama.cpp's, float for float.

use anyhow::{Context, bail};
use llamay_formats::nearest_int;
use std::io::{Read, Write};

const MAGIC: &[u8; 8] = b"_logits_";

/// `u16` per row: the two floats, the vocabulary rounded up to even.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Quantises one position's logits into `out` (a row of [`row_len`]) and returns the
/// negative log-likelihood of `tok`, as llama.cpp's `log_softmax` for the base file.
pub fn encode_row(logits: &[f32], tok: usize, out: &mut [u16]) -> f64 {
    let mut max = logits[0];
    let mut min = logits[0];
    for &l in &logits[1..] {
        max = max.max(l);
        min = min.min(l);
    }
    min = min.max(max - 16.0);
    let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    let log_sum_exp = sum_exp.ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0;
    out[..2].copy_from_slice(&split(scale));
    out[2..4].copy_from_slice(&split(min_log_prob));
    let q = &mut out[4..];
    q.fill(0);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (o, &l) in q.iter_mut().zip(logits) {
            if l > min {
                *o = nearest_int(inv * (l - min)) as u16;
            }
        }
    }
    f64::from(max + log_sum_exp - logits[tok])
}

fn split(x: f32) -> [u16; 2] {
    let b = x.to_le_bytes();
    [
        u16::from_le_bytes([b[0], b[1]]),
        u16::from_le_bytes([b[2], b[3]]),
    ]
}

fn join(lo: u16, hi: u16) -> f32 {
    let (a, b) = (lo.to_le_bytes(), hi.to_le_bytes());
    f32::from_le_bytes([a[0], a[1], b[0], b[1]])
}

/// Writes a base file: the header and tokens now, then one chunk's rows at a time.
pub struct Writer<W: Write> {
    out: W,
    row: Vec<u16>,
    bytes: Vec<u8>,
}

impl<W: Write> Writer<W> {
    pub fn new(mut out: W, n_ctx: usize, n_vocab: usize, tokens: &[u32]) -> anyhow::Result<Self> {
        let n_chunk = tokens.len() / n_ctx;
        out.write_all(MAGIC)?;
        out.write_all(&u32::try_from(n_ctx)?.to_le_bytes())?;
        out.write_all(&i32::try_from(n_vocab)?.to_le_bytes())?;
        out.write_all(&i32::try_from(n_chunk)?.to_le_bytes())?;
        for &t in &tokens[..n_chunk * n_ctx] {
            out.write_all(&(t as i32).to_le_bytes())?;
        }
        Ok(Writer {
            out,
            row: vec![0; row_len(n_vocab)],
            bytes: Vec::new(),
        })
    }

    /// One scored position: its logits and the token that followed; returns its NLL.
    pub fn row(&mut self, logits: &[f32], next: u32) -> anyhow::Result<f64> {
        let nll = encode_row(logits, next as usize, &mut self.row);
        self.bytes.clear();
        self.bytes
            .extend(self.row.iter().flat_map(|v| v.to_le_bytes()));
        self.out.write_all(&self.bytes)?;
        Ok(nll)
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

/// A base file opened for reading: its header checked against its length before
/// anything is allocated, then one chunk's rows at a time.
#[derive(Debug)]
pub struct Reader<R: Read> {
    input: R,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    pub tokens: Vec<u32>,
}

impl<R: Read> Reader<R> {
    /// `len`: the file's size, which must be exactly what the header declares.
    pub fn open(mut input: R, len: u64, what: &str) -> anyhow::Result<Self> {
        let mut head = [0u8; 20];
        input
            .read_exact(&mut head)
            .with_context(|| format!("{what}: shorter than a base-logits header (20 bytes)"))?;
        if &head[..8] != MAGIC {
            bail!(
                "{what}: not a base-logits file (it does not start with `_logits_`; llama-perplexity --kl-divergence-base writes them)"
            );
        }
        let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
        let n_ctx = word(8) as usize;
        let n_vocab = word(12) as i32;
        let n_chunk = word(16) as i32;
        if !(8..=1 << 20).contains(&n_ctx) {
            bail!(
                "{what}: a context of {n_ctx} tokens (8 to {} supported)",
                1 << 20
            );
        }
        if n_vocab <= 0 || n_chunk <= 0 {
            bail!("{what}: n_vocab {n_vocab} and n_chunk {n_chunk} must be positive");
        }
        let (n_vocab, n_chunk) = (n_vocab as usize, n_chunk as usize);
        let rows = n_ctx - 1 - n_ctx / 2;
        let expect = (n_chunk as u64)
            .checked_mul(n_ctx as u64 * 4)
            .and_then(|t| {
                (n_chunk as u64)
                    .checked_mul(rows as u64)?
                    .checked_mul(row_len(n_vocab) as u64 * 2)?
                    .checked_add(t)
            })
            .and_then(|b| b.checked_add(20));
        if expect != Some(len) {
            bail!(
                "{what}: {len} bytes, but its header (n_ctx {n_ctx}, n_vocab {n_vocab}, {n_chunk} chunks) declares {} — truncated or not a base-logits file",
                expect.map_or("more than 2⁶⁴".to_string(), |e| e.to_string())
            );
        }
        let mut raw = vec![0u8; n_chunk * n_ctx * 4];
        input.read_exact(&mut raw)?;
        let mut tokens = Vec::with_capacity(n_chunk * n_ctx);
        for c in raw.chunks_exact(4) {
            let t = i32::from_le_bytes(c.try_into().expect("4 bytes"));
            if t < 0 || t as usize >= n_vocab {
                bail!("{what}: token {t} is outside its vocabulary of {n_vocab}");
            }
            tokens.push(t as u32);
        }
        Ok(Reader {
            input,
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
        })
    }

    /// The next chunk's rows, `(n_ctx - 1 - n_ctx/2) × row_len(n_vocab)` values.
    pub fn chunk(&mut self) -> anyhow::Result<Vec<u16>> {
        let n = (self.n_ctx - 1 - self.n_ctx / 2) * row_len(self.n_vocab);
        let mut raw = vec![0u8; n * 2];
        self.input.read_exact(&mut raw)?;
        Ok(raw
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect())
    }
}

/// llama.cpp's `kl_divergence_result`, accumulated as it accumulates it.
#[derive(Default)]
pub struct Kld {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    n_same_top: usize,
    count: usize,
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

impl Kld {
    /// One position: our logits against the base row, `tok` the token that followed.
    pub fn add(&mut self, logits: &[f32], base: &[u16], tok: usize) {
        let mut max_logit = logits[0];
        let mut imax = 0;
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max_logit {
                max_logit = l;
                imax = i;
            }
        }
        let sum_exp: f64 = logits
            .iter()
            .map(|&l| f64::from((l - max_logit).exp()))
            .sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let scale = join(base[0], base[1]);
        let min_log_prob = join(base[2], base[3]);
        let q = &base[4..];
        let nll = max_logit + log_sum_exp - logits[tok];
        self.sum_nll += f64::from(nll);
        self.sum_nll2 += f64::from(nll * nll);
        let nll_base = -(scale * f32::from(q[tok]) + min_log_prob);
        self.sum_nll_base += f64::from(nll_base);
        self.sum_nll_base2 += f64::from(nll_base * nll_base);
        self.sum_nll_nll_base += f64::from(nll * nll_base);
        let max_lse = max_logit + log_sum_exp;
        let mut sum = 0f64;
        let (mut imax_base, mut p_log_base_max) = (0usize, 0f32);
        for (i, (&qi, &l)) in q.iter().zip(logits).enumerate() {
            let p_log_base = scale * f32::from(qi) + min_log_prob;
            if i == 0 || p_log_base > p_log_base_max {
                p_log_base_max = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += f64::from(p_base * (p_log_base - l + max_lse));
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += f64::from(p_diff);
        let p2 = f64::from(p_diff) * f64::from(p_diff);
        self.sum_p_diff2 += p2;
        self.sum_p_diff4 += p2 * p2;
        self.kld_values.push(sum as f32);
        self.p_diff_values.push(p_diff);
    }

    fn mean_unc(sum: f64, sum2: f64, n: usize) -> (f64, f64) {
        if n < 1 {
            return (0.0, 0.0);
        }
        let f = sum / n as f64;
        let df = sum2 / n as f64 - f * f;
        let df = if df > 0.0 && n > 10 {
            (df / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        (f, df)
    }

    /// Cov(ln PPL(Q), ln PPL(base)). Where it makes the variance of their difference
    /// slightly negative (two identical runs), the uncertainties below print 0, not
    /// llama.cpp's NaN.
    fn covariance(&self) -> f64 {
        let n = self.count as f64;
        if self.count < 10 {
            return 0.0;
        }
        (self.sum_nll_nll_base / n - (self.sum_nll / n) * (self.sum_nll_base / n)) / (n - 1.0)
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Mean KL divergence and the share of positions whose top token agrees.
    #[cfg(test)]
    pub fn summary(&self) -> (f64, f64) {
        (
            Self::mean_unc(self.sum_kld, self.sum_kld2, self.count).0,
            self.n_same_top as f64 / self.count.max(1) as f64,
        )
    }

    /// The running line llama.cpp prints after each chunk.
    pub fn chunk_line(&self, chunk: usize) -> String {
        let lp = Self::mean_unc(self.sum_nll, self.sum_nll2, self.count);
        let lb = Self::mean_unc(self.sum_nll_base, self.sum_nll_base2, self.count);
        let cov = self.covariance();
        let ratio_unc = (lp.1 * lp.1 + lb.1 * lb.1 - 2.0 * cov).max(0.0).sqrt();
        let kl = Self::mean_unc(self.sum_kld, self.sum_kld2, self.count);
        let mse = Self::mean_unc(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.0.sqrt();
        let top = self.n_same_top as f64 / self.count as f64;
        let top_unc = (top * (1.0 - top) / (self.count as f64 - 1.0)).sqrt();
        format!(
            "{chunk:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            lp.0.exp(),
            lp.0.exp() * lp.1,
            lp.0 - lb.0,
            ratio_unc,
            kl.0,
            kl.1,
            100.0 * rms,
            100.0 * 0.5 / rms * mse.1,
            100.0 * top,
            100.0 * top_unc
        )
    }

    /// The closing statistics, in llama.cpp's words and order.
    pub fn report(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let mut kv = self.kld_values.clone();
        let mut pd = self.p_diff_values.clone();
        kv.sort_by(f32::total_cmp);
        pd.sort_by(f32::total_cmp);
        let pct = |v: &[f32], f: f32| -> f32 {
            if f <= 0.0 {
                return v[0];
            }
            if f >= 1.0 {
                return v[v.len() - 1];
            }
            let p = f * (v.len() - 1) as f32;
            let ip = p as usize;
            let p = p - ip as f32;
            (1.0 - p) * v[ip] + p * v[(ip + 1).min(v.len() - 1)]
        };
        let median = |v: &[f32]| -> f32 {
            let n = v.len();
            if n.is_multiple_of(2) {
                0.5 * (v[n / 2] + v[n / 2 - 1])
            } else {
                v[n / 2]
            }
        };
        let lp = Self::mean_unc(self.sum_nll, self.sum_nll2, self.count);
        let lb = Self::mean_unc(self.sum_nll_base, self.sum_nll_base2, self.count);
        let (ppl, ppl_unc) = (lp.0.exp(), lp.0.exp() * lp.1);
        let (pplb, pplb_unc) = (lb.0.exp(), lb.0.exp() * lb.1);
        let cov = self.covariance();
        let ratio = lp.0 - lb.0;
        let ratio_unc = (lp.1 * lp.1 + lb.1 * lb.1 - 2.0 * cov).max(0.0).sqrt();
        let diff_unc = (ppl_unc * ppl_unc + pplb_unc * pplb_unc - 2.0 * ppl * pplb * cov)
            .max(0.0)
            .sqrt();
        let _ = writeln!(s, "====== Perplexity statistics ======");
        let _ = writeln!(
            s,
            "Mean PPL(Q)                   : {ppl:10.6} ± {ppl_unc:10.6}"
        );
        let _ = writeln!(
            s,
            "Mean PPL(base)                : {pplb:10.6} ± {pplb_unc:10.6}"
        );
        let _ = writeln!(
            s,
            "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
            100.0 * cov / (lp.1 * lb.1)
        );
        let _ = writeln!(
            s,
            "Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6} ± {ratio_unc:10.6}"
        );
        let _ = writeln!(
            s,
            "Mean PPL(Q)/PPL(base)         : {:10.6} ± {:10.6}",
            ratio.exp(),
            ratio.exp() * ratio_unc
        );
        let _ = writeln!(
            s,
            "Mean PPL(Q)-PPL(base)         : {:10.6} ± {diff_unc:10.6}",
            ppl - pplb
        );
        let _ = writeln!(s);
        let kl = Self::mean_unc(self.sum_kld, self.sum_kld2, self.count);
        let _ = writeln!(s, "====== KL divergence statistics ======");
        let _ = writeln!(s, "Mean    KLD: {:10.6} ± {:10.6}", kl.0, kl.1);
        let _ = writeln!(s, "Maximum KLD: {:10.6}", kv[kv.len() - 1]);
        for (name, f) in [
            ("99.9%", 0.999),
            ("99.0%", 0.99),
            ("95.0%", 0.95),
            ("90.0%", 0.9),
        ] {
            let _ = writeln!(s, "{name}   KLD: {:10.6}", pct(&kv, f));
        }
        let _ = writeln!(s, "Median  KLD: {:10.6}", median(&kv));
        for (name, f) in [
            ("10.0%", 0.1),
            (" 5.0%", 0.05),
            (" 1.0%", 0.01),
            (" 0.1%", 0.001),
        ] {
            let _ = writeln!(s, "{name}   KLD: {:10.6}", pct(&kv, f));
        }
        let _ = writeln!(s, "Minimum KLD: {:10.6}", kv[0]);
        let _ = writeln!(s);
        let _ = writeln!(s, "====== Token probability statistics ======");
        let pdm = Self::mean_unc(self.sum_p_diff, self.sum_p_diff2, self.count);
        let _ = writeln!(
            s,
            "Mean    Δp: {:6.3} ± {:5.3} %",
            100.0 * pdm.0,
            100.0 * pdm.1
        );
        let _ = writeln!(s, "Maximum Δp: {:6.3}%", 100.0 * pd[pd.len() - 1]);
        for (name, f) in [
            ("99.9%", 0.999),
            ("99.0%", 0.99),
            ("95.0%", 0.95),
            ("90.0%", 0.9),
            ("75.0%", 0.75),
        ] {
            let _ = writeln!(s, "{name}   Δp: {:6.3}%", 100.0 * pct(&pd, f));
        }
        let _ = writeln!(s, "Median  Δp: {:6.3}%", 100.0 * median(&pd));
        for (name, f) in [
            ("25.0%", 0.25),
            ("10.0%", 0.1),
            (" 5.0%", 0.05),
            (" 1.0%", 0.01),
            (" 0.1%", 0.001),
        ] {
            let _ = writeln!(s, "{name}   Δp: {:6.3}%", 100.0 * pct(&pd, f));
        }
        let _ = writeln!(s, "Minimum Δp: {:6.3}%", 100.0 * pd[0]);
        let mse = Self::mean_unc(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.0.sqrt();
        let _ = writeln!(
            s,
            "RMS Δp    : {:6.3} ± {:5.3} %",
            100.0 * rms,
            100.0 * 0.5 / rms * mse.1
        );
        let top = self.n_same_top as f64 / self.count as f64;
        let _ = writeln!(
            s,
            "Same top p: {:6.3} ± {:5.3} %",
            100.0 * top,
            100.0 * (top * (1.0 - top) / (self.count as f64 - 1.0)).sqrt()
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back_and_scores_itself_at_zero() {
        let (n_ctx, n_vocab) = (16usize, 7usize);
        let tokens: Vec<u32> = (0..40).map(|i| (i * 3 % 7) as u32).collect();
        let logits = |p: usize| -> Vec<f32> {
            (0..n_vocab)
                .map(|v| ((p * 7 + v * 13) % 11) as f32 * 0.7 - 3.0)
                .collect()
        };
        let mut buf = Vec::new();
        let mut w = Writer::new(&mut buf, n_ctx, n_vocab, &tokens).unwrap();
        let first = n_ctx / 2;
        for c in 0..2 {
            for p in first..n_ctx - 1 {
                w.row(&logits(c * n_ctx + p), tokens[c * n_ctx + p + 1])
                    .unwrap();
            }
        }
        w.finish().unwrap();
        let mut r = Reader::open(&buf[..], buf.len() as u64, "t").unwrap();
        assert_eq!((r.n_ctx, r.n_vocab, r.n_chunk), (16, 7, 2));
        assert_eq!(r.tokens, tokens[..32]);
        let mut k = Kld::default();
        for c in 0..2 {
            let rows = r.chunk().unwrap();
            for (i, p) in (first..n_ctx - 1).enumerate() {
                let row = &rows[i * row_len(n_vocab)..(i + 1) * row_len(n_vocab)];
                k.add(
                    &logits(c * n_ctx + p),
                    row,
                    r.tokens[c * n_ctx + p + 1] as usize,
                );
            }
        }
        let (kld, top) = k.summary();
        // What remains is the 16-bit quantisation of the base log-probabilities.
        assert!(
            kld.abs() < 1e-5,
            "a file scored against its own logits: {kld}"
        );
        assert_eq!(top, 1.0);
        // Truncated, or a wrong magic: refused by name.
        assert!(
            Reader::open(&buf[..buf.len() - 1], buf.len() as u64 - 1, "t")
                .unwrap_err()
                .to_string()
                .contains("declares")
        );
        let mut bad = buf.clone();
        bad[0] = b'x';
        assert!(
            Reader::open(&bad[..], bad.len() as u64, "t")
                .unwrap_err()
                .to_string()
                .contains("_logits_")
        );
    }
}
