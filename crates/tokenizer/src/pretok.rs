//! Pre-tokenizers: split text into words before BPE, exactly as llama.cpp b11434's
//! `unicode_regex_split` does.
//!
//! llama.cpp runs a list of regexes per `tokenizer.ggml.pre` value, each refining the
//! previous split. Four of them have hand-written splitters there (GPT-2, Llama 3,
//! Qwen 2, Qwen 3.5, and the newline splitter); we hand-write the same four
//! (`Custom`). Every other regex runs through `std::regex` in llama.cpp, on a
//! "collapsed" text where each non-ASCII code point is replaced by one byte naming
//! its category; we do the same with the `regex` crate (`bytes::Regex`, ASCII mode)
//! on the same collapsed text, so category semantics (and their quirks) match.
//! Look-around: `\s+(?!\S)` is emulated by hand (a named group, trimmed after the
//! match); `((?=[X])([^a-z]))` becomes the class X minus `a-z`. Any other
//! look-around is refused, and the `pre` value is then treated as unknown.

use crate::unicode::{self, Flags};

/// One regex step of a rule set.
pub(crate) enum Step {
    Gpt2,
    /// Llama 3 / Qwen 2 / Qwen 3.5 family: digits grouped by `digits`, letters
    /// runs including marks when `marks`.
    Llama3Like {
        digits: usize,
        marks: bool,
    },
    Newlines,
    Regex(Box<RegexStep>),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WsMode {
    /// The regex has no `\s+(?!\S)`.
    None,
    /// `...|\s+(?!\S)` as the last alternative.
    Alone,
    /// `...|\s+(?!\S)|\s+` as the last two alternatives.
    WithPlain,
}

pub(crate) struct RegexStep {
    re: regex::bytes::Regex,
    /// Runs on the collapsed text (one byte per code point) rather than on UTF-8.
    collapsed: bool,
    ws: WsMode,
}

pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
    need_collapse: bool,
}

const UCATS: [(&str, u16); 10] = [
    ("\\p{N}", unicode::NUMBER),
    ("\\p{L}", unicode::LETTER),
    ("\\p{P}", unicode::PUNCTUATION),
    ("\\p{M}", unicode::ACCENT_MARK),
    ("\\p{S}", unicode::SYMBOL),
    ("\\p{Lu}", unicode::LETTER),
    ("\\p{Ll}", unicode::LETTER),
    ("\\p{Lt}", unicode::LETTER),
    ("\\p{Lm}", unicode::LETTER),
    ("\\p{Lo}", unicode::LETTER),
];

fn cat_byte(cat: u16) -> Option<u8> {
    Some(match cat {
        unicode::NUMBER => 0xD1,
        unicode::LETTER => 0xD2,
        unicode::PUNCTUATION => 0xD3,
        unicode::ACCENT_MARK => 0xD4,
        unicode::SYMBOL => 0xD5,
        _ => return None,
    })
}

/// The ASCII members of each category, in the form llama.cpp splices them in.
fn cat_ascii(cat: u16) -> &'static str {
    match cat {
        unicode::NUMBER => "0-9",
        unicode::LETTER => "A-Za-z",
        unicode::PUNCTUATION => "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
        unicode::SYMBOL => "\\$\\+<->\\^`\\|\\~",
        _ => "",
    }
}

fn uses_categories(expr: &str) -> bool {
    UCATS.iter().any(|(k, _)| expr.contains(k))
}

const WS_CLASS: &str = "[\\t\\n\\x0B\\x0C\\r ]";
const WS_INNER: &str = "\\t\\n\\x0B\\x0C\\r\\x20";

impl PreTokenizer {
    /// Builds the splitter for llama.cpp's regex list; `Err` names a regex we cannot
    /// reproduce exactly.
    pub(crate) fn new(exprs: &[&str]) -> Result<Self, String> {
        let need_collapse = exprs.iter().any(|e| uses_categories(e));
        let mut steps = Vec::new();
        for e in exprs {
            steps.push(compile_step(e)?);
        }
        Ok(PreTokenizer {
            steps,
            need_collapse,
        })
    }

    /// Splits `text` into words (as UTF-8 byte strings of the code points llama.cpp
    /// decodes, invalid sequences as U+FFFD).
    pub(crate) fn split(&self, text: &[u8]) -> (Vec<u32>, Vec<usize>) {
        let cpts = unicode::cpts_from_utf8(text);
        let collapsed: Vec<u8> = if self.need_collapse {
            cpts.iter()
                .map(|&c| {
                    if c < 128 {
                        return c as u8;
                    }
                    let f = unicode::flags(c);
                    if f.is_whitespace() {
                        0x0B
                    } else {
                        cat_byte(f.category()).unwrap_or(0xD0)
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut wide: Option<(Vec<u8>, Vec<usize>)> = None;
        let mut offsets = vec![cpts.len()];
        for step in &self.steps {
            offsets = match step {
                Step::Gpt2 => split_gpt2(&cpts, &offsets),
                Step::Llama3Like { digits, marks } => {
                    split_llama3(&cpts, &offsets, *digits, *marks)
                }
                Step::Newlines => split_newlines(&cpts, &offsets),
                Step::Regex(r) => {
                    if r.collapsed {
                        r.split_collapsed(&collapsed, &offsets)
                    } else {
                        let w = wide.get_or_insert_with(|| wide_text(&cpts));
                        r.split_wide(&w.0, &w.1, &offsets)
                    }
                }
            };
        }
        (cpts, offsets)
    }
}

/// UTF-8 of the code points with non-ASCII whitespace replaced by U+000B (as
/// llama.cpp does for `std::wregex`), and the byte offset of each code point
/// (plus the end).
fn wide_text(cpts: &[u32]) -> (Vec<u8>, Vec<usize>) {
    let mut s = Vec::with_capacity(cpts.len());
    let mut idx = Vec::with_capacity(cpts.len() + 1);
    let mut buf = [0u8; 4];
    for &c in cpts {
        idx.push(s.len());
        let c = if c > 0x7F && unicode::flags(c).is_whitespace() {
            0x0B
        } else {
            c
        };
        let ch = char::from_u32(c).unwrap_or('\u{FFFD}');
        s.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
    }
    idx.push(s.len());
    (s, idx)
}

fn compile_step(expr: &str) -> Result<Step, String> {
    match expr {
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)" => {
            return Ok(Step::Gpt2);
        }
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
        | "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" =>
        {
            return Ok(Step::Llama3Like {
                digits: 3,
                marks: false,
            });
        }
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" =>
        {
            return Ok(Step::Llama3Like {
                digits: 1,
                marks: false,
            });
        }
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" =>
        {
            return Ok(Step::Llama3Like {
                digits: 1,
                marks: true,
            });
        }
        "[^\\n]+|[\\n]+" => return Ok(Step::Newlines),
        _ => {}
    }
    let collapsed = uses_categories(expr);
    let pattern = if collapsed {
        if !expr.is_ascii() {
            return Err(format!(
                "regex mixes unicode categories and non-ASCII characters: {expr}"
            ));
        }
        collapse_pattern(expr)?
    } else {
        wide_pattern(expr)
    };
    let (pattern, ws) = ws_lookahead(&pattern);
    let pattern = lookahead_intersections(&pattern)?;
    if pattern.contains("(?=") || pattern.contains("(?!") || pattern.contains("(?<") {
        return Err(format!("regex needs look-around we do not emulate: {expr}"));
    }
    let full = if collapsed {
        format!("(?-u){pattern}")
    } else {
        pattern
    };
    let re = regex::bytes::RegexBuilder::new(&full)
        .size_limit(1 << 26)
        .build()
        .map_err(|e| format!("regex {expr}: {e}"))?;
    Ok(Step::Regex(Box::new(RegexStep { re, collapsed, ws })))
}

/// llama.cpp's collapsing of `\p{..}` into the category byte plus its ASCII members,
/// written as a Rust byte-regex pattern.
fn collapse_pattern(expr: &str) -> Result<String, String> {
    let b = expr.as_bytes();
    let mut out = String::new();
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && c == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if c == b'\\' && i + 3 < b.len() && b[i + 1] == b'p' && b[i + 2] == b'{' {
            #[allow(clippy::collapsible_if)]
            if let Some(close) = expr[i + 3..].find('}').map(|p| p + i + 3)
                && close <= i + 10
            {
                let pat = &expr[i..=close];
                if let Some(&(_, cat)) = UCATS.iter().find(|(k, _)| *k == pat) {
                    let byte = cat_byte(cat).ok_or("bad category")?;
                    if !inside {
                        out.push('[');
                    }
                    out.push_str(&format!("\\x{byte:02X}"));
                    out.push_str(cat_ascii(cat));
                    if !inside {
                        out.push(']');
                    }
                    i = close + 1;
                    continue;
                }
            }
        }
        out.push(c as char);
        i += 1;
    }
    Ok(out)
}

/// ECMAScript `\s`, `\S`, `\d`, `\w` are ASCII-only; spell them out for a Unicode
/// Rust regex.
fn wide_pattern(expr: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    let mut it = expr.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\\' {
            let Some(n) = it.next() else {
                out.push('\\');
                break;
            };
            match (n, inside) {
                ('s', false) => out.push_str(WS_CLASS),
                ('s', true) => out.push_str(WS_INNER),
                ('S', false) => out.push_str("[^\\t\\n\\x0B\\x0C\\r ]"),
                ('d', false) => out.push_str("[0-9]"),
                ('d', true) => out.push_str("0-9"),
                ('D', false) => out.push_str("[^0-9]"),
                ('w', false) => out.push_str("[0-9A-Za-z_]"),
                ('w', true) => out.push_str("0-9A-Za-z_"),
                _ => {
                    out.push('\\');
                    out.push(n);
                }
            }
            continue;
        }
        if c == '[' && !inside {
            inside = true;
        } else if c == ']' && inside {
            inside = false;
        }
        out.push(c);
    }
    out
}

fn ws_lookahead(p: &str) -> (String, WsMode) {
    for (ws, ns) in [
        ("\\s+(?!\\S)|\\s+", WsMode::WithPlain),
        ("\\s+(?!\\S)", WsMode::Alone),
    ] {
        // the same, spelled out for the wide (Unicode) form
        let wide = ws
            .replace("\\s", WS_CLASS)
            .replace("\\S", "[^\\t\\n\\x0B\\x0C\\r ]");
        for form in [ws.to_string(), wide] {
            let alt = format!("|{form}");
            if let Some(stripped) = p.strip_suffix(&alt) {
                let group = if form.starts_with("\\s") {
                    "(?P<ws>\\s+)".to_string()
                } else {
                    format!("(?P<ws>{WS_CLASS}+)")
                };
                return (format!("{stripped}|{group}"), ns);
            }
            if p == form {
                let group = if form.starts_with("\\s") {
                    "(?P<ws>\\s+)".to_string()
                } else {
                    format!("(?P<ws>{WS_CLASS}+)")
                };
                return (group, ns);
            }
        }
    }
    (p.to_string(), WsMode::None)
}

/// `((?=[X])([^a-z]))` is "a member of X that is not in a-z": a class.
fn lookahead_intersections(p: &str) -> Result<String, String> {
    let re = regex::Regex::new(r"\(\(\?=\[([^\]]*)\]\)\(\[\^(a-z|A-Z)\]\)\)")
        .map_err(|e| e.to_string())?;
    let mut bad = false;
    let out = re.replace_all(p, |c: &regex::Captures| {
        let (class, excl) = (&c[1], &c[2]);
        if !class.contains(excl) {
            bad = true;
        }
        format!("[{}]", class.replacen(excl, "", 1))
    });
    if bad {
        return Err(format!("unsupported look-ahead class in {p}"));
    }
    Ok(out.into_owned())
}

#[inline]
fn is_c_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')
}

impl RegexStep {
    /// Runs the regex over each fragment of `hay` (`bounds(i)` = byte offset of
    /// code point i) and returns the new fragment lengths, in code points.
    fn run(&self, hay: &[u8], frag: std::ops::Range<usize>, out: &mut Vec<(usize, usize)>) {
        let h = &hay[frag.clone()];
        let mut pos = 0usize;
        let mut start_idx = 0usize;
        while pos <= h.len() {
            let Some(caps) = self.re.captures_at(h, pos) else {
                break;
            };
            let Some(m) = caps.get(0) else { break };
            let (ms, mut me) = (m.start(), m.end());
            if self.ws != WsMode::None
                && caps.name("ws").is_some()
                && let Some(&next) = h.get(me)
                && !is_c_space(next)
            {
                {
                    if me - ms > 1 {
                        me -= 1; // whitespace is ASCII in both text forms
                    } else if self.ws == WsMode::Alone {
                        pos = ms + 1;
                        continue;
                    }
                }
            }
            if me == ms {
                // empty match: llama.cpp never relies on these in the rule sets we
                // accept; step over one character.
                pos = ms + unicode::len_utf8(h.get(ms).copied().unwrap_or(0)).max(1);
                continue;
            }
            if ms > start_idx {
                out.push((frag.start + start_idx, frag.start + ms));
            }
            out.push((frag.start + ms, frag.start + me));
            start_idx = me;
            pos = me;
        }
        if start_idx < h.len() {
            out.push((frag.start + start_idx, frag.end));
        }
    }

    fn split_collapsed(&self, collapsed: &[u8], offsets: &[usize]) -> Vec<usize> {
        let mut out = Vec::with_capacity(offsets.len());
        let mut ranges = Vec::new();
        let mut start = 0;
        for &len in offsets {
            ranges.clear();
            self.run(collapsed, start..start + len, &mut ranges);
            out.extend(ranges.iter().map(|(a, b)| b - a));
            start += len;
        }
        out
    }

    fn split_wide(&self, text: &[u8], idx: &[usize], offsets: &[usize]) -> Vec<usize> {
        let mut out = Vec::with_capacity(offsets.len());
        let mut ranges = Vec::new();
        let mut start = 0;
        for &len in offsets {
            ranges.clear();
            self.run(text, idx[start]..idx[start + len], &mut ranges);
            for &(a, b) in &ranges {
                // count code points: bytes that are not UTF-8 continuation bytes
                out.push(text[a..b].iter().filter(|&&x| x & 0xC0 != 0x80).count());
            }
            start += len;
        }
        out
    }
}

const OUT_OF_RANGE: u32 = 0xFFFF_FFFF;

struct Frag<'a> {
    cpts: &'a [u32],
    ini: usize,
    end: usize,
}

impl Frag<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos]
        } else {
            OUT_OF_RANGE
        }
    }
    #[inline]
    fn flags(&self, pos: usize) -> Flags {
        if self.ini <= pos && pos < self.end {
            unicode::flags(self.cpts[pos])
        } else {
            Flags(0)
        }
    }
}

fn for_fragments(
    cpts: &[u32],
    offsets: &[usize],
    mut f: impl FnMut(&Frag, &mut dyn FnMut(usize) -> usize),
) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len() + cpts.len() / 4);
    let mut start = 0;
    for &len in offsets {
        let frag = Frag {
            cpts,
            ini: start,
            end: start + len,
        };
        let mut prev_end = start;
        let mut add = |end: usize| -> usize {
            let l = end - prev_end;
            if l > 0 {
                out.push(l);
            }
            prev_end = end;
            l
        };
        f(&frag, &mut add);
        start += len;
    }
    out
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
fn split_gpt2(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    for_fragments(cpts, offsets, |fr, add| {
        let mut pos = fr.ini;
        while pos < fr.end {
            let cpt = fr.cpt(pos);
            let flags = fr.flags(pos);
            if cpt == '\'' as u32 && pos + 1 < fr.end {
                let n = fr.cpt(pos + 1);
                if [b's', b't', b'm', b'd'].iter().any(|&c| n == c as u32) {
                    pos += add(pos + 2);
                    continue;
                }
                if pos + 2 < fr.end {
                    let nn = fr.cpt(pos + 2);
                    if ((n == 'r' as u32 || n == 'v' as u32) && nn == 'e' as u32)
                        || (n == 'l' as u32 && nn == 'l' as u32)
                    {
                        pos += add(pos + 3);
                        continue;
                    }
                }
            }
            let sp = cpt == ' ' as u32;
            let mut f2 = if sp { fr.flags(pos + 1) } else { flags };
            if f2.is_letter() {
                pos += sp as usize;
                while f2.is_letter() {
                    pos += 1;
                    f2 = fr.flags(pos);
                }
                add(pos);
                continue;
            }
            if f2.is_number() {
                pos += sp as usize;
                while f2.is_number() {
                    pos += 1;
                    f2 = fr.flags(pos);
                }
                add(pos);
                continue;
            }
            let other =
                |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
            if other(f2) {
                pos += sp as usize;
                while other(f2) {
                    pos += 1;
                    f2 = fr.flags(pos);
                }
                add(pos);
                continue;
            }
            let mut nws = 0;
            while fr.flags(pos + nws).is_whitespace() {
                nws += 1;
            }
            if nws > 1 && fr.cpt(pos + nws) != OUT_OF_RANGE {
                pos += nws - 1;
                add(pos);
                continue;
            }
            if nws > 0 {
                pos += nws;
                add(pos);
                continue;
            }
            pos += 1;
            add(pos);
        }
    })
}

/// Llama 3 (`digits` = 3), Qwen 2 (`digits` = 1) and Qwen 3.5 (`digits` = 1,
/// `marks`): `(?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn split_llama3(cpts: &[u32], offsets: &[usize], digits: usize, marks: bool) -> Vec<usize> {
    let is_word = |f: Flags| f.is_letter() || (marks && f.is_accent_mark());
    let is_other = |f: Flags| {
        !(f.is_whitespace() || f.is_letter() || (marks && f.is_accent_mark()) || f.is_number())
    };
    for_fragments(cpts, offsets, |fr, add| {
        let mut pos = fr.ini;
        while pos < fr.end {
            let cpt = fr.cpt(pos);
            let flags = fr.flags(pos);
            if cpt == '\'' as u32 && pos + 1 < fr.end {
                let n = unicode::to_lower(fr.cpt(pos + 1));
                if [b's', b't', b'm', b'd'].iter().any(|&c| n == c as u32) {
                    pos += add(pos + 2);
                    continue;
                }
                if pos + 2 < fr.end {
                    let nn = unicode::to_lower(fr.cpt(pos + 2));
                    if ((n == 'r' as u32 || n == 'v' as u32) && nn == 'e' as u32)
                        || (n == 'l' as u32 && nn == 'l' as u32)
                    {
                        pos += add(pos + 3);
                        continue;
                    }
                }
            }
            if !(cpt == '\r' as u32 || cpt == '\n' as u32 || flags.is_number())
                && (is_word(flags) || is_word(fr.flags(pos + 1)))
            {
                pos += 1;
                while is_word(fr.flags(pos)) {
                    pos += 1;
                }
                add(pos);
                continue;
            }
            if flags.is_number() {
                if digits == 1 {
                    pos += 1;
                    add(pos);
                    continue;
                }
                let mut ini = pos;
                while fr.flags(pos).is_number() {
                    pos += 1;
                    if pos - ini >= digits {
                        add(pos);
                        ini = pos;
                    }
                }
                add(pos);
                continue;
            }
            let mut f2 = if cpt == ' ' as u32 {
                fr.flags(pos + 1)
            } else {
                flags
            };
            if is_other(f2) && flags.any() {
                pos += (cpt == ' ' as u32) as usize;
                while is_other(f2) && f2.any() {
                    pos += 1;
                    f2 = fr.flags(pos);
                }
                let mut c2 = fr.cpt(pos);
                while c2 == '\r' as u32 || c2 == '\n' as u32 {
                    pos += 1;
                    c2 = fr.cpt(pos);
                }
                add(pos);
                continue;
            }
            let mut nws = 0;
            let mut last_rn = 0;
            while fr.flags(pos + nws).is_whitespace() {
                let c2 = fr.cpt(pos + nws);
                if c2 == '\r' as u32 || c2 == '\n' as u32 {
                    last_rn = pos + nws + 1;
                }
                nws += 1;
            }
            if last_rn > 0 {
                pos = last_rn;
                add(pos);
                continue;
            }
            if nws > 1 && fr.cpt(pos + nws) != OUT_OF_RANGE {
                pos += nws - 1;
                add(pos);
                continue;
            }
            if nws > 0 {
                pos += nws;
                add(pos);
                continue;
            }
            pos += 1;
            add(pos);
        }
    })
}

/// `[^\n]+|[\n]+`
fn split_newlines(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut start = 0;
    for &len in offsets {
        let end = start + len;
        let mut pos = start;
        while pos < end {
            let nl = cpts[pos] == '\n' as u32;
            let run = pos;
            while pos < end && (cpts[pos] == '\n' as u32) == nl {
                pos += 1;
            }
            out.push(pos - run);
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(exprs: &[&str], s: &str) -> Vec<String> {
        let p = PreTokenizer::new(exprs).unwrap();
        let (cpts, offs) = p.split(s.as_bytes());
        let mut out = Vec::new();
        let mut i = 0;
        for l in offs {
            out.push(
                cpts[i..i + l]
                    .iter()
                    .map(|&c| char::from_u32(c).unwrap())
                    .collect(),
            );
            i += l;
        }
        out
    }

    #[test]
    fn gpt2_regex_emulation_agrees_with_custom() {
        // The generic path with the ws emulation, on the GPT-2 regex written
        // differently so it does not hit the custom splitter.
        let generic =
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
        let p = PreTokenizer {
            steps: vec![compile_generic(generic)],
            need_collapse: true,
        };
        for s in [
            "Hello  world   x\n\n y",
            "  a",
            "a  ",
            " \t\n",
            "x's 12 ,,, ",
        ] {
            let (c, o) = p.split(s.as_bytes());
            let q = PreTokenizer::new(&[generic]).unwrap();
            let (c2, o2) = q.split(s.as_bytes());
            assert_eq!((c, o), (c2, o2), "{s:?}");
        }
    }

    fn compile_generic(expr: &str) -> Step {
        let pattern = collapse_pattern(expr).unwrap();
        let (pattern, ws) = ws_lookahead(&pattern);
        let re = regex::bytes::Regex::new(&format!("(?-u){pattern}")).unwrap();
        Step::Regex(Box::new(RegexStep {
            re,
            collapsed: true,
            ws,
        }))
    }

    #[test]
    fn llama3_basic() {
        let l3 = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
        assert_eq!(
            words(&[l3], "Hello  world 12345\n\n"),
            ["Hello", " ", " world", " ", "123", "45", "\n\n"]
        );
    }
}
