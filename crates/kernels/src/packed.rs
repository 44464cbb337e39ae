//! Weights repacked once, at load, for the VNNI GEMM/GEMV: sixteen rows are interleaved
//! four bytes at a time, so one 64-byte load holds four consecutive weights of each of
//! 16 rows, `vpdpbusd` against four broadcast activation bytes leaves the 16 rows'
//! partial sums in the 16 lanes, and no horizontal reduction is ever needed. In prefill
//! the unpacked weight vector is reused for several tokens from registers. The same
//! layout serves AVX-512 VNNI (a line per zmm, 8 tokens per tile) and AVX-VNNI (half a
//! line per ymm, two 8-row passes, 4 tokens per tile).
//!
//! Every layout holds the same information as the source blocks, in (almost) the same
//! bytes: Q8_0, Q4_0, Q5_0, MXFP4 and Q6_K are exactly as large; Q4_K and Q5_K grow by 4
//! bytes per 256 weights (its six-bit scales and mins are stored one byte each). The
//! values are kept unsigned (Q8_0 as `q + 128`, Q4_0/Q5_0 and Q6_K before their
//! `-8`/`-16`/`-32`), as `vpdpbusd` wants; the offset is taken back exactly in the
//! integer sum by starting the accumulator at `-offset · Σ activation` (see `ActPrep`).
//! MXFP4 keeps its nibbles (as Q4_0) and its E8M0 exponent bytes; the kernels look each
//! nibble up in `kvalues_mxfp4 + 12` (0..=24, one `vpshufb` / `tbl` per 64 weights) and
//! take the 12 back the same way, and turn the exponents into ggml's
//! `GGML_E8M0_TO_FP32_HALF` scales exactly.
//!
//! Numerics: the integer block sums are exact and the float steps are ggml's, in ggml's
//! order, per lane; so the result is bit-identical to the portable `vec_dot` (the tests
//! assert equality, not a bound).
//!
//! A group is `nb` blocks of its 16 rows; inside a group each *section* (quants, high
//! bits, scales, ...) is stored for all `nb` blocks in turn, so SIMD loads stay aligned.

use crate::{KernelSet, QuantizedRows, SyncPtr, ThreadPool, dispatch};
use llamay_formats::GgmlType;

/// Rows interleaved in one group.
pub const GROUP_ROWS: usize = 16;

/// One 64-byte line; a `Vec<Line>` is 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct Line(pub(crate) [u8; 64]);

/// The sections of one block of a group, in bytes, in storage order.
pub(crate) const fn sections(ty: GgmlType) -> Option<&'static [usize]> {
    Some(match ty {
        // quants ([k][row][4] u8 = q + 128), d (16 × f16)
        GgmlType::Q8_0 => &[512, 32],
        // nibbles ([kk][row][4]: low = quad kk, high = quad kk + 4), d
        GgmlType::Q4_0 => &[256, 32],
        // nibbles as Q4_0's, E8M0 exponents (16 × u8)
        GgmlType::MXFP4 => &[256, 16],
        // nibbles, fifth bits (8 × u64: bit 4·row + i = bit 4k + i of qh), d
        GgmlType::Q5_0 => &[256, 64, 32],
        // nibbles ([c][kk][row][4]: low = sub-block 2c, high = 2c + 1), scales
        // ([j][row] u8), mins ([j][row] u8), d, dmin
        GgmlType::Q4_K => &[2048, 128, 128, 32, 32],
        // as Q4_K, with the fifth bits after the nibbles ([j][kk] u64: bit 4·row + i =
        // bit j of qh[4kk + i])
        GgmlType::Q5_K => &[2048, 512, 128, 128, 32, 32],
        // low nibbles ([v][row][4]: low = quad v, high = quad v + 32), high bits
        // ([u][row][4]: bits 2m = quad u + 16m), scales ([s][row] i8), d
        GgmlType::Q6_K => &[2048, 1024, 256, 32],
        _ => return None,
    })
}

/// Bytes of one block over all its sections (`sections` summed; 0 for a type that is
/// not packed). Read by the x86 one-token prefetches.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const fn block_bytes(ty: GgmlType) -> usize {
    let Some(secs) = sections(ty) else {
        return 0;
    };
    let (mut sum, mut i) = (0, 0);
    while i < secs.len() {
        sum += secs[i];
        i += 1;
    }
    sum
}

/// A weight matrix in the packed layout (rows a multiple of 16).
#[derive(Clone)]
pub struct PackedMatrix {
    /// The kernel set it was packed for (one with packed kernels, available here).
    set: KernelSet,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Bytes of one group (all blocks of its 16 rows), a multiple of 64.
    group_bytes: usize,
    /// Where each section (`sections`, in order) starts in a group, in bytes.
    sec: [usize; 6],
    /// One-token tiles run on the AVX-VNNI kernels (`one_token_at_256`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    one_token_vnni: bool,
    lines: LineBuf,
}

/// The packed bytes. Where the OS allows, an anonymous mapping advised for transparent
/// huge pages before packing first touches it: prefill streams every weight once per
/// token chunk, and with 4 KiB pages each of those pages costs a TLB walk (a 1B model is
/// ~190 000 of them). Otherwise (or if mapping fails) 64-byte-aligned heap lines.
enum LineBuf {
    Map(memmap2::MmapMut),
    Heap(Vec<Line>),
}

impl LineBuf {
    /// `len` zero bytes (a multiple of 64).
    fn zeroed(len: usize) -> LineBuf {
        debug_assert!(len.is_multiple_of(64));
        if len >= 2 << 20
            && let Ok(map) = memmap2::MmapMut::map_anon(len)
        {
            // Advice only: without THP the mapping works the same, with small pages.
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            return LineBuf::Map(map);
        }
        LineBuf::Heap(vec![Line([0; 64]); len / 64])
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            LineBuf::Map(m) => m,
            LineBuf::Heap(v) => {
                // SAFETY: `v` holds v.len() * 64 initialised bytes.
                unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 64) }
            }
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            LineBuf::Map(m) => m.as_mut_ptr(),
            LineBuf::Heap(v) => v.as_mut_ptr() as *mut u8,
        }
    }
}

impl Clone for LineBuf {
    fn clone(&self) -> Self {
        let src = self.as_slice();
        let mut out = LineBuf::zeroed(src.len());
        // SAFETY: `out` has src.len() bytes; the two buffers are distinct.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr(), src.len()) };
        out
    }
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ty, rows, cols, set) = (self.ty, self.rows, self.cols, self.set.name());
        write!(f, "PackedMatrix({ty} {rows}x{cols} for {set})")
    }
}

impl PackedMatrix {
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.lines.as_slice().len()
    }

    /// The packed bytes, group after group: the order a one-token matmul streams them.
    pub fn bytes(&self) -> &[u8] {
        self.lines.as_slice()
    }

    /// The same matrix with its one-token tiles on its own set's kernels even where
    /// `one_token_at_256` would take the AVX-VNNI ones: tests compare both paths.
    #[doc(hidden)]
    pub fn with_own_one_token_kernels(mut self) -> Self {
        self.one_token_vnni = false;
        self
    }

    fn blocks_per_row(&self) -> usize {
        self.cols / self.ty.block_size() as usize
    }
}

/// Whether `pack` would pack a `rows × cols` matrix of `ty` for the active kernel set.
pub fn packable(ty: GgmlType, rows: usize, cols: usize) -> bool {
    packable_with(dispatch::active(), ty, rows, cols)
}

/// Whether `set` has packed kernels for `ty` and this CPU runs it (x86-64 `Avx2`,
/// `AvxVnni`, `Avx512Vnni`; aarch64 `NeonDotprod`, not for Q8_0, whose stored bytes do
/// not fit `sdot`'s signed weights; `NeonI8mm`), the format has a layout, and the rows
/// fill whole groups.
pub fn packable_with(set: KernelSet, ty: GgmlType, rows: usize, cols: usize) -> bool {
    let set_packs = match set {
        KernelSet::NeonDotprod => ty != GgmlType::Q8_0,
        KernelSet::Avx2 | KernelSet::AvxVnni | KernelSet::Avx512Vnni | KernelSet::Avx512Amx => true,
        KernelSet::NeonI8mm => true,
        KernelSet::Portable | KernelSet::Neon => false,
    };
    set_packs
        && set.is_available()
        && sections(ty).is_some()
        && rows > 0
        && rows.is_multiple_of(GROUP_ROWS)
        && cols > 0
        && cols.is_multiple_of(ty.block_size() as usize)
}

/// Repacks `rows` rows of `cols` values of `ty` (the file's bytes) for the packed
/// kernels of the active set, groups in parallel on the pool; `None` when `packable`
/// says no or `w` is shorter than the matrix.
pub fn pack(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    pool: &ThreadPool,
) -> Option<PackedMatrix> {
    pack_with(dispatch::active(), ty, w, rows, cols, pool)
}

/// `pack` for the kernels of `set` (tests and benchmarks compare the sets).
pub fn pack_with(
    set: KernelSet,
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    pool: &ThreadPool,
) -> Option<PackedMatrix> {
    pack_for(set, ty, w, rows, cols, pool, &|_| {})
}

/// Groups packed between two `release` calls (≈ 1 MiB of source for a wide matrix).
const RELEASE_GROUPS: usize = 64;

/// `pack`, handing `release` each part of `w` as soon as it has been copied, so that a
/// caller whose `w` is a file mapping can drop those pages while the copy grows: the
/// resident peak stays about one copy, not two.
pub fn pack_releasing<'w>(
    ty: GgmlType,
    w: &'w [u8],
    rows: usize,
    cols: usize,
    pool: &ThreadPool,
    release: &dyn Fn(&'w [u8]),
) -> Option<PackedMatrix> {
    pack_for(dispatch::active(), ty, w, rows, cols, pool, release)
}

fn pack_for<'w>(
    set: KernelSet,
    ty: GgmlType,
    w: &'w [u8],
    rows: usize,
    cols: usize,
    pool: &ThreadPool,
    release: &dyn Fn(&'w [u8]),
) -> Option<PackedMatrix> {
    if !packable_with(set, ty, rows, cols) {
        return None;
    }
    let secs = sections(ty)?;
    let nb = cols / ty.block_size() as usize;
    let src_block = ty.type_size() as usize;
    let row_bytes = nb * src_block;
    if w.len() < rows.checked_mul(row_bytes)? {
        return None;
    }
    let per_block: usize = secs.iter().sum();
    let group_bytes = (nb * per_block).next_multiple_of(64);
    let groups = rows / GROUP_ROWS;
    let mut lines = LineBuf::zeroed(groups * group_bytes);
    let base = SyncPtr(lines.as_mut_ptr());
    let offs = section_offsets(secs, nb);
    let group_src = GROUP_ROWS * row_bytes;
    for g0 in (0..groups).step_by(RELEASE_GROUPS) {
        let g1 = (g0 + RELEASE_GROUPS).min(groups);
        pool.run(g1 - g0, |i| {
            let g = g0 + i;
            // SAFETY: task g writes only group g's bytes (g*group_bytes..(g+1)*group_bytes
            // of `lines`, which holds groups*group_bytes bytes and outlives the region).
            let out = unsafe {
                std::slice::from_raw_parts_mut(base.get().add(g * group_bytes), group_bytes)
            };
            let src = &w[g * group_src..(g + 1) * group_src];
            for (r, row) in src.chunks_exact(row_bytes).enumerate() {
                for (b, blk) in row.chunks_exact(src_block).enumerate() {
                    pack_block(ty, blk, r, b, secs, &offs, out);
                }
            }
        });
        release(&w[g0 * group_src..g1 * group_src]);
    }
    Some(PackedMatrix {
        set,
        ty,
        rows,
        cols,
        group_bytes,
        sec: offs,
        one_token_vnni: one_token_at_256(set, ty),
        lines,
    })
}

/// Writes row `r`'s block `b` (`src`, the file's bytes) into its group's sections.
/// Runs once per weight block at load, so the hot formats copy four bytes at a time.
fn pack_block(
    ty: GgmlType,
    src: &[u8],
    r: usize,
    b: usize,
    secs: &[usize],
    offs: &[usize; 6],
    out: &mut [u8],
) {
    // Section s of block b starts here.
    let at = |s: usize| offs[s] + b * secs[s];
    // The four bytes row r holds in interleaved vector v of section s.
    let put4 = |out: &mut [u8], s: usize, v: usize, bytes: [u8; 4]| {
        out[at(s) + v * 64 + r * 4..][..4].copy_from_slice(&bytes);
    };
    let four = |o: usize| -> [u8; 4] { src[o..o + 4].try_into().unwrap_or([0; 4]) };
    match ty {
        GgmlType::Q8_0 => {
            for k in 0..8 {
                let v = u32::from_le_bytes(four(2 + 4 * k)) ^ 0x8080_8080;
                put4(out, 0, k, v.to_le_bytes());
            }
            out[at(1) + 2 * r..][..2].copy_from_slice(&src[0..2]);
        }
        GgmlType::Q4_0 => {
            for kk in 0..4 {
                put4(out, 0, kk, four(2 + 4 * kk));
            }
            out[at(1) + 2 * r..][..2].copy_from_slice(&src[0..2]);
        }
        GgmlType::MXFP4 => {
            for kk in 0..4 {
                put4(out, 0, kk, four(1 + 4 * kk));
            }
            out[at(1) + r] = src[0];
        }
        GgmlType::Q5_0 => {
            for kk in 0..4 {
                put4(out, 0, kk, four(6 + 4 * kk));
            }
            let qh = u32::from_le_bytes(four(2));
            // Row r's nibble k of qh goes to bits 4r..4r+3 of mask k.
            for k in 0..8 {
                let nib = ((qh >> (4 * k)) & 0xF) as u8;
                out[at(1) + 8 * k + r / 2] |= nib << (4 * (r % 2));
            }
            out[at(2) + 2 * r..][..2].copy_from_slice(&src[0..2]);
        }
        GgmlType::Q4_K => {
            for v in 0..32 {
                put4(out, 0, v, four(16 + 4 * v));
            }
            let (sc, mn) = crate::portable::scales_mins_k4(&src[4..16]);
            for j in 0..8 {
                out[at(1) + 16 * j + r] = sc[j];
                out[at(2) + 16 * j + r] = mn[j];
            }
            out[at(3) + 2 * r..][..2].copy_from_slice(&src[0..2]);
            out[at(4) + 2 * r..][..2].copy_from_slice(&src[2..4]);
        }
        GgmlType::Q5_K => {
            for v in 0..32 {
                put4(out, 0, v, four(48 + 4 * v));
            }
            for j in 0..8 {
                for kk in 0..8 {
                    let nib =
                        (0..4).fold(0u8, |acc, i| acc | (((src[16 + 4 * kk + i] >> j) & 1) << i));
                    out[at(1) + 8 * (8 * j + kk) + r / 2] |= nib << (4 * (r % 2));
                }
            }
            let (sc, mn) = crate::portable::scales_mins_k4(&src[4..16]);
            for j in 0..8 {
                out[at(2) + 16 * j + r] = sc[j];
                out[at(3) + 16 * j + r] = mn[j];
            }
            out[at(4) + 2 * r..][..2].copy_from_slice(&src[0..2]);
            out[at(5) + 2 * r..][..2].copy_from_slice(&src[2..4]);
        }
        GgmlType::Q6_K => {
            // Four consecutive elements at a time, as portable::dot_q6_k reads them:
            // element e = 128h + 32k + l has its low nibble in ql[64h + l + 32(k&1)]
            // (low half of the byte for k < 2) and its high pair at bits 2k of
            // qh[32h + l]; four consecutive e share h and k.
            let word = |o: usize| u32::from_le_bytes(four(o));
            let low4 = |e: usize| {
                let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
                let w = word(64 * h + l + 32 * (k & 1));
                (if k < 2 { w } else { w >> 4 }) & 0x0F0F_0F0F
            };
            let high4 = |e: usize| {
                let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
                (word(128 + 32 * h + l) >> (2 * k)) & 0x0303_0303
            };
            for v in 0..32 {
                let bytes = low4(4 * v) | (low4(4 * (v + 32)) << 4);
                put4(out, 0, v, bytes.to_le_bytes());
            }
            for u in 0..16 {
                let bytes = (0..4).fold(0u32, |acc, m| acc | (high4(4 * (u + 16 * m)) << (2 * m)));
                put4(out, 1, u, bytes.to_le_bytes());
            }
            for s in 0..16 {
                out[at(2) + 16 * s + r] = src[192 + s];
            }
            out[at(3) + 2 * r..][..2].copy_from_slice(&src[208..210]);
        }
        // No layout: `packable` refused the type before any block is packed.
        _ => {}
    }
}

impl PackedMatrix {
    /// Writes row `r`'s bytes in the file's block format into `out` (the inverse of
    /// `pack`, byte for byte): how a tied embedding is looked up once its file pages
    /// are released. Returns false (and writes nothing) when `r` or `out` do not fit.
    pub fn source_row(&self, r: usize, out: &mut [u8]) -> bool {
        let Some(secs) = sections(self.ty) else {
            return false;
        };
        let nb = self.blocks_per_row();
        let ts = self.ty.type_size() as usize;
        if r >= self.rows || out.len() < nb * ts {
            return false;
        }
        let (g, rr) = (r / GROUP_ROWS, r % GROUP_ROWS);
        let group = &self.bytes()[g * self.group_bytes..(g + 1) * self.group_bytes];
        for (b, dst) in out.chunks_exact_mut(ts).take(nb).enumerate() {
            unpack_block(self.ty, group, rr, b, secs, &self.sec, dst);
        }
        true
    }
}

/// Where each section starts inside a group of `nb` blocks.
fn section_offsets(secs: &[usize], nb: usize) -> [usize; 6] {
    let mut offs = [0usize; 6];
    let mut acc = 0;
    for (o, s) in offs.iter_mut().zip(secs) {
        *o = acc;
        acc += nb * s;
    }
    offs
}

/// Row `r`'s eight scales and mins (stored one byte each at `sc_at`/`mn_at`) back in
/// the 12-byte six-bit layout: the inverse of ggml's `get_scale_min_k4`.
fn unpack_scales_mins_k4(g: &[u8], sc_at: usize, mn_at: usize, r: usize, dst: &mut [u8]) {
    let sc: [u8; 8] = std::array::from_fn(|j| g[sc_at + 16 * j + r]);
    let mn: [u8; 8] = std::array::from_fn(|j| g[mn_at + 16 * j + r]);
    for j in 0..4 {
        dst[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        dst[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        dst[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
    }
}

/// The inverse of `pack_block`: row `r`'s block `b` back in the file's format.
fn unpack_block(
    ty: GgmlType,
    g: &[u8],
    r: usize,
    b: usize,
    secs: &[usize],
    offs: &[usize; 6],
    dst: &mut [u8],
) {
    let at = |s: usize| offs[s] + b * secs[s];
    let lane = |s: usize, v: usize, i: usize| at(s) + v * 64 + r * 4 + i;
    match ty {
        GgmlType::Q8_0 => {
            dst[0..2].copy_from_slice(&g[at(1) + 2 * r..][..2]);
            for k in 0..8 {
                for i in 0..4 {
                    dst[2 + 4 * k + i] = g[lane(0, k, i)] ^ 0x80;
                }
            }
        }
        GgmlType::Q4_0 => {
            dst[0..2].copy_from_slice(&g[at(1) + 2 * r..][..2]);
            for kk in 0..4 {
                for i in 0..4 {
                    dst[2 + 4 * kk + i] = g[lane(0, kk, i)];
                }
            }
        }
        GgmlType::MXFP4 => {
            dst[0] = g[at(1) + r];
            for kk in 0..4 {
                for i in 0..4 {
                    dst[1 + 4 * kk + i] = g[lane(0, kk, i)];
                }
            }
        }
        GgmlType::Q5_0 => {
            dst[0..2].copy_from_slice(&g[at(2) + 2 * r..][..2]);
            let mut qh = 0u32;
            for k in 0..8 {
                for i in 0..4 {
                    let bit = 4 * r + i;
                    if (g[at(1) + 8 * k + bit / 8] >> (bit % 8)) & 1 == 1 {
                        qh |= 1 << (4 * k + i);
                    }
                }
            }
            dst[2..6].copy_from_slice(&qh.to_le_bytes());
            for kk in 0..4 {
                for i in 0..4 {
                    dst[6 + 4 * kk + i] = g[lane(0, kk, i)];
                }
            }
        }
        GgmlType::Q4_K => {
            dst[0..2].copy_from_slice(&g[at(3) + 2 * r..][..2]);
            dst[2..4].copy_from_slice(&g[at(4) + 2 * r..][..2]);
            unpack_scales_mins_k4(g, at(1), at(2), r, &mut dst[4..16]);
            for c in 0..4 {
                for kk in 0..8 {
                    for i in 0..4 {
                        dst[16 + 32 * c + 4 * kk + i] = g[lane(0, c * 8 + kk, i)];
                    }
                }
            }
        }
        GgmlType::Q5_K => {
            dst[0..2].copy_from_slice(&g[at(4) + 2 * r..][..2]);
            dst[2..4].copy_from_slice(&g[at(5) + 2 * r..][..2]);
            unpack_scales_mins_k4(g, at(2), at(3), r, &mut dst[4..16]);
            dst[16..48].fill(0);
            for j in 0..8 {
                for kk in 0..8 {
                    let nib = (g[at(1) + 8 * (8 * j + kk) + r / 2] >> (4 * (r % 2))) & 0xF;
                    for i in 0..4 {
                        dst[16 + 4 * kk + i] |= ((nib >> i) & 1) << j;
                    }
                }
            }
            for v in 0..32 {
                for i in 0..4 {
                    dst[48 + 4 * v + i] = g[lane(0, v, i)];
                }
            }
        }
        GgmlType::Q6_K => {
            dst[..208].fill(0);
            for e in 0..256 {
                let (q, i) = (e / 4, e % 4);
                let low = (g[lane(0, q % 32, i)] >> if q < 32 { 0 } else { 4 }) & 0xF;
                let high = (g[lane(1, q % 16, i)] >> (2 * (q / 16))) & 3;
                let (h, rr) = (e / 128, e % 128);
                let (k, l) = (rr / 32, rr % 32);
                dst[64 * h + l + 32 * (k & 1)] |= if k < 2 { low } else { low << 4 };
                dst[128 + 32 * h + l] |= high << (2 * k);
            }
            for s in 0..16 {
                dst[192 + s] = g[at(2) + 16 * s + r];
            }
            dst[208..210].copy_from_slice(&g[at(3) + 2 * r..][..2]);
        }
        _ => {}
    }
}

/// Per-token facts about the activation that the packed kernels need, computed once per
/// matmul: the f32 scale of every block and the integer start values of the block sums
/// (`-offset · Σq` for the legacy formats, `-32 · bsum` per 16 for Q6_K, the paired
/// 32-element sums for Q4_K's mins).
// Read only by the x86-64 and aarch64 kernels; elsewhere nothing packs (`packable`).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) struct ActPrep {
    pub dy: Vec<f32>,
    pub aux: Vec<i32>,
    /// Entries of `aux` per block.
    pub aux_per_block: usize,
    pub blocks: usize,
    /// For the AMX kernels (else empty): the Q8_K quants of every whole group of 16
    /// tokens as `[block][group][token][256]`, so that a tile row (a token's 16–64
    /// bytes of one block) is aligned, rows are 256 bytes apart, and one block's tiles
    /// for successive groups are contiguous (the kernels stream them). Read in place,
    /// the rows straddle lines and the kernels run at half speed.
    pub tiles16: Vec<Line>,
}

/// Q8_K block: f32 d, 256 × i8, 16 × i16 bsums.
const Q8K_BYTES: usize = 292;

/// What the packed MXFP4 kernels add to each `kvalues_mxfp4` value (≥ −12) so that the
/// weights are unsigned.
pub(crate) const MXFP4_OFFSET: i8 = 12;

/// `kvalues_mxfp4[i] + MXFP4_OFFSET`: the unsigned weight of nibble `i` in the packed
/// MXFP4 kernels (0..=24).
// Read only by the x86-64 and aarch64 kernels.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) const MXFP4_UNSIGNED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (crate::portable::KVALUES_MXFP4[i] + MXFP4_OFFSET) as u8;
        i += 1;
    }
    t
};

/// Tokens per task when preparing the activations.
const PREP_TOKENS: usize = 32;

fn prep(ty: GgmlType, a: &QuantizedRows, tiles16: bool, pool: &ThreadPool) -> ActPrep {
    let rb = a.row_bytes();
    let (blocks, per) = match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::MXFP4 => (a.cols / 32, 1),
        GgmlType::Q6_K => (a.cols / 256, 16),
        _ => (a.cols / 256, 4),
    };
    // The activation row of token `t` and its blocks (34-byte Q8_0 or 292-byte Q8_K).
    let row = |t: usize| &a.data[t * rb..(t + 1) * rb];
    let block_bytes = if per == 1 { 34 } else { Q8K_BYTES };
    let mut dy = vec![0f32; a.n * blocks];
    pool.for_each_chunk_mut(&mut dy, blocks * PREP_TOKENS, |c, dys| {
        for (i, d) in dys.chunks_exact_mut(blocks).enumerate() {
            let blks = row(c * PREP_TOKENS + i).chunks_exact(block_bytes);
            for (d, blk) in d.iter_mut().zip(blks) {
                *d = if per == 1 {
                    half::f16::from_le_bytes([blk[0], blk[1]]).to_f32()
                } else {
                    f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]])
                };
            }
        }
    });
    let mut aux = vec![0i32; a.n * blocks * per];
    pool.for_each_chunk_mut(&mut aux, blocks * per * PREP_TOKENS, |c, auxs| {
        for (i, x) in auxs.chunks_exact_mut(blocks * per).enumerate() {
            let blks = row(c * PREP_TOKENS + i).chunks_exact(block_bytes);
            for (x, blk) in x.chunks_exact_mut(per).zip(blks) {
                prep_block(ty, blk, x);
            }
        }
    });
    let tiles16 = if tiles16 && per != 1 {
        tile_rows16(a, blocks, pool)
    } else {
        Vec::new()
    };
    ActPrep {
        dy,
        aux,
        aux_per_block: per,
        blocks,
        tiles16,
    }
}

/// `ActPrep::tiles16` of Q8_K rows `a` (`blocks` per row).
fn tile_rows16(a: &QuantizedRows, blocks: usize, pool: &ThreadPool) -> Vec<Line> {
    let rb = a.row_bytes();
    let groups = a.n / 16;
    // Lines per (block, group of 16 tokens): 16 tokens × 256 bytes.
    let per_group = 16 * 256 / 64;
    let mut out = vec![Line([0; 64]); blocks * groups * per_group];
    pool.for_each_chunk_mut(&mut out, groups * per_group, |b, lines| {
        for (g, grp) in lines.chunks_exact_mut(per_group).enumerate() {
            for (t, dst) in grp.chunks_exact_mut(4).enumerate() {
                let src = &a.data[(16 * g + t) * rb + b * Q8K_BYTES + 4..][..256];
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(64)) {
                    d.0.copy_from_slice(s);
                }
            }
        }
    });
    out
}

/// The aux values of one activation block (see `ActPrep`).
fn prep_block(ty: GgmlType, blk: &[u8], x: &mut [i32]) {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::MXFP4 => {
            let off = match ty {
                GgmlType::Q8_0 => 128,
                GgmlType::Q4_0 => 8,
                GgmlType::MXFP4 => MXFP4_OFFSET as i32,
                _ => 16,
            };
            let s: i32 = blk[2..34].iter().map(|&q| q as i8 as i32).sum();
            x[0] = -off * s;
        }
        _ => {
            let bsum = |j: usize| i16::from_le_bytes([blk[260 + 2 * j], blk[261 + 2 * j]]) as i32;
            if ty == GgmlType::Q6_K {
                for (s, x) in x.iter_mut().enumerate() {
                    *x = -32 * bsum(s);
                }
            } else {
                // Sub-block sums (32 values) as i16 pairs (2p, 2p+1) for vpdpwssd.
                let sub = |j: usize| (bsum(2 * j) + bsum(2 * j + 1)) as i16 as u16 as u32;
                for (p, x) in x.iter_mut().enumerate() {
                    *x = (sub(2 * p) | (sub(2 * p + 1) << 16)) as i32;
                }
            }
        }
    }
}

/// Pointers for one tile; see `packed::run_tile`.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) struct Tile {
    /// The group's first byte.
    pub w: *const u8,
    /// Blocks per row.
    pub nb: usize,
    /// Where each section (`sections`, in order) starts in the group, in bytes.
    pub sec: [usize; 6],
    /// Bytes from one group to the next (a one-token pass prefetches into the next).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub group_bytes: usize,
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
    /// Where `ActPrep::tiles16` holds block 0 of the first token's group of 16 (null
    /// when the first token does not start one, or there are none); block b is
    /// `b · tiles16_block` bytes on. Read by the AMX kernels only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub tiles16: *const u8,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub tiles16_block: usize,
}

/// Tokens per task in prefill: the group's weights stay in L1 while this many
/// activation rows stream from L2.
const TOKEN_CHUNK: usize = 64;

/// `out[t * rows + r] = W[r] · A[t]` for the packed matrix, as `matmul` computes it
/// (bit-identical to the portable kernels), split over the pool. On a shape mismatch the
/// output that exists is filled with NaN (debug builds assert).
pub fn matmul_packed(p: &PackedMatrix, a: &QuantizedRows, out: &mut [f32], pool: &ThreadPool) {
    matmul_packed_many(&mut [(p, out)], a, pool);
}

/// `matmul_packed` of several matrices by the same activations (a layer's q, k and v;
/// its up and gate), as one region of the pool: a thread that runs out of one matrix's
/// tasks goes on to the next one's instead of waiting at a barrier (a 512-row k or v
/// matrix alone streamed at 26 GB/s where the step's large ones read 42; one region
/// made a 1B decode step 0.5–0.7% faster, AMD Zen 5, two threads). Each output as
/// `matmul_packed`'s, NaN-filled on a shape mismatch.
pub fn matmul_packed_many(
    jobs: &mut [(&PackedMatrix, &mut [f32])],
    a: &QuantizedRows,
    pool: &ThreadPool,
) {
    if a.n == 0 {
        return;
    }
    let mut preps: Vec<((GgmlType, bool), ActPrep)> = Vec::new();
    let mut plans = Vec::with_capacity(jobs.len());
    for (p, out) in jobs.iter_mut() {
        let ok = a.ty == p.ty.vec_dot_type()
            && a.cols == p.cols
            && a.data.len() >= a.n * a.row_bytes()
            && out.len() >= a.n * p.rows;
        if !ok {
            debug_assert!(false, "matmul_packed: shapes do not match");
            out.fill(f32::NAN);
            continue;
        }
        // Matrices of one type share the activations' preparation.
        let key = (p.ty, uses_tiles16(p.set, p.ty, a.n));
        let prep = match preps.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                preps.push((key, prep(key.0, a, key.1, pool)));
                preps.len() - 1
            }
        };
        plans.push((*p, prep, SyncPtr(out.as_mut_ptr())));
    }
    // One token: tasks of about equal bytes over the region's matrices, so that the
    // threads' runs (`run_contiguous`) split its bytes evenly.
    let threads = pool.n_threads();
    let total: usize = plans
        .iter()
        .map(|(p, ..)| p.rows / GROUP_ROWS * p.group_bytes)
        .sum();
    let task_bytes = (total / (threads * 8)).max(1);
    let plans: Vec<Plan> = (plans.into_iter())
        .map(|(p, prep, out)| Plan::new(p, prep, a.n, out, threads, task_bytes))
        .collect();
    // Task `i` of the region is task `i - first[j]` of plan `j`.
    let mut first = Vec::with_capacity(plans.len());
    let mut n_tasks = 0;
    for plan in &plans {
        first.push(n_tasks);
        n_tasks += plan.n_tasks();
    }
    let task = |i: usize| {
        let j = first.partition_point(|&f| f <= i) - 1;
        let plan = &plans[j];
        // SAFETY: `plan` was made from a matrix and output that passed the checks above,
        // with the preparation of `a` for its type; tasks are disjoint (`Plan::run`).
        unsafe { plan.run(i - first[j], &preps[plan.prep].1, a) };
    };
    if n_tasks == 1 || threads == 1 {
        (0..n_tasks).for_each(task);
    } else if a.n == 1 {
        // One token: each thread streams its own consecutive rows.
        pool.run_contiguous(n_tasks, task);
    } else {
        pool.run(n_tasks, task);
    }
}

/// How one matrix's product is cut into tasks: runs of groups (rows) × runs of tokens.
struct Plan<'a> {
    p: &'a PackedMatrix,
    /// Index of the activations' preparation for `p`'s type.
    prep: usize,
    n: usize,
    out: SyncPtr<f32>,
    groups: usize,
    gchunk: usize,
    tchunk: usize,
    gtasks: usize,
}

impl<'a> Plan<'a> {
    /// `task_bytes`: the weight bytes a one-token task reads (about).
    fn new(
        p: &'a PackedMatrix,
        prep: usize,
        n: usize,
        out: SyncPtr<f32>,
        threads: usize,
        task_bytes: usize,
    ) -> Self {
        let groups = p.rows / GROUP_ROWS;
        let (gchunk, tchunk) = if n == 1 {
            ((task_bytes / p.group_bytes).clamp(1, 64), 1)
        } else {
            let tchunk = TOKEN_CHUNK.max(tile_tokens(p.set)).min(n);
            let tcs = n.div_ceil(tchunk);
            let want = (threads * 4).div_ceil(tcs);
            ((groups / want.max(1)).clamp(1, 16), tchunk)
        };
        Plan {
            p,
            prep,
            n,
            out,
            groups,
            gchunk,
            tchunk,
            gtasks: groups.div_ceil(gchunk),
        }
    }

    fn n_tasks(&self) -> usize {
        self.gtasks * self.n.div_ceil(self.tchunk)
    }

    /// Task `i` (< `n_tasks`): its groups against its tokens.
    ///
    /// # Safety
    /// `p` and the output passed `matmul_packed_many`'s checks against `a`, `prep` is
    /// `a`'s preparation for `p`'s type, and no other thread runs task `i` meanwhile.
    unsafe fn run(&self, i: usize, prep: &ActPrep, a: &QuantizedRows) {
        let (p, n) = (self.p, self.n);
        let (gi, ti) = (i % self.gtasks, i / self.gtasks);
        let (g0, g1) = (gi * self.gchunk, ((gi + 1) * self.gchunk).min(self.groups));
        let (t0, t1) = (ti * self.tchunk, ((ti + 1) * self.tchunk).min(n));
        for g in g0..g1 {
            let mut t = t0;
            while t < t1 {
                let m = (t1 - t).min(tile_tokens(p.set));
                // SAFETY: the kernels write out[(t+j)*rows + 16g .. +16] for j < m: inside
                // this task's (groups × tokens) tile, disjoint from every other task's,
                // and < n*rows <= the output's length. `p` exists only if `packable_with`
                // found its set (AVX-VNNI or AVX-512 VNNI) on this CPU when it was built.
                unsafe { run_tile(p, prep, a, g, t, m, self.out.get()) };
                t += m;
            }
        }
    }
}

/// Whether `set`'s kernels for `ty` read `ActPrep::tiles16` (AMX, a group of 16 tokens).
fn uses_tiles16(set: KernelSet, ty: GgmlType, n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if set == KernelSet::Avx512Amx {
        return crate::x86::amx::tokens(ty, n) > 0;
    }
    let _ = (set, ty, n);
    false
}

/// Tokens per register tile of `set`'s packed kernels.
fn tile_tokens(set: KernelSet) -> usize {
    match set {
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx2 | KernelSet::AvxVnni => crate::x86::packed256::TILE,
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx512Vnni => crate::x86::packed512::TILE,
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx512Amx => crate::x86::amx::TILE,
        #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
        KernelSet::NeonDotprod | KernelSet::NeonI8mm => crate::aarch64::packed::TILE,
        _ => 1,
    }
}

/// Whether the AVX-512 sets run one-token tiles of `ty` through the AVX-VNNI kernels
/// (`packed256`; the same layout), on a CPU that has AVX-VNNI. For the K-quants they
/// stream faster than the 512-bit pass: AMD Zen 5, one thread from DRAM, four
/// alternating rounds, Q6_K 27.5–28.7 → 31.8–35.4 GiB/s and Q4_K 31.1–33.0 → 34.7–42.3;
/// two threads +4–6%. Their pass takes each line as two 8-row halves with a sub-block
/// pair's sums in four independent chains, where the 512-bit pass has one chain a sub-
/// block. Not taken: a 512-bit pair pass (two chains; slower than either), and the same
/// 256-bit body EVEX-encoded for AVX-512 CPUs without AVX-VNNI (compiled with the
/// AVX-512 features it ran Q4_K at 27 GiB/s, below the 512-bit pass). Q8_0's passes were
/// level: the legacy formats keep the 512-bit one. Q5_K shares Q4_K's pair body (not
/// measured on its own).
fn one_token_at_256(set: KernelSet, ty: GgmlType) -> bool {
    matches!(set, KernelSet::Avx512Vnni | KernelSet::Avx512Amx)
        && matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
        && KernelSet::AvxVnni.is_available()
}

/// Computes tokens `t..t+m` (m ≤ the set's tile) against group `g`.
///
/// # Safety
/// `p` was built by `pack_for` (so this CPU runs `p.set`, which has packed kernels);
/// `a` and `prep` match `p`; `out` has room for `(t+m) * p.rows` values.
// Only targets with packed kernels use `m` and the tile.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_variables, unused_unsafe)
)]
unsafe fn run_tile(
    p: &PackedMatrix,
    prep: &ActPrep,
    a: &QuantizedRows,
    g: usize,
    t: usize,
    m: usize,
    out: *mut f32,
) {
    let nb = p.blocks_per_row();
    let rb = a.row_bytes();
    // The tile of tokens t..: pointers only, dereferenced by the kernels.
    let tile_at = |t: usize| Tile {
        w: p.bytes()[g * p.group_bytes..].as_ptr(),
        nb,
        sec: p.sec,
        group_bytes: p.group_bytes,
        a: a.data[t * rb..].as_ptr(),
        a_stride: rb,
        dy: prep.dy[t * prep.blocks..].as_ptr(),
        aux: prep.aux[t * prep.blocks * prep.aux_per_block..].as_ptr(),
        prep_stride: prep.blocks,
        out: out.wrapping_add(t * p.rows + g * GROUP_ROWS),
        out_stride: p.rows,
        tiles16: if t.is_multiple_of(16) && (t + 16) * 256 * nb <= prep.tiles16.len() * 64 {
            prep.tiles16[t * 4..].as_ptr() as *const u8
        } else {
            std::ptr::null()
        },
        tiles16_block: prep.tiles16.len() * 64 / nb,
    };
    let tile_args = tile_at(t);
    // SAFETY: forwarded from the caller; the kernels of `p.set`, which this CPU runs, or
    // (`one_token_vnni`) the AVX-VNNI ones, which `one_token_at_256` found it runs.
    unsafe {
        match p.set {
            #[cfg(target_arch = "x86_64")]
            KernelSet::Avx2 => crate::x86::packed256::avx2::tile(p.ty, m, &tile_args),
            #[cfg(target_arch = "x86_64")]
            KernelSet::AvxVnni => crate::x86::packed256::vnni::tile(p.ty, m, &tile_args),
            #[cfg(target_arch = "x86_64")]
            KernelSet::Avx512Vnni | KernelSet::Avx512Amx if m == 1 && p.one_token_vnni => {
                crate::x86::packed256::vnni::tile(p.ty, m, &tile_args)
            }
            #[cfg(target_arch = "x86_64")]
            KernelSet::Avx512Vnni => crate::x86::packed512::tile(p.ty, m, &tile_args),
            #[cfg(target_arch = "x86_64")]
            KernelSet::Avx512Amx => {
                // Whole 16-token tiles on the tile unit, the rest on AVX-512 VNNI.
                use crate::x86::{amx, packed512};
                let full = if tile_args.tiles16.is_null() {
                    0
                } else {
                    amx::tokens(p.ty, m)
                };
                if full > 0 {
                    amx::tile(p.ty, full, &tile_args);
                }
                let mut s = full;
                while s < m {
                    let k = (m - s).min(packed512::TILE);
                    packed512::tile(p.ty, k, &tile_at(t + s));
                    s += k;
                }
            }
            #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
            KernelSet::NeonDotprod => crate::aarch64::packed::dotprod::tile(p.ty, m, &tile_args),
            #[cfg(all(target_arch = "aarch64", target_endian = "little"))]
            KernelSet::NeonI8mm => crate::aarch64::packed::i8mm::tile(p.ty, m, &tile_args),
            _ => unreachable!("packable_with admits no other set"),
        }
    }
}
