//! The Vulkan device: the loader opened at run time (never linked), device discovery,
//! and compute kernels over weights kept in their GGUF block formats. Shaders are GLSL
//! under `shaders/`, compiled to the SPIR-V this crate embeds by
//! `scripts/build-shaders` (committed; CI checks it is what the sources compile to).
//!
//! Numerics follow llamay's CPU kernels (hence llama.cpp's CPU backend): activations
//! are quantised to the weight's dot type with ggml-cpu's quantiser, block products are
//! exact integer sums, and blocks are folded in the CPU's order without contraction.

mod device;
mod error;
mod gpu;
mod kernels;
mod ops;
mod probe;

pub use device::VulkanDevice;
pub use error::VulkanError;
pub use gpu::{BufferId, Gpu, Stats};
pub use kernels::Kernel;
pub use ops::{DeviceMatrix, Q8Rows, declines, weight_formats};
pub use probe::{DEFAULT_LOADER, DeviceInfo, DeviceKind, INTEGER_DOT_PRODUCT, pick_auto, probe};
