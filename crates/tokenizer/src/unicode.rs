//! Code-point classification exactly as llama.cpp b11434 does it (its tables, not
//! Rust's), plus the GPT-2 byte<->unicode map.

use crate::unicode_data::{LOWERCASE, NFD, RANGES_FLAGS, WHITESPACE};
use std::sync::OnceLock;

pub const UNDEFINED: u16 = 0x0001;
pub const NUMBER: u16 = 0x0002;
pub const LETTER: u16 = 0x0004;
pub const ACCENT_MARK: u16 = 0x0010;
pub const PUNCTUATION: u16 = 0x0020;
pub const SYMBOL: u16 = 0x0040;
pub const CONTROL: u16 = 0x0080;
pub const MASK_CATEGORIES: u16 = 0x00FF;
pub const WHITESPACE_FLAG: u16 = 0x0100;

const MAX_CODEPOINTS: usize = 0x110000;

/// Flags of one code point; `Flags(0)` is "out of range" (llama.cpp's empty flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Flags(pub u16);

impl Flags {
    #[inline]
    pub fn is_number(self) -> bool {
        self.0 & NUMBER != 0
    }
    #[inline]
    pub fn is_letter(self) -> bool {
        self.0 & LETTER != 0
    }
    #[inline]
    pub fn is_accent_mark(self) -> bool {
        self.0 & ACCENT_MARK != 0
    }
    #[inline]
    pub fn is_punctuation(self) -> bool {
        self.0 & PUNCTUATION != 0
    }
    #[inline]
    pub fn is_symbol(self) -> bool {
        self.0 & SYMBOL != 0
    }
    #[inline]
    pub fn is_control(self) -> bool {
        self.0 & CONTROL != 0
    }
    #[inline]
    pub fn is_whitespace(self) -> bool {
        self.0 & WHITESPACE_FLAG != 0
    }
    #[inline]
    pub fn category(self) -> u16 {
        self.0 & MASK_CATEGORIES
    }
    #[inline]
    pub fn any(self) -> bool {
        self.0 != 0
    }
}

fn table() -> &'static [u16] {
    static T: OnceLock<Vec<u16>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = vec![UNDEFINED; MAX_CODEPOINTS];
        for w in RANGES_FLAGS.windows(2) {
            let (a, f) = w[0];
            let (b, _) = w[1];
            let (a, b) = (a as usize, (b as usize).min(MAX_CODEPOINTS));
            if a < b {
                t[a..b].fill(f);
            }
        }
        for &c in WHITESPACE {
            t[c as usize] |= WHITESPACE_FLAG;
        }
        t
    })
}

/// Flags of a code point (llama.cpp `unicode_cpt_flags_from_cpt`).
#[inline]
pub fn flags(cpt: u32) -> Flags {
    match table().get(cpt as usize) {
        Some(&f) => Flags(f),
        None => Flags(UNDEFINED),
    }
}

/// llama.cpp `unicode_tolower` (simple one-to-one map).
pub fn to_lower(cpt: u32) -> u32 {
    match LOWERCASE.binary_search_by_key(&cpt, |&(a, _)| a) {
        Ok(i) => LOWERCASE[i].1,
        Err(_) => cpt,
    }
}

/// llama.cpp `unicode_cpts_normalize_nfd`: maps a code point to its base letter.
pub fn nfd_base(cpt: u32) -> u32 {
    let i = NFD.partition_point(|&(first, _, _)| first <= cpt);
    if i == 0 {
        return cpt;
    }
    let (first, last, base) = NFD[i - 1];
    if first <= cpt && cpt <= last {
        base
    } else {
        cpt
    }
}

/// Decode UTF-8 as llama.cpp does: every invalid sequence start becomes U+FFFD and
/// consumes one byte. For valid UTF-8 this is the ordinary decoding.
pub fn cpts_from_utf8(s: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let (c, n) = decode_one(s, i);
        out.push(c);
        i += n;
    }
    out
}

/// One code point at `i` as llama.cpp's `unicode_cpt_from_utf8` reads it (it does not
/// reject overlong forms or surrogates); (U+FFFD, 1) where it would throw.
#[inline]
pub fn decode_one(s: &[u8], i: usize) -> (u32, usize) {
    let b0 = s[i] as u32;
    let cont = |k: usize| s.get(i + k).is_some_and(|&b| b & 0xC0 == 0x80);
    if b0 & 0x80 == 0 {
        return (b0, 1);
    }
    if b0 & 0x40 == 0 {
        return (0xFFFD, 1);
    }
    if b0 & 0x20 == 0 {
        if cont(1) {
            return (((b0 & 0x1F) << 6) | (s[i + 1] as u32 & 0x3F), 2);
        }
        return (0xFFFD, 1);
    }
    if b0 & 0x10 == 0 {
        if cont(1) && cont(2) {
            return (
                ((b0 & 0x0F) << 12) | ((s[i + 1] as u32 & 0x3F) << 6) | (s[i + 2] as u32 & 0x3F),
                3,
            );
        }
        return (0xFFFD, 1);
    }
    if b0 & 0x08 == 0 {
        if cont(1) && cont(2) && cont(3) {
            return (
                ((b0 & 0x07) << 18)
                    | ((s[i + 1] as u32 & 0x3F) << 12)
                    | ((s[i + 2] as u32 & 0x3F) << 6)
                    | (s[i + 3] as u32 & 0x3F),
                4,
            );
        }
        return (0xFFFD, 1);
    }
    (0xFFFD, 1)
}

/// llama.cpp `unicode_cpt_to_utf8`, appending; code points above U+10FFFF (which the
/// decoder above can produce from 4-byte forms) are written with the same bit layout.
pub fn push_utf8(out: &mut Vec<u8>, cpt: u32) {
    if cpt <= 0x7F {
        out.push(cpt as u8);
    } else if cpt <= 0x7FF {
        out.push(0xC0 | ((cpt >> 6) & 0x1F) as u8);
        out.push(0x80 | (cpt & 0x3F) as u8);
    } else if cpt <= 0xFFFF {
        out.push(0xE0 | ((cpt >> 12) & 0x0F) as u8);
        out.push(0x80 | ((cpt >> 6) & 0x3F) as u8);
        out.push(0x80 | (cpt & 0x3F) as u8);
    } else {
        out.push(0xF0 | ((cpt >> 18) & 0x07) as u8);
        out.push(0x80 | ((cpt >> 12) & 0x3F) as u8);
        out.push(0x80 | ((cpt >> 6) & 0x3F) as u8);
        out.push(0x80 | (cpt & 0x3F) as u8);
    }
}

/// Length of a UTF-8 sequence from its first byte (llama.cpp `unicode_len_utf8`).
#[inline]
pub fn len_utf8(b: u8) -> usize {
    const L: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    L[(b >> 4) as usize]
}

/// GPT-2 byte -> code point map.
pub fn byte_to_cpt_table() -> &'static [u32; 256] {
    static T: OnceLock<[u32; 256]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = [0u32; 256];
        let mut n = 0;
        for b in 0..256u32 {
            let direct = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            if direct {
                t[b as usize] = b;
            } else {
                t[b as usize] = 256 + n;
                n += 1;
            }
        }
        t
    })
}

/// Inverse of the GPT-2 byte map: code point -> byte.
#[inline]
pub fn cpt_to_byte(cpt: u32) -> Option<u8> {
    match cpt {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cpt as u8),
        0x100..=0x143 => {
            let t = byte_to_cpt_table();
            // 68 remapped bytes, in increasing byte order
            t.iter().position(|&c| c == cpt).map(|b| b as u8)
        }
        _ => None,
    }
}
