//! Detokenisation exactly as llama.cpp (`token_to_piece`, `detokenize`), and a
//! streaming decoder that only ever emits complete UTF-8.

use crate::vocab::attr;
use crate::{Kind, Tokenizer, TokenizerError, unicode};

/// `token_to_piece(id, special = true)` for the piece cache.
pub(crate) fn piece_for_cache(t: &Tokenizer, id: usize) -> Vec<u8> {
    let text = &t.tokens[id];
    let a = t.attrs[id] as u32;
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.to_vec();
    }
    if a & attr::NORMAL != 0 {
        return match t.kind {
            Kind::Spm | Kind::Wpm => unescape_whitespace(text),
            Kind::Bpe if t.escape_whitespaces => unescape_whitespace(text),
            Kind::Bpe => decode_byte_level(text),
        };
    }
    if a & attr::BYTE != 0 {
        // validated at load: `<0xXX>`
        if let Some(b) = parse_byte_token(text) {
            return vec![b];
        }
    }
    Vec::new()
}

/// `<0xXX>` -> the byte.
pub(crate) fn parse_byte_token(text: &[u8]) -> Option<u8> {
    if text.len() != 6 || &text[..3] != b"<0x" || text[5] != b'>' {
        return None;
    }
    let s = std::str::from_utf8(&text[3..5]).ok()?;
    u8::from_str_radix(s, 16).ok()
}

fn unescape_whitespace(s: &[u8]) -> Vec<u8> {
    let pat = "\u{2581}".as_bytes();
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(pat) {
            out.push(b' ');
            i += pat.len();
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// llama.cpp `llama_decode_text`: GPT-2 chars back to bytes; a char outside the
/// map becomes `[UNK_BYTE_0x..<token text>]`.
fn decode_byte_level(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in unicode::cpts_from_utf8(text) {
        match unicode::cpt_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut u = Vec::new();
                unicode::push_utf8(&mut u, c);
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in u {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
    out
}

/// Whether detokenisation applies the vocabulary's space clean-up (llama.cpp's
/// `clean_up_tokenization_spaces`: `" ,"` → `","` and the like), which loses the
/// round trip `decode(encode(x)) == x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanSpaces {
    /// As the vocabulary asks (llama.cpp's `llama_detokenize`).
    AsVocabulary,
    /// Never: the text the tokens spell.
    Never,
}

pub(crate) fn detokenize(
    t: &Tokenizer,
    ids: &[u32],
    remove_special: bool,
    unparse_special: bool,
    clean: CleanSpaces,
) -> Result<Vec<u8>, TokenizerError> {
    for &id in ids {
        t.check(id)?;
    }
    let mut ids = ids;
    let mut remove_space = t.add_space_prefix;
    if remove_special && t.add_bos && !ids.is_empty() && Some(ids[0]) == t.special.bos {
        remove_space = false;
        ids = &ids[1..];
    }
    if remove_special && t.add_eos && !ids.is_empty() && Some(ids[ids.len() - 1]) == t.special.eos {
        ids = &ids[..ids.len() - 1];
    }
    let mut text = Vec::new();
    for &id in ids {
        let mut p = t.token_to_piece(id, unparse_special)?;
        if remove_space && p.first() == Some(&b' ') {
            p = &p[1..];
        }
        remove_space = false;
        text.extend_from_slice(p);
    }
    if t.clean_spaces && clean == CleanSpaces::AsVocabulary {
        text = clean_spaces(text);
    }
    Ok(text)
}

/// llama.cpp's three clean-up passes (clean_up_tokenization_spaces).
fn clean_spaces(mut text: Vec<u8>) -> Vec<u8> {
    let total1 = text.len();
    if total1 == 0 {
        return text;
    }
    // first pass: " ?", " !", " .", " ,"
    let mut total = 1;
    for i in 1..total1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // second pass: " ' " -> "'"
    let total2 = total;
    total = 1;
    let mut i = 1;
    while i < total2 {
        let x = text[i];
        if x == b'\'' && i + 1 < total2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // third pass: " 's", " 'm", " 're", " 've"
    let total3 = total;
    total = 1;
    for i in 1..total3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < total3 {
            let x1 = text[i + 1];
            if x1 == b't' || x1 == b'd' {
            } else if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if i + 2 < total3 {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
    text
}

/// Turns a stream of generated token ids into text, emitting only complete UTF-8: bytes
/// of a character split across tokens are held until the character is complete. The
/// stream continues a prompt, so its first piece keeps its leading space even where the
/// vocabulary adds a space prefix (as llama-completion, Ollama and llama-server print
/// it: ` Paris`); [`Tokenizer::decode`] is for whole texts. Control
/// tokens render empty (as in [`Tokenizer::decode`]) unless the decoder renders them
/// ([`StreamDecoder::rendering_special`]: chat output, whose markup is often control
/// tokens); no clean-up of spaces is applied (it needs look-ahead).
pub struct StreamDecoder<'a> {
    t: &'a Tokenizer,
    pending: Vec<u8>,
    special: bool,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(t: &'a Tokenizer) -> Self {
        StreamDecoder {
            t,
            pending: Vec::new(),
            special: false,
        }
    }

    /// A decoder that renders control tokens' text (`<|channel|>`, `<tool_call>`, ...).
    pub fn rendering_special(t: &'a Tokenizer) -> Self {
        StreamDecoder {
            special: true,
            ..Self::new(t)
        }
    }

    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let p = self.t.token_to_piece(id, self.special)?;
        self.pending.extend_from_slice(p);
        Ok(self.take_complete())
    }

    fn take_complete(&mut self) -> String {
        let buf = &self.pending;
        // find the longest prefix that does not end inside an incomplete sequence
        let mut cut = buf.len();
        let mut i = buf.len();
        let mut back = 0;
        while i > 0 && back < 4 {
            i -= 1;
            back += 1;
            let b = buf[i];
            if b & 0xC0 != 0x80 {
                // a lead (or ASCII) byte: is its sequence complete?
                let need = match b {
                    0x00..=0x7F => 1,
                    0xC0..=0xDF => 2,
                    0xE0..=0xEF => 3,
                    0xF0..=0xF7 => 4,
                    _ => 1,
                };
                if buf.len() - i < need {
                    cut = i;
                }
                break;
            }
        }
        let rest = self.pending.split_off(cut);
        let done = std::mem::replace(&mut self.pending, rest);
        String::from_utf8_lossy(&done).into_owned()
    }

    /// Ends the stream: whatever is held (an incomplete sequence) comes out as
    /// U+FFFD.
    pub fn finish(&mut self) -> String {
        let done = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&done).into_owned()
    }
}
