//! BPE merges (llama.cpp `llm_tokenizer_bpe_session`): per pre-tokenized word,
//! repeatedly merge the adjacent pair with the lowest merge rank (ties: leftmost).

use crate::Tokenizer;
use crate::pretok::PreTokenizer;
use crate::unicode;
use crate::vocab::FxMap;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

const NONE: u32 = u32::MAX;

pub(crate) struct Bpe {
    pub pretok: PreTokenizer,
    pub byte_encode: bool,
    pub ignore_merges: bool,
    /// Gemma 4: a word of only newlines that is a token stays whole.
    pub newline_words_whole: bool,
    /// Strings that occur in merges but are not tokens: ids from n_vocab up.
    extra: FxMap<Box<[u8]>, u32>,
    /// (left sym, right sym) -> (rank, merged sym)
    merges: FxMap<(u32, u32), (u32, u32)>,
    /// byte_encode: raw byte -> sym of its GPT-2 char
    byte_sym: [u32; 256],
    /// byte_encode: raw byte -> UTF-8 of its GPT-2 char
    byte_chars: Vec<Vec<u8>>,
    /// fallback for a symbol that is not a token: 1-byte string token (byte
    /// encoded) or `<0xXX>` token (raw)
    fallback: [Option<u32>; 256],
}

#[derive(Default)]
pub(crate) struct Scratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Bigram>,
    word: Vec<u8>,
}

#[derive(Clone, Copy)]
struct Sym {
    start: usize, // byte offset in the (encoded) word
    n: usize,
    prev: i32,
    next: i32,
    id: u32,
}

#[derive(PartialEq, Eq)]
struct Bigram {
    rank: u32,
    left: i32,
    right: i32,
    size: usize,
    merged: u32,
}

impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> Ordering {
        // max-heap: lowest rank first, then lowest left
        o.rank.cmp(&self.rank).then(o.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Bpe {
    pub(crate) fn new(
        t: &Tokenizer,
        pretok: PreTokenizer,
        byte_encode: bool,
        merges_list: &[&[u8]],
    ) -> Bpe {
        let n_vocab = t.tokens.len() as u32;
        let mut extra: FxMap<Box<[u8]>, u32> = FxMap::default();
        let intern = |s: &[u8], extra: &mut FxMap<Box<[u8]>, u32>| -> u32 {
            if let Some(id) = t.text_to_token(s) {
                return id;
            }
            let next = n_vocab + extra.len() as u32;
            *extra.entry(s.into()).or_insert(next)
        };
        let mut merges = FxMap::default();
        merges.reserve(merges_list.len());
        let mut buf = Vec::new();
        for (rank, m) in merges_list.iter().enumerate() {
            // llama.cpp: split at the first space at or after index 1
            let Some(pos) = m.iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (a, b) = (&m[..pos], &m[pos + 1..]);
            if a.is_empty() || b.is_empty() {
                continue;
            }
            let la = intern(a, &mut extra);
            let lb = intern(b, &mut extra);
            buf.clear();
            buf.extend_from_slice(a);
            buf.extend_from_slice(b);
            let merged = intern(&buf, &mut extra);
            merges.entry((la, lb)).or_insert((rank as u32, merged));
        }
        let mut byte_sym = [NONE; 256];
        let mut byte_chars = Vec::with_capacity(256);
        let mut fallback = [None; 256];
        let table = unicode::byte_to_cpt_table();
        for b in 0..256usize {
            let mut s = Vec::new();
            unicode::push_utf8(&mut s, table[b]);
            byte_sym[b] = t
                .text_to_token(&s)
                .or_else(|| extra.get(s.as_slice()).copied())
                .unwrap_or(NONE);
            byte_chars.push(s);
            fallback[b] = if byte_encode {
                t.text_to_token(&[b as u8])
            } else {
                t.text_to_token(format!("<0x{b:02X}>").as_bytes())
            };
        }
        Bpe {
            pretok,
            byte_encode,
            ignore_merges: false,
            newline_words_whole: false,
            extra,
            merges,
            byte_sym,
            byte_chars,
            fallback,
        }
    }

    /// Approximate: hashbrown holds one control byte per bucket.
    pub(crate) fn heap_bytes(&self) -> usize {
        let extra: usize = self.extra.keys().map(|k| k.len() + 16).sum();
        (self.extra.capacity() * 21)
            + extra
            + self.merges.capacity() * 17
            + self
                .byte_chars
                .iter()
                .map(|c| c.capacity() + 24)
                .sum::<usize>()
    }

    fn sym_of(&self, t: &Tokenizer, s: &[u8]) -> u32 {
        t.text_to_token(s)
            .or_else(|| self.extra.get(s).copied())
            .unwrap_or(NONE)
    }

    pub(crate) fn tokenize(
        &self,
        t: &Tokenizer,
        text: &[u8],
        out: &mut Vec<u32>,
        sc: &mut Scratch,
    ) {
        let (cpts, offsets) = self.pretok.split(text);
        let n_vocab = t.tokens.len() as u32;
        let mut ci = 0;
        for &len in &offsets {
            // the word, as llama.cpp rebuilds it: UTF-8 of its code points, then
            // (byte_encode) each byte as its GPT-2 char
            sc.word.clear();
            let mut raw = Vec::new();
            for &c in &cpts[ci..ci + len] {
                unicode::push_utf8(&mut raw, c);
            }
            ci += len;
            sc.syms.clear();
            if self.byte_encode {
                for &b in &raw {
                    let start = sc.word.len();
                    sc.word.extend_from_slice(&self.byte_chars[b as usize]);
                    sc.syms.push(Sym {
                        start,
                        n: sc.word.len() - start,
                        prev: 0,
                        next: 0,
                        id: self.byte_sym[b as usize],
                    });
                }
            } else {
                sc.word.extend_from_slice(&raw);
                let mut off = 0;
                while off < raw.len() {
                    let n = unicode::len_utf8(raw[off]).min(raw.len() - off);
                    sc.syms.push(Sym {
                        start: off,
                        n,
                        prev: 0,
                        next: 0,
                        id: self.sym_of(t, &raw[off..off + n]),
                    });
                    off += n;
                }
            }
            let whole = if self.ignore_merges
                || (self.newline_words_whole && sc.word.iter().all(|&b| b == b'\n'))
            {
                t.text_to_token(&sc.word)
            } else {
                None
            };
            if let Some(id) = whole {
                out.push(id);
                continue;
            }
            let ns = sc.syms.len();
            for (i, s) in sc.syms.iter_mut().enumerate() {
                s.prev = i as i32 - 1;
                s.next = if i + 1 == ns { -1 } else { i as i32 + 1 };
            }
            sc.heap.clear();
            for i in 1..ns {
                self.add_bigram(sc, i as i32 - 1, i as i32);
            }
            while let Some(bg) = sc.heap.pop() {
                let (l, r) = (bg.left as usize, bg.right as usize);
                let (ln, rn) = (sc.syms[l].n, sc.syms[r].n);
                if ln == 0 || rn == 0 || ln + rn != bg.size {
                    continue;
                }
                sc.syms[l].n += rn;
                sc.syms[l].id = bg.merged;
                sc.syms[r].n = 0;
                let rnext = sc.syms[r].next;
                sc.syms[l].next = rnext;
                if rnext >= 0 {
                    sc.syms[rnext as usize].prev = bg.left;
                }
                let lprev = sc.syms[l].prev;
                self.add_bigram(sc, lprev, bg.left);
                self.add_bigram(sc, bg.left, rnext);
            }
            for s in &sc.syms {
                if s.n == 0 {
                    continue;
                }
                if s.id < n_vocab {
                    out.push(s.id);
                } else {
                    for &b in &sc.word[s.start..s.start + s.n] {
                        if let Some(id) = self.fallback[b as usize] {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }

    #[inline]
    fn add_bigram(&self, sc: &mut Scratch, left: i32, right: i32) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (&sc.syms[left as usize], &sc.syms[right as usize]);
        if l.id == NONE || r.id == NONE {
            return;
        }
        if let Some(&(rank, merged)) = self.merges.get(&(l.id, r.id)) {
            sc.heap.push(Bigram {
                rank,
                left,
                right,
                size: l.n + r.n,
                merged,
            });
        }
    }
}
