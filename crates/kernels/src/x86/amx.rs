//! AMX (tile matrix multiply, Sapphire Rapids and later) prefill kernels for Q4_K and
//! Q6_K over the packed layout. The packed layout is already what AMX's second operand
//! wants: a line holds four consecutive weights of each of 16 rows, which is a row of a
//! "VNNI-layout" B tile. One `tdpbsud`/`tdpbssd` multiplies 16 tokens' activations (an
//! A tile: one token's 64 bytes per row, from `ActPrep::tiles16`) by 64 values of 16
//! weight rows, adding the 16 × 16 integer sums into a C tile.
//!
//! A C tile can only sum across sub-blocks if their scales are inside the integers, so
//! each block is unpacked with its sub-block scales folded in, split into pieces that
//! keep every weight a byte (Q4_K: `sc = sl + 16 sh`; Q6_K: base-4 digits of `sc + 128`),
//! one C tile per piece; the block's integer sum `Σ_j sc_j Σ q a` is then recombined
//! exactly with shifts and adds, converted to f32 once, and finished by the VNNI
//! kernels' block ends (`packed512::k45_end`, `q6_k_end`). So the results are
//! bit-identical to the portable kernels.
//!
//! Tile state: the OS grants it per process (`tile_data_granted` asks Linux once); the
//! tile configuration is per thread and is loaded at the start of every call (a call
//! is 16 rows × up to 64 tokens × a whole row, so the `ldtilecfg` is noise).

use crate::packed::{Line, Tile};
use crate::x86::packed512::{
    bytes16, k45_end, k45_end_of, k45_sections, load512, q6_k_end, q6_k_quad, scales16,
};
use core::arch::asm;
use core::arch::x86_64::*;
use llamay_formats::GgmlType;
use std::sync::OnceLock;

/// Tokens per A tile (its rows).
const ROWS: usize = 16;

/// Most tokens per call: the block's weights are unpacked once and used by up to four
/// A tiles.
pub(crate) const TILE: usize = 4 * ROWS;

/// Whether this CPU has AMX-TILE and AMX-INT8 and the OS lets this process use the tile
/// data state (requested here, once; Linux only).
pub(crate) fn tile_data_granted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| cpu_has_amx_int8() && request_tile_data())
}

fn cpu_has_amx_int8() -> bool {
    // CPUID.(EAX=7, ECX=0):EDX bit 24 = AMX-TILE, bit 25 = AMX-INT8.
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without it the first tile
/// instruction raises SIGILL.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: a system call that only changes this process's permitted xsave features;
    // the kernel clobbers rcx and r11 and returns in rax.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// How many of `m` tokens the AMX kernels take for `ty` (whole A tiles; the rest, and
/// formats without an AMX kernel, go to `packed512`).
pub(crate) fn tokens(ty: GgmlType, m: usize) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q6_K => (m.min(TILE) / ROWS) * ROWS,
        _ => 0,
    }
}

/// Runs the AMX kernel for `ty` on `m` tokens, `m` as `tokens` returned it (> 0).
///
/// # Safety
/// The AVX-512 VNNI set and `tile_data_granted()`; `t`'s pointers cover `m` tokens and
/// the group, and `t.tiles16` holds their `m / 16` groups of 16.
pub(crate) unsafe fn tile(ty: GgmlType, m: usize, t: &Tile) {
    debug_assert!(m > 0 && m == tokens(ty, m));
    // SAFETY: forwarded from the caller.
    unsafe {
        match ty {
            GgmlType::Q4_K => q4_k(t, m / ROWS),
            GgmlType::Q6_K => q6_k(t, m / ROWS),
            _ => {}
        }
    }
}

/// The tile configuration (palette 1): all eight tiles 16 rows × 64 bytes: tmm0–3
/// hold 16 × 16 i32 sums (C), the others 16 tokens × 64 activation bytes (A) or 16
/// lines of unpacked weights (B), 64 values per product.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

static TILES_16X64: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut i = 0;
    while i < 8 {
        c[16 + 2 * i] = 64;
        c[48 + i] = 16;
        i += 1;
    }
    TileConfig(c)
};

/// Loads `TILES_16X64` into this thread's tile configuration.
///
/// # Safety
/// `tile_data_granted()`.
#[inline]
unsafe fn configure() {
    // SAFETY: a valid palette-1 configuration of 64 readable bytes.
    let cfg = TILES_16X64.0.as_ptr();
    unsafe { asm!("ldtilecfg [{0}]", in(reg) cfg, options(nostack, readonly)) };
}

/// Four stored C tiles: `[tile][token][row]`.
#[repr(C, align(64))]
struct CTiles([[[i32; 16]; ROWS]; 4]);

thread_local! {
    /// A call's scratch: the unpacked weights (B tiles) of two blocks and the C-tile
    /// buffers, in 64-byte lines (zeroed when first grown).
    static UNPACKED: core::cell::RefCell<Vec<Line>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// C-tile buffers in flight.
const DEPTH: usize = 3;

/// Lines of one `CTiles`.
const CTILE_LINES: usize = size_of::<CTiles>() / 64;

/// Runs `units` steps as a pipeline `DEPTH` deep: the tile unit computes step
/// `u + DEPTH − 1` into one of the `DEPTH` C-tile buffers at `c` while the vector units
/// finish step `u` from another (the tile stores and the float work of one step would
/// otherwise wait on each other). `tiles(u, c)` issues step u's tile work into `c`;
/// `finish(u, c)` consumes it.
///
/// # Safety
/// `c` points to `DEPTH` initialised `CTiles`; `tiles` stores every tile `finish` reads.
#[inline(always)]
unsafe fn pipelined(
    units: usize,
    c: *mut CTiles,
    mut tiles: impl FnMut(usize, *mut CTiles),
    mut finish: impl FnMut(usize, &CTiles),
) {
    // SAFETY: indices are taken mod DEPTH; step u's buffer is read after its tiles were
    // stored, and written again (step u + DEPTH) only after `finish(u)` returned.
    unsafe {
        for u in 0..(DEPTH - 1).min(units) {
            tiles(u, c.add(u % DEPTH));
        }
        for u in 0..units {
            if u + DEPTH - 1 < units {
                tiles(u + DEPTH - 1, c.add((u + DEPTH - 1) % DEPTH));
            }
            finish(u, &*c.add(u % DEPTH));
        }
    }
}

/// `f(lines)` with this thread's unpack buffer holding at least `n` lines.
fn with_unpacked<R>(n: usize, f: impl FnOnce(&mut [Line]) -> R) -> R {
    UNPACKED.with(|cell| {
        let mut v = cell.borrow_mut();
        if v.len() < n {
            v.resize(n, Line([0; 64]));
        }
        f(&mut v[..n])
    })
}

/// The frame of both kernels: zeroes the output rows, then runs one step per (block
/// `b`, A tile `tt`), blocks outer, so that a block's unpacked weights stay in L1 while
/// its activation tiles stream in order. Blocks are unpacked one ahead, into the other
/// of two slots of `lines` lines (tile loads of lines just stored would wait for the
/// stores to drain). `tile_work(u, b, tt, slot, c)` issues a step's tile work into `c`,
/// `finish(b, tt, c)` its vector work (see `pipelined`).
///
/// # Safety
/// `tile_data_granted()`; the closures' accesses suit `p` (the kernels' contract).
#[inline(always)]
unsafe fn block_steps(
    p: &Tile,
    tiles: usize,
    lines: usize,
    unpack: impl Fn(usize, *mut Line),
    mut tile_work: impl FnMut(usize, usize, usize, *const u8, *mut CTiles),
    mut finish: impl FnMut(usize, usize, &CTiles),
) {
    let nb = p.nb;
    with_unpacked(2 * lines + DEPTH * CTILE_LINES, |bw| {
        let slots = bw.as_mut_ptr();
        // SAFETY: the caller's contract; both slots and the C buffers (64-byte aligned
        // lines, initialised) lie in `bw`.
        unsafe {
            configure();
            zero_out(p, tiles * ROWS);
            unpack(0, slots);
            pipelined(
                nb * tiles,
                slots.add(2 * lines) as *mut CTiles,
                |u, c| {
                    let (b, tt) = (u / tiles, u % tiles);
                    if tt == 0 && b + 1 < nb {
                        unpack(b + 1, slots.add(lines * ((b + 1) % 2)));
                    }
                    tile_work(u, b, tt, slots.add(lines * (b % 2)) as *const u8, c);
                },
                |u, c| finish(u / tiles, u % tiles, c),
            );
        }
    })
}

/// Zeroes the output rows of `n` tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn zero_out(p: &Tile, n: usize) {
    for t in 0..n {
        // SAFETY: token t's output row (the caller's contract).
        unsafe { _mm512_storeu_ps(p.out.add(t * p.out_stride), _mm512_setzero_ps()) };
    }
}

/// Zeroes the C tiles listed (`tmm` numbers).
macro_rules! zero_tiles {
    ($($t:literal),+) => {
        $(asm!(concat!("tilezero tmm", $t), options(nostack, nomem));)+
    };
}

/// Stores C tile `tmm$t` into buffer `$i` of the `CTiles` at `$c`, for each pair.
macro_rules! store_tiles {
    ($c:expr; $($i:literal <- $t:literal),+) => {{
        let c: *mut CTiles = $c;
        $(asm!(
            concat!("tilestored [{c} + {l}*1], tmm", $t),
            c = in(reg) (*c).0[$i].as_mut_ptr(),
            l = in(reg) 64usize,
            options(nostack),
        );)+
    }};
}

/// One block of Q4_K for one A tile, `tdpbsud` with K = 64: C tile `$cl` (zeroed) +=
/// Σ_c A(`a + 64c`) · B(`bl + 16c` lines) and `$ch` likewise from `bh`; both stored at
/// `c` (tiles 0 and 1).
macro_rules! q4_k_block {
    ($cl:literal, $ch:literal, $a:expr, $bl:expr, $bh:expr, $c:expr) => {{
        let (a, bl, bh): (*const u8, *const u8, *const u8) = ($a, $bl, $bh);
        let c: *mut CTiles = $c;
        zero_tiles!($cl, $ch);
        for w in 0..4 {
            asm!(
                "tileloadd tmm4, [{a} + {s}*1]",
                "tileloadd tmm5, [{bl} + {l}*1]",
                "tileloadd tmm7, [{bh} + {l}*1]",
                concat!("tdpbsud tmm", $cl, ", tmm4, tmm5"),
                concat!("tdpbsud tmm", $ch, ", tmm4, tmm7"),
                a = in(reg) a.add(64 * w),
                s = in(reg) 256usize,
                bl = in(reg) bl.add(w * 16 * 64),
                bh = in(reg) bh.add(w * 16 * 64),
                l = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
        store_tiles!(c; 0 <- $cl, 1 <- $ch);
    }};
}

/// Q4_K against Q8_K, `tiles` A tiles of 16 tokens, a whole block per step. Each
/// sub-block scale `sc` (six bits) is split as `sl + 16 sh` (`sl` < 16, `sh` < 4) and
/// folded into the unpacked weights: `q·sl` and `q·sh` still fit a byte (≤ 225), so two
/// C tiles accumulate a block's Σ q·sl·a and Σ q·sh·a over all 256 values, and
/// `C_l + 16 C_h` is the block's exact integer Σ_j sc_j Σ q a, converted to f32 once as
/// `portable::dot_q4_k` does. The mins and float steps are `packed512::k45_end`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_k(p: &Tile, tiles: usize) {
    // A slot is 128 lines: the q·sl lines, then the q·sh lines; each 4 windows of 16
    // lines (the low nibbles of line pair c for sub-block 2c, then the high ones for
    // 2c + 1).
    // SAFETY: tile data granted (the caller's contract); every pointer stays inside the
    // group, the slot and the 16·tiles tokens' activation rows, prep entries and output
    // rows.
    unsafe {
        block_steps(
            p,
            tiles,
            128,
            |b, slot| q4_k_unpack(p, b, slot),
            |u, b, tt, slot, c| {
                let a = p.tiles16.add(b * p.tiles16_block + tt * ROWS * 256);
                let bh = slot.add(64 * 64);
                // Alternate C tiles, so a step's products need not wait for the
                // previous step's tiles to be stored.
                if u % 2 == 0 {
                    q4_k_block!(0, 1, a, slot, bh, c);
                } else {
                    q4_k_block!(2, 3, a, slot, bh, c);
                }
            },
            |b, tt, c| {
                let end = k45_end_of::<false>(p, b);
                for t in 0..ROWS {
                    // SAFETY: 64-byte rows of `c`.
                    let (l, h) = (
                        _mm512_load_si512(c.0[0][t].as_ptr() as *const _),
                        _mm512_load_si512(c.0[1][t].as_ptr() as *const _),
                    );
                    let isum = _mm512_add_epi32(l, _mm512_slli_epi32(h, 4));
                    k45_end(p, &end, b, tt * ROWS + t, _mm512_cvtepi32_ps(isum));
                }
            },
        );
    }
}

/// Block `b` of a Q4_K group as `q4_k`'s B tiles, into the 128 lines at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q4_k_unpack(p: &Tile, b: usize, out: *mut Line) {
    let m4 = _mm512_set1_epi8(0xF);
    let sc_sec = k45_sections::<false>(p)[1];
    // SAFETY: block b of the group (the caller's contract); 128 lines at `out`.
    unsafe {
        // Sub-block j's sl and sh in both 16-bit halves of row r's lane: a 16-bit
        // multiply scales a byte pair without a carry between them.
        let sc: [__m512i; 8] =
            core::array::from_fn(|j| bytes16::<false>(p.w.add(sc_sec + b * 128 + j * 16)));
        let pair = |x: __m512i| _mm512_or_si512(x, _mm512_slli_epi32(x, 16));
        let sl = sc.map(|x| pair(_mm512_and_si512(x, _mm512_set1_epi32(15))));
        let sh = sc.map(|x| pair(_mm512_srli_epi32(x, 4)));
        for cc in 0..4 {
            for kk in 0..8 {
                let v = load512(p.w.add(b * 2048 + (cc * 8 + kk) * 64));
                let lo = _mm512_and_si512(v, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                let at = |part: usize, half: usize| {
                    out.add(64 * part + 16 * cc + 8 * half + kk) as *mut __m512i
                };
                _mm512_store_si512(at(0, 0), _mm512_mullo_epi16(lo, sl[2 * cc]));
                _mm512_store_si512(at(0, 1), _mm512_mullo_epi16(hi, sl[2 * cc + 1]));
                _mm512_store_si512(at(1, 0), _mm512_mullo_epi16(lo, sh[2 * cc]));
                _mm512_store_si512(at(1, 1), _mm512_mullo_epi16(hi, sh[2 * cc + 1]));
            }
        }
    }
}

/// One block of Q6_K for one A tile, `tdpbssd` with K = 64: C tile `i` (zeroed) +=
/// Σ_w A(`a + 64w`) · B(part `i`, window `w`: lines `64i + 16w..`) for the four parts,
/// then stored at `c`.
macro_rules! q6_k_block {
    ($a:expr, $parts:expr, $c:expr) => {{
        let (a, b): (*const u8, *const u8) = ($a, $parts);
        let c: *mut CTiles = $c;
        zero_tiles!(0, 1, 2, 3);
        for w in 0..4 {
            asm!(
                "tileloadd tmm4, [{a} + {s}*1]",
                "tileloadd tmm5, [{b0} + {l}*1]",
                "tileloadd tmm6, [{b1} + {l}*1]",
                "tileloadd tmm7, [{b2} + {l}*1]",
                "tdpbssd tmm0, tmm4, tmm5",
                "tdpbssd tmm1, tmm4, tmm6",
                "tdpbssd tmm2, tmm4, tmm7",
                "tileloadd tmm5, [{b3} + {l}*1]",
                "tdpbssd tmm3, tmm4, tmm5",
                a = in(reg) a.add(64 * w),
                s = in(reg) 256usize,
                b0 = in(reg) b.add((16 * w) * 64),
                b1 = in(reg) b.add((64 + 16 * w) * 64),
                b2 = in(reg) b.add((128 + 16 * w) * 64),
                b3 = in(reg) b.add((192 + 16 * w) * 64),
                l = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
        store_tiles!(c; 0 <- 0, 1 <- 1, 2 <- 2, 3 <- 3);
    }};
}

/// Q6_K against Q8_K, `tiles` A tiles of 16 tokens, a whole block per step. Each
/// sub-block scale `sc` (signed byte) is written in base 4 as `e0 + 4 e1 + 16 e2 +
/// 64 (e3 − 2)` (`e_i` in 0..=3) and folded into the unpacked weights: part `i` holds
/// `(q − 32)·e_i` (`(q − 32)(e3 − 2)` for part 3), each a signed byte, so four C tiles
/// accumulate a block over all 256 values with `tdpbssd`, and `C0 + 4 C1 + 16 C2 +
/// 64 C3` is the block's exact integer Σ sc (q − 32) a, as `portable::dot_q6_k` sums
/// it. The float step is `packed512::q6_k_end`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k(p: &Tile, tiles: usize) {
    let d_sec = p.sec[3];
    // A slot is four parts of 64 lines; line q of a part holds quad q (so window w of a
    // part, 64 values, is lines 16w..16w+16).
    // SAFETY: as in `q4_k`.
    unsafe {
        block_steps(
            p,
            tiles,
            256,
            |b, slot| q6_k_unpack(p, b, slot),
            |_, b, tt, slot, c| {
                let a = p.tiles16.add(b * p.tiles16_block + tt * ROWS * 256);
                q6_k_block!(a, slot, c);
            },
            |b, tt, c| {
                let d = scales16(p.w.add(d_sec + b * 32));
                for t in 0..ROWS {
                    // SAFETY: 64-byte rows of `c`.
                    let part = |i: usize| _mm512_load_si512(c.0[i][t].as_ptr() as *const _);
                    let hi = _mm512_add_epi32(part(2), _mm512_slli_epi32(part(3), 2));
                    let lo = _mm512_add_epi32(part(0), _mm512_slli_epi32(part(1), 2));
                    let isum = _mm512_add_epi32(lo, _mm512_slli_epi32(hi, 4));
                    q6_k_end(p, d, b, tt * ROWS + t, isum);
                }
            },
        );
    }
}

/// Block `b` of a Q6_K group as `q6_k`'s four parts of B tiles, into the 256 lines at
/// `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn q6_k_unpack(p: &Tile, b: usize, out: *mut Line) {
    let sc_sec = p.sec[2];
    // SAFETY: block b of the group (the caller's contract); 256 lines at `out`.
    unsafe {
        for s in 0..16 {
            // Row r's digits of sc + 128 (so e3 − 2 is the top signed digit), each in
            // all four bytes of the row's lane: e_i for the 16-bit multiply (no carry:
            // q·e ≤ 189), and the byte offset that turns q·e_i into (q − 32)·e_i (part
            // 3: (q − 32)(e3 − 2) = q·e3 − 2q − 32 e3 + 64).
            let u = _mm512_xor_si512(
                bytes16::<false>(p.w.add(sc_sec + b * 256 + s * 16)),
                _mm512_set1_epi32(0x80),
            );
            let digit = |i: usize| {
                let e = _mm512_and_si512(_mm512_srli_epi32(u, 0), _mm512_set1_epi32(3));
                let e = match i {
                    0 => e,
                    1 => _mm512_and_si512(_mm512_srli_epi32(u, 2), _mm512_set1_epi32(3)),
                    2 => _mm512_and_si512(_mm512_srli_epi32(u, 4), _mm512_set1_epi32(3)),
                    _ => _mm512_srli_epi32(u, 6),
                };
                // In both 16-bit halves (the multiplier) and in all four bytes.
                let words = _mm512_or_si512(e, _mm512_slli_epi32(e, 16));
                (words, _mm512_or_si512(words, _mm512_slli_epi32(words, 8)))
            };
            let e: [(__m512i, __m512i); 4] = [digit(0), digit(1), digit(2), digit(3)];
            let k = |i: usize| {
                let base = _mm512_set1_epi8(if i == 3 { 64 } else { 0 });
                _mm512_sub_epi8(base, _mm512_slli_epi16(e[i].1, 5))
            };
            let ks: [__m512i; 4] = [k(0), k(1), k(2), k(3)];
            macro_rules! quads {
                ($m:literal) => {
                    for q in 4 * s..4 * s + 4 {
                        let w = q6_k_quad::<$m>(p, b, q);
                        for i in 0..4 {
                            let mut v = _mm512_add_epi8(_mm512_mullo_epi16(w, e[i].0), ks[i]);
                            if i == 3 {
                                v = _mm512_sub_epi8(v, _mm512_add_epi8(w, w));
                            }
                            _mm512_store_si512(out.add(64 * i + q) as *mut __m512i, v);
                        }
                    }
                };
            }
            match s / 4 {
                0 => quads!(0),
                1 => quads!(1),
                2 => quads!(2),
                _ => quads!(3),
            }
        }
    }
}
