//! `llamay version`: what this build carries. The first command to run when a number
//! looks wrong.

use crate::out;
use llamay_engine::ARCHITECTURES;
use llamay_formats::ALL_TYPES;
use serde_json::json;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn cpu_features() -> Vec<&'static str> {
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_mut)
    )]
    let mut f = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! check {
            ($($name:tt),*) => { $( if std::arch::is_x86_feature_detected!($name) { f.push($name); } )* };
        }
        check!(
            "sse4.2",
            "avx",
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512vnni",
            "avx512bf16",
            "avxvnni"
        );
        // AMX needs the OS's permission as well as the CPU bit (std cannot detect it
        // on stable): listed when the AMX kernel set can run here.
        if llamay_kernels::KernelSet::Avx512Amx.is_available() {
            f.push("amx-int8");
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! check {
            ($($name:tt),*) => { $( if std::arch::is_aarch64_feature_detected!($name) { f.push($name); } )* };
        }
        check!("neon", "dotprod", "i8mm", "fp16", "sve");
    }
    f
}

#[cfg(not(target_family = "wasm"))]
fn device_json(d: &llamay_vulkan::DeviceInfo) -> serde_json::Value {
    json!({
        "index": d.index,
        "name": d.name,
        "type": d.kind.name(),
        "api_version": d.api_version,
        "driver": d.driver,
        "memory_bytes": d.memory_bytes,
        "subgroup_size": d.subgroup_size,
        "extensions": d.extensions,
        "unusable": d.unusable,
    })
}

/// The GPU backends compiled in and what they find: the JSON object and the text lines.
/// The loader is opened here, once (a missing one is a line, not an error).
#[cfg(not(target_family = "wasm"))]
fn gpu_backends() -> (serde_json::Value, Vec<String>) {
    let vulkan = llamay_vulkan::probe();
    let mut lines = vec!["gpu backends:    vulkan (loader opened at run time)".to_string()];
    match &vulkan {
        Ok(devices) if devices.is_empty() => lines.push("vulkan:          no device".into()),
        Ok(devices) => {
            lines.extend(
                devices
                    .iter()
                    .map(|d| format!("vulkan device:   {}", d.describe())),
            );
            lines.push(format!(
                "vulkan kernels:  {} weights",
                llamay_vulkan::weight_formats()
            ));
        }
        Err(e) => lines.push(format!("vulkan:          {e}")),
    }
    let doc = json!({
        "compiled": ["vulkan"],
        "vulkan": match &vulkan {
            Ok(devices) => json!({
                "devices": devices.iter().map(device_json).collect::<Vec<_>>(),
                "weight_formats": llamay_vulkan::weight_formats(),
            }),
            Err(e) => json!({ "error": e.to_string() }),
        },
    });
    (doc, lines)
}

#[cfg(target_family = "wasm")]
fn gpu_backends() -> (serde_json::Value, Vec<String>) {
    let why = "none in a wasm32 build (WASI preview 1 has no dynamic loading)";
    (
        json!({ "compiled": [], "note": why }),
        vec![format!("gpu backends:    {why}")],
    )
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let read: Vec<&str> = ALL_TYPES
        .iter()
        .filter(|t| t.is_readable())
        .map(|t| t.name())
        .collect();
    let written: Vec<&str> = ALL_TYPES
        .iter()
        .filter(|t| t.is_writable() && !matches!(t.name(), "Q8_1" | "Q8_K"))
        .map(|t| t.name())
        .collect();
    let archs: Vec<&str> = ARCHITECTURES.iter().map(|a| a.name).collect();
    // The full target triple, from the build (build.rs).
    let target = env!("LLAMAY_TARGET");
    let endian = if cfg!(target_endian = "big") {
        "big-endian"
    } else {
        "little-endian"
    };
    let compiled: Vec<&str> = llamay_kernels::compiled_kernel_sets()
        .iter()
        .map(|k| k.name())
        .collect();
    let features = cpu_features();
    let kernels = llamay_kernels::kernel_set();
    let (gpu_json, gpu_lines) = gpu_backends();
    let mut w = out::stdout();
    if args.json {
        let doc = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "target": target,
            "endianness": endian.trim_end_matches("-endian"),
            "cpu_features": features,
            "kernels": kernels,
            "kernel_sets_compiled": compiled,
            "gpu_backends": gpu_json,
            "formats_read": read,
            "formats_written": written,
            "architectures": archs,
        });
        serde_json::to_writer(&mut w, &doc)?;
        writeln!(w)?;
    } else {
        writeln!(w, "llamay {}", env!("CARGO_PKG_VERSION"))?;
        writeln!(w, "target:          {target} ({endian})")?;
        writeln!(w, "cpu features:    {}", features.join(" "))?;
        writeln!(
            w,
            "kernels:         {kernels} (compiled in: {})",
            compiled.join(" ")
        )?;
        for line in gpu_lines {
            writeln!(w, "{line}")?;
        }
        writeln!(w, "formats read:    {} ({})", read.join(" "), read.len())?;
        writeln!(
            w,
            "formats written: {} ({})",
            written.join(" "),
            written.len()
        )?;
        writeln!(w, "architectures:   {}", archs.join(" "))?;
    }
    w.flush()?;
    Ok(())
}
