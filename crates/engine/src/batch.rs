//! What `decode` takes and gives back: the tokens of a batch and their logits.

use crate::kv::SeqId;

/// One token of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchToken {
    /// The sequence of the context's KV pool this token extends.
    pub seq: SeqId,
    pub token: u32,
    /// Position in its sequence; must be the sequence's next position.
    pub pos: usize,
    /// Whether logits are wanted for this token.
    pub logits: bool,
}

/// Logits for the tokens that asked for them, in batch order.
pub struct Logits {
    pub n_vocab: usize,
    /// Batch indices that asked for logits.
    pub index: Vec<usize>,
    pub values: Vec<f32>,
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.n_vocab..(i + 1) * self.n_vocab]
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

/// Final hidden states (after the output norm) for the tokens that asked, in batch
/// order: [`Context::hidden`](crate::Context::hidden).
pub struct Hidden {
    pub n_embd: usize,
    /// Batch indices that asked.
    pub index: Vec<usize>,
    pub values: Vec<f32>,
}

impl Hidden {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.n_embd..(i + 1) * self.n_embd]
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}
