//! Helpers shared by the Vulkan device's tests.
#![allow(dead_code)]

use llamay_engine::{ArchSpec, Model, Threads};
use llamay_formats::GgmlType;
use llamay_gguf::{GgufFile, Model as Gguf};
use llamay_synth::{ModelFile, Spec};

/// The quantised weight formats the device runs (each giving the CPU kernels' bits).
pub const QUANTISED: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The index of the device to test on: `LLAMAY_VULKAN_TEST_DEVICE`, else the first
/// usable one. Without any, the test fails under the test command (which installs
/// lavapipe) and is skipped elsewhere.
pub fn device_index() -> Option<usize> {
    let devices = match llamay_vulkan::probe() {
        Ok(d) if d.iter().any(|d| d.unusable.is_none()) => d,
        outcome => {
            let why = match outcome {
                Ok(_) => "no usable Vulkan device".to_string(),
                Err(e) => e.to_string(),
            };
            let required = std::env::var_os("LLAMAY_REQUIRE_REFERENCE").is_some_and(|v| v != "0");
            assert!(
                !required,
                "{why}; scripts/test installs mesa-vulkan-drivers (lavapipe)"
            );
            eprintln!("skipped: {why}");
            return None;
        }
    };
    Some(match std::env::var("LLAMAY_VULKAN_TEST_DEVICE") {
        Ok(i) => i.parse().expect("LLAMAY_VULKAN_TEST_DEVICE is an index"),
        Err(_) => devices
            .iter()
            .find(|d| d.unusable.is_none())
            .map(|d| d.index)
            .unwrap(),
    })
}

/// A synthetic model of `arch` with `ty` matrices, handed to `f` (its bytes live for
/// the call).
pub fn with_synthetic<T>(
    arch: &'static ArchSpec,
    ty: GgmlType,
    f: impl FnOnce(&Model<'_>) -> T,
) -> T {
    let spec = Spec {
        ty,
        ..Spec::new(arch)
    };
    let bytes = ModelFile::new(&spec).write().unwrap();
    let gguf = Gguf::single(GgufFile::parse(&bytes).unwrap());
    let m = Model::load(&gguf, Threads(2)).unwrap();
    f(&m)
}
