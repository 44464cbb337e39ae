//! Special-token partitioning (llama.cpp `tokenizer_st_partition`): before the
//! model's algorithm runs, occurrences of control / user-defined / unknown token
//! texts are cut out of the input, longest token first. Without parse_special only
//! user-defined tokens are matched (the Pythia literal-spaces case).

use crate::Tokenizer;
use crate::vocab::attr;
use aho_corasick::AhoCorasick;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frag {
    /// Byte range of the input.
    Text(usize, usize),
    Token(u32),
}

/// Finds which special tokens occur in a text at all, in one pass, so the exact
/// per-token partition below only runs for those.
pub(crate) struct Finder {
    ac: AhoCorasick,
    /// pattern index -> position in `special_cache`
    order: Vec<usize>,
}

impl Finder {
    pub(crate) fn new(t: &Tokenizer) -> Option<Finder> {
        let mut pats = Vec::new();
        let mut order = Vec::new();
        for (i, &id) in t.special_cache.iter().enumerate() {
            let text = &t.tokens[id as usize];
            if !text.is_empty() {
                pats.push(text);
                order.push(i);
            }
        }
        if pats.is_empty() {
            return None;
        }
        // The noncontiguous NFA is built directly, without the conversion step that
        // briefly doubles memory on 6,000-pattern vocabularies (Gemma): this pass only
        // asks which special tokens occur at all, so its speed is not critical.
        let ac = AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::Standard)
            .kind(Some(aho_corasick::AhoCorasickKind::NoncontiguousNFA))
            .build(&pats)
            .ok()?;
        Some(Finder { ac, order })
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.ac.memory_usage() + 8 * self.order.capacity()
    }
}

#[inline]
fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

pub(crate) fn partition(t: &Tokenizer, text: &[u8], parse_special: bool) -> Vec<Frag> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Frag::Text(0, text.len()));
    let Some(finder) = t.special_finder.get_or_init(|| Finder::new(t)) else {
        return frags;
    };
    // which cache entries occur anywhere in the text
    let mut present = vec![false; t.special_cache.len()];
    let mut any = false;
    for m in finder.ac.find_overlapping_iter(text) {
        present[finder.order[m.pattern().as_usize()]] = true;
        any = true;
    }
    if !any {
        return frags;
    }
    for (ci, &id) in t.special_cache.iter().enumerate() {
        if !present[ci] {
            continue;
        }
        let a = t.attrs[id as usize] as u32;
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let tok = &t.tokens[id as usize];
        let finder = memchr::memmem::Finder::new(tok);
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags.drain(..) {
            let Frag::Text(mut off, end) = f else {
                next.push(f);
                continue;
            };
            loop {
                let Some(rel) = finder.find(&text[off..end]) else {
                    if off < end {
                        next.push(Frag::Text(off, end));
                    }
                    break;
                };
                let m = off + rel;
                if m > off {
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > off && c_isspace(text[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > off {
                        next.push(Frag::Text(off, left_end));
                    }
                }
                next.push(Frag::Token(id));
                let mut r = m + tok.len();
                if r < end {
                    if a & attr::RSTRIP != 0 {
                        while r < end && c_isspace(text[r]) {
                            r += 1;
                        }
                    }
                    off = r;
                    if off >= end {
                        break;
                    }
                } else {
                    break;
                }
            }
        }
        frags = next;
    }
    frags
}
