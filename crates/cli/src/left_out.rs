//! What a wasm32 build leaves out, refused by name. WASI preview 1 (wasm32-wasip1) gives
//! files, stdin/stdout and clocks, but no sockets, no threads and no dynamic loading:
//! `run`, `chat`, `info`, `tokenize`, `perplexity`, `quantize` and the other file
//! commands work (one thread, the portable kernels); the server, `pull`, remote
//! `validate` and the GPU backend are not compiled in.

/// `WHAT: this wasm32 build has no WHICH (WHY); USE`.
#[cfg_attr(not(target_family = "wasm"), allow(dead_code))]
pub fn refuse(what: &str, which: &str, why: &str, instead: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{what}: this {} build has no {which} ({why}); {instead}",
        env!("LLAMAY_TARGET")
    )
}

/// The refusal of anything that needs the network.
#[cfg_attr(not(target_family = "wasm"), allow(dead_code))]
pub fn network(what: &str) -> anyhow::Error {
    refuse(
        what,
        "networking",
        "WASI preview 1 has no sockets",
        "use a native build, or give a local file",
    )
}

/// The refusal of a GPU device.
#[cfg_attr(not(target_family = "wasm"), allow(dead_code))]
pub fn gpu(what: &str) -> anyhow::Error {
    refuse(
        what,
        "GPU backend",
        "WASI preview 1 has no dynamic loading",
        "it runs on the CPU: leave --device out",
    )
}
