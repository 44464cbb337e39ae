//! Compact storage for a vocabulary's strings. A 262k-token vocabulary as 262k
//! boxed slices costs ~48 bytes of allocator overhead per token before any text,
//! and a `HashMap<Box<[u8]>, u32>` copies every text again; here texts live in one
//! byte arena addressed by `u32` offsets, and the text -> id map holds only ids
//! (hashing and comparing through the arena).

use crate::vocab::FxHasher;
use std::hash::Hasher;
use std::ops::Index;

/// Byte strings in one arena; string `i` is `bytes[offs[i]..offs[i + 1]]`.
#[derive(Default)]
pub(crate) struct StrTable {
    bytes: Vec<u8>,
    offs: Vec<u32>,
}

impl StrTable {
    pub(crate) fn with_capacity(n: usize, n_bytes: usize) -> StrTable {
        let mut offs = Vec::with_capacity(n + 1);
        offs.push(0);
        StrTable {
            bytes: Vec::with_capacity(n_bytes),
            offs,
        }
    }

    /// Appends `s`; `None` when the arena would pass 4 GiB (u32 offsets).
    pub(crate) fn push(&mut self, s: &[u8]) -> Option<()> {
        let end = u32::try_from(self.bytes.len() + s.len()).ok()?;
        self.bytes.extend_from_slice(s);
        if self.offs.is_empty() {
            self.offs.push(0);
        }
        self.offs.push(end);
        Some(())
    }

    pub(crate) fn len(&self) -> usize {
        self.offs.len().saturating_sub(1)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.offs
            .windows(2)
            .map(|w| &self.bytes[w[0] as usize..w[1] as usize])
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.offs.shrink_to_fit();
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + 4 * self.offs.capacity()
    }
}

impl Index<usize> for StrTable {
    type Output = [u8];
    #[inline]
    fn index(&self, i: usize) -> &[u8] {
        &self.bytes[self.offs[i] as usize..self.offs[i + 1] as usize]
    }
}

#[inline]
fn hash(s: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(s);
    h.write_usize(s.len());
    h.finish()
}

const EMPTY: u32 = u32::MAX;

/// Text -> id for the strings of a [`StrTable`]: open addressing (linear probing,
/// load factor at most 1/2) over `u32` slots. A slot holds the id in its low
/// `id_bits` bits and, above them, a tag taken from the text's hash, so most
/// probes that miss never touch the arena. `id_bits` is the bit length of the
/// table's length, so no slot can equal `EMPTY`.
#[derive(Default)]
pub(crate) struct TokenIndex {
    slots: Vec<u32>,
    /// log2(slots.len())
    bits: u32,
    id_bits: u32,
}

impl TokenIndex {
    /// An empty index sized for ids below `n`.
    pub(crate) fn with_ids_below(n: usize) -> TokenIndex {
        let cap = (n.max(4) * 2).next_power_of_two();
        TokenIndex {
            slots: vec![EMPTY; cap],
            bits: cap.trailing_zeros(),
            id_bits: usize::BITS - n.leading_zeros(),
        }
    }

    #[inline]
    fn tag(&self, h: u64) -> u32 {
        if self.id_bits >= 32 {
            return 0;
        }
        // bits 8.. of the hash (the slot index uses the top bits)
        (((h >> 8) as u32) << self.id_bits) & !((1u32 << self.id_bits) - 1)
    }

    #[inline]
    fn id_mask(&self) -> u32 {
        if self.id_bits >= 32 {
            u32::MAX
        } else {
            (1u32 << self.id_bits) - 1
        }
    }

    /// Adds `id` (whose text is `strs[id]`); `Err(existing)` when a string with the
    /// same text is already indexed (the index is left unchanged).
    pub(crate) fn insert(&mut self, strs: &StrTable, id: u32) -> Result<(), u32> {
        let s = &strs[id as usize];
        let h = hash(s);
        let tag = self.tag(h);
        let mask = self.slots.len() - 1;
        let idm = self.id_mask();
        let mut i = (h >> (64 - self.bits)) as usize;
        loop {
            let v = self.slots[i];
            if v == EMPTY {
                self.slots[i] = tag | id;
                return Ok(());
            }
            if v & !idm == tag && strs[(v & idm) as usize] == *s {
                return Err(v & idm);
            }
            i = (i + 1) & mask;
        }
    }

    /// The id whose text is `s`.
    #[inline]
    pub(crate) fn get(&self, strs: &StrTable, s: &[u8]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let h = hash(s);
        let tag = self.tag(h);
        let mask = self.slots.len() - 1;
        let idm = self.id_mask();
        let mut i = (h >> (64 - self.bits)) as usize;
        loop {
            let v = self.slots[i];
            if v == EMPTY {
                return None;
            }
            if v & !idm == tag && strs[(v & idm) as usize] == *s {
                return Some(v & idm);
            }
            i = (i + 1) & mask;
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        4 * self.slots.capacity()
    }
}

/// `token_to_piece(id, special = true)` for every id, storing only the pieces that
/// differ from the token's text (a bit per id, with per-64-id ranks, finds a
/// differing piece's slot in `diff`).
#[derive(Default)]
pub(crate) struct PieceTable {
    differs: Vec<u64>,
    /// number of set bits in `differs[..w]`
    rank: Vec<u32>,
    diff: StrTable,
}

impl PieceTable {
    /// `piece(i)` for `i` in `0..tokens.len()`.
    pub(crate) fn build(tokens: &StrTable, mut piece: impl FnMut(usize) -> Vec<u8>) -> PieceTable {
        let n = tokens.len();
        let words = n.div_ceil(64);
        let mut differs = vec![0u64; words];
        let mut rank = Vec::with_capacity(words);
        // Size the arena exactly first: growing it by doubling would briefly hold twice
        // its bytes, which is what sets `llamay info`'s peak memory on a big vocabulary.
        let (mut n_diff, mut n_diff_bytes) = (0usize, 0usize);
        for i in 0..n {
            let p = piece(i);
            if p[..] != tokens[i] {
                n_diff += 1;
                n_diff_bytes += p.len();
            }
        }
        let mut diff = StrTable::with_capacity(n_diff, n_diff_bytes);
        for (w, bits) in differs.iter_mut().enumerate() {
            rank.push(diff.len() as u32);
            for i in w * 64..((w + 1) * 64).min(n) {
                let p = piece(i);
                if p[..] != tokens[i] {
                    *bits |= 1 << (i % 64);
                    // a piece is never longer than the arena the tokens fit in
                    diff.push(&p).expect("pieces fit in a u32-addressed arena");
                }
            }
        }
        diff.shrink_to_fit();
        PieceTable {
            differs,
            rank,
            diff,
        }
    }

    #[inline]
    pub(crate) fn get<'a>(&'a self, tokens: &'a StrTable, id: usize) -> &'a [u8] {
        let (w, b) = (id / 64, id % 64);
        let bits = self.differs[w];
        if bits >> b & 1 == 0 {
            return &tokens[id];
        }
        let k = self.rank[w] as usize + (bits & ((1u64 << b) - 1)).count_ones() as usize;
        &self.diff[k]
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        8 * self.differs.capacity() + 4 * self.rank.capacity() + self.diff.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(strs: &[&[u8]]) -> StrTable {
        let mut t = StrTable::with_capacity(strs.len(), 0);
        for s in strs {
            t.push(s).unwrap();
        }
        t
    }

    #[test]
    fn index_finds_every_string_and_nothing_else() {
        let owned: Vec<Vec<u8>> = (0..5000u32)
            .map(|i| format!("tok{i}").into_bytes())
            .chain([b"".to_vec(), b"a".to_vec(), b"a\0".to_vec()])
            .collect();
        let strs: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
        let t = table(&strs);
        assert_eq!(t.len(), strs.len());
        let mut ix = TokenIndex::with_ids_below(t.len());
        for i in 0..t.len() {
            ix.insert(&t, i as u32).unwrap();
        }
        for (i, s) in strs.iter().enumerate() {
            assert_eq!(&t[i], *s);
            assert_eq!(ix.get(&t, s), Some(i as u32));
        }
        assert_eq!(ix.get(&t, b"tok5000"), None);
        assert_eq!(ix.get(&t, b"a\0\0"), None);
        assert_eq!(TokenIndex::default().get(&t, b"a"), None);
    }

    #[test]
    fn index_reports_duplicates() {
        let t = table(&[b"x", b"y", b"x"]);
        let mut ix = TokenIndex::with_ids_below(3);
        ix.insert(&t, 0).unwrap();
        ix.insert(&t, 1).unwrap();
        assert_eq!(ix.insert(&t, 2), Err(0));
        assert_eq!(ix.get(&t, b"x"), Some(0));
    }

    #[test]
    fn id_bits_cover_powers_of_two() {
        // n = 2^k: the largest id is 2^k - 1, and no tag can make a slot EMPTY
        for n in [1usize, 2, 64, 256, 1 << 18] {
            let owned: Vec<Vec<u8>> = (0..n).map(|i| i.to_le_bytes().to_vec()).collect();
            let strs: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
            let t = table(&strs);
            let mut ix = TokenIndex::with_ids_below(n);
            for i in 0..n {
                ix.insert(&t, i as u32).unwrap();
            }
            for (i, s) in strs.iter().enumerate() {
                assert_eq!(ix.get(&t, s), Some(i as u32));
            }
        }
    }

    #[test]
    fn pieces_store_only_differences() {
        let t = table(&[b"a", b"\xe2\x96\x81b", b"c", b"d"]);
        let strs: Vec<Vec<u8>> = (0..130)
            .map(|i| format!("p{}", i % 7).into_bytes())
            .collect();
        let big = table(&strs.iter().map(|v| v.as_slice()).collect::<Vec<_>>());
        let p = PieceTable::build(&t, |i| {
            if i == 1 {
                b" b".to_vec()
            } else {
                t[i].to_vec()
            }
        });
        assert_eq!(p.get(&t, 0), b"a");
        assert_eq!(p.get(&t, 1), b" b");
        assert_eq!(p.get(&t, 3), b"d");
        assert_eq!(p.diff.len(), 1);
        // differences across several 64-id words
        let q = PieceTable::build(&big, |i| {
            if i % 3 == 0 {
                format!("q{i}").into_bytes()
            } else {
                big[i].to_vec()
            }
        });
        for i in 0..130 {
            let want = if i % 3 == 0 {
                format!("q{i}").into_bytes()
            } else {
                big[i].to_vec()
            };
            assert_eq!(q.get(&big, i), want.as_slice(), "id {i}");
        }
    }
}
