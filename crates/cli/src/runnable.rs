//! Would this build run the file? The engine's strict loader and the tokenizer loader
//! answer; `info` reports their verdict.

use llamay_engine::{Model, Threads};
use llamay_gguf::Model as Gguf;
use llamay_tokenizer::Tokenizer;

/// The verdict `info` prints.
pub struct Assessment {
    pub runnable: bool,
    pub refusal: Option<String>,
    /// Tensors the loader would leave unread.
    pub unread: Vec<String>,
}

pub fn assess(gguf: &Gguf<'_>) -> Assessment {
    if gguf.tensor_count() == 0 {
        let why = if gguf.metadata().architecture().ok().flatten().is_none() {
            "the file holds no tensors and no general.architecture (a vocabulary-only file)"
        } else {
            "the file holds no tensors (a vocabulary-only file)"
        };
        return Assessment {
            runnable: false,
            refusal: Some(why.into()),
            unread: Vec::new(),
        };
    }
    if let Err(e) = Model::load(gguf, Threads(1)) {
        return Assessment {
            runnable: false,
            refusal: Some(e.to_string()),
            unread: e.unread().to_vec(),
        };
    }
    if let Err(e) = Tokenizer::from_metadata(gguf.metadata()) {
        return Assessment {
            runnable: false,
            refusal: Some(format!("the tokenizer cannot be loaded: {e}")),
            unread: Vec::new(),
        };
    }
    Assessment {
        runnable: true,
        refusal: None,
        unread: Vec::new(),
    }
}
