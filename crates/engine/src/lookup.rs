//! Prompt-lookup drafting for speculative decoding, as llama.cpp's `llama-lookup` drafts
//! from its context cache, over an index of the history's n-grams that grows with the
//! history: a draft costs a few hash lookups, not a scan of the context per token.

use std::collections::HashMap;

/// Longest n-gram the drafter keys on.
const NGRAM_MAX: usize = 4;
/// Per n-gram size (1..=4): occurrences a continuation needs in the context, and the
/// share of them (percent) its most frequent continuation needs, before it is drafted
/// (llama.cpp's `common_ngram_cache` "lax" thresholds, for the context cache).
const MIN_SAMPLES: [usize; NGRAM_MAX] = [2, 2, 1, 1];
const MIN_PERCENT: [usize; NGRAM_MAX] = [66, 50, 50, 50];

/// What followed one n-gram in the history.
#[derive(Default)]
struct Continuations {
    /// Occurrences of the n-gram with a token after them.
    total: usize,
    /// (token, occurrences, start of the latest occurrence it followed).
    next: Vec<(u32, usize, usize)>,
}

/// The n-grams of a history (sizes 1 to 4) and what followed each, kept in step with
/// the history [`LookupIndex::draft`] is given: extended when it grew, rebuilt when it
/// is another one.
#[derive(Default)]
pub struct LookupIndex {
    /// The history indexed so far.
    seen: Vec<u32>,
    /// Per size n (index n - 1): the n-gram, packed, to its continuations.
    grams: [HashMap<u128, Continuations>; NGRAM_MAX],
}

/// `n ≤ 4` tokens as one key (one map per size, so sizes never collide).
fn key(tokens: &[u32]) -> u128 {
    tokens.iter().fold(0, |k, &t| (k << 32) | u128::from(t))
}

impl LookupIndex {
    /// Up to `max` tokens drafted after `history`, token by token: the sequence so far
    /// (the history, then the tokens drafted) ends in an n-gram (n = 4 down to 1); among
    /// the tokens that followed that n-gram's earlier occurrences in the history, the
    /// most frequent (the most recent on a tie) is drafted when it has enough
    /// occurrences and a large enough share of them (`MIN_SAMPLES`, `MIN_PERCENT`); else
    /// the next shorter n-gram is tried, and drafting stops where none qualifies.
    pub fn draft(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        self.sync(history);
        let mut draft: Vec<u32> = Vec::with_capacity(max);
        let mut tail: Vec<u32> = Vec::with_capacity(NGRAM_MAX);
        'next: while draft.len() < max {
            for n in (1..=NGRAM_MAX).rev() {
                // The last n tokens of history ++ draft.
                let from_draft = n.min(draft.len());
                let Some(from_history) = history.len().checked_sub(n - from_draft) else {
                    continue;
                };
                tail.clear();
                tail.extend_from_slice(&history[from_history..]);
                tail.extend_from_slice(&draft[draft.len() - from_draft..]);
                let Some(c) = self.grams[n - 1].get(&key(&tail)) else {
                    continue;
                };
                let best = c.next.iter().max_by_key(|&&(_, count, last)| (count, last));
                if let Some(&(t, count, _)) = best
                    && c.total >= MIN_SAMPLES[n - 1]
                    && count * 100 >= MIN_PERCENT[n - 1] * c.total
                {
                    draft.push(t);
                    continue 'next;
                }
            }
            break;
        }
        draft
    }

    /// Brings the index to `history`: the n-grams of the positions added since the last
    /// call, or all of them if `history` does not extend what was indexed.
    fn sync(&mut self, history: &[u32]) {
        if !history.starts_with(&self.seen) {
            *self = LookupIndex::default();
        }
        let (old, len) = (self.seen.len(), history.len());
        for n in 1..=NGRAM_MAX {
            // Occurrences starting at s with a token after them: s + n < len.
            for s in old.saturating_sub(n)..len.saturating_sub(n) {
                let c = self.grams[n - 1]
                    .entry(key(&history[s..s + n]))
                    .or_default();
                let t = history[s + n];
                c.total += 1;
                match c.next.iter_mut().find(|e| e.0 == t) {
                    Some(e) => {
                        e.1 += 1;
                        e.2 = s;
                    }
                    None => c.next.push((t, 1, s)),
                }
            }
        }
        self.seen.extend_from_slice(&history[old..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The drafter as first written: every draft token rescans the history.
    fn scan(history: &[u32], max: usize) -> Vec<u32> {
        let mut draft: Vec<u32> = Vec::new();
        let len = history.len();
        'next: while draft.len() < max {
            for n in (1..=NGRAM_MAX).rev() {
                if len + draft.len() < n {
                    continue;
                }
                let mut key: Vec<u32> = history[len - (n - n.min(draft.len()))..].to_vec();
                key.extend_from_slice(&draft[draft.len() - n.min(draft.len())..]);
                let mut counts: Vec<(u32, usize, usize)> = Vec::new();
                let mut total = 0;
                for s in 0..len.saturating_sub(n) {
                    if history[s..s + n] == key[..] {
                        let t = history[s + n];
                        total += 1;
                        match counts.iter_mut().find(|c| c.0 == t) {
                            Some(c) => {
                                c.1 += 1;
                                c.2 = s;
                            }
                            None => counts.push((t, 1, s)),
                        }
                    }
                }
                if let Some(&(t, count, _)) = counts.iter().max_by_key(|c| (c.1, c.2))
                    && total >= MIN_SAMPLES[n - 1]
                    && count * 100 >= MIN_PERCENT[n - 1] * total
                {
                    draft.push(t);
                    continue 'next;
                }
            }
            break;
        }
        draft
    }

    /// A fresh index's draft after `history`.
    fn draft(history: &[u32], max: usize) -> Vec<u32> {
        LookupIndex::default().draft(history, max)
    }

    #[test]
    fn the_draft_follows_the_longest_ngram_with_a_clear_continuation() {
        // "1 2 3" occurred before, followed by 4 5 9 3: each step keys on the longest
        // n-gram that recurs with a clear continuation.
        assert_eq!(draft(&[1, 2, 3, 4, 5, 9, 3, 7, 1, 2, 3], 4), [4, 5, 9, 3]);
        assert_eq!(draft(&[1, 2, 3, 4, 5, 9, 3, 7, 1, 2, 3], 1), [4]);
        // A unigram needs two occurrences, two thirds of them agreeing: 1 was followed
        // by 6 and 7, no majority, so nothing is drafted.
        assert!(draft(&[5, 1, 6, 1, 7, 1], 2).is_empty());
        // 1 was followed by 6 twice and 7 once: 6, then "1 6" continues with 1 (twice).
        assert_eq!(draft(&[1, 6, 1, 6, 1, 7, 1], 2), [6, 1]);
        // Nothing recurs, or nothing to look at.
        assert!(draft(&[1, 2, 3], 4).is_empty());
        assert!(draft(&[], 4).is_empty());
        assert!(draft(&[1, 1], 0).is_empty());
    }

    #[test]
    fn the_index_drafts_what_a_full_scan_drafts_as_the_history_grows_and_changes() {
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |m: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % m) as u32
        };
        let mut drafted = 0;
        for vocab in [2u64, 3, 5, 40] {
            let mut index = LookupIndex::default();
            let mut history: Vec<u32> = Vec::new();
            for step in 0..400 {
                // Mostly growth, now and then a cut (a rejected draft) or a new text.
                match next(20) {
                    0 => history.truncate(history.len() / 2),
                    1 if step % 7 == 0 => history = (0..next(30)).map(|_| next(vocab)).collect(),
                    _ => {
                        let k = next(4) as usize;
                        history.extend((0..k).map(|_| next(vocab)));
                    }
                }
                let max = next(9) as usize;
                let got = index.draft(&history, max);
                assert_eq!(
                    got,
                    scan(&history, max),
                    "vocab {vocab}, step {step}, history {history:?}"
                );
                drafted += got.len();
            }
        }
        assert!(
            drafted > 1000,
            "only {drafted} tokens drafted: the test drafts too little"
        );
    }
}
