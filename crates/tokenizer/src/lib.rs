//! Tokenizers loaded from a GGUF file's `tokenizer.ggml.*` metadata, producing
//! exactly llama.cpp b11434's token ids: byte-level BPE (with every pre-tokenizer
//! rule set llama.cpp ships a vocab test for, plus o200k), SentencePiece (SPM) and
//! WordPiece (WPM). See `docs/tokenizers.md`.

mod bpe;
mod decode;
mod load;
mod pretok;
mod rules;
mod special;
mod spm;
mod strtab;
mod unicode;
mod unicode_data;
mod vocab;
mod wpm;

pub use decode::{CleanSpaces, StreamDecoder};
pub use rules::KNOWN_PRE;
pub use vocab::{TokenType, attr};

use std::collections::BTreeSet;
use strtab::{PieceTable, StrTable, TokenIndex};

/// Errors from loading a vocabulary or decoding ids.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Metadata(String),
    #[error(
        "unsupported tokenizer model '{0}' (supported: gpt2 (byte-level BPE), llama (SentencePiece), bert (WordPiece), gemma4)"
    )]
    UnsupportedModel(String),
    #[error("token id {id} is out of range (vocabulary has {n_vocab} tokens)")]
    IdOutOfRange { id: u64, n_vocab: usize },
}

/// Which algorithm the vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SentencePiece (`tokenizer.ggml.model = llama`).
    Spm,
    /// Byte-level BPE (`gpt2`) or SPM-style BPE (`gemma4`).
    Bpe,
    /// WordPiece (`bert`).
    Wpm,
}

/// Special token ids (None where the vocabulary has none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// A loaded tokenizer. Cheap to share (`&Tokenizer` is `Sync`).
pub struct Tokenizer {
    kind: Kind,
    model: String,
    pre: String,
    pre_known: bool,
    rule_name: &'static str,
    tokens: StrTable,
    scores: Vec<f32>,
    /// `attr` bits; all fit in 16 (see `vocab::attr`).
    attrs: Vec<u16>,
    /// Text -> id (ids only; texts are looked up in `tokens`).
    token_to_id: TokenIndex,
    special: SpecialIds,
    eog: BTreeSet<u32>,
    add_bos: bool,
    add_eos: bool,
    add_sep: bool,
    /// `tokenizer.chat_template.rerank`: how a reranker's file lays out a pair.
    rerank_template: Option<String>,
    add_space_prefix: bool,
    remove_extra_whitespaces: bool,
    clean_spaces: bool,
    escape_whitespaces: bool,
    lowercase: bool,
    strip_accents: bool,
    max_token_len: usize,
    /// Control, user-defined and unknown tokens, longest text first.
    special_cache: Vec<u32>,
    /// Built on the first encode that needs it: validating a vocabulary (`llamay
    /// info`) never pays for it.
    special_finder: std::sync::OnceLock<Option<special::Finder>>,
    /// `token_to_piece(id, special = true)` for every id.
    pieces: PieceTable,
    bpe: Option<bpe::Bpe>,
    /// SPM: byte -> token (`<0xXX>` or the 1-byte string).
    spm_bytes: [Option<u32>; 256],
    warnings: Vec<String>,
    notes: Vec<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("pre_known", &self.pre_known)
            .field("n_vocab", &self.tokens.len())
            .finish()
    }
}

impl Tokenizer {
    /// Loads the tokenizer from a file's metadata. Every array is type- and
    /// length-checked and every special id range-checked here, so nothing later
    /// can index out of bounds.
    pub fn from_metadata(md: &llamay_gguf::Metadata<'_>) -> Result<Tokenizer, TokenizerError> {
        load::load(md)
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// `tokenizer.ggml.model` as in the file.
    pub fn model(&self) -> &str {
        &self.model
    }
    /// `tokenizer.ggml.pre` as in the file ("" when absent).
    pub fn pre(&self) -> &str {
        &self.pre
    }
    /// False when the file's `pre` names a rule set we do not implement (or names
    /// none): the tokenizer then runs under a guess, see [`Tokenizer::rule_set`].
    pub fn pre_known(&self) -> bool {
        self.pre_known
    }
    /// The rule set actually used ("llama3", "gpt2", ..., "spm", "wpm").
    pub fn rule_set(&self) -> &'static str {
        self.rule_name
    }
    /// Warnings produced at load (unknown `pre`, overridden attributes, ...).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
    /// What the loader corrected as llama.cpp does (a control-looking token's type),
    /// with no effect on the output: for `info`, not for every run.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }
    /// Approximate heap bytes held by the vocabulary tables (texts, the text -> id
    /// index, pieces, scores, attributes, the special-token matcher, BPE merges);
    /// excludes the pre-tokenizer's regexes.
    pub fn heap_bytes(&self) -> usize {
        self.tokens.heap_bytes()
            + self.token_to_id.heap_bytes()
            + self.pieces.heap_bytes()
            + 4 * (self.scores.capacity() + self.special_cache.capacity())
            + 2 * self.attrs.capacity()
            + self.rerank_template.as_ref().map_or(0, String::capacity)
            + self
                .special_finder
                .get()
                .and_then(Option::as_ref)
                .map_or(0, special::Finder::heap_bytes)
            + self.bpe.as_ref().map_or(0, bpe::Bpe::heap_bytes)
    }
    pub fn special_ids(&self) -> &SpecialIds {
        &self.special
    }
    pub fn bos(&self) -> Option<u32> {
        self.special.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.special.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.special.eot
    }
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    pub fn add_sep(&self) -> bool {
        self.add_sep
    }
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }
    /// Read and reported; llama.cpp applies it only to T5-style (UGM) vocabularies.
    /// Spaces travel as U+2581 inside the model (SPM, and BPE vocabularies that
    /// escape whitespace): a U+2581 in the input is then indistinguishable from a
    /// space and decodes as one, in llama.cpp as here.
    pub fn escapes_whitespace(&self) -> bool {
        self.kind == Kind::Spm || (self.kind == Kind::Bpe && self.escape_whitespaces)
    }
    pub fn remove_extra_whitespaces(&self) -> bool {
        self.remove_extra_whitespaces
    }
    /// End-of-generation ids (eos, eot, eom and llama.cpp's text-detected set).
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
    /// The token's text as stored in the vocabulary.
    pub fn token_text(&self, id: u32) -> Result<&[u8], TokenizerError> {
        self.check(id)?;
        Ok(&self.tokens[id as usize])
    }
    pub fn token_attr(&self, id: u32) -> Result<u32, TokenizerError> {
        self.check(id)?;
        Ok(self.attrs[id as usize] as u32)
    }
    pub fn token_score(&self, id: u32) -> Result<f32, TokenizerError> {
        self.check(id)?;
        Ok(self.scores[id as usize])
    }
    /// The id of a token with exactly this text.
    pub fn text_to_token(&self, text: &[u8]) -> Option<u32> {
        self.token_to_id.get(&self.tokens, text)
    }

    fn check(&self, id: u32) -> Result<(), TokenizerError> {
        if (id as usize) < self.tokens.len() {
            Ok(())
        } else {
            Err(TokenizerError::IdOutOfRange {
                id: id as u64,
                n_vocab: self.tokens.len(),
            })
        }
    }

    /// Tokenises `text` (bytes; invalid UTF-8 is handled as llama.cpp does).
    /// `add_special`: add BOS/EOS/SEP as the vocabulary asks; `parse_special`:
    /// control-token text in the input becomes that token (user-defined tokens are
    /// always matched first).
    pub fn encode(&self, text: &[u8], add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = special::partition(self, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        match self.kind {
            Kind::Spm => {
                let mut prev_special = true;
                if add_special && self.add_bos {
                    out.extend(self.special.bos);
                }
                let mut buf = Vec::new();
                for f in &frags {
                    match *f {
                        special::Frag::Text(a, b) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push(b' ');
                            }
                            buf.extend_from_slice(&text[a..b]);
                            let escaped = escape_whitespace(&buf);
                            spm::tokenize(self, &escaped, &mut out);
                            prev_special = false;
                        }
                        special::Frag::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.special.eos);
                }
            }
            Kind::Bpe => {
                let bpe = self.bpe.as_ref().expect("BPE tables exist for Kind::Bpe");
                if add_special && self.add_bos {
                    out.extend(self.special.bos);
                }
                let mut scratch = bpe::Scratch::default();
                for f in &frags {
                    match *f {
                        special::Frag::Text(a, b) => {
                            if self.escape_whitespaces {
                                let escaped = escape_whitespace(&text[a..b]);
                                bpe.tokenize(self, &escaped, &mut out, &mut scratch);
                            } else {
                                bpe.tokenize(self, &text[a..b], &mut out, &mut scratch);
                            }
                        }
                        special::Frag::Token(id) => out.push(id),
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.special.eos);
                }
            }
            Kind::Wpm => {
                if add_special {
                    out.extend(self.special.bos);
                }
                for f in &frags {
                    match *f {
                        special::Frag::Text(a, b) => wpm::tokenize(self, &text[a..b], &mut out),
                        special::Frag::Token(id) => out.push(id),
                    }
                }
                if add_special {
                    out.extend(self.special.sep);
                }
            }
        }
        out
    }

    /// [`Tokenizer::encode`] on a `&str`.
    /// A (query, document) pair for a cross-encoder, as llama.cpp's `llama-embedding`
    /// and `llama-server`'s `/v1/rerank` lay it out: the file's rerank template with
    /// `{query}` and `{document}` filled in where it has one; else the query, the
    /// end-of-text text if the vocabulary adds one, the separator's if it adds that,
    /// then the document — tokenised with the special tokens added and parsed
    /// (`[CLS] q [SEP][SEP] d [SEP]` for a converted BERT, whose files add both).
    pub fn encode_pair(&self, query: &str, document: &str) -> Vec<u32> {
        let prompt = match &self.rerank_template {
            Some(t) => t.replace("{query}", query).replace("{document}", document),
            None => {
                let text = |id: Option<u32>, added: bool| {
                    (id.filter(|_| added).and_then(|id| self.token_text(id).ok()))
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_default()
                };
                let eos = text(self.special.eos, self.add_eos);
                let sep = text(self.special.sep, self.add_sep);
                format!("{query}{eos}{sep}{document}")
            }
        };
        self.encode(prompt.as_bytes(), true, true)
    }

    pub fn encode_str(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode(text.as_bytes(), add_special, parse_special)
    }

    /// One token's text as llama.cpp's `token_to_piece` (lstrip 0) renders it;
    /// `special`: render control/unknown tokens (otherwise they are empty).
    pub fn token_to_piece(&self, id: u32, special: bool) -> Result<&[u8], TokenizerError> {
        self.check(id)?;
        let a = self.attrs[id as usize] as u32;
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Ok(&[]);
        }
        Ok(self.pieces.get(&self.tokens, id as usize))
    }

    /// llama.cpp `llama_detokenize(remove_special = false, unparse_special =
    /// false)`, which is what `common_detokenize` and `llama-tokenize` use:
    /// control tokens render empty, clean-up of spaces as the vocabulary asks.
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        self.detokenize(ids, false, false, CleanSpaces::AsVocabulary)
    }

    /// llama.cpp `llama_detokenize` with both flags; `clean` says whether the
    /// vocabulary's space clean-up applies ([`CleanSpaces::Never`]: exactly the text
    /// the pieces spell, so `decode(encode(x)) == x`).
    pub fn detokenize(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
        clean: CleanSpaces,
    ) -> Result<Vec<u8>, TokenizerError> {
        decode::detokenize(self, ids, remove_special, unparse_special, clean)
    }

    /// What a grammar is bound to: every token's text as sampled output spells it
    /// (control tokens empty, so a grammar never allows them) and the
    /// end-of-generation tokens.
    pub fn grammar_vocabulary(&self) -> (Vec<Vec<u8>>, Vec<u32>) {
        let n = self.n_vocab() as u32;
        let pieces = (0..n)
            .map(|id| {
                self.token_to_piece(id, false)
                    .map_or_else(|_| Vec::new(), <[u8]>::to_vec)
            })
            .collect();
        let eog = (0..n).filter(|&id| self.is_eog(id)).collect();
        (pieces, eog)
    }

    /// A streaming decoder for this tokenizer (never emits partial UTF-8).
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

/// Replaces every space with U+2581 (llama.cpp `llama_escape_whitespace`).
fn escape_whitespace(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + s.len() / 4);
    for &b in s {
        if b == b' ' {
            out.extend_from_slice("\u{2581}".as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}
