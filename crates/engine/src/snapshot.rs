//! Snapshots: one sequence's KV cache written out with the tokens it holds, and read
//! back into any context of the same model and precision.
//!
//! Format (little-endian), version 1:
//! ```text
//! "LLAMAYKV" | version u32 | model identity [32] | precision u8 | page positions u32
//! | n_layer u32 | k_dim u32 | v_dim u32 | n_tokens u64 | tokens [u32; n_tokens]
//! | per layer: n_pages u64, then n_pages × (key page bytes, value page bytes)
//! | SHA-256 of everything before it [32]
//! ```
//! A snapshot is untrusted input: every count is checked against the bytes present
//! before anything is allocated, every field against the context reading it, and the
//! checksum against the body; on any error nothing is loaded.

use crate::DecodeError;
use crate::context::Context;
use crate::kv::{KvError, KvPrecision, PAGE, SeqId};
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"LLAMAYKV";
const VERSION: u32 = 1;

/// Why a snapshot cannot be read into this context (nothing was loaded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a llamay KV snapshot (the file does not start with LLAMAYKV)")]
    NotASnapshot,
    #[error("snapshot format version {0}; this build reads version {VERSION}")]
    Version(u32),
    #[error("the snapshot is truncated: {0} is cut short")]
    Truncated(&'static str),
    #[error("the snapshot was made by another model (identity {theirs}, this model {ours})")]
    OtherModel { theirs: String, ours: String },
    #[error("the snapshot holds a {theirs} cache; this context's is {ours}")]
    OtherPrecision { theirs: String, ours: &'static str },
    #[error("the snapshot's {what} is {theirs}; this context's is {ours}")]
    Mismatch {
        what: &'static str,
        theirs: u64,
        ours: u64,
    },
    #[error("the snapshot holds {n} tokens; this context's sequences hold at most {n_ctx}")]
    TooLong { n: u64, n_ctx: usize },
    #[error("token {token} at position {pos} is outside the vocabulary (0..{n_vocab})")]
    BadToken {
        token: u32,
        pos: usize,
        n_vocab: usize,
    },
    #[error("layer {layer}: {theirs} pages given, a sequence of {n_tokens} tokens holds {ours}")]
    PageCount {
        layer: usize,
        theirs: u64,
        ours: usize,
        n_tokens: usize,
    },
    #[error(
        "the snapshot's checksum does not match its contents (the file was altered or damaged)"
    )]
    Checksum,
    #[error("{0} trailing byte(s) after the snapshot")]
    Trailing(usize),
    #[error(transparent)]
    Pool(#[from] DecodeError),
    #[error(transparent)]
    Kv(#[from] KvError),
}

fn precision_code(p: KvPrecision) -> u8 {
    match p {
        KvPrecision::F32 => 0,
        KvPrecision::F16 => 1,
        KvPrecision::Vq8 => 2,
        KvPrecision::Q8 => 3,
        KvPrecision::OneBit => 4,
    }
}

fn precision_name(code: u8) -> String {
    [
        KvPrecision::F32,
        KvPrecision::F16,
        KvPrecision::Vq8,
        KvPrecision::Q8,
        KvPrecision::OneBit,
    ]
    .into_iter()
    .find(|&p| precision_code(p) == code)
    .map_or_else(
        || format!("unknown (code {code})"),
        |p| p.name().to_string(),
    )
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .take(8)
        .map(|x| format!("{x:02x}"))
        .collect::<String>()
        + "…"
}

/// A bounds-checked reader: every read names the field it was for.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], SnapshotError> {
        if self.rest.len() < n {
            return Err(SnapshotError::Truncated(what));
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
}

impl Context<'_> {
    /// Sequence `s` as a snapshot (see the module docs).
    pub fn save_sequence(&mut self, s: SeqId) -> Result<Vec<u8>, KvError> {
        // A device holds the pages' contents: the host's copies are brought up to date.
        if let Some(dev) = self.device.as_deref_mut() {
            dev.pages_to_host(&mut self.kv, self.model.config(), s)?;
        }
        let kv = &self.kv;
        let tokens = kv.tokens(s)?;
        let layers = kv.pages_of(s)?;
        let (kd, vd) = kv.dims();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(self.model.identity());
        out.push(precision_code(kv.precision()));
        for v in [PAGE, kv.n_layer(), kd, vd] {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
        out.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        for pages in &layers {
            out.extend_from_slice(&(pages.len() as u64).to_le_bytes());
            for (k, v) in pages {
                out.extend_from_slice(k);
                out.extend_from_slice(v);
            }
        }
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        Ok(out)
    }

    /// Reads a snapshot into a new sequence of this context; on error nothing changed.
    pub fn load_sequence(&mut self, bytes: &[u8]) -> Result<SeqId, SnapshotError> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(SnapshotError::NotASnapshot);
        }
        let mut r = Reader {
            rest: &bytes[MAGIC.len()..],
        };
        let version = r.u32("the version")?;
        if version != VERSION {
            return Err(SnapshotError::Version(version));
        }
        let identity = r.take(32, "the model identity")?;
        if identity != self.model.identity() {
            return Err(SnapshotError::OtherModel {
                theirs: hex(identity),
                ours: hex(self.model.identity()),
            });
        }
        let code = r.take(1, "the precision")?[0];
        let ours = self.kv.precision();
        if code != precision_code(ours) {
            return Err(SnapshotError::OtherPrecision {
                theirs: precision_name(code),
                ours: ours.name(),
            });
        }
        let (kd, vd) = self.kv.dims();
        for (what, want) in [
            ("page size", PAGE),
            ("layer count", self.kv.n_layer()),
            ("key width", kd),
            ("value width", vd),
        ] {
            let got = r.u32(what)?;
            if got as usize != want {
                return Err(SnapshotError::Mismatch {
                    what,
                    theirs: got.into(),
                    ours: want as u64,
                });
            }
        }
        let n = r.u64("the token count")?;
        let n_ctx = self.kv.n_ctx();
        if n > n_ctx as u64 {
            return Err(SnapshotError::TooLong { n, n_ctx });
        }
        let n = n as usize;
        let raw = r.take(n * 4, "the token list")?;
        let n_vocab = self.model.config().n_vocab;
        let mut tokens = Vec::with_capacity(n);
        for (pos, c) in raw.chunks_exact(4).enumerate() {
            let token = u32::from_le_bytes(c.try_into().expect("4 bytes"));
            if token as usize >= n_vocab {
                return Err(SnapshotError::BadToken {
                    token,
                    pos,
                    n_vocab,
                });
            }
            tokens.push(token);
        }
        let (kb, vb) = self.kv.page_sizes();
        let mut layers = Vec::with_capacity(self.kv.n_layer());
        for layer in 0..self.kv.n_layer() {
            let count = r.u64("a layer's page count")?;
            let (lo, hi) = self.kv.held_range(layer, n);
            if count != (hi - lo) as u64 {
                return Err(SnapshotError::PageCount {
                    layer,
                    theirs: count,
                    ours: hi - lo,
                    n_tokens: n,
                });
            }
            let mut pages = Vec::with_capacity(hi - lo);
            for _ in lo..hi {
                pages.push((r.take(kb, "a key page")?, r.take(vb, "a value page")?));
            }
            layers.push(pages);
        }
        let body = bytes.len() - r.rest.len();
        let sum = r.take(32, "the checksum")?;
        if !r.rest.is_empty() {
            return Err(SnapshotError::Trailing(r.rest.len()));
        }
        if Sha256::digest(&bytes[..body]).as_slice() != sum {
            return Err(SnapshotError::Checksum);
        }
        let seq = self.kv.adopt(tokens, &layers)?;
        // A device holds the pages' contents: the new pages go there too.
        if let Some(dev) = self.device.as_deref_mut()
            && let Err(e) = dev.pages_to_device(&self.kv, self.model.config(), seq)
        {
            let _ = self.kv.free(seq);
            return Err(e.into());
        }
        Ok(seq)
    }
}
