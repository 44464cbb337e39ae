//! SentencePiece (llama.cpp `llm_tokenizer_spm_session`): start from UTF-8
//! characters, repeatedly merge the adjacent pair whose concatenation is the
//! highest-scoring token (ties: leftmost); leftovers that are not tokens become
//! byte tokens.

use crate::Tokenizer;
use crate::unicode;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    n: usize,
    prev: i32,
    next: i32,
}

struct Bigram {
    left: i32,
    right: i32,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> Ordering {
        // highest score first, then lowest left (llama.cpp's comparator)
        match self.score.partial_cmp(&o.score) {
            Some(Ordering::Equal) | None => o.left.cmp(&self.left),
            Some(ord) => ord,
        }
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

pub(crate) fn tokenize(t: &Tokenizer, text: &[u8], out: &mut Vec<u32>) {
    let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
    let mut off = 0;
    while off < text.len() {
        let n = unicode::len_utf8(text[off]).min(text.len() - off);
        let i = syms.len() as i32;
        off += n;
        syms.push(Sym {
            start: off - n,
            n,
            prev: i - 1,
            next: if off == text.len() { -1 } else { i + 1 },
        });
    }
    let mut heap = BinaryHeap::new();
    let try_add = |syms: &[Sym], heap: &mut BinaryHeap<Bigram>, left: i32, right: i32| {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (syms[left as usize], syms[right as usize]);
        let s = &text[l.start..l.start + l.n + r.n];
        if let Some(id) = t.text_to_token(s) {
            heap.push(Bigram {
                left,
                right,
                score: t.scores[id as usize],
                size: s.len(),
            });
        }
    };
    for i in 1..syms.len() as i32 {
        try_add(&syms, &mut heap, i - 1, i);
    }
    while let Some(bg) = heap.pop() {
        let (l, r) = (bg.left as usize, bg.right as usize);
        if syms[l].n == 0 || syms[r].n == 0 || syms[l].n + syms[r].n != bg.size {
            continue;
        }
        syms[l].n += syms[r].n;
        syms[r].n = 0;
        let rnext = syms[r].next;
        syms[l].next = rnext;
        if rnext >= 0 {
            syms[rnext as usize].prev = bg.left;
        }
        let lprev = syms[l].prev;
        try_add(&syms, &mut heap, lprev, bg.left);
        try_add(&syms, &mut heap, bg.left, rnext);
    }
    if syms.is_empty() {
        return;
    }
    let mut i = 0i32;
    while i != -1 {
        let s = syms[i as usize];
        let piece = &text[s.start..s.start + s.n];
        match t.text_to_token(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece {
                    if let Some(id) = t.spm_bytes[b as usize].or(t.special.unk) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}
