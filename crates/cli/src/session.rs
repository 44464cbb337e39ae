//! Loading a model for the commands that run one: the mapping, the engine model and
//! the tokenizer, with the common flags (-t, -c) validated in one place.

use anyhow::{Context, bail};
use llamay_engine::{Model, Threads};
use llamay_gguf::{MappedModel, Model as Gguf};
use llamay_tokenizer::Tokenizer;

/// `-t N`: default one thread per physical core (docs/cli.md), as llama.cpp does: a
/// second hyper-thread on a core shares its vector units and slows a compute-bound
/// pool down.
pub fn threads(flag: Option<usize>) -> anyhow::Result<Threads> {
    match flag {
        Some(0) => bail!("-t 0: at least one thread is needed"),
        Some(n) if n > 1024 => bail!("-t {n}: at most 1024 threads"),
        Some(n) if n > 1 && cfg!(target_family = "wasm") => Err(crate::left_out::refuse(
            &format!("-t {n}"),
            "threads",
            "WASI preview 1 cannot start one",
            "it runs one: leave -t out",
        )),
        Some(n) => Ok(Threads(n)),
        None if cfg!(target_family = "wasm") => Ok(Threads(1)),
        None => Ok(Threads(physical_cores())),
    }
}

/// Physical cores this process may run on: on Linux, the distinct (package, core) pairs
/// of the topology in /sys, capped by the CPUs the process is allowed (affinity,
/// cgroup quota); elsewhere, or when /sys does not say, the logical CPUs allowed.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    physical_cores_from(std::path::Path::new("/sys/devices/system/cpu"))
        .map_or(logical, |p| p.clamp(1, logical))
}

/// The distinct (physical_package_id, core_id) pairs under `cpu_dir`
/// (`cpuN/topology/...`), or `None` if it holds none.
pub fn physical_cores_from(cpu_dir: &std::path::Path) -> Option<usize> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let mut cores = std::collections::HashSet::new();
    for entry in std::fs::read_dir(cpu_dir).ok()?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let is_cpu = name
            .strip_prefix("cpu")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_cpu {
            continue;
        }
        let topo = entry.path().join("topology");
        if let (Some(pkg), Some(core)) = (
            read(topo.join("physical_package_id")),
            read(topo.join("core_id")),
        ) {
            cores.insert((pkg.trim().to_string(), core.trim().to_string()));
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// `--kv NAME`: the KV cache's precision.
pub fn kv(flag: &str) -> anyhow::Result<llamay_engine::KvPrecision> {
    llamay_engine::KvPrecision::parse(flag).ok_or_else(|| {
        anyhow::anyhow!(
            "--kv {flag}: use one of {} (f32 exact, the default; f16 as llama.cpp's default; vq8 int8 values; q8 int8 keys and values)",
            llamay_engine::KvPrecision::NAMES
        )
    })
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

/// Refuses an embedding model (an encoder) where text is to be generated.
pub fn require_logits(model: &Model<'_>) -> anyhow::Result<()> {
    let arch = model.config().arch;
    if arch.output == llamay_engine::arch::Output::Embeddings {
        bail!(
            "{} is an embedding model (an encoder): it computes embeddings, not text; use llamay embed (or serve's /api/embed, /v1/embeddings)",
            arch.name
        );
    }
    Ok(())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two packages of two cores with two hyper-threads each, plus a directory that
    /// is not a CPU: four physical cores.
    #[test]
    fn physical_cores_count_distinct_package_core_pairs() {
        let dir = std::env::temp_dir().join(format!("llamay-topology-{}", std::process::id()));
        for (cpu, pkg, core) in [
            (0, 0, 0),
            (1, 0, 1),
            (2, 0, 0),
            (3, 0, 1),
            (4, 1, 0),
            (5, 1, 0),
            (6, 1, 1),
            (7, 1, 1),
        ] {
            let t = dir.join(format!("cpu{cpu}/topology"));
            std::fs::create_dir_all(&t).unwrap();
            std::fs::write(t.join("physical_package_id"), format!("{pkg}\n")).unwrap();
            std::fs::write(t.join("core_id"), format!("{core}\n")).unwrap();
        }
        std::fs::create_dir_all(dir.join("cpufreq")).unwrap();
        assert_eq!(physical_cores_from(&dir), Some(4));
        assert_eq!(physical_cores_from(&dir.join("cpufreq")), None);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(physical_cores() >= 1);
    }
}
