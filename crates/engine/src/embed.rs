//! Sentence embeddings: texts encoded together, each sequence's final states pooled
//! into one vector (`config::Pooling`), as llama.cpp's `llama-embedding` computes them;
//! a cross-encoder's relevance scores (rank pooling) through its classification head.

use crate::batch::BatchToken;
use crate::config::Pooling;
use crate::context::Context;
use crate::cpu::linear;
use crate::{DecodeError, SeqId};

/// Most tokens one encoding batch carries (texts are grouped up to it).
pub const EMBED_BATCH_TOKENS: usize = 2048;
/// Most texts one encoding batch carries.
pub const EMBED_BATCH_SEQS: usize = 64;

/// The KV budget (positions per layer) a decoder's context needs for
/// [`Context::embed`]'s batches: every sequence of a batch holds whole pages. (An
/// encoder's context holds no pages whatever its budget.)
pub fn embed_kv_budget(n_ctx: usize) -> usize {
    EMBED_BATCH_TOKENS.max(n_ctx) + EMBED_BATCH_SEQS * crate::kv::PAGE
}

impl Context<'_> {
    /// One embedding per text (token ids), `pooling` over its final hidden states,
    /// unnormalised. Texts are encoded together in batches of at most
    /// [`EMBED_BATCH_TOKENS`] tokens and [`EMBED_BATCH_SEQS`] texts, each text whole in
    /// one batch and in its own sequence, freed afterwards. A text longer than the
    /// context is an error (`ContextFull`), as is an empty one (`EmptyBatch`).
    pub fn embed(
        &mut self,
        texts: &[&[u32]],
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>, DecodeError> {
        let mut out = Vec::with_capacity(texts.len());
        let mut start = 0;
        while start < texts.len() {
            // The texts of this batch: at least one, then while they fit.
            let mut end = start + 1;
            let mut tokens = texts[start].len();
            while end < texts.len()
                && end - start < EMBED_BATCH_SEQS
                && tokens + texts[end].len() <= EMBED_BATCH_TOKENS
            {
                tokens += texts[end].len();
                end += 1;
            }
            out.extend(self.embed_batch(&texts[start..end], pooling)?);
            start = end;
        }
        Ok(out)
    }

    fn embed_batch(
        &mut self,
        texts: &[&[u32]],
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>, DecodeError> {
        if texts.iter().any(|t| t.is_empty()) {
            return Err(DecodeError::EmptyBatch);
        }
        let seqs: Vec<SeqId> = texts.iter().map(|_| self.new_sequence()).collect();
        let batch: Vec<BatchToken> = (texts.iter().zip(&seqs))
            .flat_map(|(t, &seq)| {
                t.iter().enumerate().map(move |(pos, &token)| BatchToken {
                    seq,
                    token,
                    pos,
                    logits: true,
                })
            })
            .collect();
        let hidden = self.hidden(&batch);
        for &s in &seqs {
            // Made above, so it exists.
            let _ = self.kv_mut().free(s);
        }
        let hidden = hidden?;
        let mut out = Vec::with_capacity(texts.len());
        let mut first = 0;
        for t in texts {
            let rows = &hidden.values[first * hidden.n_embd..(first + t.len()) * hidden.n_embd];
            let mut v = Vec::new();
            pooling.apply(rows, hidden.n_embd, &mut v);
            out.push(v);
            first += t.len();
        }
        if pooling == Pooling::Rank {
            out = self.classify(&out);
        }
        Ok(out)
    }

    /// Pooled states (one row per text) through the classification head, as llama.cpp's
    /// rank pooling: `cls` then tanh, then `cls.output`, each where the file has it; no
    /// sigmoid or softmax (a BERT reranker's score is the raw logit). Without a head
    /// (the load refuses rank pooling then) the rows come back as they are.
    fn classify(&self, rows: &[Vec<f32>]) -> Vec<Vec<f32>> {
        let Some(head) = &self.model.weights.classifier else {
            return rows.to_vec();
        };
        let mut act = crate::cpu::MatmulInput::default();
        let mut x = rows.concat();
        let mut y = Vec::new();
        if let Some(dense) = &head.dense {
            linear(dense, &x, &mut act, &mut y, &self.pool);
            y.iter_mut()
                .for_each(|v| *v = llamay_kernels::math::tanh(*v));
            std::mem::swap(&mut x, &mut y);
        }
        if let Some(out) = &head.out {
            linear(out, &x, &mut act, &mut y, &self.pool);
            std::mem::swap(&mut x, &mut y);
        }
        let width = x.len() / rows.len().max(1);
        x.chunks(width.max(1)).map(<[f32]>::to_vec).collect()
    }
}

/// `v` scaled as llama.cpp's `common_embd_normalize` does for `--embd-normalize n`:
/// -1 none, 0 max-absolute scaled to 32760 (int16 range), 1 taxicab, 2 euclidean
/// (the default), p > 2 the p-norm.
pub fn normalize(v: &mut [f32], n: i32) {
    let sum = match n {
        -1 => return,
        0 => {
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            (max / 32760.0) as f64
        }
        1 => v.iter().map(|x| f64::from(x.abs())).sum::<f64>(),
        2 => v
            .iter()
            .map(|x| f64::from(*x) * f64::from(*x))
            .sum::<f64>()
            .sqrt(),
        p => v
            .iter()
            .map(|x| f64::from(x.abs()).powi(p))
            .sum::<f64>()
            .powf(1.0 / f64::from(p)),
    };
    let norm = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= norm);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_takes_the_mean_the_first_or_the_last_row() {
        let rows = [1.0, 2.0, 3.0, 6.0, 5.0, 10.0];
        let mut out = Vec::new();
        Pooling::Mean.apply(&rows, 2, &mut out);
        assert_eq!(out, [3.0, 6.0]);
        Pooling::Cls.apply(&rows, 2, &mut out);
        assert_eq!(out, [1.0, 2.0]);
        Pooling::Last.apply(&rows, 2, &mut out);
        assert_eq!(out, [5.0, 10.0]);
        for p in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
            assert_eq!(Pooling::parse(p.name()), Some(p));
        }
        assert_eq!(Pooling::parse("max"), None);
    }

    #[test]
    fn normalisations_are_llama_cpps() {
        let v = [3.0f32, -4.0];
        let norm = |n| {
            let mut x = v;
            normalize(&mut x, n);
            x
        };
        assert_eq!(norm(-1), v);
        assert_eq!(norm(2), [0.6, -0.8]);
        let l1 = norm(1);
        assert!((l1[0] - 3.0 / 7.0).abs() < 1e-6 && (l1[1] + 4.0 / 7.0).abs() < 1e-6);
        // Max-absolute to the int16 range: the largest component becomes ±32760.
        assert!((norm(0)[1] + 32760.0).abs() < 1e-2, "{:?}", norm(0));
        let p3 = (27.0f64 + 64.0).cbrt() as f32;
        let got = norm(3);
        assert!((got[0] - 3.0 / p3).abs() < 1e-6 && (got[1] + 4.0 / p3).abs() < 1e-6);
        let mut zero = [0.0f32; 3];
        normalize(&mut zero, 2);
        assert_eq!(zero, [0.0; 3]);
    }
}
