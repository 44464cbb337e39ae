//! Would this build run the file? The engine's strict loader and the tokenizer loader
//! answer; `info` reports their verdict.

use llamay_engine::Model;
use llamay_gguf::Model as Gguf;
use llamay_tokenizer::Tokenizer;

/// The verdict `info` prints.
pub struct Assessment {
    pub runnable: bool,
    pub refusal: Option<String>,
    /// Tensors the loader would leave unread.
    pub unread: Vec<String>,
    /// What the tokenizer loader made of the file's vocabulary; None when the file
    /// has no `tokenizer.ggml.model` or the vocabulary does not load.
    pub tokenizer: Option<TokenizerFacts>,
}

/// Facts about a loaded tokenizer, kept after the tokenizer itself is dropped.
pub struct TokenizerFacts {
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre` ("" when absent).
    pub pre: String,
    /// False when the tokenizer runs under a guessed rule set.
    pub pre_known: bool,
    /// The rule set actually used.
    pub rule_set: &'static str,
    pub n_tokens: usize,
    /// The loader's warnings and notes (corrections made as llama.cpp makes them).
    pub notes: Vec<String>,
}

pub fn assess(gguf: &Gguf<'_>) -> Assessment {
    // The tokenizer is loaded (once) and dropped before the engine's loader runs,
    // so the two never hold their memory at the same time.
    let tok = Tokenizer::from_metadata(gguf.metadata()).map(|t| TokenizerFacts {
        model: t.model().to_string(),
        pre: t.pre().to_string(),
        pre_known: t.pre_known(),
        rule_set: t.rule_set(),
        n_tokens: t.n_vocab(),
        notes: t.warnings().iter().chain(t.notes()).cloned().collect(),
    });
    release_freed_heap();
    let (tokenizer, tok_err) = match tok {
        Ok(f) => (Some(f), None),
        Err(e) => (None, Some(e)),
    };
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
            tokenizer,
        };
    }
    if let Err(e) = Model::check(gguf) {
        return Assessment {
            runnable: false,
            refusal: Some(e.to_string()),
            unread: e.unread().to_vec(),
            tokenizer,
        };
    }
    if let Some(e) = tok_err {
        return Assessment {
            runnable: false,
            refusal: Some(format!("the tokenizer cannot be loaded: {e}")),
            unread: Vec::new(),
            tokenizer,
        };
    }
    Assessment {
        runnable: true,
        refusal: None,
        unread: Vec::new(),
        tokenizer,
    }
}
/// Hands the heap pages the dropped tokenizer used back to the kernel. glibc
/// serves its tables from the brk heap (parsing the file freed a 4 MiB buffer, which
/// raises malloc's mmap threshold above their sizes) and does not trim a heap whose
/// top is still in use, so without this `info`'s peak would carry the ~10 MB of a
/// 262k-token vocabulary on top of the pages the engine's loader touches.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_freed_heap() {
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: glibc's malloc_trim takes the arena locks itself and only returns
    // free pages; it is callable at any time from any thread.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_freed_heap() {}
