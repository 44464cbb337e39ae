//! AMX (tile matrix multiply, Sapphire Rapids and later) prefill kernels over the packed
//! layout. The packed layout is already what AMX's second operand wants: a line holds
//! four consecutive weights of each of 16 rows, which is a row of a "VNNI-layout" B
//! tile. One `tdpbsud`/`tdpbssd` multiplies 16 tokens' activations (an A tile read in
//! place, one token per row) by one sub-block of 16 weight rows, leaving the 16 × 16
//! integer sums in a C tile; a sub-block per instruction keeps the K-quant scales
//! outside the integer sums, as the VNNI kernels do.
//!
//! Numerics are `packed512`'s: each sub-block's integer sums are exact, are scaled in
//! f32 where every product and partial sum is an exact integer (see `packed512::k45`
//! and `packed512::q6_k` for the bounds), and the block ends are the same functions.
//! So results are bit-identical to the portable kernels.
//!
//! Tile state: the OS grants it per process (`tile_data_granted` asks Linux once); the
//! tile configuration is per thread and is loaded at the start of every call (a call
//! is 16 rows × 16–64 tokens × a whole row, so the `ldtilecfg` is noise).

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
pub(crate) const TILE: usize = 16 * ROWS;

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

/// A tile configuration (palette 1): tmm0–3 are 16 × 16 i32 C tiles; tmm4 and tmm6 are
/// A tiles of 16 tokens × `k` bytes; tmm5 and tmm7 are B tiles of `k / 4` lines.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const fn config(k: u8) -> TileConfig {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut i = 0;
    while i < 8 {
        let (rows, colsb) = match i {
            0..=3 => (16, 64),
            4 | 6 => (16, k),
            _ => (k / 4, 64),
        };
        c[16 + 2 * i] = colsb;
        c[48 + i] = rows;
        i += 1;
    }
    TileConfig(c)
}

/// Q4_K: 64 values per instruction (scales folded into the weights).
static K64: TileConfig = config(64);
/// Q6_K: one sub-block of 16 per instruction.
static K16: TileConfig = config(16);

/// Loads `cfg` into this thread's tile configuration.
///
/// # Safety
/// `tile_data_granted()`.
#[inline]
unsafe fn configure(cfg: &TileConfig) {
    // SAFETY: a valid palette-1 configuration of 64 readable bytes.
    unsafe { asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
}

/// Four stored C tiles: `[tile][token][row]`.
#[repr(C, align(64))]
struct CTiles([[[i32; 16]; ROWS]; 4]);

thread_local! {
    /// The unpacked weights of the group a call works on (B tiles, 64-byte lines).
    static UNPACKED: core::cell::RefCell<Vec<Line>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// Four sub-blocks against one A tile: C tile `i` (zeroed) += A(`a + i·k` bytes, token
/// rows `a_stride` apart) · B(`b + i·k/4` lines), then the four C tiles stored at `c`.
/// `$dp` is `tdpbsud` (signed activations × unsigned weights) or `tdpbssd`.
macro_rules! four_sub_blocks {
    ($dp:literal, $a:expr, $a_stride:expr, $k:expr, $b:expr, $c:expr) => {{
        let (a, stride, k, b): (*const u8, usize, usize, *const u8) = ($a, $a_stride, $k, $b);
        let c: *mut CTiles = $c;
        macro_rules! one {
            ($i:literal, $ta:literal, $tb:literal) => {
                asm!(
                    concat!("tilezero tmm", $i),
                    concat!("tileloadd tmm", $ta, ", [{a} + {s}*1]"),
                    concat!("tileloadd tmm", $tb, ", [{b} + {l}*1]"),
                    concat!($dp, " tmm", $i, ", tmm", $ta, ", tmm", $tb),
                    a = in(reg) a.add($i * k),
                    s = in(reg) stride,
                    b = in(reg) b.add($i * k * 16),
                    l = in(reg) 64usize,
                    options(nostack, readonly),
                )
            };
        }
        one!(0, 4, 5);
        one!(1, 6, 7);
        one!(2, 4, 5);
        one!(3, 6, 7);
        macro_rules! store {
            ($i:literal) => {
                asm!(
                    concat!("tilestored [{c} + {l}*1], tmm", $i),
                    c = in(reg) (*c).0[$i].as_mut_ptr(),
                    l = in(reg) 64usize,
                    options(nostack),
                )
            };
        }
        store!(0);
        store!(1);
        store!(2);
        store!(3);
    }};
}

/// Runs `units` steps as a two-stage pipeline: the tile unit computes step `u + 1` into
/// one buffer of C tiles while the vector units finish step `u` from the other (the
/// tile stores and the float work of one step would otherwise wait on each other).
/// `tiles(u, c)` issues step u's tile work into `c`; `finish(u, c)` consumes it.
#[inline(always)]
unsafe fn pipelined(
    units: usize,
    mut tiles: impl FnMut(usize, *mut CTiles),
    mut finish: impl FnMut(usize, &CTiles),
) {
    const DEPTH: usize = 3;
    let mut c: [core::mem::MaybeUninit<CTiles>; DEPTH] = [const { core::mem::MaybeUninit::uninit() }; DEPTH];
    let cp = c.as_mut_ptr() as *mut CTiles;
    // SAFETY: indices are taken mod DEPTH; step u's buffer is only read after its tiles were stored, and
    // written again (step u + DEPTH) only after `finish(u)` returned.
    unsafe {
        for u in 0..(DEPTH - 1).min(units) {
            tiles(u, cp.add(u % DEPTH));
        }
        for u in 0..units {
            if u + DEPTH - 1 < units {
                tiles(u + DEPTH - 1, cp.add((u + DEPTH - 1) % DEPTH));
            }
            finish(u, &*cp.add(u % DEPTH));
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

/// Zeroes the output rows of `n` tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn zero_out(p: &Tile, n: usize) {
    for t in 0..n {
        // SAFETY: token t's output row (the caller's contract).
        unsafe { _mm512_storeu_ps(p.out.add(t * p.out_stride), _mm512_setzero_ps()) };
    }
}

/// Token `t`'s sums of C tile `i`, as f32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn sums(c: &CTiles, i: usize, t: usize) -> __m512 {
    // SAFETY: a 64-byte row of `c`.
    _mm512_cvtepi32_ps(unsafe { _mm512_load_si512(c.0[i][t].as_ptr() as *const _) })
}

/// One block of Q4_K for one A tile, `tdpbsud` with K = 64: C tile `$cl` (zeroed) +=
/// Σ_c A(`a + 64c`) · B(`bl + 16c` lines) and `$ch` likewise from `bh`; both stored at
/// `c` (tiles 0 and 1).
macro_rules! q4_k_block {
    ($cl:literal, $ch:literal, $a:expr, $bl:expr, $bh:expr, $c:expr) => {{
        let (a, bl, bh): (*const u8, *const u8, *const u8) = ($a, $bl, $bh);
        let c: *mut CTiles = $c;
        asm!(
            concat!("tilezero tmm", $cl),
            concat!("tilezero tmm", $ch),
            options(nostack, nomem),
        );
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
        asm!(
            concat!("tilestored [{c0} + {l}*1], tmm", $cl),
            concat!("tilestored [{c1} + {l}*1], tmm", $ch),
            c0 = in(reg) (*c).0[0].as_mut_ptr(),
            c1 = in(reg) (*c).0[1].as_mut_ptr(),
            l = in(reg) 64usize,
            options(nostack),
        );
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
    let nb = p.nb;
    // Two slots (blocks b and b + 1) of 128 lines: the q·sl lines, then the q·sh lines;
    // each 4 windows of 16 lines (the low nibbles of line pair c for sub-block 2c, then
    // the high ones for 2c + 1).
    with_unpacked(2 * 128, |bw| {
        let slots = bw.as_mut_ptr();
        // SAFETY: tile data granted (the caller's contract); every pointer stays inside
        // the group, `bw` and the 16·tiles tokens' activation rows, prep entries and
        // output rows.
        unsafe {
            configure(&K64);
            zero_out(p, tiles * ROWS);
            // A step is one block of one A tile: blocks outer, so a block's unpacked
            // weights stay in L1 while its activation tiles stream in order. The next
            // block is unpacked a block ahead: tile loads of lines just stored wait for
            // the stores to drain.
            q4_k_unpack(p, 0, slots);
            pipelined(
                nb * tiles,
                |u, c| {
                    let (b, tt) = (u / tiles, u % tiles);
                    let slot = slots.add(128 * (b % 2));
                    if tt == 0 && b + 1 < nb {
                        q4_k_unpack(p, b + 1, slots.add(128 * ((b + 1) % 2)));
                    }
                    let a = p.tiles16.add(b * p.tiles16_block + tt * ROWS * 256);
                    let bl = slot as *const u8;
                    let bh = bl.add(64 * 64);
                    // Alternate C tiles, so a step's products need not wait for the
                    // previous step's tiles to be stored.
                    if u % 2 == 0 {
                        q4_k_block!(0, 1, a, bl, bh, c);
                    } else {
                        q4_k_block!(2, 3, a, bl, bh, c);
                    }
                },
                |u, c| {
                    let (b, tt) = (u / tiles, u % tiles);
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
    })
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

/// Q6_K against Q8_K, `tiles` A tiles of 16 tokens: the weights unpacked to signed
/// `q − 32` (`tdpbssd`), one sub-block of 16 per instruction; scale products summed in
/// pairs in f32 and the pairs as integers, as `packed512::q6_k`. A step is a quarter
/// block (four sub-blocks) of one A tile.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k(p: &Tile, tiles: usize) {
    let (sc_sec, d_sec) = (p.sec[2], p.sec[3]);
    let m32 = _mm512_set1_epi8(32);
    let nb = p.nb;
    // Two slots (blocks b and b + 1) of 64 lines; line q holds quad q (sub-block s is
    // lines 4s..4s+4).
    with_unpacked(2 * 64, |bw| {
        let slots = bw.as_mut_ptr();
        // SAFETY: as in `q4_k`.
        unsafe {
            configure(&K16);
            zero_out(p, tiles * ROWS);
            let step = |u: usize| (u / (4 * tiles), (u / 4) % tiles, u % 4);
            let mut sumi = [_mm512_setzero_si512(); ROWS];
            pipelined(
                4 * nb * tiles,
                |u, c| {
                    let (b, tt, quarter) = step(u);
                    let slot = slots.add(64 * (b % 2));
                    if tt == 0 && quarter == 0 {
                        macro_rules! unpack_quarter {
                            ($m:literal) => {
                                for q in 16 * $m..16 * $m + 16 {
                                    let w = _mm512_sub_epi8(q6_k_quad::<$m>(p, b, q), m32);
                                    _mm512_store_si512(slot.add(q) as *mut __m512i, w);
                                }
                            };
                        }
                        unpack_quarter!(0);
                        unpack_quarter!(1);
                        unpack_quarter!(2);
                        unpack_quarter!(3);
                    }
                    let a = p.tiles16.add(b * p.tiles16_block + tt * ROWS * 256 + 64 * quarter);
                    let bq = (slot as *const u8).add(16 * quarter * 64);
                    four_sub_blocks!("tdpbssd", a, 256, 16, bq, c);
                },
                |u, c| {
                    let (b, tt, quarter) = step(u);
                    let sc: [__m512; 4] = core::array::from_fn(|i| {
                        let at = sc_sec + b * 256 + (4 * quarter + i) * 16;
                        _mm512_cvtepi32_ps(bytes16::<true>(p.w.add(at)))
                    });
                    for (t, sm) in sumi.iter_mut().enumerate() {
                        let p0 =
                            _mm512_fmadd_ps(sc[1], sums(c, 1, t), _mm512_mul_ps(sc[0], sums(c, 0, t)));
                        let p1 =
                            _mm512_fmadd_ps(sc[3], sums(c, 3, t), _mm512_mul_ps(sc[2], sums(c, 2, t)));
                        let pair = _mm512_add_epi32(_mm512_cvtps_epi32(p0), _mm512_cvtps_epi32(p1));
                        *sm = if quarter == 0 { pair } else { _mm512_add_epi32(*sm, pair) };
                    }
                    if quarter == 3 {
                        let d = scales16(p.w.add(d_sec + b * 32));
                        for (t, sm) in sumi.iter().enumerate() {
                            q6_k_end(p, d, b, tt * ROWS + t, *sm);
                        }
                    }
                },
            );
        }
    })
}
