//! llama.cpp's GBNF, parsed into the flat rule table the matcher walks.
//!
//! `name ::= alternatives` rules (names `[A-Za-z0-9_-]+`, `root` the start); a sequence
//! of string literals (`"…"` with `\x`, `\u`, `\U`, `\t\n\r\\\"\[\]` escapes),
//! character classes (`[a-z]`, `[^"\\]`), `.` (any character), rule references,
//! groups `( … )` and the postfix operators `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`,
//! `{,n}`; `#` comments. A rule ends at the end of its line unless inside parentheses
//! or right after `::=` or `|`, as in llama.cpp. Repetitions become generated
//! right-recursive rules, as llama.cpp builds them.

use super::{Class, Elem, GrammarError, Rules};
use std::collections::HashMap;

/// Repetition bounds past this are refused (each copy is a rule element).
const MAX_REPEAT: u32 = 10_000;
/// Parentheses nested deeper than this are refused (the parser recurses per level).
const MAX_NESTING: usize = 256;

struct Parser<'s> {
    src: &'s [u8],
    pos: usize,
    /// Rule name → id; ids are indices into `rules`.
    ids: HashMap<String, u32>,
    names: Vec<String>,
    /// Alternatives per rule (`None`: referenced, not yet defined).
    rules: Vec<Option<Vec<Vec<Elem>>>>,
    /// Current parenthesis depth.
    depth: usize,
}

impl<'s> Parser<'s> {
    fn err(&self, what: impl Into<String>) -> GrammarError {
        let line = 1 + self.src[..self.pos.min(self.src.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        GrammarError::Syntax {
            line,
            what: what.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    /// Skips spaces and comments; newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newlines => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| String::from_utf8_lossy(&self.src[start..self.pos]).into_owned())
    }

    fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.rules.len() as u32;
        self.ids.insert(name.to_string(), id);
        self.names.push(name.to_string());
        self.rules.push(None);
        id
    }

    /// A fresh rule for a group or repetition, named after its parent as llama.cpp does.
    fn generated(&mut self, parent: &str, alts: Vec<Vec<Elem>>) -> u32 {
        let mut n = self.rules.len();
        let name = loop {
            let candidate = format!("{parent}_{n}");
            if !self.ids.contains_key(&candidate) {
                break candidate;
            }
            n += 1;
        };
        let id = self.id(&name);
        self.rules[id as usize] = Some(alts);
        id
    }

    /// One UTF-8 character or escape inside a literal or class.
    fn char(&mut self) -> Result<u32, GrammarError> {
        let Some(c) = self.peek() else {
            return Err(self.err("unexpected end of input"));
        };
        if c == b'\\' {
            self.pos += 1;
            let e = self.peek().ok_or_else(|| self.err("unfinished escape"))?;
            self.pos += 1;
            let hex = |p: &mut Self, n: usize| -> Result<u32, GrammarError> {
                let s = p
                    .src
                    .get(p.pos..p.pos + n)
                    .ok_or_else(|| p.err("short \\x/\\u escape"))?;
                let s = std::str::from_utf8(s).map_err(|_| p.err("bad escape"))?;
                let v = u32::from_str_radix(s, 16)
                    .map_err(|_| p.err(format!("bad hex escape {s:?}")))?;
                p.pos += n;
                Ok(v)
            };
            return match e {
                b'x' => hex(self, 2),
                b'u' => hex(self, 4),
                b'U' => hex(self, 8),
                b't' => Ok('\t' as u32),
                b'r' => Ok('\r' as u32),
                b'n' => Ok('\n' as u32),
                b'\\' | b'"' | b'[' | b']' | b'-' | b'^' => Ok(u32::from(e)),
                other => Err(self.err(format!("unknown escape \\{}", other as char))),
            };
        }
        let rest = &self.src[self.pos..];
        let len = match c {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        };
        let s = rest.get(..len).and_then(|b| std::str::from_utf8(b).ok());
        let ch = s
            .and_then(|s| s.chars().next())
            .ok_or_else(|| self.err("invalid UTF-8"))?;
        self.pos += len;
        Ok(ch as u32)
    }

    fn alternatives(&mut self, rule: &str, nested: bool) -> Result<Vec<Vec<Elem>>, GrammarError> {
        let mut alts = vec![self.sequence(rule, nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(rule, nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, rule: &str, nested: bool) -> Result<Vec<Elem>, GrammarError> {
        let mut seq: Vec<Elem> = Vec::new();
        // Where the last item starts in `seq` (what a postfix operator applies to).
        let mut last_start = None;
        loop {
            let start = seq.len();
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    while self.peek() != Some(b'"') {
                        if self.peek().is_none() {
                            return Err(self.err("unterminated string literal"));
                        }
                        let c = self.char()?;
                        seq.push(Elem::Char(Class::single(c)));
                    }
                    self.pos += 1;
                    if seq.len() == start {
                        // "" matches nothing: no item for an operator to take.
                        self.space(nested);
                        last_start = None;
                        continue;
                    }
                }
                Some(b'[') => {
                    self.pos += 1;
                    let negated = self.peek() == Some(b'^');
                    if negated {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    while self.peek() != Some(b']') {
                        if self.peek().is_none() {
                            return Err(self.err("unterminated character class"));
                        }
                        let lo = self.char()?;
                        let hi = if self.peek() == Some(b'-')
                            && self.src.get(self.pos + 1).is_some_and(|&c| c != b']')
                        {
                            self.pos += 1;
                            self.char()?
                        } else {
                            lo
                        };
                        if hi < lo {
                            return Err(self.err("a character range runs backwards"));
                        }
                        ranges.push((lo, hi));
                    }
                    self.pos += 1;
                    seq.push(Elem::Char(Class { ranges, negated }));
                }
                Some(b'.') => {
                    self.pos += 1;
                    seq.push(Elem::Char(Class {
                        ranges: Vec::new(),
                        negated: true,
                    }));
                }
                Some(b'(') => {
                    self.pos += 1;
                    self.space(true);
                    self.depth += 1;
                    if self.depth > MAX_NESTING {
                        return Err(
                            self.err(format!("parentheses nested deeper than {MAX_NESTING}"))
                        );
                    }
                    let alts = self.alternatives(rule, true)?;
                    self.depth -= 1;
                    if self.peek() != Some(b')') {
                        return Err(self.err("expected ')'"));
                    }
                    self.pos += 1;
                    let id = self.generated(rule, alts);
                    seq.push(Elem::Rule(id));
                }
                Some(c) if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => {
                    let save = self.pos;
                    let name = self.name().expect("a name starts here");
                    // `name ::=` starts the next rule: this sequence has ended.
                    let after = self.pos;
                    self.space(false);
                    if self.src[self.pos..].starts_with(b"::=") {
                        self.pos = save;
                        break;
                    }
                    self.pos = after;
                    let id = self.id(&name);
                    seq.push(Elem::Rule(id));
                }
                Some(op @ (b'*' | b'+' | b'?' | b'{')) => {
                    let Some(s) = last_start else {
                        return Err(self.err(format!("'{}' follows nothing", op as char)));
                    };
                    self.pos += 1;
                    let (min, max) = match op {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        b'?' => (0, Some(1)),
                        _ => self.braces()?,
                    };
                    let item: Vec<Elem> = seq.drain(s..).collect();
                    let rep = self.repeat(rule, item, min, max);
                    seq.extend(rep);
                    self.space(nested);
                    last_start = None;
                    continue;
                }
                _ => break,
            }
            last_start = Some(start);
            self.space(nested);
        }
        Ok(seq)
    }

    /// `{m}`, `{m,}`, `{m,n}`, `{,n}` after the `{`.
    fn braces(&mut self) -> Result<(u32, Option<u32>), GrammarError> {
        let num = |p: &mut Self| -> Result<Option<u32>, GrammarError> {
            p.space(false);
            let start = p.pos;
            while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                p.pos += 1;
            }
            if p.pos == start {
                return Ok(None);
            }
            let s = std::str::from_utf8(&p.src[start..p.pos]).expect("digits");
            let n: u32 = s.parse().map_err(|_| p.err("repetition count too large"))?;
            if n > MAX_REPEAT {
                return Err(p.err(format!("repetition count {n} is over {MAX_REPEAT}")));
            }
            p.space(false);
            Ok(Some(n))
        };
        let min = num(self)?;
        let (min, max) = if self.peek() == Some(b',') {
            self.pos += 1;
            (min.unwrap_or(0), num(self)?)
        } else {
            let m = min.ok_or_else(|| self.err("expected a number in { }"))?;
            (m, Some(m))
        };
        if self.peek() != Some(b'}') {
            return Err(self.err("expected '}'"));
        }
        self.pos += 1;
        if max.is_some_and(|m| m < min) {
            return Err(self.err("repetition {m,n} with n < m"));
        }
        Ok((min, max))
    }

    /// `item{min,max}` as elements: `min` copies, then either `x*`-style recursion
    /// (no max) or nested optionals, as llama.cpp expands them.
    fn repeat(&mut self, rule: &str, item: Vec<Elem>, min: u32, max: Option<u32>) -> Vec<Elem> {
        // A multi-element item becomes one rule so copies stay small.
        let item = if item.len() == 1 {
            item
        } else {
            vec![Elem::Rule(self.generated(rule, vec![item]))]
        };
        let mut out = Vec::new();
        for _ in 0..min {
            out.extend(item.iter().cloned());
        }
        match max {
            None => {
                // star ::= item star | ε
                let id = self.id(&format!("{rule}_star_{}", self.rules.len()));
                let mut rec = item.clone();
                rec.push(Elem::Rule(id));
                self.rules[id as usize] = Some(vec![rec, Vec::new()]);
                out.push(Elem::Rule(id));
            }
            Some(max) if max > min => {
                // opt_k ::= item opt_{k-1} | ε, innermost first
                let mut inner: Option<u32> = None;
                for _ in min..max {
                    let mut alt = item.clone();
                    if let Some(i) = inner {
                        alt.push(Elem::Rule(i));
                    }
                    inner = Some(self.generated(rule, vec![alt, Vec::new()]));
                }
                out.push(Elem::Rule(inner.expect("max > min")));
            }
            Some(_) => {}
        }
        out
    }

    fn grammar(mut self) -> Result<Rules, GrammarError> {
        self.space(true);
        while self.peek().is_some() {
            let name = self
                .name()
                .ok_or_else(|| self.err("expected a rule name"))?;
            self.space(false);
            if !self.src[self.pos..].starts_with(b"::=") {
                return Err(self.err(format!("expected '::=' after '{name}'")));
            }
            self.pos += 3;
            self.space(true);
            let id = self.id(&name);
            if self.rules[id as usize].is_some() {
                return Err(self.err(format!("rule '{name}' is defined twice")));
            }
            let alts = self.alternatives(&name, false)?;
            self.rules[id as usize] = Some(alts);
            match self.peek() {
                None | Some(b'\n' | b'\r') => self.space(true),
                Some(c) => return Err(self.err(format!("unexpected '{}'", c as char))),
            }
        }
        let root = *self.ids.get("root").ok_or(GrammarError::NoRoot)?;
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, r) in self.rules.into_iter().enumerate() {
            rules.push(r.ok_or_else(|| GrammarError::Undefined(self.names[i].clone()))?);
        }
        Rules::new(rules, self.names, root)
    }
}

/// Parses GBNF text.
pub fn parse(src: &str) -> Result<Rules, GrammarError> {
    Parser {
        src: src.as_bytes(),
        pos: 0,
        ids: HashMap::new(),
        names: Vec::new(),
        rules: Vec::new(),
        depth: 0,
    }
    .grammar()
}
