//! Loading a model for the commands that run one: the mapping, the engine model and
//! the tokenizer, with the common flags (-t, -c) validated in one place.

use anyhow::{Context, bail};
use llamay_engine::{Model, Threads};
use llamay_gguf::{MappedModel, Model as Gguf};
use llamay_tokenizer::Tokenizer;

/// `-t N`: default one thread per available core.
pub fn threads(flag: Option<usize>) -> anyhow::Result<Threads> {
    match flag {
        Some(0) => bail!("-t 0: at least one thread is needed"),
        Some(n) if n > 1024 => bail!("-t {n}: at most 1024 threads"),
        Some(n) => Ok(Threads(n)),
        None => Ok(Threads(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        )),
    }
}

/// `-c N`: 0 or absent means the model's training context, as in llama.cpp.
pub fn context(flag: Option<usize>, model: &Model<'_>) -> anyhow::Result<usize> {
    const MAX_CTX: usize = 1 << 24;
    match flag {
        None | Some(0) => Ok(model.config().n_ctx_train.min(MAX_CTX)),
        Some(n) if n > MAX_CTX => bail!("-c {n}: at most {MAX_CTX} tokens"),
        Some(n) => Ok(n),
    }
}

/// Keeps glibc from returning the forward pass's large per-layer buffers to the kernel
/// after every use (by default, blocks over 128 KiB are mmapped and unmapped each time,
/// and the heap top is trimmed): with them kept, each decode call reuses pages instead
/// of faulting in and zeroing fresh ones. Peak memory is unchanged (the same buffers
/// are live at the peak); freed memory is just not handed back until exit.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_buffers() {
    unsafe extern "C" {
        fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
    }
    const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
    const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
    // SAFETY: mallopt only changes malloc's tuning parameters; it is called before the
    // model's threads exist and takes malloc's lock itself.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 256 << 20);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_buffers() {}

/// Loads the engine model and the tokenizer. The file pages of weights the engine
/// repacked are released from `mapped`, so they are not resident twice.
pub fn load<'a>(
    mapped: &MappedModel,
    gguf: &Gguf<'a>,
    threads: Threads,
) -> anyhow::Result<(Model<'a>, Tokenizer)> {
    keep_freed_buffers();
    // A tied embedding is released too: lookups fault back the few rows they read.
    let release = |data: &[u8]| {
        mapped.release(data);
    };
    let model = Model::load_releasing(gguf, threads, &release).context("cannot run this model")?;
    let tok = Tokenizer::from_metadata(gguf.metadata()).context("cannot load the tokenizer")?;
    for w in tok.warnings() {
        eprintln!("warning: {w}");
    }
    if tok.n_vocab() != model.config().n_vocab {
        bail!(
            "the tokenizer has {} tokens but the embedding has {} rows",
            tok.n_vocab(),
            model.config().n_vocab
        );
    }
    Ok((model, tok))
}
