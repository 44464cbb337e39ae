//! Constrained sampling: a grammar (llama.cpp's GBNF, JSON, or a JSON Schema compiled to
//! GBNF) matched against the vocabulary, so that every sampled token keeps the output
//! a prefix of a sentence of the grammar.
//!
//! The matcher is a pushdown automaton over Unicode scalar values, as llama.cpp's: a
//! state is a set of stacks of rule positions, each stack's top a character class
//! (or no stack frame at all: the sentence may end here). Tokens are byte strings; a
//! token may end inside a UTF-8 sequence, which the state carries into the next token.
//!
//! Cost: sampling checks only the token it drew ([`Constraint::accepts`], a few stack
//! steps); only when the grammar rejects it is the whole vocabulary masked, by a walk
//! over a byte trie of the vocabulary that prunes every token sharing a rejected
//! prefix ([`Constraint::allowed`]). Drawing from the unconstrained distribution and,
//! on rejection, again from the masked one gives exactly the masked distribution (the
//! rejection rule), and the same argmax at temperature 0.

mod gbnf;
pub mod schema;

use std::sync::Arc;

/// Live stacks past this make a character unacceptable (see `accept_char`).
const MAX_STACKS: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrammarError {
    #[error("grammar line {line}: {what}")]
    Syntax { line: usize, what: String },
    #[error("grammar has no 'root' rule")]
    NoRoot,
    #[error("grammar rule '{0}' is used but never defined")]
    Undefined(String),
    #[error(
        "grammar rule '{0}' is left-recursive (it can start with itself), which this matcher cannot run; rewrite it right-recursive"
    )]
    LeftRecursion(String),
    #[error("JSON schema: {0}")]
    Schema(String),
}

/// A set of Unicode scalar values: ranges, possibly negated (`.` is an empty negated set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Class {
    ranges: Vec<(u32, u32)>,
    negated: bool,
}

impl Class {
    fn single(c: u32) -> Self {
        Class {
            ranges: vec![(c, c)],
            negated: false,
        }
    }

    fn contains(&self, c: u32) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != self.negated
    }

    /// Whether some value in `lo..=hi` is in the set (for a partial UTF-8 sequence).
    fn meets(&self, lo: u32, hi: u32) -> bool {
        if !self.negated {
            return self.ranges.iter().any(|&(a, b)| a <= hi && lo <= b);
        }
        // Negated: is `lo..=hi` entirely covered by the ranges? Walk them in order.
        let mut r = self.ranges.clone();
        r.sort_unstable();
        let mut next = lo;
        for (a, b) in r {
            if a > next {
                break;
            }
            if b >= next {
                if b >= hi {
                    return false;
                }
                next = b + 1;
            }
        }
        true
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Elem {
    Char(Class),
    Rule(u32),
}

/// Flattened grammar: every alternative's elements followed by `End`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Flat {
    Char(Class),
    Rule(u32),
    End,
}

/// A compiled grammar.
#[derive(Debug)]
pub struct Rules {
    flat: Vec<Flat>,
    /// Per rule, where each alternative starts in `flat`.
    alts: Vec<Vec<u32>>,
    names: Vec<String>,
    root: u32,
    /// The JSON Schema the grammar was compiled from (None for GBNF).
    schema: Option<serde_json::Value>,
}

impl Rules {
    fn new(
        rules: Vec<Vec<Vec<Elem>>>,
        names: Vec<String>,
        root: u32,
    ) -> Result<Self, GrammarError> {
        check_left_recursion(&rules, &names)?;
        let mut flat = Vec::new();
        let mut alts = Vec::with_capacity(rules.len());
        for r in &rules {
            let mut starts = Vec::with_capacity(r.len());
            for alt in r {
                starts.push(flat.len() as u32);
                flat.extend(alt.iter().map(|e| match e {
                    Elem::Char(c) => Flat::Char(c.clone()),
                    Elem::Rule(id) => Flat::Rule(*id),
                }));
                flat.push(Flat::End);
            }
            alts.push(starts);
        }
        Ok(Rules {
            flat,
            alts,
            names,
            root,
            schema: None,
        })
    }

    /// Parses llama.cpp GBNF.
    pub fn gbnf(src: &str) -> Result<Arc<Self>, GrammarError> {
        gbnf::parse(src).map(Arc::new)
    }

    /// Any JSON value (`--json`).
    pub fn json() -> Arc<Self> {
        Self::gbnf(&schema::to_gbnf(&serde_json::json!({})).expect("the empty schema compiles"))
            .expect("the JSON grammar parses")
    }

    /// Any JSON object: JSON mode as Ollama (`format: "json"`, whose grammar is
    /// `root ::= object`) and OpenAI (`response_format: json_object`) give it.
    pub fn json_object() -> Arc<Self> {
        Self::json_schema(&serde_json::json!({"type": "object"}))
            .expect("the object schema compiles")
    }

    /// A JSON Schema's grammar under a caller's root: the schema's sentences are the
    /// rule `json`, which `root` (GBNF rules, `root ::= …` among them) wraps in markup,
    /// such as a model's tool-call syntax around a call's JSON.
    pub fn json_schema_in(
        schema: &serde_json::Value,
        root: &str,
    ) -> Result<Arc<Self>, GrammarError> {
        Self::gbnf(&(schema::to_gbnf_as(schema, "json")? + root))
    }

    /// As [`Rules::json_schema_in`], with a second document as the rule `answer` (the
    /// generic tool format's response under a requested schema).
    pub fn json_schemas_in(
        call: &serde_json::Value,
        answer: &serde_json::Value,
        root: &str,
    ) -> Result<Arc<Self>, GrammarError> {
        Self::gbnf(&(schema::to_gbnf_tops(&[(call, "json"), (answer, "answer")])? + root))
    }

    /// A JSON Schema's grammar (`--json-schema`).
    pub fn json_schema(schema: &serde_json::Value) -> Result<Arc<Self>, GrammarError> {
        let mut rules = gbnf::parse(&schema::to_gbnf(schema)?)?;
        rules.schema = Some(schema.clone());
        Ok(Arc::new(rules))
    }

    /// The JSON Schema this grammar was compiled from (None for GBNF).
    pub fn schema(&self) -> Option<&serde_json::Value> {
        self.schema.as_ref()
    }

    pub fn rule_count(&self) -> usize {
        self.alts.len()
    }

    /// The rules' names (generated ones included), by id.
    pub fn rule_names(&self) -> &[String] {
        &self.names
    }

    /// Pushes every stack `stack` can reach whose top is a character class (or which is
    /// empty: the sentence is complete). Iterative: a long chain of rules cannot
    /// exhaust the thread's stack.
    fn expand(&self, stack: Vec<u32>, out: &mut Vec<Vec<u32>>) {
        let mut work = vec![stack];
        while let Some(mut stack) = work.pop() {
            loop {
                let Some(&top) = stack.last() else {
                    out.push(stack);
                    break;
                };
                match &self.flat[top as usize] {
                    Flat::Char(_) => {
                        out.push(stack);
                        break;
                    }
                    Flat::End => {
                        stack.pop();
                    }
                    Flat::Rule(r) => {
                        stack.pop();
                        // No frame for a continuation that only ends its alternative
                        // (keeps right recursion, every repetition, at constant depth).
                        if self.flat[top as usize + 1] != Flat::End {
                            stack.push(top + 1);
                        }
                        let (last, rest) = self.alts[*r as usize]
                            .split_last()
                            .expect("every rule has an alternative");
                        for &a in rest {
                            let mut s = stack.clone();
                            s.push(a);
                            work.push(s);
                        }
                        stack.push(*last);
                    }
                }
            }
        }
    }
}

/// Refuses rules that can begin with themselves (the expansion would not terminate).
fn check_left_recursion(rules: &[Vec<Vec<Elem>>], names: &[String]) -> Result<(), GrammarError> {
    let n = rules.len();
    // Which rules can match the empty string (fixpoint).
    let mut nullable = vec![false; n];
    loop {
        let mut changed = false;
        for (i, r) in rules.iter().enumerate() {
            if !nullable[i]
                && r.iter().any(|alt| {
                    alt.iter()
                        .all(|e| matches!(e, Elem::Rule(x) if nullable[*x as usize]))
                })
            {
                nullable[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Edges rule -> rules it may begin with.
    let first: Vec<Vec<u32>> = rules
        .iter()
        .map(|r| {
            let mut f = Vec::new();
            for alt in r {
                for e in alt {
                    match e {
                        Elem::Rule(x) => {
                            f.push(*x);
                            if !nullable[*x as usize] {
                                break;
                            }
                        }
                        Elem::Char(_) => break,
                    }
                }
            }
            f
        })
        .collect();
    // A cycle in `first` is left recursion: iterative DFS with colours.
    let mut colour = vec![0u8; n];
    for start in 0..n {
        if colour[start] != 0 {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        colour[start] = 1;
        while let Some(&mut (v, ref mut i)) = stack.last_mut() {
            if *i < first[v].len() {
                let w = first[v][*i] as usize;
                *i += 1;
                match colour[w] {
                    0 => {
                        colour[w] = 1;
                        stack.push((w, 0));
                    }
                    1 => return Err(GrammarError::LeftRecursion(names[w].clone())),
                    _ => {}
                }
            } else {
                colour[v] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}

/// Bytes of a UTF-8 sequence seen so far (the token ended inside it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Partial {
    value: u32,
    /// Continuation bytes still to come (0: none pending).
    missing: u8,
    /// Bytes seen (for the range of values the sequence can still become).
    seen: u8,
}

impl Partial {
    /// The smallest and largest scalar value the sequence can still complete to.
    fn range(&self) -> (u32, u32) {
        let shift = 6 * u32::from(self.missing);
        let lo = self.value << shift;
        let hi = lo | ((1u32 << shift) - 1);
        (lo, hi)
    }
}

/// Where the matcher is: the live stacks and any pending UTF-8 bytes.
#[derive(Clone, Debug)]
pub struct GrammarState {
    rules: Arc<Rules>,
    stacks: Vec<Vec<u32>>,
    partial: Partial,
}

impl GrammarState {
    /// The start: the root rule's alternatives, expanded.
    pub fn new(rules: Arc<Rules>) -> Self {
        let mut stacks = Vec::new();
        for &a in &rules.alts[rules.root as usize] {
            rules.expand(vec![a], &mut stacks);
        }
        dedup(&mut stacks);
        GrammarState {
            rules,
            stacks,
            partial: Partial::default(),
        }
    }

    /// Whether the output may end here.
    pub fn is_complete(&self) -> bool {
        self.partial.missing == 0 && self.stacks.iter().any(Vec::is_empty)
    }

    /// Whether nothing but the end may follow.
    pub fn is_finished(&self) -> bool {
        self.partial.missing == 0 && self.stacks.iter().all(Vec::is_empty)
    }

    fn accept_char(&self, c: u32) -> Vec<Vec<u32>> {
        let mut next = Vec::new();
        for s in &self.stacks {
            let Some(&top) = s.last() else { continue };
            if let Flat::Char(class) = &self.rules.flat[top as usize]
                && class.contains(c)
            {
                let mut s = s.clone();
                *s.last_mut().expect("non-empty") = top + 1;
                self.rules.expand(s, &mut next);
            }
        }
        dedup(&mut next);
        // An ambiguous grammar can multiply its stacks with every character; past the
        // bound the character is refused rather than the process's memory spent.
        if next.len() > MAX_STACKS {
            next.clear();
        }
        next
    }

    /// Whether some stack can take a character in `lo..=hi`.
    fn can_take(&self, lo: u32, hi: u32) -> bool {
        self.stacks.iter().any(|s| {
            s.last().is_some_and(
                |&t| matches!(&self.rules.flat[t as usize], Flat::Char(c) if c.meets(lo, hi)),
            )
        })
    }

    /// The state after one more byte, or `None` if the grammar cannot take it.
    fn advance_byte(&self, b: u8) -> Option<Self> {
        let mut p = self.partial;
        if p.missing == 0 {
            let (value, missing) = match b {
                0x00..=0x7f => (u32::from(b), 0),
                0xc2..=0xdf => (u32::from(b & 0x1f), 1),
                0xe0..=0xef => (u32::from(b & 0x0f), 2),
                0xf0..=0xf4 => (u32::from(b & 0x07), 3),
                _ => return None,
            };
            p = Partial {
                value,
                missing,
                seen: 1,
            };
        } else {
            if b & 0xc0 != 0x80 {
                return None;
            }
            p.value = (p.value << 6) | u32::from(b & 0x3f);
            p.missing -= 1;
            p.seen += 1;
        }
        if p.missing > 0 {
            let (lo, hi) = p.range();
            if !self.can_take(lo.max(0x80), hi.min(0x10ffff)) {
                return None;
            }
            return Some(GrammarState {
                rules: self.rules.clone(),
                stacks: self.stacks.clone(),
                partial: p,
            });
        }
        let c = p.value;
        // Overlong encodings and surrogates are not characters.
        let min = [0, 0x80, 0x800, 0x10000][usize::from(p.seen) - 1];
        if c < min || (0xd800..=0xdfff).contains(&c) || c > 0x10ffff {
            return None;
        }
        let stacks = self.accept_char(c);
        (!stacks.is_empty()).then(|| GrammarState {
            rules: self.rules.clone(),
            stacks,
            partial: Partial::default(),
        })
    }

    /// The state after `bytes`, or `None` if the grammar cannot take them.
    pub fn advance(&self, bytes: &[u8]) -> Option<Self> {
        let mut s = self.clone();
        for &b in bytes {
            s = s.advance_byte(b)?;
        }
        Some(s)
    }
}

fn dedup(stacks: &mut Vec<Vec<u32>>) {
    stacks.sort_unstable();
    stacks.dedup();
}

/// No node (`first_child` / `next_sibling`).
const NONE: u32 = u32::MAX;

/// The vocabulary as a byte trie (tokens sharing a prefix share its walk) and the
/// tokens' texts, in flat arrays: nodes in preorder, each with its edge byte, first
/// child and next sibling, and the tokens ending there as a range of `toks`. About
/// 16 bytes per node — Gemma's 262k vocabulary is ~1.5M nodes — where a `Vec` per node
/// cost several times that.
#[derive(Debug)]
pub struct TokenTrie {
    byte: Vec<u8>,
    first_child: Vec<u32>,
    next_sibling: Vec<u32>,
    /// Node `n`'s tokens: `toks[tok_start[n]..tok_start[n + 1]]`.
    tok_start: Vec<u32>,
    toks: Vec<u32>,
    /// Token `id`'s text: `text[text_start[id]..text_start[id + 1]]`.
    text: Vec<u8>,
    text_start: Vec<u32>,
    /// End-of-generation tokens: allowed exactly when the grammar is complete.
    eog: Vec<u32>,
}

impl TokenTrie {
    /// `pieces[id]`: token `id`'s text (empty for control tokens, which the grammar
    /// never allows); `eog`: the end-of-generation ids.
    pub fn new(pieces: &[Vec<u8>], eog: &[u32]) -> Self {
        let mut text = Vec::with_capacity(pieces.iter().map(Vec::len).sum());
        let mut text_start = Vec::with_capacity(pieces.len() + 1);
        for p in pieces {
            text_start.push(text.len() as u32);
            text.extend_from_slice(p);
        }
        text_start.push(text.len() as u32);
        // Inserted in byte order, the nodes come out in preorder, and every node's
        // tokens arrive before any later node is made: `tok_start` is monotone.
        let mut order: Vec<u32> = (0..pieces.len() as u32)
            .filter(|&id| !pieces[id as usize].is_empty() && !eog.contains(&id))
            .collect();
        order
            .sort_unstable_by(|&a, &b| pieces[a as usize].cmp(&pieces[b as usize]).then(a.cmp(&b)));
        let mut t = TokenTrie {
            byte: vec![0],
            first_child: vec![NONE],
            next_sibling: vec![NONE],
            tok_start: vec![0],
            toks: Vec::with_capacity(order.len()),
            text,
            text_start,
            eog: eog.to_vec(),
        };
        // The path to the last inserted piece: (node, its last child so far).
        let mut path: Vec<(u32, u32)> = vec![(0, NONE)];
        let mut prev: &[u8] = &[];
        for &id in &order {
            let piece = pieces[id as usize].as_slice();
            let common = piece.iter().zip(prev).take_while(|(a, b)| a == b).count();
            path.truncate(common + 1);
            for &b in &piece[common..] {
                let n = t.byte.len() as u32;
                t.byte.push(b);
                t.first_child.push(NONE);
                t.next_sibling.push(NONE);
                t.tok_start.push(t.toks.len() as u32);
                let (parent, last) = path.last_mut().expect("the root is always on the path");
                if *last == NONE {
                    t.first_child[*parent as usize] = n;
                } else {
                    t.next_sibling[*last as usize] = n;
                }
                *last = n;
                path.push((n, NONE));
            }
            t.toks.push(id);
            prev = piece;
        }
        t.tok_start.push(t.toks.len() as u32);
        t
    }

    pub fn n_vocab(&self) -> usize {
        self.text_start.len() - 1
    }

    /// Token `id`'s text (empty for an id out of range).
    fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.text_start.get(i), self.text_start.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.text[a as usize..b as usize],
            _ => &[],
        }
    }

    fn tokens(&self, node: u32) -> &[u32] {
        let n = node as usize;
        &self.toks[self.tok_start[n] as usize..self.tok_start[n + 1] as usize]
    }
}

/// A grammar applied to a vocabulary: what sampling consults per token.
#[derive(Clone, Debug)]
pub struct Constraint {
    state: GrammarState,
    trie: Arc<TokenTrie>,
}

impl Constraint {
    pub fn new(rules: Arc<Rules>, trie: Arc<TokenTrie>) -> Self {
        Constraint {
            state: GrammarState::new(rules),
            trie,
        }
    }

    pub fn state(&self) -> &GrammarState {
        &self.state
    }

    /// Whether `token` may come next.
    pub fn accepts(&self, token: u32) -> bool {
        if self.trie.eog.contains(&token) {
            return self.state.is_complete();
        }
        let p = self.trie.piece(token);
        !p.is_empty() && self.state.advance(p).is_some()
    }

    /// Takes `token` (which [`Constraint::accepts`]); false if it does not.
    pub fn accept(&mut self, token: u32) -> bool {
        if self.trie.eog.contains(&token) {
            return self.state.is_complete();
        }
        let p = self.trie.piece(token);
        match (!p.is_empty()).then(|| self.state.advance(p)).flatten() {
            Some(s) => {
                self.state = s;
                true
            }
            None => false,
        }
    }

    /// `allowed[id]` for every token id: the mask.
    pub fn allowed(&self) -> Vec<bool> {
        let mut allowed = vec![false; self.trie.n_vocab()];
        if self.state.is_complete() {
            for &e in &self.trie.eog {
                if let Some(a) = allowed.get_mut(e as usize) {
                    *a = true;
                }
            }
        }
        // Depth-first over the trie, carrying the state; a rejected byte prunes the
        // whole subtree.
        let trie = &self.trie;
        let mut work: Vec<(u32, GrammarState)> = vec![(0, self.state.clone())];
        while let Some((node, state)) = work.pop() {
            let mut child = trie.first_child[node as usize];
            while child != NONE {
                if let Some(next) = state.advance_byte(trie.byte[child as usize]) {
                    for &t in trie.tokens(child) {
                        allowed[t as usize] = true;
                    }
                    if trie.first_child[child as usize] != NONE {
                        work.push((child, next));
                    }
                }
                child = trie.next_sibling[child as usize];
            }
        }
        allowed
    }
}

#[cfg(test)]
mod tests;
