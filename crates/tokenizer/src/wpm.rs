//! WordPiece (llama.cpp `llm_tokenizer_wpm_session`): BERT-style normalisation
//! (optional lower-casing and accent stripping), split on whitespace and
//! punctuation, then greedy longest-match per word with a `▁` word prefix.

use crate::Tokenizer;
use crate::unicode;

fn is_chinese_char(c: u32) -> bool {
    (0x04E00..=0x09FFF).contains(&c)
        || (0x03400..=0x04DBF).contains(&c)
        || (0x20000..=0x2A6DF).contains(&c)
        || (0x2A700..=0x2B73F).contains(&c)
        || (0x2B740..=0x2B81F).contains(&c)
        || (0x2B920..=0x2CEAF).contains(&c)
        || (0x0F900..=0x0FAFF).contains(&c)
        || (0x2F800..=0x2FA1F).contains(&c)
}

fn preprocess(t: &Tokenizer, text: &[u8]) -> Vec<Vec<u8>> {
    let mut cpts = unicode::cpts_from_utf8(text);
    if t.strip_accents {
        for c in cpts.iter_mut() {
            *c = unicode::nfd_base(*c);
        }
    }
    let mut words: Vec<Vec<u8>> = vec![Vec::new()];
    for c in cpts {
        let f = unicode::flags(c);
        if f.is_whitespace() {
            if !words.last().is_some_and(|w| w.is_empty()) {
                words.push(Vec::new());
            }
            continue;
        }
        if c == 0 || c == 0xFFFD || f.is_control() {
            continue;
        }
        if t.strip_accents && f.is_accent_mark() {
            continue;
        }
        let mut s = Vec::new();
        unicode::push_utf8(&mut s, if t.lowercase { unicode::to_lower(c) } else { c });
        if f.is_punctuation() || (c < 0x7F && f.is_symbol()) || is_chinese_char(c) {
            if !words.last().is_some_and(|w| w.is_empty()) {
                words.push(Vec::new());
            }
            if let Some(w) = words.last_mut() {
                *w = s;
            }
            words.push(Vec::new());
        } else if let Some(w) = words.last_mut() {
            w.extend_from_slice(&s);
        }
    }
    if words.last().is_some_and(|w| w.is_empty()) {
        words.pop();
    }
    words
}

pub(crate) fn tokenize(t: &Tokenizer, text: &[u8], out: &mut Vec<u32>) {
    for word in preprocess(t, text) {
        if word.is_empty() {
            continue;
        }
        let mut w1 = "\u{2581}".as_bytes().to_vec();
        w1.extend_from_slice(&word);
        let n = w1.len();
        let current = out.len();
        let mut i = 0;
        while i < n {
            let mut matched = false;
            let mut j = n.min(i + t.max_token_len + 1);
            while j > i {
                if let Some(id) = t.text_to_token(&w1[i..j]) {
                    out.push(id);
                    matched = true;
                    i = j - 1;
                    break;
                }
                j -= 1;
            }
            if !matched {
                out.truncate(current);
                break;
            }
            i += 1;
        }
        if current == out.len() {
            out.extend(t.special.unk);
        }
    }
}
