//! x86-64 SIMD kernels; reached only through `crate::dispatch`.

pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod packed256;
pub(crate) mod packed512;
pub(crate) mod quant_avx2;

/// Pointers for one tile; see `packed::run_tile`.
pub(crate) struct Tile {
    /// The group's first byte.
    pub w: *const u8,
    /// Blocks per row.
    pub nb: usize,
    /// The first token's activation row; the next is `a_stride` bytes on.
    pub a: *const u8,
    pub a_stride: usize,
    /// The first token's block scales and aux values; per token `prep_stride` blocks.
    pub dy: *const f32,
    pub aux: *const i32,
    pub prep_stride: usize,
    /// Row 0 of the group for the first token; the next token is `out_stride` on.
    pub out: *mut f32,
    pub out_stride: usize,
}
