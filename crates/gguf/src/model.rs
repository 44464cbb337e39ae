//! Opening a model from disk: memory-map the file (and, for a split model, its sibling
//! shards) and present the set as one tensor table with one metadata set.

use crate::error::OpenError;
use crate::file::{GgufFile, TensorInfo};
use crate::metadata::Metadata;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

const KEY_SPLIT_NO: &str = "split.no";
const KEY_SPLIT_COUNT: &str = "split.count";
const KEY_SPLIT_TENSORS: &str = "split.tensors.count";
/// More shards than this is not a real model.
const MAX_SPLITS: u64 = 9999;

/// The memory-mapped files of one model: one file, or every shard of a split model.
pub struct MappedModel {
    shards: Vec<(PathBuf, FileBytes)>,
    /// The files are big-endian and their tensor data was rewritten, in memory, into
    /// the little-endian layout where the format defines one (see `little_endian`).
    converted: bool,
}

/// A file's bytes: mapped, or (where the target has no `mmap`: WASI preview 1) read
/// into memory aligned to 64 bytes, as a mapping would be to a page.
enum FileBytes {
    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    Mapped(Mmap),
    Read(Owned),
}

/// `len` bytes in memory, starting on a 64-byte boundary.
struct Owned {
    lines: Vec<Line>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl Owned {
    fn zeroed(len: usize) -> Owned {
        Owned {
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `lines` holds at least `len` initialised bytes (`zeroed`); `Line` is
        // plain bytes with no padding.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Read(o) => o.bytes(),
        }
    }
}

/// The whole file in memory (targets without `mmap`).
#[cfg_attr(not(target_family = "wasm"), allow(dead_code))]
fn read_whole(mut file: &File, len: u64) -> std::io::Result<FileBytes> {
    use std::io::Read;
    // `len <= MAX_MAPPED` (checked by the caller), so it fits usize.
    let mut owned = Owned::zeroed(len as usize);
    // In pieces: one read of hundreds of megabytes fails under some WASI runtimes
    // (Wasmtime: ENOMEM).
    for piece in owned.bytes_mut().chunks_mut(8 << 20) {
        file.read_exact(piece)?;
    }
    Ok(FileBytes::Read(owned))
}

/// A parsed model: metadata from the first shard, tensors from all of them.
pub struct Model<'a> {
    pub shards: Vec<GgufFile<'a>>,
    /// As [`MappedModel`]'s `converted`.
    data_converted: bool,
    /// (shard, index in that shard) for each tensor in load order.
    order: Vec<(usize, usize)>,
    index: HashMap<&'a str, (usize, usize)>,
}

fn map_file(path: &Path) -> Result<FileBytes, OpenError> {
    let io = |source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(OpenError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if meta.len() == 0 {
        return Err(OpenError::Empty {
            path: path.to_path_buf(),
        });
    }
    if meta.len() > crate::limits::MAX_MAPPED {
        return Err(beyond_address_space(path, file, meta.len()));
    }
    #[cfg(target_family = "wasm")]
    return read_whole(&file, meta.len()).map_err(io);
    // SAFETY: the mapping is read-only and private to this process. The one hazard is
    // another process truncating or rewriting the file while it is mapped (SIGBUS or
    // changed bytes), which no file-backed engine can rule out; llama.cpp and Ollama
    // accept the same. Every read of the mapping goes through bounds-checked slices.
    #[cfg(not(target_family = "wasm"))]
    unsafe { Mmap::map(&file) }
        .map(FileBytes::Mapped)
        .map_err(io)
}

/// Why a file larger than this target can map is refused: the first tensor too large
/// for the address space, by name, when the header (read, not mapped) has one; else
/// the file's own size. Only reachable on a 32-bit target.
fn beyond_address_space(path: &Path, file: File, len: u64) -> OpenError {
    use crate::error::ErrorKind;
    use std::io::Read;
    const MAX_HEADER: u64 = 256 << 20;
    let mut want: u64 = 1 << 20;
    let mut prefix = Vec::new();
    loop {
        prefix.clear();
        let read = (&file).take(want).read_to_end(&mut prefix);
        if let Err(source) = read.and_then(|_| std::io::Seek::rewind(&mut &file)) {
            return OpenError::Io {
                path: path.to_path_buf(),
                source,
            };
        }
        match GgufFile::parse_header(&prefix, len) {
            Ok(_) => {
                return OpenError::BeyondAddressSpace {
                    path: path.to_path_buf(),
                    len,
                };
            }
            Err(e) => match e.kind {
                ErrorKind::Truncated { need, .. } if want < MAX_HEADER => {
                    want = e.offset.saturating_add(need).max(want * 2).min(MAX_HEADER);
                }
                ErrorKind::BeyondAddressSpace { .. } => {
                    return OpenError::TensorBeyondAddressSpace {
                        path: path.to_path_buf(),
                        source: e,
                    };
                }
                _ => {
                    return OpenError::Malformed {
                        path: path.to_path_buf(),
                        source: e,
                    };
                }
            },
        }
    }
}

/// A big-endian file's bytes with its tensor data in the little-endian layout (read
/// into memory: a mapping is never written): every tensor of a format with a defined
/// big-endian layout (`llamay_formats::byte_order`) is rewritten; the others are left
/// as they are, and [`Model::big_endian_data`] names them. A little-endian file is
/// returned as it is.
fn little_endian(path: &Path, bytes: FileBytes) -> Result<FileBytes, OpenError> {
    // A little-endian file (by its version field, as the parser reads it) is returned
    // without a parse here.
    let version = (bytes.get(4..8)).map(|v| u32::from_le_bytes([v[0], v[1], v[2], v[3]]));
    if !version.is_some_and(crate::read::is_big_endian_version) {
        return Ok(bytes);
    }
    let malformed = |source| OpenError::Malformed {
        path: path.to_path_buf(),
        source,
    };
    let extents: Vec<(usize, usize, llamay_formats::GgmlType)> = {
        let f = GgufFile::parse(&bytes).map_err(malformed)?;
        let base = bytes.as_ptr() as usize;
        (f.tensors.iter())
            .map(|t| (t.data.as_ptr() as usize - base, t.data.len(), t.ty))
            .collect()
    };
    let mut owned = match bytes {
        FileBytes::Read(owned) => owned,
        FileBytes::Mapped(map) => {
            let mut owned = Owned::zeroed(map.len());
            owned.bytes_mut().copy_from_slice(&map);
            owned
        }
    };
    let buf = owned.bytes_mut();
    for (start, n, ty) in extents {
        // In range: the parser checked every tensor's extent against these bytes.
        llamay_formats::byte_order::big_to_little_endian(ty, &mut buf[start..start + n]);
    }
    Ok(FileBytes::Read(owned))
}

/// `name-00001-of-00003.gguf` → ("name", 1, 3).
fn split_pattern(path: &Path) -> Option<(String, u64, u64)> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((prefix.to_string(), no.parse().ok()?, count.parse().ok()?))
}

fn shard_path(prefix: &str, no: u64, count: u64) -> PathBuf {
    PathBuf::from(format!("{prefix}-{no:05}-of-{count:05}.gguf"))
}

impl MappedModel {
    /// Maps `path`. If it is the first shard of a split model (`split.count` > 1), maps
    /// the other shards too, found by the `-0000N-of-0000M.gguf` naming rule.
    /// A big-endian file is read into memory with its tensor data rewritten into the
    /// little-endian layout (see [`Model::big_endian_data`]).
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        let first = little_endian(path, map_file(path)?)?;
        let malformed = |source| OpenError::Malformed {
            path: path.to_path_buf(),
            source,
        };
        let split_err = |message: String| OpenError::Split {
            path: path.to_path_buf(),
            message,
        };
        let (no, count, converted) = {
            let f = GgufFile::parse(&first).map_err(malformed)?;
            let get = |k| f.metadata.get_u64(k).map_err(|e| split_err(e.to_string()));
            (get(KEY_SPLIT_NO)?, get(KEY_SPLIT_COUNT)?, f.big_endian)
        };
        let count = count.unwrap_or(1);
        if count <= 1 {
            return Ok(MappedModel {
                shards: vec![(path.to_path_buf(), first)],
                converted,
            });
        }
        if count > MAX_SPLITS {
            return Err(split_err(format!(
                "split.count {count} exceeds {MAX_SPLITS}"
            )));
        }
        let Some((prefix, _, name_count)) = split_pattern(path) else {
            return Err(split_err(format!(
                "split.count is {count} but the file name does not follow the NAME-00001-of-{count:05}.gguf rule, so the other shards cannot be found"
            )));
        };
        if no.unwrap_or(0) != 0 {
            return Err(split_err(format!(
                "this is shard {} of {count}; open the first shard, {}",
                no.unwrap_or(0) + 1,
                shard_path(&prefix, 1, count).display()
            )));
        }
        if name_count != count {
            return Err(split_err(format!(
                "split.count is {count} but the file name says {name_count} shards"
            )));
        }
        let mut shards = vec![(path.to_path_buf(), first)];
        for i in 2..=count {
            let p = shard_path(&prefix, i, count);
            let map = little_endian(&p, map_file(&p)?)?;
            shards.push((p, map));
        }
        Ok(MappedModel { shards, converted })
    }

    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|(p, _)| p.as_path())
    }

    /// Tells the kernel it may drop the resident pages behind `data` (a slice of one of
    /// these mappings, e.g. a tensor the engine has copied into its own layout). Only
    /// whole pages inside `data` are released. The mapping stays valid: a later read
    /// faults the page back in from the file, unchanged. Returns the bytes released (0
    /// when `data` is not inside a mapping, or off unix).
    pub fn release(&self, data: &[u8]) -> usize {
        #[cfg(unix)]
        {
            let page = 4096usize;
            let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
            for (_, bytes) in &self.shards {
                let FileBytes::Mapped(map) = bytes else {
                    continue;
                };
                let base = map.as_ptr() as usize;
                if start < base || end > base + map.len() {
                    continue;
                }
                let lo = (start - base).next_multiple_of(page);
                let hi = (end - base) / page * page;
                if hi <= lo {
                    return 0;
                }
                // SAFETY: `Mmap` is a read-only private file mapping (never written through),
                // so MADV_DONTNEED only drops clean pages: the next access re-reads the same
                // bytes from the file, and every outstanding borrow stays valid and
                // unchanged. The range is inside the map (checked above).
                let r = unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
                };
                return if r.is_ok() { hi - lo } else { 0 };
            }
            0
        }
        #[cfg(not(unix))]
        {
            let _ = data;
            0
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(|(_, m)| m.len() as u64).sum()
    }

    /// Parses every shard and checks that they form one model.
    pub fn parse(&self) -> Result<Model<'_>, OpenError> {
        let mut shards = Vec::with_capacity(self.shards.len());
        for (path, map) in &self.shards {
            let f = GgufFile::parse(map).map_err(|source| OpenError::Malformed {
                path: path.clone(),
                source,
            })?;
            shards.push(f);
        }
        let first_path = &self.shards[0].0;
        let split_err = |message: String| OpenError::Split {
            path: first_path.clone(),
            message,
        };
        if shards.len() > 1 {
            for (i, (f, (path, _))) in shards.iter().zip(&self.shards).enumerate() {
                let no = f
                    .metadata
                    .get_u64(KEY_SPLIT_NO)
                    .map_err(|e| split_err(e.to_string()))?;
                let count = f
                    .metadata
                    .get_u64(KEY_SPLIT_COUNT)
                    .map_err(|e| split_err(e.to_string()))?;
                if no != Some(i as u64) || count != Some(shards.len() as u64) {
                    return Err(split_err(format!(
                        "{} says it is shard {:?} of {:?}, expected {} of {}",
                        path.display(),
                        no,
                        count,
                        i,
                        shards.len()
                    )));
                }
            }
            let total: u64 = shards.iter().map(|f| f.tensors.len() as u64).sum();
            let declared = shards[0]
                .metadata
                .get_u64(KEY_SPLIT_TENSORS)
                .map_err(|e| split_err(e.to_string()))?;
            if declared.is_some_and(|d| d != total) {
                return Err(split_err(format!(
                    "split.tensors.count is {} but the shards hold {total} tensors",
                    declared.unwrap_or(0)
                )));
            }
        }
        let mut order = Vec::new();
        let mut index = HashMap::new();
        for (s, f) in shards.iter().enumerate() {
            for (i, t) in f.tensors.iter().enumerate() {
                if index.insert(t.name, (s, i)).is_some() {
                    return Err(split_err(format!(
                        "tensor '{}' appears in more than one shard",
                        t.name
                    )));
                }
                order.push((s, i));
            }
        }
        Ok(Model {
            shards,
            data_converted: self.converted,
            order,
            index,
        })
    }
}

impl<'a> Model<'a> {
    /// A model of one parsed file (not a shard of a split set): how a file built in
    /// memory (tests, the fuzz targets) is presented to the loaders. The parser has
    /// already refused duplicate tensor names.
    pub fn single(file: GgufFile<'a>) -> Model<'a> {
        let order = (0..file.tensors.len()).map(|i| (0, i)).collect();
        let index = (file.tensors.iter().enumerate())
            .map(|(i, t)| (t.name, (0, i)))
            .collect();
        Model {
            shards: vec![file],
            data_converted: false,
            order,
            index,
        }
    }

    /// The model's metadata (the first shard's; other shards carry only split keys).
    pub fn metadata(&self) -> &Metadata<'a> {
        &self.shards[0].metadata
    }

    pub fn first(&self) -> &GgufFile<'a> {
        &self.shards[0]
    }

    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo<'a>> + '_ {
        self.order.iter().map(|&(s, i)| &self.shards[s].tensors[i])
    }

    pub fn tensor_count(&self) -> usize {
        self.order.len()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo<'a>> {
        self.index
            .get(name)
            .map(|&(s, i)| &self.shards[s].tensors[i])
    }

    pub fn is_split(&self) -> bool {
        self.shards.len() > 1
    }

    /// The file's byte order (its header's; see [`Model::big_endian_data`] for its
    /// tensors').
    pub fn big_endian(&self) -> bool {
        self.shards[0].big_endian
    }

    /// Whether `t`'s bytes are still big-endian: in a big-endian file, a tensor whose
    /// format has no defined big-endian layout (`MappedModel::open` rewrote the others
    /// into the little-endian one), or any tensor of a file parsed from raw bytes.
    pub fn big_endian_data(&self, t: &TensorInfo<'_>) -> bool {
        self.big_endian()
            && !(self.data_converted
                && llamay_formats::byte_order::big_endian_fields(t.ty).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let p = Path::new("/m/model-q4-00001-of-00003.gguf");
        assert_eq!(split_pattern(p), Some(("/m/model-q4".into(), 1, 3)));
        assert_eq!(
            shard_path("/m/model-q4", 2, 3),
            PathBuf::from("/m/model-q4-00002-of-00003.gguf")
        );
        assert_eq!(split_pattern(Path::new("model.gguf")), None);
        assert_eq!(split_pattern(Path::new("a-1-of-3.gguf")), None);
    }
}
