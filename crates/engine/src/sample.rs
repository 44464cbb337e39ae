//! Sampling: penalties, then top-k, top-p, min-p, temperature, and a seeded draw —
//! llama.cpp's default chain order. Temperature 0 is greedy.

/// Sampling parameters, validated by [`SamplerParams::validate`].
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerParams {
    /// llama.cpp's defaults.
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerParams {
    pub fn validate(&self) -> Result<(), String> {
        let finite = |name: &str, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number, got {v}"))
            }
        };
        finite("temperature", self.temperature)?;
        finite("top-p", self.top_p)?;
        finite("min-p", self.min_p)?;
        finite("repeat-penalty", self.repeat_penalty)?;
        finite("presence-penalty", self.presence_penalty)?;
        finite("frequency-penalty", self.frequency_penalty)?;
        if self.temperature < 0.0 {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(format!("top-p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min-p must be in [0, 1], got {}", self.min_p));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(format!(
                "repeat-penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        Ok(())
    }
}

/// A seeded sampler (xorshift64*: small, deterministic across platforms).
/// How many of the best tokens a rejected draw checks one by one before masking the
/// whole vocabulary (`Sampler::sample_constrained`).
pub const SCAN: usize = 4096;

pub struct Sampler {
    params: SamplerParams,
    state: u64,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        let state = params.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        Sampler {
            params,
            state,
            candidates: Vec::new(),
        }
    }

    fn next_f32(&mut self) -> f32 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let r = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 40) as f32 / (1u64 << 24) as f32
    }

    /// As [`Sampler::sample`], under a grammar: the drawn token is kept if the grammar
    /// takes it (the rejection rule: a draw from the unconstrained distribution kept
    /// when allowed, else a draw from the masked one, is distributed as the masked
    /// distribution; at temperature 0 it is the masked argmax). On a rejection the
    /// masked chain needs only the `top_k` best allowed tokens (1 when greedy): they
    /// are looked for in descending logit order, a token check each, and only if they
    /// are not among the best [`SCAN`] is the whole vocabulary masked. `None` when the
    /// grammar takes no token at all.
    pub fn sample_constrained(
        &mut self,
        logits: &[f32],
        history: &[u32],
        constraint: &crate::grammar::Constraint,
    ) -> Option<u32> {
        let id = self.sample(logits, history);
        if constraint.accepts(id) {
            return Some(id);
        }
        let logits = self.penalised(logits, history);
        let want = if self.params.temperature == 0.0 {
            1
        } else {
            self.params.top_k
        };
        let mut masked = vec![f32::NEG_INFINITY; logits.len()];
        let mut found = 0;
        if want > 0 {
            let mut order = Vec::new();
            top_k(&logits, SCAN, &mut order);
            for &(t, l) in &order {
                if constraint.accepts(t) {
                    masked[t as usize] = l;
                    found += 1;
                    if found == want {
                        break;
                    }
                }
            }
        }
        if found < want || want == 0 {
            let allowed = constraint.allowed();
            if !allowed.iter().any(|&a| a) {
                return None;
            }
            for ((m, &l), &a) in masked.iter_mut().zip(logits.iter()).zip(&allowed) {
                *m = if a { l } else { f32::NEG_INFINITY };
            }
        }
        // The penalties are in `masked` already.
        let id = self.sample(&masked, &[]);
        constraint.accepts(id).then_some(id)
    }

    /// `logits` with the repetition, presence and frequency penalties applied.
    fn penalised<'l>(&self, logits: &'l [f32], history: &[u32]) -> std::borrow::Cow<'l, [f32]> {
        let p = &self.params;
        let penalised =
            p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if !penalised || history.is_empty() {
            return std::borrow::Cow::Borrowed(logits);
        }
        let mut out = logits.to_vec();
        let recent = &history[history.len().saturating_sub(p.penalty_last_n)..];
        let mut counts = std::collections::HashMap::new();
        for &t in recent {
            *counts.entry(t).or_insert(0u32) += 1;
        }
        for (&t, &c) in &counts {
            if let Some(l) = out.get_mut(t as usize) {
                *l = if *l <= 0.0 {
                    *l * p.repeat_penalty
                } else {
                    *l / p.repeat_penalty
                };
                *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// Whether every pick is the (penalised) argmax: temperature 0.
    pub fn is_greedy(&self) -> bool {
        self.params.temperature == 0.0
    }

    /// Picks the next token from `logits`, given the tokens generated so far (for the
    /// penalties). Non-finite logits are never chosen while a finite one exists.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let logits = self.penalised(logits, history);
        let logits: &[f32] = &logits;
        let p = &self.params;
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        let c = &mut self.candidates;
        // top-k 0: every finite logit, ranked.
        top_k(logits, if p.top_k > 0 { p.top_k } else { usize::MAX }, c);
        if c.is_empty() {
            return argmax(logits);
        }
        // Softmax over the survivors (at temperature 1, as llama.cpp's top-p/min-p see it).
        let probs = |c: &[(u32, f32)], temp: f32| -> Vec<f32> {
            let max = c[0].1;
            let e: Vec<f32> = c.iter().map(|(_, l)| ((l - max) / temp).exp()).collect();
            let s: f32 = e.iter().sum();
            e.into_iter().map(|v| v / s).collect()
        };
        if p.top_p < 1.0 {
            let pr = probs(c, 1.0);
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, q) in pr.iter().enumerate() {
                cum += q;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let max = c[0].1;
            let threshold = max + p.min_p.ln();
            let keep = c.iter().take_while(|(_, l)| *l >= threshold).count();
            c.truncate(keep.max(1));
        }
        let temperature = p.temperature;
        let pr = probs(&self.candidates, temperature);
        let r = self.next_f32();
        let mut cum = 0.0;
        for (i, q) in pr.iter().enumerate() {
            cum += q;
            if r < cum {
                return self.candidates[i].0;
            }
        }
        self.candidates.last().map_or(0, |c| c.0)
    }
}

/// Sampling's order of candidates: descending logit, ties by id. A total order, so the
/// first k under it are one list however they are found.
fn by_rank(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Up to this k, [`top_k`] keeps the best k sorted in one pass; above it, each insert
/// shifts too much and a selection over all candidates is cheaper.
const TOP_K_PASS: usize = 256;

/// The `k` best finite logits in [`by_rank`] order, into `out` (fewer if fewer are
/// finite). For a small k, one pass that keeps the best k sorted: a logit joins only if
/// it beats the k-th, which after the first few thousand of a vocabulary is rare, and a
/// block of 64 whose largest value is below the k-th is skipped with one vectorised max
/// (copying a 262k vocabulary into candidates and selecting from them cost Gemma
/// 0.67–0.79 ms a token; this pass 0.08–0.11 ms). For a large k, that copy and a
/// selection, then a sort of the k.
fn top_k(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    if k == 0 {
        return;
    }
    if k > TOP_K_PASS {
        out.extend(
            (logits.iter().enumerate())
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l)),
        );
        if out.len() > k {
            out.select_nth_unstable_by(k, by_rank);
            out.truncate(k);
        }
        out.sort_unstable_by(by_rank);
        return;
    }
    const BLOCK: usize = 64;
    for (b, block) in logits.chunks(BLOCK).enumerate() {
        if let Some(worst) = out.get(k - 1) {
            // `max` skips NaN; a block is skipped only when strictly below the k-th
            // (equal values, -0.0 against +0.0 included, go through `by_rank` below).
            let top = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if top < worst.1 {
                continue;
            }
        }
        for (j, &l) in block.iter().enumerate() {
            if !l.is_finite() {
                continue;
            }
            let cand = ((b * BLOCK + j) as u32, l);
            if out.len() == k && by_rank(&cand, &out[k - 1]).is_ge() {
                continue;
            }
            let at = out.partition_point(|x| by_rank(x, &cand).is_lt());
            out.insert(at, cand);
            out.truncate(k);
        }
    }
}

/// The index of the largest finite logit (lowest index on ties); 0 if none is finite.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = None::<(usize, f32)>;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_the_head_of_the_full_ranking() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) as u32
        };
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
        for case in 0..200 {
            let n = [1, 7, 64, 65, 300, 5000][case % 6];
            // Few distinct values (many ties), and the non-finite and signed zeros.
            let logits: Vec<f32> = (0..n)
                .map(|_| match next() % 20 {
                    0 => specials[next() as usize % specials.len()],
                    _ => (next() % 41) as f32 / 8.0 - 2.5,
                })
                .collect();
            let mut all: Vec<(u32, f32)> = (logits.iter().enumerate())
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l))
                .collect();
            all.sort_by(by_rank);
            // Both ways: the one pass (k <= TOP_K_PASS) and the selection.
            for k in [1, 2, 40, 64, 100, TOP_K_PASS, TOP_K_PASS + 1, 1000, n + 3] {
                let mut got = Vec::new();
                top_k(&logits, k, &mut got);
                let want = &all[..k.min(all.len())];
                assert_eq!(got.len(), want.len(), "n {n} k {k}");
                for (g, w) in got.iter().zip(want) {
                    assert!(g.0 == w.0 && g.1.to_bits() == w.1.to_bits(), "n {n} k {k}");
                }
            }
        }
    }

    /// Time of one sampling step over Gemma's 262,144 logits with llama.cpp's default
    /// chain (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8), best of 50.
    /// `cargo test --release -p llamay-engine --lib sample::tests::bench -- --ignored --nocapture`
    #[test]
    #[ignore = "timing, not a check"]
    fn bench() {
        let mut seed = 3u64;
        let logits: Vec<f32> = (0..262_144)
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                (seed >> 40) as f32 / (1u64 << 24) as f32 * 30.0 - 15.0
            })
            .collect();
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.8,
            ..Default::default()
        });
        let best = (0..50)
            .map(|_| {
                let t = std::time::Instant::now();
                std::hint::black_box(s.sample(&logits, &[]));
                t.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::INFINITY, f64::min);
        eprintln!("sample over 262144 logits: {best:.3} ms");
    }

    #[test]
    fn greedy_and_seeded() {
        let logits = [0.1, 3.0, 2.9, f32::NAN, -1.0];
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&logits, &[]), 1);
        let draw = |seed| {
            let mut s = Sampler::new(SamplerParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..Default::default()
            });
            (0..50).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7), "same seed, same draws");
        assert!(draw(7).iter().all(|&t| t != 3), "NaN never drawn");
        assert!(draw(7).contains(&2) && draw(7).contains(&1));
    }

    #[test]
    fn filters_and_penalties() {
        let logits = [5.0, 4.0, 0.0, -3.0];
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        });
        assert!((0..20).all(|_| s.sample(&logits, &[]) == 0));
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.0,
            repeat_penalty: 10.0,
            ..Default::default()
        });
        assert_eq!(
            s.sample(&logits, &[0]),
            1,
            "repeat penalty demotes the seen token"
        );
        let bad = SamplerParams {
            top_p: 2.0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("top-p"));
        assert!(
            SamplerParams {
                temperature: f32::NAN,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
    }
}
