//! A JSON Schema `pattern` (an ECMA-262 regular expression) as grammar over the JSON
//! string's encoded characters. The subset: literals and escapes (`\d \D \w \W \s \S`,
//! `\n \t \r \f \v \0`, `\xHH`, `\uHHHH`, escaped punctuation), classes `[…]` and
//! `[^…]` with ranges, `.`, groups `(…)` and `(?:…)`, alternation, the quantifiers
//! `* + ? {n} {n,} {n,m}` (lazy ones too: laziness does not change what matches), and
//! `^` / `$` at the ends of top-level alternatives. A pattern matches anywhere in the
//! string unless anchored, as JSON Schema says: an unanchored end admits any characters
//! there. Anything else (backreferences, lookaround, `\b`, `\p{…}`, flags) is refused
//! by name.

/// Characters as sorted, merged, inclusive ranges of scalar values.
#[derive(Clone, Debug, PartialEq)]
pub struct CharSet(Vec<(u32, u32)>);

const MAX_CHAR: u32 = 0x10FFFF;

impl CharSet {
    fn new(mut r: Vec<(u32, u32)>) -> Self {
        r.sort_unstable();
        let mut out: Vec<(u32, u32)> = Vec::new();
        for (a, b) in r {
            match out.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        CharSet(out)
    }
    fn one(c: u32) -> Self {
        CharSet(vec![(c, c)])
    }
    fn union(&self, o: &CharSet) -> Self {
        CharSet::new(self.0.iter().chain(&o.0).copied().collect())
    }
    fn complement(&self) -> Self {
        let mut out = Vec::new();
        let mut next = 0u32;
        for &(a, b) in &self.0 {
            if a > next {
                out.push((next, a - 1));
            }
            next = b + 1;
        }
        if next <= MAX_CHAR {
            out.push((next, MAX_CHAR));
        }
        CharSet(out)
    }
    fn minus(&self, o: &CharSet) -> Self {
        let keep = o.complement();
        let mut out = Vec::new();
        for &(a, b) in &self.0 {
            for &(c, d) in &keep.0 {
                let (lo, hi) = (a.max(c), b.min(d));
                if lo <= hi {
                    out.push((lo, hi));
                }
            }
        }
        CharSet::new(out)
    }
    fn contains(&self, c: u32) -> bool {
        self.0.iter().any(|&(a, b)| a <= c && c <= b)
    }
}

fn ranges(r: &[(u32, u32)]) -> CharSet {
    CharSet::new(r.to_vec())
}
fn digit() -> CharSet {
    ranges(&[(0x30, 0x39)])
}
fn word() -> CharSet {
    ranges(&[(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
}
/// ECMA-262's `\s`: white space and line terminators.
fn space() -> CharSet {
    ranges(&[
        (0x09, 0x0D),
        (0x20, 0x20),
        (0xA0, 0xA0),
        (0x1680, 0x1680),
        (0x2000, 0x200A),
        (0x2028, 0x2029),
        (0x202F, 0x202F),
        (0x205F, 0x205F),
        (0x3000, 0x3000),
        (0xFEFF, 0xFEFF),
    ])
}
/// What `.` does not match: the line terminators.
fn line_terminators() -> CharSet {
    ranges(&[(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
}
fn surrogates() -> CharSet {
    ranges(&[(0xD800, 0xDFFF)])
}

#[derive(Clone, Debug)]
enum Node {
    Set(CharSet),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    Repeat(Box<Node>, u32, Option<u32>),
    Start,
    End,
}

struct Parser<'p> {
    chars: Vec<char>,
    pos: usize,
    pattern: &'p str,
    depth: usize,
}

const MAX_NESTING: usize = 64;

impl Parser<'_> {
    fn err(&self, what: impl std::fmt::Display) -> String {
        format!("`pattern` {:?}: {what}", self.pattern)
    }
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn alt(&mut self) -> Result<Node, String> {
        let mut alts = vec![self.seq()?];
        while self.eat('|') {
            alts.push(self.seq()?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            Node::Alt(alts)
        })
    }
    fn seq(&mut self) -> Result<Node, String> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            items.push(self.quantified(atom)?);
        }
        Ok(Node::Seq(items))
    }
    fn number(&mut self) -> Option<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        self.chars[start..self.pos]
            .iter()
            .collect::<String>()
            .parse()
            .ok()
    }
    fn quantified(&mut self, atom: Node) -> Result<Node, String> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                let save = self.pos;
                self.pos += 1;
                let Some(min) = self.number() else {
                    // A `{` that opens no quantifier is a literal in ECMA's Annex B;
                    // refuse rather than guess.
                    self.pos = save;
                    return Err(self.err("a `{` that is not a quantifier {n,m}"));
                };
                let max = if self.eat(',') {
                    if self.peek() == Some('}') {
                        None
                    } else {
                        Some(self.number().ok_or_else(|| self.err("bad {n,m}"))?)
                    }
                } else {
                    Some(min)
                };
                if !self.eat('}') {
                    return Err(self.err("unclosed {n,m}"));
                }
                if max.is_some_and(|m| m < min) {
                    return Err(self.err("{n,m} with m < n"));
                }
                if min > super::MAX_BOUND as u32 || max.is_some_and(|m| m > super::MAX_BOUND as u32)
                {
                    return Err(self.err(format!("a repetition over {}", super::MAX_BOUND)));
                }
                self.pos -= 1;
                (min, max)
            }
            _ => return Ok(atom),
        };
        self.pos += 1;
        if matches!(atom, Node::Start | Node::End) {
            return Err(self.err("a quantified anchor"));
        }
        // Lazy: the same language.
        self.eat('?');
        if self
            .peek()
            .is_some_and(|c| matches!(c, '*' | '+' | '?' | '{'))
        {
            return Err(self.err("a quantifier after a quantifier"));
        }
        Ok(Node::Repeat(Box::new(atom), min, max))
    }
    fn atom(&mut self) -> Result<Node, String> {
        let c = self.peek().expect("caller checked");
        self.pos += 1;
        Ok(match c {
            '^' => Node::Start,
            '$' => Node::End,
            '.' => Node::Set(line_terminators().complement()),
            '(' => {
                if self.eat('?') && !self.eat(':') {
                    return Err(self.err(
                        "lookaround and named groups are not supported (only `(…)` and `(?:…)`)",
                    ));
                }
                self.depth += 1;
                if self.depth > MAX_NESTING {
                    return Err(self.err(format!("groups nested deeper than {MAX_NESTING}")));
                }
                let inner = self.alt()?;
                self.depth -= 1;
                if !self.eat(')') {
                    return Err(self.err("unclosed `(`"));
                }
                inner
            }
            ')' => return Err(self.err("unbalanced `)`")),
            '[' => Node::Set(self.class()?),
            '\\' => Node::Set(self.escape(false)?),
            '*' | '+' | '?' => return Err(self.err(format!("`{c}` follows nothing"))),
            c => Node::Set(CharSet::one(c as u32)),
        })
    }
    /// After a `\`.
    fn escape(&mut self, in_class: bool) -> Result<CharSet, String> {
        let c = self.peek().ok_or_else(|| self.err("ends in `\\`"))?;
        self.pos += 1;
        let hex = |p: &mut Self, n: usize| -> Result<u32, String> {
            let s: String = p
                .chars
                .get(p.pos..p.pos + n)
                .unwrap_or(&[])
                .iter()
                .collect();
            let v = u32::from_str_radix(&s, 16)
                .ok()
                .filter(|_| s.len() == n)
                .ok_or_else(|| p.err(format!("a bad \\{c} escape")))?;
            p.pos += n;
            Ok(v)
        };
        Ok(match c {
            'd' => digit(),
            'D' => digit().complement(),
            'w' => word(),
            'W' => word().complement(),
            's' => space(),
            'S' => space().complement(),
            'n' => CharSet::one(0x0A),
            't' => CharSet::one(0x09),
            'r' => CharSet::one(0x0D),
            'f' => CharSet::one(0x0C),
            'v' => CharSet::one(0x0B),
            '0' if !self.peek().is_some_and(|c| c.is_ascii_digit()) => CharSet::one(0),
            'x' => CharSet::one(hex(self, 2)?),
            'u' => CharSet::one(hex(self, 4)?),
            'b' if in_class => CharSet::one(0x08),
            'b' | 'B' => return Err(self.err("word boundaries (`\\b`, `\\B`) are not supported")),
            '1'..='9' => return Err(self.err("backreferences are not supported")),
            'p' | 'P' | 'k' | 'c' => {
                return Err(self.err(format!("`\\{c}` escapes are not supported")));
            }
            c if c.is_ascii_alphanumeric() => {
                return Err(self.err(format!("unknown escape `\\{c}`")));
            }
            c => CharSet::one(c as u32),
        })
    }
    /// After a `[`.
    fn class(&mut self) -> Result<CharSet, String> {
        let negated = self.eat('^');
        let mut set = CharSet(Vec::new());
        loop {
            let c = self.peek().ok_or_else(|| self.err("unclosed `[`"))?;
            self.pos += 1;
            if c == ']' {
                break;
            }
            let lo = if c == '\\' {
                self.escape(true)?
            } else {
                CharSet::one(c as u32)
            };
            // A range `a-z` (a `-` before `]` is literal).
            if self.peek() == Some('-') && self.chars.get(self.pos + 1).is_some_and(|&n| n != ']') {
                self.pos += 1;
                let c2 = self.peek().expect("checked");
                self.pos += 1;
                let hi = if c2 == '\\' {
                    self.escape(true)?
                } else {
                    CharSet::one(c2 as u32)
                };
                match (&lo.0[..], &hi.0[..]) {
                    ([(a, a2)], [(b, b2)]) if a == a2 && b == b2 && a <= b => {
                        set = set.union(&CharSet(vec![(*a, *b)]));
                    }
                    _ => return Err(self.err("a bad range in a class")),
                }
            } else {
                set = set.union(&lo);
            }
        }
        Ok(if negated { set.complement() } else { set })
    }
}

/// One character of the set as the JSON string writes it: raw where JSON allows, else
/// its escape.
fn set_expr(set: &CharSet) -> Result<String, String> {
    let set = set.minus(&surrogates());
    // Raw in a JSON string: anything but `"`, `\` and the controls (and DEL, kept out
    // as the `char` primitive keeps it out).
    let needs_escape = ranges(&[(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]);
    let raw = set.minus(&needs_escape);
    let mut alts = Vec::new();
    if !raw.0.is_empty() {
        let mut class = String::from("[");
        for &(a, b) in &raw.0 {
            class.push_str(&class_char(a));
            if b > a {
                class.push('-');
                class.push_str(&class_char(b));
            }
        }
        class.push(']');
        alts.push(class);
    }
    for c in set
        .0
        .iter()
        .flat_map(|&(a, b)| a..=b)
        .filter(|&c| needs_escape.contains(c))
    {
        alts.push(match c {
            0x22 => r#""\\\"""#.to_string(),
            0x5C => r#""\\\\""#.to_string(),
            0x0A => r#""\\n""#.to_string(),
            0x09 => r#""\\t""#.to_string(),
            0x0D => r#""\\r""#.to_string(),
            0x08 => r#""\\b""#.to_string(),
            0x0C => r#""\\f""#.to_string(),
            c => format!("\"\\\\u{c:04x}\""),
        });
    }
    match alts.len() {
        0 => Err("a character class that admits no character".into()),
        1 => Ok(alts.pop().expect("one")),
        _ => Ok(format!("({})", alts.join(" | "))),
    }
}

/// A character inside a GBNF class, escaped unless plainly printable.
fn class_char(c: u32) -> String {
    match char::from_u32(c) {
        Some(ch) if ch.is_ascii_alphanumeric() || " !#$%&'()*+,./:;<=>?@_`{|}~\"".contains(ch) => {
            ch.to_string()
        }
        _ if c <= 0xFF => format!("\\x{c:02X}"),
        _ if c <= 0xFFFF => format!("\\u{c:04X}"),
        _ => format!("\\U{c:08X}"),
    }
}

fn expr(n: &Node) -> Result<String, String> {
    Ok(match n {
        Node::Set(s) => set_expr(s)?,
        Node::Seq(items) if items.is_empty() => "\"\"".into(),
        Node::Seq(items) => {
            let parts: Result<Vec<String>, String> = items.iter().map(expr).collect();
            format!("({})", parts?.join(" "))
        }
        Node::Alt(alts) => {
            let parts: Result<Vec<String>, String> = alts.iter().map(expr).collect();
            format!("({})", parts?.join(" | "))
        }
        Node::Repeat(inner, min, max) => {
            let i = expr(inner)?;
            match (min, max) {
                (0, None) => format!("{i}*"),
                (1, None) => format!("{i}+"),
                (0, Some(1)) => format!("{i}?"),
                (m, None) => format!("{i}{{{m},}}"),
                (m, Some(x)) if m == x => format!("{i}{{{m}}}"),
                (m, Some(x)) => format!("{i}{{{m},{x}}}"),
            }
        }
        Node::Start | Node::End => {
            return Err("an anchor inside the pattern is not supported".into());
        }
    })
}

/// The grammar of the string's contents (between its quotes) for `pattern`; `any` is
/// the expression of one arbitrary string character, for unanchored ends.
pub fn to_gbnf(pattern: &str, any: &str) -> Result<String, String> {
    let mut p = Parser {
        chars: pattern.chars().collect(),
        pos: 0,
        pattern,
        depth: 0,
    };
    let tree = p.alt()?;
    if p.pos != p.chars.len() {
        return Err(p.err("unbalanced `)`"));
    }
    let branches = match tree {
        Node::Alt(a) => a,
        other => vec![other],
    };
    let mut out = Vec::new();
    for b in branches {
        let mut items = match b {
            Node::Seq(items) => items,
            other => vec![other],
        };
        let anchored_start = matches!(items.first(), Some(Node::Start));
        if anchored_start {
            items.remove(0);
        }
        let anchored_end = matches!(items.last(), Some(Node::End));
        if anchored_end {
            items.pop();
        }
        let body = expr(&Node::Seq(items)).map_err(|e| p.err(e))?;
        let head = if anchored_start {
            String::new()
        } else {
            format!("{any}* ")
        };
        let tail = if anchored_end {
            String::new()
        } else {
            format!(" {any}*")
        };
        out.push(format!("{head}{body}{tail}"));
    }
    Ok(format!("({})", out.join(" | ")))
}
