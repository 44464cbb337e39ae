//! x86-64 SIMD kernels; reached only through `crate::dispatch`.

pub(crate) mod amx;
pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod packed256;
pub(crate) mod packed512;
pub(crate) mod quant_avx2;
