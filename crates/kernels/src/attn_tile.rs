//! The two small products of tiled attention, over a tile of `TILE` key positions:
//! scores `S = Q · Kᵀ` with the keys stored transposed (`kt[d][j]`, so the tile's keys
//! sit in SIMD lanes and no horizontal sums are needed), and `Acc += P · V`. Keys and
//! values are read where the cache holds them, f32 or f16 ([`KvRows`]): f16 is widened
//! in registers, which is exact, so an f16 tile gives bit for bit what its widened copy
//! would. A portable reference and AVX2+FMA / AVX-512 versions behind the one dispatch
//! point; they agree within f32 rounding (the order of the additions over `d` is the
//! same, FMA vs mul+add aside).
//!
//! Each product can be told where the next tile lies ([`Next`]): the SIMD versions then
//! ask for it a line at a time, spread over their loops, so the cache streams in from
//! memory while the FMAs run. A decode step reads its cache once, from DRAM; without
//! this the loads waited on each 4 KiB page's misses before the hardware prefetcher
//! caught up (Zen 5, Gemma's global layer at 4096 positions, one thread: 0.59 → 0.37 ms).

use half::f16;

/// Key positions per tile.
pub const TILE: usize = 16;

/// Keys or values as a cache page holds them.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KvRows<'_> {
    fn len(&self) -> usize {
        match self {
            KvRows::F32(x) => x.len(),
            KvRows::F16(x) => x.len(),
        }
    }
}

/// Where the next tile's keys or values start (laid out as this tile's), for the
/// products to prefetch. Only an address: nothing is read through it, and a prefetch
/// cannot fault, so a stale or absent one costs nothing but the prefetches.
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, reason = "only the x86 tile products prefetch")
)]
pub struct Next(usize);

#[cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, reason = "only the x86 tile products prefetch")
)]
impl Next {
    pub const NONE: Next = Next(0);

    pub fn of(rows: KvRows<'_>) -> Next {
        Next(match rows {
            KvRows::F32(x) => x.as_ptr() as usize,
            KvRows::F16(x) => x.as_ptr() as usize,
        })
    }

    /// The same tile from its element `e` of `E` on (none stays none).
    fn skip<E>(self, e: usize) -> Next {
        if self.0 == 0 {
            self
        } else {
            Next(self.0.wrapping_add(e * size_of::<E>()))
        }
    }

    /// Asks for the line holding byte `at` of the next tile (into L1).
    #[inline(always)]
    fn fetch(self, at: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.0 != 0 {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            // SAFETY: `prefetcht0` reads nothing architecturally and cannot fault,
            // whatever the address; SSE is part of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.0.wrapping_add(at) as *const i8) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (self, at);
    }

    /// Asks for the lines of `n` elements of `E` from element `at`.
    #[inline(always)]
    fn fetch_elems<E>(self, at: usize, n: usize) {
        let (b, e) = (at * size_of::<E>(), (at + n) * size_of::<E>());
        for x in (b..e).step_by(64) {
            self.fetch(x);
        }
    }
}

/// `s[r][j] = Σ_d q[r][d] · kt[d][j]` for `r < rows`, `j < TILE`; `q` is `rows × hk`,
/// `kt` is `hk × TILE`, `s` is `rows × TILE`; `next`: the next key tile's.
pub fn scores_tile(q: &[f32], rows: usize, hk: usize, kt: KvRows<'_>, next: Next, s: &mut [f32]) {
    let ok = q.len() >= rows * hk && kt.len() >= hk * TILE && s.len() >= rows * TILE;
    if !ok {
        debug_assert!(false, "scores_tile: shapes do not match");
        return;
    }
    match kt {
        KvRows::F32(kt) => scores_dispatch(q, (rows, hk), kt, next, s),
        KvRows::F16(kt) => scores_dispatch(q, (rows, hk), kt, next, s),
    }
}

fn scores_dispatch<E: Elem>(
    q: &[f32],
    (rows, hk): (usize, usize),
    kt: &[E],
    next: Next,
    s: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match simd() {
        // SAFETY: `scores_tile` checked the lengths; the dispatch reports Avx512Vnni only
        // when the CPU has avx512f (and AVX2+FMA+F16C), Avx2 only with AVX2+FMA+F16C.
        Some(true) => return unsafe { avx512::scores(q, rows, hk, kt, next, s) },
        Some(false) => return unsafe { avx2::scores(q, rows, hk, kt, next, s) },
        None => {}
    }
    let _ = next;
    scores_portable(q, rows, hk, kt, s)
}

/// `acc[r][c] += Σ_j p[r][j] · v[j][c]` for `r < rows`, `c < hv`; `p` is `rows × TILE`,
/// `v` is `TILE` rows of `hv` values, `vs` apart (`vs >= hv`: a cache page's rows are
/// read where they lie), `acc` is `rows × hv`; `next`: the next value tile's (`vs`
/// apart too).
pub fn pv_tile(
    p: &[f32],
    rows: usize,
    (v, vs): (KvRows<'_>, usize),
    hv: usize,
    next: Next,
    acc: &mut [f32],
) {
    let ok = p.len() >= rows * TILE
        && vs >= hv
        && v.len() >= (TILE - 1) * vs + hv
        && acc.len() >= rows * hv;
    if !ok {
        debug_assert!(false, "pv_tile: shapes do not match");
        return;
    }
    match v {
        KvRows::F32(v) => pv_dispatch(p, rows, (v, vs), hv, next, acc),
        KvRows::F16(v) => pv_dispatch(p, rows, (v, vs), hv, next, acc),
    }
}

fn pv_dispatch<E: Elem>(
    p: &[f32],
    rows: usize,
    (v, vs): (&[E], usize),
    hv: usize,
    next: Next,
    acc: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match simd() {
        // SAFETY: as in `scores_dispatch` (`pv_tile` checked the lengths).
        Some(true) => return unsafe { avx512::pv(p, rows, (v, vs), hv, next, acc) },
        Some(false) => return unsafe { avx2::pv(p, rows, (v, vs), hv, next, acc) },
        None => {}
    }
    let _ = next;
    pv_portable(p, rows, v, vs, hv, acc)
}

/// A cache element the tile products read: its value as f32 and, on x86, 8 or 16 of
/// them widened into a vector (only inlined into functions that enable the features).
trait Elem: Copy {
    fn f32(self) -> f32;
    /// # Safety
    /// 8 elements readable from `p`; the caller enables AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// # Safety
    /// 16 elements readable from `p`; the caller enables AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl Elem for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's (8 halves are 16 bytes).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's (16 halves are 32 bytes).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
}

fn scores_portable<E: Elem>(q: &[f32], rows: usize, hk: usize, kt: &[E], s: &mut [f32]) {
    for r in 0..rows {
        let mut acc = [0f32; TILE];
        for d in 0..hk {
            let qd = q[r * hk + d];
            for (a, k) in acc.iter_mut().zip(&kt[d * TILE..(d + 1) * TILE]) {
                *a += qd * k.f32();
            }
        }
        s[r * TILE..(r + 1) * TILE].copy_from_slice(&acc);
    }
}

fn pv_portable<E: Elem>(p: &[f32], rows: usize, v: &[E], vs: usize, hv: usize, acc: &mut [f32]) {
    for r in 0..rows {
        pv_cols(
            &p[r * TILE..(r + 1) * TILE],
            v,
            vs,
            &mut acc[r * hv..(r + 1) * hv],
            0,
        );
    }
}

/// One row of `pv_tile` for columns `c0..acc_row.len()`: each column sums its TILE
/// products in order (the SIMD versions' tails, and the whole portable version).
fn pv_cols<E: Elem>(p_row: &[f32], v: &[E], vs: usize, acc_row: &mut [f32], c0: usize) {
    for c in c0..acc_row.len() {
        let mut x = acc_row[c];
        for (j, w) in p_row.iter().enumerate().take(TILE) {
            x += w * v[j * vs + c].f32();
        }
        acc_row[c] = x;
    }
}

/// `Some(true)` for AVX-512, `Some(false)` for AVX2, `None` for portable.
#[cfg(target_arch = "x86_64")]
fn simd() -> Option<bool> {
    use crate::dispatch::{avx2_active, avx512_active};
    avx2_active().then(avx512_active)
}

/// `s[i] = exp(s[i] − max)` for `i < n` (0 where `s[i]` is −∞) and `s[i] = 0` past
/// `n` up to `TILE`; returns the sum of the first `n`. The exponential is a SIMD
/// polynomial (within 2 ulp of `expf`) where the CPU has AVX2.
pub fn exp_tile(s: &mut [f32; TILE], n: usize, max: f32) -> f32 {
    let n = n.min(TILE);
    #[cfg(target_arch = "x86_64")]
    if simd().is_some() {
        // SAFETY: AVX2+FMA reported by the dispatch.
        return unsafe { avx2::exp_tile(s, n, max) };
    }
    let mut sum = 0f32;
    for (i, v) in s.iter_mut().enumerate() {
        *v = if i < n { (*v - max).exp() } else { 0.0 };
        sum += *v;
    }
    sum
}

/// One score row's online-softmax step over a tile: scales the visible positions
/// `visible` (and soft-caps them: `c · tanh(s / c)`), raises the running max `m` to the
/// tile's, and writes the weights `exp(s − m)` (0 outside `visible`); `l` becomes the
/// running sum at the new max. Returns the factor `exp(m_old − m_new)` by which the
/// row's accumulator must be multiplied (1 when the max did not grow).
pub fn softmax_row(
    s: &mut [f32; TILE],
    visible: std::ops::Range<usize>,
    scale: f32,
    softcap: Option<f32>,
    m: &mut f32,
    l: &mut f32,
) -> f32 {
    let (a, b) = (visible.start.min(TILE), visible.end.min(TILE));
    if a >= b {
        s.fill(0.0);
        return 1.0;
    }
    #[cfg(target_arch = "x86_64")]
    if softcap.is_none() {
        match simd() {
            // SAFETY: the dispatch reports AVX-512 only when the CPU has avx512f
            // (+AVX2/FMA), AVX2 only with AVX2+FMA.
            Some(true) => return unsafe { avx512::softmax_row(s, a, b, scale, m, l) },
            Some(false) => return unsafe { avx2::softmax_row(s, a, b, scale, m, l) },
            None => {}
        }
    }
    let mut mt = f32::NEG_INFINITY;
    s[..a].fill(f32::NEG_INFINITY);
    for v in &mut s[a..b] {
        *v *= scale;
        if let Some(c) = softcap {
            *v = crate::math::tanh(*v / c) * c;
        }
        mt = mt.max(*v);
    }
    let c = grow_max(m, l, mt);
    *l += exp_tile(s, b, *m);
    c
}

/// Raises the running max `m` to `mt` (if larger), rescaling the running sum `l`;
/// returns the rescale factor.
fn grow_max(m: &mut f32, l: &mut f32, mt: f32) -> f32 {
    if mt <= *m {
        return 1.0;
    }
    let c = if *m == f32::NEG_INFINITY {
        1.0
    } else {
        (*m - mt).exp()
    };
    *l *= c;
    *m = mt;
    c
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Elem, Next, TILE};
    use crate::vecf32::avx2::exp8;
    use crate::x86::avx2::{hmax_f32, hsum_f32};
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 + FMA + F16C; shapes as `scores_tile` checks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores<E: Elem>(
        q: &[f32],
        rows: usize,
        hk: usize,
        kt: &[E],
        next: Next,
        s: &mut [f32],
    ) {
        let (qp, kp, sp) = (q.as_ptr(), kt.as_ptr(), s.as_mut_ptr());
        let mut r = 0;
        // SAFETY: row r + i < rows, d < hk, 16 lanes per kt row: all inside the checked
        // lengths.
        unsafe {
            while r + 4 <= rows {
                let mut acc = [[_mm256_setzero_ps(); 2]; 4];
                for d in 0..hk {
                    if r == 0 {
                        next.fetch_elems::<E>(d * TILE, TILE);
                    }
                    let k0 = E::load8(kp.add(d * TILE));
                    let k1 = E::load8(kp.add(d * TILE + 8));
                    for (i, a) in acc.iter_mut().enumerate() {
                        let qb = _mm256_set1_ps(*qp.add((r + i) * hk + d));
                        a[0] = _mm256_fmadd_ps(qb, k0, a[0]);
                        a[1] = _mm256_fmadd_ps(qb, k1, a[1]);
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(sp.add((r + i) * TILE), a[0]);
                    _mm256_storeu_ps(sp.add((r + i) * TILE + 8), a[1]);
                }
                r += 4;
            }
            while r < rows {
                let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for d in 0..hk {
                    if r == 0 {
                        next.fetch_elems::<E>(d * TILE, TILE);
                    }
                    let qb = _mm256_set1_ps(*qp.add(r * hk + d));
                    a0 = _mm256_fmadd_ps(qb, E::load8(kp.add(d * TILE)), a0);
                    a1 = _mm256_fmadd_ps(qb, E::load8(kp.add(d * TILE + 8)), a1);
                }
                _mm256_storeu_ps(sp.add(r * TILE), a0);
                _mm256_storeu_ps(sp.add(r * TILE + 8), a1);
                r += 1;
            }
        }
    }

    /// `super::softmax_row` without soft-cap, for `a < b <= TILE`: two 8-lane halves,
    /// the invisible lanes masked to −∞ for the max and to 0 after the exponential.
    ///
    /// # Safety
    /// AVX2 + FMA + F16C (every x86 set has all three).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn softmax_row(
        s: &mut [f32; TILE],
        a: usize,
        b: usize,
        scale: f32,
        m: &mut f32,
        l: &mut f32,
    ) -> f32 {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let (lo, hi) = (_mm256_set1_epi32(a as i32 - 1), _mm256_set1_epi32(b as i32));
        let p = s.as_mut_ptr();
        let mut v = [_mm256_setzero_ps(); 2];
        let mut vis = [_mm256_setzero_ps(); 2];
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        for h in 0..2 {
            let idx = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * h as i32));
            // a <= idx < b
            let mask = _mm256_and_si256(_mm256_cmpgt_epi32(idx, lo), _mm256_cmpgt_epi32(hi, idx));
            vis[h] = _mm256_castsi256_ps(mask);
            // SAFETY: two 8-lane halves of the 16-float array.
            v[h] = _mm256_mul_ps(
                unsafe { _mm256_loadu_ps(p.add(8 * h)) },
                _mm256_set1_ps(scale),
            );
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(mx, v[h], vis[h]));
        }
        let c = super::grow_max(m, l, hmax_f32(mx));
        let mv = _mm256_set1_ps(*m);
        let mut sum = _mm256_setzero_ps();
        for h in 0..2 {
            let e = _mm256_and_ps(vis[h], exp8(_mm256_sub_ps(v[h], mv)));
            sum = _mm256_add_ps(sum, e);
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(p.add(8 * h), e) };
        }
        // SAFETY: the features this function has.
        *l += unsafe { hsum_f32(sum) };
        c
    }

    /// # Safety
    /// AVX2 + FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_tile(s: &mut [f32; TILE], n: usize, max: f32) -> f32 {
        let m = _mm256_set1_ps(max);
        let p = s.as_mut_ptr();
        let mut sum = 0f32;
        // SAFETY: two 8-lane halves of the 16-float array.
        unsafe {
            for h in 0..2 {
                let v = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(8 * h)), m));
                _mm256_storeu_ps(p.add(8 * h), v);
            }
        }
        for v in &mut s[n..] {
            *v = 0.0;
        }
        for v in &s[..n] {
            sum += *v;
        }
        sum
    }

    /// # Safety
    /// AVX2 + FMA + F16C; shapes as `pv_tile` checks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn pv<E: Elem>(
        p: &[f32],
        rows: usize,
        (v, vs): (&[E], usize),
        hv: usize,
        next: Next,
        acc: &mut [f32],
    ) {
        let (pp, vp, ap) = (p.as_ptr(), v.as_ptr(), acc.as_mut_ptr());
        // SAFETY: r < rows, j < TILE, c + 8 <= hv (scalar tail below): inside the
        // checked lengths.
        unsafe {
            for r in 0..rows {
                let a_row = ap.add(r * hv);
                let mut c0 = 0;
                while c0 + 64 <= hv {
                    let mut a = [_mm256_setzero_ps(); 8];
                    for (u, x) in a.iter_mut().enumerate() {
                        *x = _mm256_loadu_ps(a_row.add(c0 + 8 * u));
                    }
                    for j in 0..TILE {
                        if r == 0 {
                            next.fetch_elems::<E>(j * vs + c0, 64);
                        }
                        let w = _mm256_set1_ps(*pp.add(r * TILE + j));
                        let vr = vp.add(j * vs + c0);
                        for (u, x) in a.iter_mut().enumerate() {
                            *x = _mm256_fmadd_ps(w, E::load8(vr.add(8 * u)), *x);
                        }
                    }
                    for (u, x) in a.iter().enumerate() {
                        _mm256_storeu_ps(a_row.add(c0 + 8 * u), *x);
                    }
                    c0 += 64;
                }
                while c0 + 8 <= hv {
                    let mut x = _mm256_loadu_ps(a_row.add(c0));
                    for j in 0..TILE {
                        if r == 0 {
                            next.fetch_elems::<E>(j * vs + c0, 8);
                        }
                        let w = _mm256_set1_ps(*pp.add(r * TILE + j));
                        x = _mm256_fmadd_ps(w, E::load8(vp.add(j * vs + c0)), x);
                    }
                    _mm256_storeu_ps(a_row.add(c0), x);
                    c0 += 8;
                }
                let row = &mut *std::ptr::slice_from_raw_parts_mut(a_row, hv);
                super::pv_cols(&p[r * TILE..(r + 1) * TILE], v, vs, row, c0);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Elem, Next, TILE};
    use std::arch::x86_64::*;

    /// `exp(x)` for 16 lanes: `vecf32::avx2::exp8`'s steps at 512 bits (the same
    /// value per lane).
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    fn exp16(x: __m512) -> __m512 {
        let lo = _mm512_set1_ps(-87.336_54);
        let under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
        let x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.376_26));
        let k = _mm512_roundscale_ps(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm512_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
        }
        let r2 = _mm512_mul_ps(r, r);
        let y = _mm512_add_ps(_mm512_fmadd_ps(y, r2, r), _mm512_set1_ps(1.0));
        let pow2 = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)),
            23,
        ));
        _mm512_maskz_mov_ps(!under, _mm512_mul_ps(y, pow2))
    }

    /// `super::softmax_row` without soft-cap, for `a < b <= TILE`: one vector.
    ///
    /// # Safety
    /// AVX-512F (+ AVX2, FMA).
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn softmax_row(
        s: &mut [f32; TILE],
        a: usize,
        b: usize,
        scale: f32,
        m: &mut f32,
        l: &mut f32,
    ) -> f32 {
        let visible = (((1u32 << b) - 1) & !((1u32 << a) - 1)) as __mmask16;
        // SAFETY: `s` holds TILE = 16 floats.
        let v = _mm512_mul_ps(
            unsafe { _mm512_loadu_ps(s.as_ptr()) },
            _mm512_set1_ps(scale),
        );
        let c = super::grow_max(m, l, _mm512_mask_reduce_max_ps(visible, v));
        let p = _mm512_maskz_mov_ps(visible, exp16(_mm512_sub_ps(v, _mm512_set1_ps(*m))));
        *l += _mm512_reduce_add_ps(p);
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(s.as_mut_ptr(), p) };
        c
    }

    /// # Safety
    /// AVX-512F (+ AVX2, FMA, F16C); shapes as `scores_tile` checks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn scores<E: Elem>(
        q: &[f32],
        rows: usize,
        hk: usize,
        kt: &[E],
        mut next: Next,
        s: &mut [f32],
    ) {
        let (qp, kp, sp) = (q.as_ptr(), kt.as_ptr(), s.as_mut_ptr());
        let mut r = 0;
        // SAFETY: rows r..r + R < rows, d < hk, one 16-lane kt row per d: inside the
        // checked lengths. Only the first block asks for the next tile.
        unsafe {
            while r + 8 <= rows {
                scores_rows::<E, 8>(qp.add(r * hk), (kp, hk), sp.add(r * TILE), next);
                (r, next) = (r + 8, Next::NONE);
            }
            // A GQA group of four (decode): four FMA chains, not one at a time.
            while r + 4 <= rows {
                scores_rows::<E, 4>(qp.add(r * hk), (kp, hk), sp.add(r * TILE), next);
                (r, next) = (r + 4, Next::NONE);
            }
            while r < rows {
                scores_rows::<E, 1>(qp.add(r * hk), (kp, hk), sp.add(r * TILE), next);
                (r, next) = (r + 1, Next::NONE);
            }
        }
    }

    /// `scores` for R rows from `q` (each `hk` long) into R score rows at `s`: one
    /// accumulator per row, the sum over `d` in order.
    ///
    /// # Safety
    /// AVX-512F; R rows of `hk` at `q`, `hk` rows of TILE at `kt`, R rows of TILE at `s`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    #[inline]
    unsafe fn scores_rows<E: Elem, const R: usize>(
        q: *const f32,
        (kt, hk): (*const E, usize),
        s: *mut f32,
        next: Next,
    ) {
        // SAFETY: the caller's.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); R];
            for d in 0..hk {
                next.fetch_elems::<E>(d * TILE, TILE);
                let k = E::load16(kt.add(d * TILE));
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(i * hk + d)), k, *a);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(s.add(i * TILE), *a);
            }
        }
    }

    /// `acc_i[0..16U] += Σ_j p_i[j] · v[j][0..16U]` for R rows (`p_i = p + i·TILE`,
    /// `acc_i = acc + i·hv`): R·U accumulators, so the FMA chains are many enough to
    /// hide the latency (one row of a 64-wide head has only four); a weight that is zero
    /// in every row is skipped.
    ///
    /// # Safety
    /// AVX-512F; R rows of TILE weights at `p`, TILE rows `vs` apart at `v` with 16U
    /// columns from each, R rows of 16U floats at `acc` (stride `hv`).
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    #[inline]
    unsafe fn pv_block<E: Elem, const R: usize, const U: usize>(
        p: *const f32,
        (v, next): (*const E, Next),
        (vs, hv): (usize, usize),
        acc: *mut f32,
    ) {
        // SAFETY: the caller's.
        unsafe {
            let mut a = [[_mm512_setzero_ps(); U]; R];
            for (i, row) in a.iter_mut().enumerate() {
                for (u, x) in row.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(acc.add(i * hv + 16 * u));
                }
            }
            for j in 0..TILE {
                next.fetch_elems::<E>(j * vs, 16 * U);
                if (0..R).all(|i| *p.add(i * TILE + j) == 0.0) {
                    continue;
                }
                let vr = v.add(j * vs);
                for (i, row) in a.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*p.add(i * TILE + j));
                    for (u, x) in row.iter_mut().enumerate() {
                        *x = _mm512_fmadd_ps(w, E::load16(vr.add(16 * u)), *x);
                    }
                }
            }
            for (i, row) in a.iter().enumerate() {
                for (u, x) in row.iter().enumerate() {
                    _mm512_storeu_ps(acc.add(i * hv + 16 * u), *x);
                }
            }
        }
    }

    /// # Safety
    /// AVX-512F (+ AVX2, FMA, F16C); shapes as `pv_tile` checks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn pv<E: Elem>(
        p: &[f32],
        rows: usize,
        (v, vs): (&[E], usize),
        hv: usize,
        next: Next,
        acc: &mut [f32],
    ) {
        let (pp, vp, ap) = (p.as_ptr(), v.as_ptr(), acc.as_mut_ptr());
        // The first rows' pass asks for the next tile, column block by block.
        let ahead = |r: usize, c0: usize| {
            if r == 0 {
                next.skip::<E>(c0)
            } else {
                Next::NONE
            }
        };
        // SAFETY: r < rows, j < TILE, c + 16 <= hv (scalar tail below): inside the
        // checked lengths.
        unsafe {
            // 64-wide heads: two rows per pass (eight accumulators).
            let mut r0 = 0;
            if hv == 64 {
                while r0 + 2 <= rows {
                    let src = (vp, ahead(r0, 0));
                    pv_block::<E, 2, 4>(pp.add(r0 * TILE), src, (vs, hv), ap.add(r0 * hv));
                    r0 += 2;
                }
            }
            for r in r0..rows {
                let a_row = ap.add(r * hv);
                let mut c0 = 0;
                // Whole 128- then 64-column blocks: each weight broadcast once per block.
                while c0 + 128 <= hv {
                    let src = (vp.add(c0), ahead(r, c0));
                    pv_block::<E, 1, 8>(pp.add(r * TILE), src, (vs, hv), a_row.add(c0));
                    c0 += 128;
                }
                while c0 + 64 <= hv {
                    let src = (vp.add(c0), ahead(r, c0));
                    pv_block::<E, 1, 4>(pp.add(r * TILE), src, (vs, hv), a_row.add(c0));
                    c0 += 64;
                }
                while c0 + 16 <= hv {
                    let mut x = _mm512_loadu_ps(a_row.add(c0));
                    for j in 0..TILE {
                        ahead(r, c0).fetch_elems::<E>(j * vs, 16);
                        let w = _mm512_set1_ps(*pp.add(r * TILE + j));
                        x = _mm512_fmadd_ps(w, E::load16(vp.add(j * vs + c0)), x);
                    }
                    _mm512_storeu_ps(a_row.add(c0), x);
                    c0 += 16;
                }
                let row = &mut *std::ptr::slice_from_raw_parts_mut(a_row, hv);
                super::pv_cols(&p[r * TILE..(r + 1) * TILE], v, vs, row, c0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn simd_tiles_match_portable() {
        let mut s = 11u32;
        let mut next = || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for (rows, hk, hv) in [
            (1, 64, 64),
            (5, 64, 64),
            (5, 256, 256),
            (9, 80, 72),
            (3, 7, 13),
        ] {
            let q: Vec<f32> = (0..rows * hk).map(|_| next()).collect();
            let kt: Vec<f32> = (0..hk * TILE).map(|_| next()).collect();
            let scores = |kt: KvRows<'_>, next: Next| {
                let mut s = vec![0f32; rows * TILE];
                scores_tile(&q, rows, hk, kt, next, &mut s);
                s
            };
            // The next tile's address (here a copy) only moves prefetches.
            let ahead = kt.clone();
            let s1 = scores(KvRows::F32(&kt), Next::of(KvRows::F32(&ahead)));
            let mut s2 = vec![0f32; rows * TILE];
            scores_portable(&q, rows, hk, &kt, &mut s2);
            for (a, b) in s1.iter().zip(&s2) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "scores {rows}x{hk}: {a} vs {b}"
                );
            }
            // An f16 tile gives bit for bit what its widened copy gives.
            let kt16: Vec<f16> = kt.iter().map(|&x| f16::from_f32(x)).collect();
            let kt16w: Vec<f32> = kt16.iter().map(|x| x.to_f32()).collect();
            let h1 = scores(KvRows::F16(&kt16), Next::of(KvRows::F16(&kt16)));
            let h2 = scores(KvRows::F32(&kt16w), Next::NONE);
            assert_eq!(bits(&h1), bits(&h2), "f16 scores {rows}x{hk}");
            assert_ne!(bits(&h1), bits(&s1), "the f16 tile is rounded");
            // Masked positions (zero weights), in some rows only and in all rows.
            let p: Vec<f32> = (0..rows * TILE)
                .map(|i| {
                    if i % 5 == 0 || i % TILE == 3 {
                        0.0
                    } else {
                        next()
                    }
                })
                .collect();
            // Values packed (`vs == hv`) and as rows of a wider cache page, whose other
            // columns must not be read into the result.
            for vs in [hv, hv + 24] {
                let v: Vec<f32> = (0..(TILE - 1) * vs + hv).map(|_| next()).collect();
                let init: Vec<f32> = (0..rows * hv).map(|_| next()).collect();
                let (mut a1, mut a2) = (init.clone(), init.clone());
                let ahead = Next::of(KvRows::F32(&v[1..]));
                pv_tile(&p, rows, (KvRows::F32(&v), vs), hv, ahead, &mut a1);
                pv_portable(&p, rows, &v, vs, hv, &mut a2);
                let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                let v16w: Vec<f32> = v16.iter().map(|x| x.to_f32()).collect();
                let (mut h1, mut h2) = (init.clone(), init.clone());
                let ahead = Next::of(KvRows::F16(&v16));
                pv_tile(&p, rows, (KvRows::F16(&v16), vs), hv, ahead, &mut h1);
                pv_tile(&p, rows, (KvRows::F32(&v16w), vs), hv, Next::NONE, &mut h2);
                assert_eq!(bits(&h1), bits(&h2), "f16 pv {rows}x{hv} (rows {vs} apart)");
                for (c, (a, b)) in a1.iter().zip(&a2).enumerate() {
                    let (r, c) = (c / hv, c % hv);
                    let plain: f32 = init[r * hv + c]
                        + (0..TILE)
                            .map(|j| p[r * TILE + j] * v[j * vs + c])
                            .sum::<f32>();
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs())
                            && (b - plain).abs() <= 1e-5 * (1.0 + plain.abs()),
                        "pv {rows}x{hv} (rows {vs} apart) at {r},{c}: {a} vs {b} vs {plain}"
                    );
                }
            }
        }
    }

    #[test]
    fn exp_tile_is_within_a_few_ulp_of_expf() {
        for max in [0.0f32, 3.5, -20.0] {
            for n in [0usize, 1, 7, 16] {
                let mut s = [0f32; TILE];
                for (i, v) in s.iter_mut().enumerate() {
                    *v = -30.0 + 2.3 * i as f32 + max;
                }
                s[0] = f32::NEG_INFINITY;
                let orig = s;
                let sum = exp_tile(&mut s, n, max);
                let mut want_sum = 0f32;
                for i in 0..TILE {
                    let want = if i < n { (orig[i] - max).exp() } else { 0.0 };
                    want_sum += want;
                    assert!(
                        (s[i] - want).abs() <= 4.0 * f32::EPSILON * want,
                        "exp {i}: {} vs {want}",
                        s[i]
                    );
                }
                assert!((sum - want_sum).abs() <= 1e-5 * (1.0 + want_sum));
            }
        }
    }

    #[test]
    fn softmax_row_steps_match_plain_softmax() {
        let mut seed = 5u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 8.0 - 4.0
        };
        for softcap in [None, Some(3.0)] {
            for (a, b) in [(0, 16), (3, 11), (0, 1), (15, 16), (5, 5)] {
                // Two tiles in turn: the second row's max may or may not grow.
                let rows: Vec<[f32; TILE]> =
                    (0..2).map(|_| std::array::from_fn(|_| next())).collect();
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                let mut weights = Vec::new();
                let mut factors = Vec::new();
                for row in &rows {
                    let mut s = *row;
                    factors.push(softmax_row(&mut s, a..b, 0.5, softcap, &mut m, &mut l));
                    weights.push(s);
                }
                // Reference: every visible value over both tiles, in f64.
                let f = |v: f32| {
                    let x = f64::from(v) * 0.5;
                    softcap.map_or(x, |c| (x / f64::from(c)).tanh() * f64::from(c))
                };
                let vis: Vec<f64> = rows
                    .iter()
                    .flat_map(|r| r[a..b].iter().map(|&v| f(v)))
                    .collect();
                if vis.is_empty() {
                    assert_eq!((m, l), (f32::NEG_INFINITY, 0.0));
                    assert!(weights.iter().all(|w| w.iter().all(|&x| x == 0.0)));
                    continue;
                }
                let max = vis.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = vis.iter().map(|v| (v - max).exp()).sum();
                assert!((f64::from(m) - max).abs() < 1e-5, "max {m} vs {max}");
                assert!((f64::from(l) - sum).abs() < 1e-5 * sum, "sum {l} vs {sum}");
                // Tile 0's weights, carried to the final max by tile 1's factor.
                for (t, w) in weights.iter().enumerate() {
                    let carry = if t == 0 { f64::from(factors[1]) } else { 1.0 };
                    for j in 0..TILE {
                        let want = if (a..b).contains(&j) {
                            (f(rows[t][j]) - max).exp()
                        } else {
                            0.0
                        };
                        let got = f64::from(w[j]) * carry;
                        assert!((got - want).abs() < 1e-5, "tile {t} [{j}]: {got} vs {want}");
                    }
                }
            }
        }
    }
}
