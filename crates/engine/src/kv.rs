//! The KV cache: one pool of fixed-size pages per context, shared by its sequences.
//!
//! A page holds the keys and values of [`PAGE`] consecutive positions of one layer. A
//! sequence is a page table per layer; pages are reference-counted, so a fork shares
//! every page of its parent and the first write to a shared page copies that page
//! alone. Sliding-window layers drop the pages their window can no longer see.
//!
//! Layout inside a page (decided once, see docs/ARCHITECTURE.md, "KV pages"):
//! - f32 / f16 keys: transposed in key tiles, `[tile][k_dim][KEY_TILE]`, the layout the
//!   score product reads (a tile's keys in SIMD lanes);
//! - int8 keys (`q8`): one row per position of ggml `q8_0` blocks along the head
//!   dimension (`[PAGE][k_dim / 32 × 34 bytes]`), as llama.cpp's `q8_0` cache holds
//!   them, so the score product is ggml's integer `q8_0 · q8_0` dot with the query
//!   quantised to `q8_0` — the same numbers llama.cpp computes;
//! - values: one row per position, `[PAGE][v_dim]`, as f32, f16 or `q8_0` blocks.

use crate::DecodeError;
use half::f16;
use llamay_formats::GgmlType;
use llamay_kernels::attn_tile::KvRows;
use std::collections::BTreeMap;

/// Positions per key tile (see the module docs).
pub(crate) const KEY_TILE: usize = llamay_kernels::attn_tile::TILE;

/// Positions per page: a multiple of the key tile and a divisor of attention's
/// segment, small enough that a sliding window of 512 holds at most one page beyond
/// what it sees.
pub const PAGE: usize = 64;

const _: () = assert!(PAGE.is_multiple_of(KEY_TILE));

/// Values per `q8_0` block, and its bytes (an f16 scale and 32 int8).
const Q8_BLOCK: usize = 32;
const Q8_BLOCK_BYTES: usize = 34;

/// How keys and values are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvPrecision {
    /// Exact: what the projections produced. The default.
    F32,
    /// Stored as f16, as llama.cpp's default cache (`-ctk f16 -ctv f16`) holds them;
    /// queries are rounded to f16 for the Q·K product too, as its f16 dot does.
    F16,
    /// Values int8 (`q8_0` blocks), keys exact: about 2/3 of f32's memory. Keys feed a
    /// dot product a softmax exponentiates, so they stay exact.
    Vq8,
    /// Keys and values int8 (`q8_0` blocks), as llama.cpp's `-ctk q8_0 -ctv q8_0`:
    /// about 27% of f32's memory.
    Q8,
    /// Keys and values rounded to one bit per value (sign × the block's mean
    /// magnitude), stored as f32: the teeth row of `llamay verify`, which must fail the
    /// bound. Not offered to users (`parse` does not accept it).
    OneBit,
}

/// How one of keys or values is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Elem {
    F32,
    F16,
    Q8,
}

impl Elem {
    fn row_bytes(self, dim: usize) -> usize {
        match self {
            Elem::F32 => dim * 4,
            Elem::F16 => dim * 2,
            Elem::Q8 => dim / Q8_BLOCK * Q8_BLOCK_BYTES,
        }
    }
}

impl KvPrecision {
    /// The precisions a user can ask for, by name.
    pub const NAMES: &'static str = "f32, f16, vq8, q8";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(KvPrecision::F32),
            "f16" => Some(KvPrecision::F16),
            "vq8" => Some(KvPrecision::Vq8),
            "q8" => Some(KvPrecision::Q8),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
            KvPrecision::Vq8 => "vq8",
            KvPrecision::Q8 => "q8",
            KvPrecision::OneBit => "1-bit",
        }
    }

    /// The matching llama.cpp cache types (`-ctk`, `-ctv`).
    pub fn llama_cpp_types(self) -> Option<(&'static str, &'static str)> {
        match self {
            KvPrecision::F32 => Some(("f32", "f32")),
            KvPrecision::F16 => Some(("f16", "f16")),
            KvPrecision::Vq8 => Some(("f32", "q8_0")),
            KvPrecision::Q8 => Some(("q8_0", "q8_0")),
            KvPrecision::OneBit => None,
        }
    }

    fn keys(self) -> Elem {
        match self {
            KvPrecision::F32 | KvPrecision::Vq8 | KvPrecision::OneBit => Elem::F32,
            KvPrecision::F16 => Elem::F16,
            KvPrecision::Q8 => Elem::Q8,
        }
    }

    fn values(self) -> Elem {
        match self {
            KvPrecision::F32 | KvPrecision::OneBit => Elem::F32,
            KvPrecision::F16 => Elem::F16,
            KvPrecision::Vq8 | KvPrecision::Q8 => Elem::Q8,
        }
    }

    /// Whether keys are int8 (the score product runs in integers).
    pub(crate) fn int8_keys(self) -> bool {
        self.keys() == Elem::Q8
    }

    /// Why this precision cannot hold heads of these sizes, if it cannot: int8 blocks
    /// run along the head dimension, 32 values each (llama.cpp refuses the same).
    pub fn unfit(self, head_dim_k: usize, head_dim_v: usize) -> Option<String> {
        let check = |what: &str, elem: Elem, dim: usize| {
            (elem == Elem::Q8 && !dim.is_multiple_of(Q8_BLOCK)).then(|| {
                format!(
                    "--kv {}: {what} heads are {dim} wide, not a multiple of the int8 block of {Q8_BLOCK}; use f32 or f16",
                    self.name()
                )
            })
        };
        check("key", self.keys(), head_dim_k).or_else(|| check("value", self.values(), head_dim_v))
    }

    /// Bytes one position of one layer takes.
    pub fn bytes_per_position(self, k_dim: usize, v_dim: usize) -> usize {
        self.keys().row_bytes(k_dim) + self.values().row_bytes(v_dim)
    }

    /// Rounds a query row as the score product against this cache's keys reads it
    /// (f16 keys: the query in f16 too; otherwise unchanged — int8 keys quantise it
    /// separately).
    pub(crate) fn round_query(self, x: &mut [f32]) {
        if self == KvPrecision::F16 {
            for v in x {
                *v = f16::from_f32(*v).to_f32();
            }
        }
    }
}

/// Rounds `x` to one bit per value: per block of 32 (or the whole row if shorter),
/// each value becomes ± the block's mean magnitude.
fn round_one_bit(x: &mut [f32]) {
    for b in x.chunks_mut(Q8_BLOCK) {
        let mean = b.iter().map(|v| v.abs()).sum::<f32>() / b.len() as f32;
        b.iter_mut()
            .for_each(|v| *v = if *v < 0.0 { -mean } else { mean });
    }
}

/// One page's keys or values.
#[derive(Clone, Debug)]
enum Buf {
    F32(Box<[f32]>),
    F16(Box<[f16]>),
    Q8(Box<[u8]>),
}

impl Buf {
    fn new(elem: Elem, dim: usize) -> Buf {
        match elem {
            Elem::F32 => Buf::F32(vec![0.0; PAGE * dim].into()),
            Elem::F16 => Buf::F16(vec![f16::ZERO; PAGE * dim].into()),
            Elem::Q8 => Buf::Q8(vec![0; PAGE * elem.row_bytes(dim)].into()),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Buf::F32(b) => bytemuck_f32(b),
            Buf::F16(b) => bytemuck_f16(b),
            Buf::Q8(b) => b,
        }
    }

    /// Overwrites the buffer from little-endian bytes of the same length.
    fn set_bytes(&mut self, src: &[u8]) {
        match self {
            Buf::F32(b) => {
                for (v, c) in b.iter_mut().zip(src.chunks_exact(4)) {
                    *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Buf::F16(b) => {
                for (v, c) in b.iter_mut().zip(src.chunks_exact(2)) {
                    *v = f16::from_le_bytes([c[0], c[1]]);
                }
            }
            Buf::Q8(b) => b.copy_from_slice(src),
        }
    }
}

fn bytemuck_f32(b: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte pattern is a valid u8; the length is
    // the slice's size in bytes and the alignment of u8 is 1.
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), std::mem::size_of_val(b)) }
}

fn bytemuck_f16(b: &[f16]) -> &[u8] {
    // SAFETY: as for `bytemuck_f32` (f16 is a plain u16).
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), std::mem::size_of_val(b)) }
}

/// The pages themselves: storage, reference counts, the free list and the budget.
#[derive(Debug)]
pub(crate) struct PageStore {
    precision: KvPrecision,
    k_dim: usize,
    v_dim: usize,
    k: Vec<Buf>,
    v: Vec<Buf>,
    /// Holders of each page (0: free).
    refs: Vec<u32>,
    /// Allocated pages with no holder, reused before new ones are allocated.
    free: Vec<u32>,
    /// Most pages the pool may allocate.
    budget: usize,
    /// Where a device holds the pages' contents: the copies made for copy on write,
    /// (from, to), for it to repeat on its own pages (`take_copies`). `None` on the CPU.
    copies: Option<Vec<(u32, u32)>>,
}

impl PageStore {
    /// An empty store that may allocate `budget` pages.
    fn new(precision: KvPrecision, k_dim: usize, v_dim: usize, budget: usize) -> PageStore {
        PageStore {
            precision,
            k_dim,
            v_dim,
            k: Vec::new(),
            v: Vec::new(),
            refs: Vec::new(),
            free: Vec::new(),
            budget,
            copies: None,
        }
    }

    fn in_use(&self) -> usize {
        self.k.len() - self.free.len()
    }

    fn available(&self) -> usize {
        self.budget - self.in_use()
    }

    /// A page for one holder; `None` when the budget is spent.
    fn alloc(&mut self) -> Option<u32> {
        let id = match self.free.pop() {
            Some(id) => id,
            None if self.k.len() < self.budget => {
                self.k.push(Buf::new(self.precision.keys(), self.k_dim));
                self.v.push(Buf::new(self.precision.values(), self.v_dim));
                self.refs.push(0);
                (self.k.len() - 1) as u32
            }
            None => return None,
        };
        debug_assert_eq!(self.refs[id as usize], 0);
        self.refs[id as usize] = 1;
        Some(id)
    }

    fn hold(&mut self, id: u32) {
        self.refs[id as usize] += 1;
    }

    fn release(&mut self, id: u32) {
        let r = &mut self.refs[id as usize];
        assert!(*r > 0, "page {id} released more often than held");
        *r -= 1;
        if *r == 0 {
            self.free.push(id);
        }
    }

    /// A private copy of `id` for one holder (the old page loses that holder).
    fn copy(&mut self, id: u32) -> Option<u32> {
        let new = self.alloc()?;
        let (i, n) = (id as usize, new as usize);
        match &mut self.copies {
            // The contents live on the device: it copies them (the host's stay unread).
            Some(log) => log.push((id, new)),
            None => {
                self.k[n] = self.k[i].clone();
                self.v[n] = self.v[i].clone();
            }
        }
        self.release(id);
        Some(new)
    }

    /// Writes position `slot` of page `id`: keys and values rounded or quantised to
    /// the pool's precision.
    pub(crate) fn write(&mut self, id: u32, slot: usize, k: &[f32], v: &[f32]) {
        let (kd, vd) = (self.k_dim, self.v_dim);
        let (k, v) = if self.precision == KvPrecision::OneBit {
            let (mut k, mut v) = (k.to_vec(), v.to_vec());
            round_one_bit(&mut k);
            round_one_bit(&mut v);
            (std::borrow::Cow::Owned(k), std::borrow::Cow::Owned(v))
        } else {
            (std::borrow::Cow::Borrowed(k), std::borrow::Cow::Borrowed(v))
        };
        let id = id as usize;
        // Keys: transposed by tile for f32/f16, a q8_0 row for int8.
        let base = (slot / KEY_TILE) * kd * KEY_TILE + slot % KEY_TILE;
        match &mut self.k[id] {
            Buf::F32(b) => k
                .iter()
                .enumerate()
                .for_each(|(c, &x)| b[base + c * KEY_TILE] = x),
            Buf::F16(b) => k
                .iter()
                .enumerate()
                .for_each(|(c, &x)| b[base + c * KEY_TILE] = f16::from_f32(x)),
            Buf::Q8(b) => {
                let rb = Elem::Q8.row_bytes(kd);
                llamay_kernels::quantize_row(
                    GgmlType::Q8_0,
                    &k,
                    &mut b[slot * rb..(slot + 1) * rb],
                );
            }
        }
        match &mut self.v[id] {
            Buf::F32(b) => b[slot * vd..(slot + 1) * vd].copy_from_slice(&v),
            Buf::F16(b) => b[slot * vd..(slot + 1) * vd]
                .iter_mut()
                .zip(v.iter())
                .for_each(|(d, &x)| *d = f16::from_f32(x)),
            Buf::Q8(b) => {
                let rb = Elem::Q8.row_bytes(vd);
                llamay_kernels::quantize_row(
                    GgmlType::Q8_0,
                    &v,
                    &mut b[slot * rb..(slot + 1) * rb],
                );
            }
        }
    }
}

/// A sequence of the pool: its tokens (one per position) and a page table per layer.
#[derive(Clone, Debug)]
struct Sequence {
    tokens: Vec<u32>,
    /// Per layer, page `i` holds positions `i * PAGE ..`; `None` where a sliding window
    /// released it (or the sequence has not reached it).
    tables: Vec<Vec<Option<u32>>>,
}

/// A sequence of a context's KV pool. Ids are unique in the process (never reused, and
/// never valid in another context), so a stray id is refused, not misapplied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub(crate) u64);

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a pool operation was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("sequence {0} does not exist in this context")]
    UnknownSequence(SeqId),
    /// Copying the pages' contents between the device and the host failed.
    #[error("the device's KV pages could not be copied: {0}")]
    Device(String),
    #[error(
        "sequence {seq}: cannot roll back to position {pos}: its sliding-window layers released positions before {held_from} (fork a sequence before decoding past the point you want to return to)"
    )]
    WindowReleased {
        seq: SeqId,
        pos: usize,
        held_from: usize,
    },
    #[error("sequence {seq}: position {pos} is past its length {len}")]
    PastEnd { seq: SeqId, pos: usize, len: usize },
}

/// Pages in use and their size: what a server exports as KV-cache utilisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvUsage {
    pub pages_used: usize,
    pub pages_total: usize,
    /// Pages ever allocated (kept for reuse after a sequence frees them).
    pub pages_allocated: usize,
    /// Bytes of one page (one layer, [`PAGE`] positions).
    pub page_bytes: usize,
    /// Bytes one position takes across every layer.
    pub bytes_per_token: usize,
}

/// The KV cache of a context: pages shared by its sequences under one budget.
#[derive(Debug)]
pub struct KvPool {
    store: PageStore,
    seqs: BTreeMap<u64, Sequence>,
    /// Per layer, its sliding window (positions a token sees, itself included).
    windows: Vec<Option<usize>>,
    /// Most positions one sequence may hold.
    n_ctx: usize,
    /// Positions a sequence may be rolled back by after a batch on sliding-window
    /// layers (`keep_for_rollback`).
    rollback: usize,
}

/// One page's key and value bytes, per layer: a snapshot's contents.
pub(crate) type LayerPages<'a> = Vec<Vec<(&'a [u8], &'a [u8])>>;

/// Where one batch token's keys and values go in every layer.
pub(crate) type Targets = Vec<Vec<(u32, usize)>>;

impl KvPool {
    /// A pool for `windows.len()` layers whose sequences hold at most `n_ctx`
    /// positions, with room for `budget_tokens` positions in every layer.
    pub(crate) fn new(
        precision: KvPrecision,
        k_dim: usize,
        v_dim: usize,
        windows: Vec<Option<usize>>,
        n_ctx: usize,
        budget_tokens: usize,
    ) -> KvPool {
        let budget = budget_tokens.div_ceil(PAGE).saturating_mul(windows.len());
        KvPool {
            store: PageStore::new(precision, k_dim, v_dim, budget),
            seqs: BTreeMap::new(),
            windows,
            n_ctx,
            rollback: 0,
        }
    }

    /// Keeps, on sliding-window layers, what the last `positions` tokens of a sequence
    /// saw, so that `truncate` may cut up to that many positions from its end (a
    /// speculative draft rejected after its batch) instead of being refused. Costs at
    /// most one page per such layer and sequence when `positions <= PAGE`.
    pub fn keep_for_rollback(&mut self, positions: usize) {
        self.rollback = positions;
    }

    pub fn precision(&self) -> KvPrecision {
        self.store.precision
    }

    /// Most positions one sequence may hold (`-c`).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn usage(&self) -> KvUsage {
        let s = &self.store;
        let per_pos = s.precision.bytes_per_position(s.k_dim, s.v_dim);
        KvUsage {
            pages_used: s.in_use(),
            pages_total: s.budget,
            pages_allocated: s.k.len(),
            page_bytes: per_pos * PAGE,
            bytes_per_token: per_pos * self.windows.len(),
        }
    }

    /// Distinct pages `seqs` hold, a page shared between them counted once: what
    /// running requests occupy, apart from pages only idle (evictable) sequences hold.
    pub fn pages_held(&self, seqs: &[SeqId]) -> usize {
        let mut ids: Vec<u32> = seqs
            .iter()
            .filter_map(|s| self.seqs.get(&s.0))
            .flat_map(|s| s.tables.iter().flatten().flatten().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// A new empty sequence.
    pub fn new_sequence(&mut self) -> SeqId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tables = vec![Vec::new(); self.windows.len()];
        self.seqs.insert(
            id,
            Sequence {
                tokens: Vec::new(),
                tables,
            },
        );
        SeqId(id)
    }

    fn seq(&self, s: SeqId) -> Result<&Sequence, KvError> {
        self.seqs.get(&s.0).ok_or(KvError::UnknownSequence(s))
    }

    pub fn contains(&self, s: SeqId) -> bool {
        self.seqs.contains_key(&s.0)
    }

    /// Positions the sequence holds (its next position).
    pub fn len(&self, s: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(s)?.tokens.len())
    }

    /// The tokens the sequence holds, one per position.
    pub fn tokens(&self, s: SeqId) -> Result<&[u32], KvError> {
        Ok(&self.seq(s)?.tokens)
    }

    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().map(|&k| SeqId(k))
    }

    /// A new sequence sharing every page of `s` (copy on write): continuing it computes
    /// exactly what continuing `s` would, with no prefix recomputed, on sliding-window
    /// layers too (the window's pages stay referenced).
    pub fn fork(&mut self, s: SeqId) -> Result<SeqId, KvError> {
        let parent = self.seq(s)?.clone();
        for id in parent.tables.iter().flatten().flatten() {
            self.store.hold(*id);
        }
        let id = self.new_sequence();
        self.seqs.insert(id.0, parent);
        Ok(id)
    }

    /// Frees a sequence: its pages return to the pool (those no other sequence holds).
    pub fn free(&mut self, s: SeqId) -> Result<(), KvError> {
        let seq = self.seqs.remove(&s.0).ok_or(KvError::UnknownSequence(s))?;
        for id in seq.tables.iter().flatten().flatten() {
            self.store.release(*id);
        }
        Ok(())
    }

    /// Forgets positions from `pos` on (a new turn, a stop string). Refused if a
    /// sliding-window layer has already released positions the token at `pos` would
    /// see.
    pub fn truncate(&mut self, s: SeqId, pos: usize) -> Result<(), KvError> {
        let seq = self.seq(s)?;
        let len = seq.tokens.len();
        if pos > len {
            return Err(KvError::PastEnd { seq: s, pos, len });
        }
        for (table, window) in seq.tables.iter().zip(&self.windows) {
            let lo = first_seen(pos, *window);
            if pos > 0
                && (lo / PAGE..pos.div_ceil(PAGE))
                    .any(|i| table.get(i).copied().flatten().is_none())
            {
                let held_from = table.iter().position(Option::is_some).unwrap_or(len) * PAGE;
                return Err(KvError::WindowReleased {
                    seq: s,
                    pos,
                    held_from,
                });
            }
        }
        let keep = pos.div_ceil(PAGE);
        let seq = self.seqs.get_mut(&s.0).expect("checked above");
        seq.tokens.truncate(pos);
        for table in &mut seq.tables {
            for id in table.drain(keep.min(table.len())..).flatten() {
                self.store.release(id);
            }
        }
        Ok(())
    }

    /// Makes every page the batch writes present and private to its sequence: `plan`
    /// is each sequence's (id, positions added); returns, per layer and batch token in
    /// `order` (sequence, position), the page and slot its keys and values go to.
    /// Checks the budget first: on `Err` nothing changed.
    pub(crate) fn reserve(
        &mut self,
        plan: &[(SeqId, usize)],
        order: &[(SeqId, usize)],
    ) -> Result<Targets, DecodeError> {
        let mut need = 0usize;
        for &(s, n) in plan {
            let seq = self
                .seq(s)
                .map_err(|_| DecodeError::UnknownSequence { seq: s })?;
            let len = seq.tokens.len();
            for table in &seq.tables {
                for i in len / PAGE..(len + n).div_ceil(PAGE) {
                    match table.get(i).copied().flatten() {
                        Some(id) if self.store.refs[id as usize] == 1 => {}
                        _ => need += 1,
                    }
                }
            }
        }
        if need > self.store.available() {
            return Err(DecodeError::PoolFull {
                need,
                free: self.store.available(),
                budget: self.store.budget,
            });
        }
        for &(s, n) in plan {
            let seq = self.seqs.get_mut(&s.0).expect("checked above");
            let len = seq.tokens.len();
            for table in &mut seq.tables {
                let end = (len + n).div_ceil(PAGE);
                if table.len() < end {
                    table.resize(end, None);
                }
                for slot in &mut table[len / PAGE..end] {
                    *slot = Some(match *slot {
                        Some(id) if self.store.refs[id as usize] == 1 => id,
                        Some(id) => self.store.copy(id).expect("budget checked"),
                        None => self.store.alloc().expect("budget checked"),
                    });
                }
            }
        }
        let n_layer = self.windows.len();
        let mut targets = vec![Vec::with_capacity(order.len()); n_layer];
        for &(s, pos) in order {
            let seq = &self.seqs[&s.0];
            for (l, t) in targets.iter_mut().enumerate() {
                let id = seq.tables[l][pos / PAGE].expect("reserved above");
                t.push((id, pos % PAGE));
            }
        }
        Ok(targets)
    }

    /// From now on the pages' contents live on a device: copy on write records the
    /// copies it makes (for `take_copies`) instead of copying host pages.
    pub(crate) fn contents_on_device(&mut self) {
        self.store.copies.get_or_insert_with(Vec::new);
    }

    /// Whether the pages' contents live on a device.
    pub fn on_device(&self) -> bool {
        self.store.copies.is_some()
    }

    /// The copy-on-write copies made since the last call, (from, to).
    pub(crate) fn take_copies(&mut self) -> Vec<(u32, u32)> {
        self.store
            .copies
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Layer `layer`'s sliding window (positions a token sees, itself included), if any.
    pub(crate) fn window(&self, layer: usize) -> Option<usize> {
        self.windows[layer]
    }

    /// Most pages the pool may hold (over every layer).
    pub(crate) fn page_budget(&self) -> usize {
        self.store.budget
    }

    /// Every page sequence `s` holds, over all its layers.
    pub(crate) fn pages_of_seq(&self, s: SeqId) -> Result<Vec<u32>, KvError> {
        let seq = self.seq(s)?;
        Ok(seq.tables.iter().flatten().flatten().copied().collect())
    }

    /// Position `slot` of page `id`: its key and value rows as f32 (exact for the f32
    /// and f16 precisions).
    pub(crate) fn read_row(&self, id: u32, slot: usize) -> (Vec<f32>, Vec<f32>) {
        let table = [Some(id)];
        let view = LayerKv {
            store: &self.store,
            table: &table,
        };
        let k = view.key_row(slot);
        let mut v = vec![0f32; self.store.v_dim];
        view.values_into(slot, 1, 0, self.store.v_dim, &mut v);
        (k, v)
    }

    /// Sequence `s`'s page table in layer `layer` (`None`: released or not reached).
    pub(crate) fn table(&self, s: SeqId, layer: usize) -> &[Option<u32>] {
        &self.seqs[&s.0].tables[layer]
    }

    pub(crate) fn store_mut(&mut self) -> &mut PageStore {
        &mut self.store
    }

    /// Layer `layer` of sequence `s` as attention reads it.
    pub(crate) fn layer(&self, s: SeqId, layer: usize) -> LayerKv<'_> {
        LayerKv {
            store: &self.store,
            table: &self.seqs[&s.0].tables[layer],
        }
    }

    /// Ends a batch: the sequence's new tokens become part of it, and its
    /// sliding-window layers release the pages no later token can see.
    pub(crate) fn commit(&mut self, s: SeqId, tokens: &[u32]) {
        let seq = self.seqs.get_mut(&s.0).expect("validated before the batch");
        seq.tokens.extend_from_slice(tokens);
        let len = seq.tokens.len();
        // What the token at the oldest position a rollback may return to sees.
        let oldest = len.saturating_sub(self.rollback);
        for (table, window) in seq.tables.iter_mut().zip(&self.windows) {
            if window.is_some() {
                let keep_from = first_seen(oldest, *window) / PAGE;
                for slot in table.iter_mut().take(keep_from) {
                    if let Some(id) = slot.take() {
                        self.store.release(id);
                    }
                }
            }
        }
    }

    /// Pages held by each sequence, summed (a page shared by two counts twice).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.seqs
            .values()
            .flat_map(|s| s.tables.iter().flatten().flatten())
            .count()
    }

    /// Checks the pool's books: every page's count equals its holders, free pages have
    /// none, no page is on the free list twice.
    #[cfg(test)]
    fn audit(&self) {
        let mut holders = vec![0u32; self.store.k.len()];
        for id in self
            .seqs
            .values()
            .flat_map(|s| s.tables.iter().flatten().flatten())
        {
            holders[*id as usize] += 1;
        }
        assert_eq!(holders, self.store.refs, "reference counts");
        let mut free = self.store.free.clone();
        free.sort();
        free.dedup();
        assert_eq!(free.len(), self.store.free.len(), "a page freed twice");
        for id in free {
            assert_eq!(self.store.refs[id as usize], 0);
        }
        assert!(self.store.in_use() <= self.store.budget);
    }
}

/// An encoder batch's keys and values, which no later batch reads: f32 pages (as
/// llama.cpp's encoders attend over the batch's own f32 K and V, with no cache) for
/// one layer, overwritten by each layer in turn since a layer reads only its own.
/// Built per batch and dropped after it: an encoder context keeps no KV cache.
pub(crate) struct TransientKv {
    store: PageStore,
    /// Each sequence's pages, in batch order of first appearance.
    tables: Vec<Vec<Option<u32>>>,
}

impl TransientKv {
    /// Room for sequences of `lens` positions.
    pub(crate) fn new(k_dim: usize, v_dim: usize, lens: &[usize]) -> TransientKv {
        let pages = lens.iter().map(|l| l.div_ceil(PAGE)).sum();
        let mut store = PageStore::new(KvPrecision::F32, k_dim, v_dim, pages);
        let tables = (lens.iter())
            .map(|l| {
                (0..l.div_ceil(PAGE))
                    .map(|_| Some(store.alloc().expect("sized to the batch")))
                    .collect()
            })
            .collect();
        TransientKv { store, tables }
    }

    /// Writes position `pos` of sequence `seq` (an index into the `lens` given).
    pub(crate) fn write(&mut self, seq: usize, pos: usize, k: &[f32], v: &[f32]) {
        let id = self.tables[seq][pos / PAGE].expect("every page allocated in new");
        self.store.write(id, pos % PAGE, k, v);
    }

    /// Sequence `seq` as attention reads it (the layer last written).
    pub(crate) fn layer(&self, seq: usize) -> LayerKv<'_> {
        LayerKv {
            store: &self.store,
            table: &self.tables[seq],
        }
    }
}

/// First position a token at `pos` sees.
pub(crate) fn first_seen(pos: usize, window: Option<usize>) -> usize {
    match window {
        Some(w) if w > 0 => (pos + 1).saturating_sub(w),
        _ => 0,
    }
}

/// One layer of one sequence, as attention reads it.
#[derive(Clone, Copy)]
pub(crate) struct LayerKv<'a> {
    store: &'a PageStore,
    table: &'a [Option<u32>],
}

impl<'a> LayerKv<'a> {
    pub(crate) fn precision(&self) -> KvPrecision {
        self.store.precision
    }

    fn page(&self, pos: usize) -> usize {
        self.table[pos / PAGE].expect("attention reads only pages the window holds") as usize
    }

    /// Key tile `t` (positions `t * KEY_TILE ..`): the `len` values from `off` of each
    /// position, transposed (`len × KEY_TILE`), read where the f32 or f16 page holds
    /// them. Lanes past the sequence's end hold zeros or stale keys: the caller masks
    /// them. Not for int8 keys (see [`LayerKv::key_rows_q8`]).
    pub(crate) fn key_tile(&self, t: usize, off: usize, len: usize) -> KvRows<'a> {
        let kd = self.store.k_dim;
        let at = ((t % (PAGE / KEY_TILE)) * kd + off) * KEY_TILE;
        match &self.store.k[self.page(t * KEY_TILE)] {
            Buf::F32(s) => KvRows::F32(&s[at..at + len * KEY_TILE]),
            Buf::F16(s) => KvRows::F16(&s[at..at + len * KEY_TILE]),
            Buf::Q8(_) => unreachable!("int8 keys are read as rows"),
        }
    }

    /// The keys of position `pos` as f32 (dequantised from int8): for tests and for
    /// copying pages to a device.
    pub(crate) fn key_row(&self, pos: usize) -> Vec<f32> {
        let kd = self.store.k_dim;
        let mut out = vec![0f32; kd];
        if self.precision().int8_keys() {
            let (rows, stride) = self.key_rows_q8(pos / KEY_TILE, 0);
            let j = pos % KEY_TILE;
            llamay_kernels::dequantize_q8_0(&rows[j * stride..(j + 1) * stride], &mut out);
        } else {
            let at = |c: usize| c * KEY_TILE + pos % KEY_TILE;
            match self.key_tile(pos / KEY_TILE, 0, kd) {
                KvRows::F32(kt) => out.iter_mut().enumerate().for_each(|(c, o)| *o = kt[at(c)]),
                KvRows::F16(kt) => {
                    (out.iter_mut().enumerate()).for_each(|(c, o)| *o = kt[at(c)].to_f32())
                }
            }
        }
        out
    }

    /// The `q8_0` key rows of tile `t`: KEY_TILE rows `stride` bytes apart, each
    /// starting at the blocks of values `off..off + len` (returned: the bytes from the
    /// first row's start, and the stride).
    pub(crate) fn key_rows_q8(&self, t: usize, off: usize) -> (&'a [u8], usize) {
        let rb = Elem::Q8.row_bytes(self.store.k_dim);
        let Buf::Q8(s) = &self.store.k[self.page(t * KEY_TILE)] else {
            unreachable!("only for int8 keys")
        };
        let slot0 = (t * KEY_TILE) % PAGE;
        (&s[slot0 * rb + off / Q8_BLOCK * Q8_BLOCK_BYTES..], rb)
    }

    /// Values `off..` of the KEY_TILE positions from `p0` (a tile's start) where an f32
    /// or f16 page holds them: the elements from the first row's, and the rows' stride
    /// (the page's value width). `None` for int8 pages (see [`LayerKv::values_into`]).
    pub(crate) fn value_rows(&self, p0: usize, off: usize) -> Option<(KvRows<'a>, usize)> {
        let vd = self.store.v_dim;
        debug_assert!(p0.is_multiple_of(KEY_TILE));
        let at = (p0 % PAGE) * vd + off;
        match &self.store.v[self.page(p0)] {
            Buf::F32(s) => Some((KvRows::F32(&s[at..]), vd)),
            Buf::F16(s) => Some((KvRows::F16(&s[at..]), vd)),
            Buf::Q8(_) => None,
        }
    }

    /// Values `off..off + len` of positions `p0..p0 + n` (within one key tile) as `n`
    /// contiguous f32 rows in `dst`: copied, widened from f16 or dequantised from int8.
    pub(crate) fn values_into(&self, p0: usize, n: usize, off: usize, len: usize, dst: &mut [f32]) {
        let vd = self.store.v_dim;
        let page = &self.store.v[self.page(p0)];
        let slot0 = p0 % PAGE;
        debug_assert!(slot0 + n <= PAGE);
        for (j, d) in dst[..n * len].chunks_exact_mut(len).enumerate() {
            let at = (slot0 + j) * vd + off;
            match page {
                Buf::F32(s) => d.copy_from_slice(&s[at..at + len]),
                Buf::F16(s) => llamay_kernels::widen_f16(&s[at..at + len], d),
                Buf::Q8(s) => {
                    let rb = Elem::Q8.row_bytes(vd);
                    let b0 = (slot0 + j) * rb + off / Q8_BLOCK * Q8_BLOCK_BYTES;
                    let bytes = &s[b0..b0 + len / Q8_BLOCK * Q8_BLOCK_BYTES];
                    llamay_kernels::dequantize_q8_0(bytes, d);
                }
            }
        }
    }
}

/// Snapshots: a sequence's cache as bytes, and back. See `snapshot.rs`.
impl KvPool {
    /// The pages of `s` in each layer's held range ([`KvPool::held_range`]): per layer,
    /// each page's key and value bytes (as stored: little-endian on every target
    /// llamay builds for).
    pub(crate) fn pages_of(&self, s: SeqId) -> Result<LayerPages<'_>, KvError> {
        let seq = self.seq(s)?;
        let len = seq.tokens.len();
        Ok((seq.tables.iter().enumerate())
            .map(|(l, table)| {
                let (lo, hi) = self.held_range(l, len);
                table[lo..hi]
                    .iter()
                    .map(|id| {
                        let id =
                            id.expect("a sequence holds every page of its held range") as usize;
                        (self.store.k[id].bytes(), self.store.v[id].bytes())
                    })
                    .collect()
            })
            .collect())
    }

    /// Bytes of one page's keys and values.
    pub(crate) fn page_sizes(&self) -> (usize, usize) {
        let s = &self.store;
        (
            PAGE * s.precision.keys().row_bytes(s.k_dim),
            PAGE * s.precision.values().row_bytes(s.v_dim),
        )
    }

    pub(crate) fn n_layer(&self) -> usize {
        self.windows.len()
    }

    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.store.k_dim, self.store.v_dim)
    }

    /// Which pages a sequence of `len` positions holds in each layer: `first..end`.
    pub(crate) fn held_range(&self, layer: usize, len: usize) -> (usize, usize) {
        (
            first_seen(len, self.windows[layer]) / PAGE,
            len.div_ceil(PAGE),
        )
    }

    /// A new sequence from checked snapshot parts: `tokens`, and per layer each page's
    /// key and value bytes (of [`KvPool::page_sizes`]) for its held range.
    pub(crate) fn adopt(
        &mut self,
        tokens: Vec<u32>,
        layers: &[Vec<(&[u8], &[u8])>],
    ) -> Result<SeqId, DecodeError> {
        let need: usize = layers.iter().map(Vec::len).sum();
        if need > self.store.available() {
            return Err(DecodeError::PoolFull {
                need,
                free: self.store.available(),
                budget: self.store.budget,
            });
        }
        let s = self.new_sequence();
        let mut tables = Vec::with_capacity(layers.len());
        for (l, pages) in layers.iter().enumerate() {
            let (first, _) = self.held_range(l, tokens.len());
            let mut table = vec![None; first];
            for (k, v) in pages {
                let id = self.store.alloc().expect("budget checked");
                self.store.k[id as usize].set_bytes(k);
                self.store.v[id as usize].set_bytes(v);
                table.push(Some(id));
            }
            tables.push(table);
        }
        let seq = self.seqs.get_mut(&s.0).expect("just made");
        seq.tables = tables;
        seq.tokens = tokens;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pool(budget: usize, window: Option<usize>) -> KvPool {
        KvPool::new(KvPrecision::F32, 4, 4, vec![None, window], 100_000, budget)
    }

    /// Appends `n` positions to `s` whose keys and values encode (sequence tag,
    /// position), so a test can tell whose write a page holds.
    fn grow(p: &mut KvPool, s: SeqId, n: usize, tag: f32) -> Result<(), DecodeError> {
        let len = p.len(s).unwrap();
        let order: Vec<(SeqId, usize)> = (len..len + n).map(|pos| (s, pos)).collect();
        let targets = p.reserve(&[(s, n)], &order)?;
        for (l, t) in targets.iter().enumerate() {
            for (&(id, slot), &(_, pos)) in t.iter().zip(&order) {
                let x = [tag, pos as f32, l as f32, 1.0];
                p.store_mut().write(id, slot, &x, &x);
            }
        }
        let toks: Vec<u32> = order.iter().map(|&(_, pos)| pos as u32).collect();
        p.commit(s, &toks);
        Ok(())
    }

    /// The value row `s` holds at `pos` in layer `l`.
    fn read(p: &KvPool, s: SeqId, l: usize, pos: usize) -> [f32; 4] {
        let mut d = [0f32; 4];
        p.layer(s, l).values_into(pos, 1, 0, 4, &mut d);
        d
    }

    #[test]
    fn pages_held_counts_shared_pages_once() {
        let mut p = pool(100 * PAGE, None);
        let a = p.new_sequence();
        grow(&mut p, a, PAGE + 1, 1.0).unwrap();
        // Two layers, two pages each.
        assert_eq!(p.pages_held(&[a]), 4);
        let b = p.fork(a).unwrap();
        assert_eq!(p.pages_held(&[a, b]), 4);
        grow(&mut p, b, 1, 2.0).unwrap();
        // b's last page was copied on write.
        assert_eq!(p.pages_held(&[a, b]), 6);
        assert_eq!(p.pages_held(&[b]), 4);
        assert_eq!(p.pages_held(&[]), 0);
        assert_eq!(p.usage().pages_used, 6);
    }

    #[test]
    fn bytes_per_position_follow_the_precision() {
        // Gemma 3 270M: one KV head of 256.
        let f32b = KvPrecision::F32.bytes_per_position(256, 256);
        assert_eq!(f32b, 2048);
        assert_eq!(KvPrecision::F16.bytes_per_position(256, 256), 1024);
        assert_eq!(KvPrecision::Vq8.bytes_per_position(256, 256), 1024 + 272);
        assert_eq!(KvPrecision::Q8.bytes_per_position(256, 256), 544);
        assert!(KvPrecision::Q8.unfit(64, 64).is_none());
        assert!(
            KvPrecision::Q8
                .unfit(40, 64)
                .unwrap()
                .contains("key heads are 40")
        );
        assert!(
            KvPrecision::Vq8
                .unfit(40, 48)
                .unwrap()
                .contains("value heads are 48")
        );
        assert!(KvPrecision::F16.unfit(40, 48).is_none());
    }

    #[test]
    fn a_full_pool_is_an_error_naming_the_budget_and_changes_nothing() {
        let mut p = pool(PAGE, None);
        let s = p.new_sequence();
        grow(&mut p, s, PAGE - 1, 1.0).unwrap();
        let before = p.usage();
        let err = grow(&mut p, s, 2, 1.0).unwrap_err();
        assert_eq!(
            err,
            DecodeError::PoolFull {
                need: 2,
                free: 0,
                budget: 2
            }
        );
        assert!(err.to_string().contains("budget of 2 pages"), "{err}");
        assert_eq!((p.usage(), p.len(s).unwrap()), (before, PAGE - 1));
        grow(&mut p, s, 1, 1.0).unwrap();
    }

    #[test]
    fn sliding_window_layers_hold_only_what_the_window_sees() {
        let w = 100;
        let mut p = pool(10_000, Some(w));
        let s = p.new_sequence();
        for _ in 0..50 {
            grow(&mut p, s, 37, 1.0).unwrap();
        }
        let len: usize = 50 * 37;
        let held = |p: &KvPool, l: usize| p.seqs[&s.0].tables[l].iter().flatten().count();
        assert_eq!(held(&p, 0), len.div_ceil(PAGE));
        assert!(held(&p, 1) <= w.div_ceil(PAGE) + 1, "{}", held(&p, 1));
        // The window is intact: the next token sees len+1-w..len.
        assert_eq!(
            read(&p, s, 1, len - w + 1),
            [1.0, (len - w + 1) as f32, 1.0, 1.0]
        );
        // Rolling back within the window works; past it is refused by name.
        p.truncate(s, len - 10).unwrap();
        let err = p.truncate(s, len - 500).unwrap_err();
        assert!(matches!(err, KvError::WindowReleased { .. }), "{err}");
        assert_eq!(p.len(s).unwrap(), len - 10);
        p.audit();
        p.free(s).unwrap();
        assert_eq!(p.usage().pages_used, 0);
    }

    /// A speculative step decodes a token and its draft, then cuts the rejected tail:
    /// with `keep_for_rollback(d)` every cut of up to d positions after a batch works,
    /// at a cost of at most one more page per sliding layer.
    #[test]
    fn a_rollback_reserve_keeps_what_a_rejected_draft_needs() {
        let w = 100;
        for d in [1, 7, 64] {
            let mut p = pool(10_000, Some(w));
            p.keep_for_rollback(d);
            let s = p.new_sequence();
            let mut len = 0;
            for step in 0..200 {
                grow(&mut p, s, d, 1.0).unwrap();
                len += d;
                let cut = step % (d + 1);
                p.truncate(s, len - cut).unwrap();
                len -= cut;
                let held = p.seqs[&s.0].tables[1].iter().flatten().count();
                assert!(held <= (w + d).div_ceil(PAGE) + 1, "d {d}: {held} pages");
            }
            p.audit();
        }
        // Without the reserve the same cut is refused once the window has moved on.
        let mut p = pool(10_000, Some(w));
        let s = p.new_sequence();
        grow(&mut p, s, 3 * PAGE, 1.0).unwrap();
        grow(&mut p, s, 64, 1.0).unwrap();
        assert!(matches!(
            p.truncate(s, 3 * PAGE).unwrap_err(),
            KvError::WindowReleased { .. }
        ));
    }

    #[test]
    fn a_fork_shares_pages_and_copies_only_the_one_it_writes() {
        let mut p = pool(10_000, None);
        let a = p.new_sequence();
        grow(&mut p, a, 3 * PAGE + 5, 1.0).unwrap();
        let used = p.usage().pages_used;
        let b = p.fork(a).unwrap();
        assert_eq!(p.usage().pages_used, used);
        grow(&mut p, b, 1, 2.0).unwrap();
        // One copied page per layer: the partial last one.
        assert_eq!(p.usage().pages_used, used + 2);
        assert_eq!(
            read(&p, a, 0, 3 * PAGE + 4),
            [1.0, (3 * PAGE + 4) as f32, 0.0, 1.0]
        );
        assert_eq!(read(&p, b, 0, 3 * PAGE + 5)[0], 2.0);
        p.truncate(b, 10).unwrap();
        grow(&mut p, b, 1, 3.0).unwrap();
        assert_eq!(
            read(&p, a, 1, 10)[0],
            1.0,
            "the parent's shared page was written"
        );
        assert_eq!(read(&p, b, 1, 10)[0], 3.0);
        p.audit();
    }

    #[derive(Clone, Debug)]
    enum Op {
        New,
        Grow(usize, usize),
        Fork(usize),
        Truncate(usize, usize),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::New),
            (0..8usize, 1..150usize).prop_map(|(s, n)| Op::Grow(s, n)),
            (0..8usize).prop_map(Op::Fork),
            (0..8usize, 0..400usize).prop_map(|(s, p)| Op::Truncate(s, p)),
            (0..8usize).prop_map(Op::Free),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Random grow / fork / write / truncate / free: the books always balance, a
        /// write never changes another sequence, and freeing everything returns every
        /// page.
        #[test]
        fn pool_never_leaks_double_frees_or_shares_a_write(
            ops in proptest::collection::vec(op(), 1..60),
            window in prop_oneof![Just(None), Just(Some(70usize)), Just(Some(130))],
        ) {
            let mut p = pool(40 * PAGE, window);
            // Per live sequence, the tag each position was written with: the model.
            let mut live: Vec<(SeqId, Vec<f32>)> = Vec::new();
            let mut tag = 0f32;
            for op in ops {
                match op {
                    Op::New => live.push((p.new_sequence(), Vec::new())),
                    Op::Grow(i, n) if !live.is_empty() => {
                        let i = i % live.len();
                        tag += 1.0;
                        if grow(&mut p, live[i].0, n, tag).is_ok() {
                            live[i].1.extend(std::iter::repeat_n(tag, n));
                        }
                    }
                    Op::Fork(i) if !live.is_empty() => {
                        let i = i % live.len();
                        let f = p.fork(live[i].0).unwrap();
                        let tags = live[i].1.clone();
                        live.push((f, tags));
                    }
                    Op::Truncate(i, pos) if !live.is_empty() => {
                        let i = i % live.len();
                        let pos = pos.min(live[i].1.len());
                        if p.truncate(live[i].0, pos).is_ok() {
                            live[i].1.truncate(pos);
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (s, _) = live.swap_remove(i % live.len());
                        p.free(s).unwrap();
                    }
                    _ => {}
                }
                p.audit();
                for (s, tags) in &live {
                    prop_assert_eq!(p.len(*s).unwrap(), tags.len());
                    let len = tags.len();
                    for l in 0..2 {
                        let (lo, _) = p.held_range(l, len);
                        let from = if len == 0 { 0 } else { (lo * PAGE).max(first_seen(len, p.windows[l])) };
                        for (pos, &tag) in tags.iter().enumerate().skip(from) {
                            let got = read(&p, *s, l, pos);
                            prop_assert_eq!(got, [tag, pos as f32, l as f32, 1.0]);
                        }
                    }
                }
            }
            // Every page in use has a holder (a page counted but held by none leaked).
            prop_assert!(p.usage().pages_used <= p.held());
            for (s, _) in live.drain(..) {
                p.free(s).unwrap();
            }
            prop_assert_eq!(p.usage().pages_used, 0);
            p.audit();
        }
    }
}
