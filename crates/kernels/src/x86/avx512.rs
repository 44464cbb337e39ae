//! AVX-512 (F, BW, VL) + VNNI kernels for the hot formats. Callable only when
//! `dispatch::hardware()` found avx2, fma, f16c, avx512f, avx512bw, avx512vl and
//! avx512vnni, with whole blocks checked by `dispatch::Kernel::call`.

use llamay_formats::GgmlType;

type SimdDotFn = unsafe fn(&[u8], &[u8], usize) -> f32;

pub(crate) fn dot_fn(_wty: GgmlType) -> Option<SimdDotFn> {
    None
}
