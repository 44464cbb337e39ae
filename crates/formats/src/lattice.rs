//! The lattice tables ggml builds when a quantiser is first used (`ggml_quantize_init`:
//! `iq2xs_init_impl`, `iq3xs_init_impl`) and the nearest-neighbour search the i-quant
//! quantisers run on them.
//!
//! A grid point is a vector of small levels `l` (2 bits each for the 8-dimensional
//! IQ2 grids, 3 bits each for the 4-dimensional IQ3 grids), stored by ggml as the bytes
//! `2l + 1`. `map` takes the levels packed into an integer to the point's index, or, for
//! a packing that is not on the grid, to its list of neighbours: the grid points at the
//! `nwant` smallest squared distances, ordered by (distance, index), exactly as ggml's
//! `qsort` with `iq2_compare_func`/`iq3_compare_func` (a total order) leaves them.
//!
//! ggml's `kgrid_*` level tables are not transcribed: the levels are each dequantisation
//! grid byte's rank among the grid's distinct bytes (IQ2: 8, 25, 43; IQ3_XXS: 4..52, 62;
//! IQ3_S: 1, 3, ..., 15), which gives ggml's tables entry for entry (pinned in
//! `table_tests.rs` by checksums of ggml's `kgrid_*` arrays).
//!
//! Neighbour lists are built for every packing the quantisers can ask about (every
//! level at most `max_level`, the quantisers' clamp); for IQ2, ggml also builds lists
//! for packings with a level of 3, which no quantiser looks up.

use crate::tables::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use std::sync::OnceLock;

/// One grid's tables; `D` is the dimension (8 for IQ2, 4 for IQ3).
pub(crate) struct Lattice<const D: usize> {
    /// ggml's `kgrid_q2xs`/`kgrid_q3xs`: each point's coordinates `2l + 1`.
    grid: Vec<[i8; D]>,
    /// Bits per level in a packing.
    bits: u32,
    /// ggml's `kmap`: `>= 0` a grid index; `< 0` `-(offset + 1)` of a neighbour list in
    /// `neighbours` (its length first); `UNREACHABLE` where no list was built.
    map: Vec<i32>,
    neighbours: Vec<u16>,
}

const UNREACHABLE: i32 = i32::MIN;

impl<const D: usize> Lattice<D> {
    #[allow(clippy::needless_range_loop)]
    fn build(
        points: &[[u8; D]],
        bits: u32,
        map_size: usize,
        max_level: usize,
        nwant: usize,
    ) -> Self {
        let mut present = [false; 256];
        for p in points {
            for &b in p {
                present[b as usize] = true;
            }
        }
        let mut rank = [0u8; 256];
        let mut r = 0;
        for (v, &here) in present.iter().enumerate() {
            if here {
                rank[v] = r;
                r += 1;
            }
        }
        let grid: Vec<[i8; D]> = points
            .iter()
            .map(|p| p.map(|b| 2 * rank[b as usize] as i8 + 1))
            .collect();
        let mut map = vec![-1i32; map_size];
        for (k, p) in points.iter().enumerate() {
            let mut index = 0usize;
            for (i, &b) in p.iter().enumerate() {
                index |= (rank[b as usize] as usize) << (bits as usize * i);
            }
            map[index] = k as i32;
        }
        let mask = (1usize << bits) - 1;
        let mut neighbours = Vec::new();
        let mut d2 = vec![0i32; grid.len()];
        for i in 0..map_size {
            if map[i] >= 0 {
                continue;
            }
            let mut pos = [0i32; D];
            let mut reachable = true;
            for (k, p) in pos.iter_mut().enumerate() {
                let l = (i >> (bits as usize * k)) & mask;
                reachable &= l <= max_level;
                *p = 2 * l as i32 + 1;
            }
            if !reachable {
                map[i] = UNREACHABLE;
                continue;
            }
            for (d, g) in d2.iter_mut().zip(&grid) {
                *d = g
                    .iter()
                    .zip(&pos)
                    .map(|(&q, &p)| (q as i32 - p) * (q as i32 - p))
                    .sum();
            }
            // The points at the nwant smallest distinct distances, by (distance, index).
            let start = neighbours.len();
            neighbours.push(0u16);
            let mut last = -1;
            for _ in 0..nwant {
                let Some(t) = d2.iter().copied().filter(|&d| d > last).min() else {
                    break;
                };
                for (j, &d) in d2.iter().enumerate() {
                    if d == t {
                        neighbours.push(j as u16);
                    }
                }
                last = t;
            }
            neighbours[start] = (neighbours.len() - start - 1) as u16;
            map[i] = -(start as i32 + 1);
        }
        Lattice {
            grid,
            bits,
            map,
            neighbours,
        }
    }

    /// Packs the levels `l` (each already in `0..=max_level`) as ggml's `u`.
    pub(crate) fn pack(&self, l: &[i8]) -> usize {
        let mut u = 0usize;
        for (i, &v) in l.iter().enumerate() {
            u |= (v as usize) << (self.bits as usize * i);
        }
        u
    }

    /// The grid index of packing `u`, or `None` when it is not a grid point (ggml's
    /// "Oops: found point not on grid", also for packings outside the map).
    pub(crate) fn index_of(&self, u: usize) -> Option<usize> {
        match self.map.get(u) {
            Some(&k) if k >= 0 => Some(k as usize),
            _ => None,
        }
    }

    /// `Ok(index)` for a grid point, `Err(neighbours)` otherwise.
    pub(crate) fn lookup(&self, u: usize) -> Result<usize, &[u16]> {
        let k = self.map[u];
        if k >= 0 {
            return Ok(k as usize);
        }
        assert!(
            k != UNREACHABLE,
            "lattice packing {u} outside the quantisers' levels"
        );
        let at = (-(k + 1)) as usize;
        let n = self.neighbours[at] as usize;
        Err(&self.neighbours[at + 1..at + 1 + n])
    }

    /// The levels `(q - 1)/2` of grid point `index` into `l`.
    pub(crate) fn levels(&self, index: usize, l: &mut [i8]) {
        for (o, &q) in l.iter_mut().zip(&self.grid[index]) {
            *o = (q - 1) / 2;
        }
    }

    /// ggml's `iq2_find_best_neighbour`/`iq3_find_best_neighbour`: the neighbour with
    /// the least weighted squared error at `scale` (first on ties), its levels into
    /// `l`. `None` where ggml's `GGML_ASSERT(grid_index >= 0)` fails (every distance
    /// NaN or at least `FLT_MAX`).
    pub(crate) fn best_neighbour(
        &self,
        neighbours: &[u16],
        xval: &[f32],
        weight: &[f32],
        scale: f32,
        l: &mut [i8],
    ) -> Option<usize> {
        let mut best_d2 = f32::MAX;
        let mut best = None;
        for &j in neighbours {
            let pg = &self.grid[j as usize];
            let mut d2 = 0.0f32;
            for i in 0..D {
                let q = pg[i] as f32;
                let diff = scale * q - xval[i];
                d2 += weight[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                best = Some(j as usize);
            }
        }
        let index = best?;
        self.levels(index, l);
        Some(index)
    }
}

fn points<T: Copy, const D: usize>(table: &[T], bytes: fn(T) -> [u8; D]) -> Vec<[u8; D]> {
    table.iter().map(|&g| bytes(g)).collect()
}

/// IQ2_XXS's grid (`iq2xs_init_impl(GGML_TYPE_IQ2_XXS)`: 256 points, 2 distances).
pub(crate) fn iq2xxs() -> &'static Lattice<8> {
    static L: OnceLock<Lattice<8>> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&points(&IQ2XXS_GRID, u64::to_le_bytes), 2, 43692, 2, 2))
}

/// IQ2_XS's grid (512 points, 2 distances).
pub(crate) fn iq2xs() -> &'static Lattice<8> {
    static L: OnceLock<Lattice<8>> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&points(&IQ2XS_GRID, u64::to_le_bytes), 2, 43692, 2, 2))
}

/// IQ2_S's grid (1024 points, 1 distance).
pub(crate) fn iq2s() -> &'static Lattice<8> {
    static L: OnceLock<Lattice<8>> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&points(&IQ2S_GRID, u64::to_le_bytes), 2, 43692, 2, 1))
}

/// IQ3_XXS's grid (`iq3xs_init_impl(256)`: 2 distances).
pub(crate) fn iq3xxs() -> &'static Lattice<4> {
    static L: OnceLock<Lattice<4>> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&points(&IQ3XXS_GRID, u32::to_le_bytes), 3, 4096, 7, 2))
}

/// IQ3_S's grid (`iq3xs_init_impl(512)`: 3 distances).
pub(crate) fn iq3s() -> &'static Lattice<4> {
    static L: OnceLock<Lattice<4>> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&points(&IQ3S_GRID, u32::to_le_bytes), 3, 4096, 7, 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a 64 over each entry widened to i64, as `table_tests.rs` pins tables.
    fn fnv1a(values: impl Iterator<Item = i64>) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in values {
            for byte in v.to_le_bytes() {
                h ^= byte as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }

    /// ggml's `kgrid_*` arrays (levels packed per point) from the derived levels.
    fn kgrid<const D: usize>(lat: &Lattice<D>) -> Vec<i64> {
        (0..lat.grid.len())
            .map(|k| {
                let mut l = [0i8; D];
                lat.levels(k, &mut l);
                lat.pack(&l) as i64
            })
            .collect()
    }

    /// Checksums computed by Python from ggml-quants.c's `kgrid_2bit_256`,
    /// `kgrid_2bit_512`, `kgrid_2bit_1024`, `kgrid_256` and `kgrid_512`.
    #[test]
    fn derived_levels_are_ggmls_kgrid_tables() {
        let h = |v: Vec<i64>| fnv1a(v.into_iter());
        assert_eq!(h(kgrid(iq2xxs())), 0xf0d70c96de1d6325);
        assert_eq!(h(kgrid(iq2xs())), 0x42860f9378989813);
        assert_eq!(h(kgrid(iq2s())), 0x071d30f8f8f0fcdc);
        assert_eq!(h(kgrid(iq3xxs())), 0x3be7a9233147afa7);
        assert_eq!(h(kgrid(iq3s())), 0x7b379d11102b9c52);
    }

    #[test]
    fn every_reachable_packing_is_a_point_or_has_neighbours() {
        let lat = iq3s();
        for u in 0..4096 {
            match lat.lookup(u) {
                Ok(k) => assert_eq!(
                    lat.pack(&{
                        let mut l = [0i8; 4];
                        lat.levels(k, &mut l);
                        l
                    }),
                    u
                ),
                Err(nb) => assert!(!nb.is_empty()),
            }
        }
        let lat = iq2s();
        let mut l = [0i8; 8];
        for code in 0..6561usize {
            let mut c = code;
            for v in l.iter_mut() {
                *v = (c % 3) as i8;
                c /= 3;
            }
            if let Err(nb) = lat.lookup(lat.pack(&l)) {
                assert!(!nb.is_empty());
            }
        }
    }
}
