//! The local store (`LLAMAY_MODELS`): content-addressed blobs, one manifest per
//! reference as given to `pull`, and the resumable partial downloads — all inside the
//! store, so nothing half-downloaded is ever found where a model is looked for.
//!
//! ```text
//! blobs/sha256-<hex>             verified bytes, named by their digest
//! partial/<key>.lock             exists only while that blob is downloaded (one writer)
//! partial/<key>.partial          a download in progress (resumed by the next pull)
//! manifests/<encoded ref>.json   what a reference is: its layers' digests
//! ```

use crate::reference::check_digest;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("model store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no model {0:?} in the store (llamay list shows what is there; llamay pull fetches)")]
    NotFound(String),
    #[error("the store's manifest for {reference:?} is damaged: {what}")]
    BadManifest { reference: String, what: String },
    #[error("{0}")]
    Digest(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One layer of a stored model.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Layer {
    /// `application/vnd.ollama.image.model` for the GGUF; `.template`, `.system`,
    /// `.params`, `.license` for what registries ship beside it.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    pub size: u64,
}

pub const MODEL_LAYER: &str = "application/vnd.ollama.image.model";

/// What the store knows of a reference.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// As given to `pull`.
    pub reference: String,
    /// Where it came from, canonical (`registry.ollama.ai/library/x:latest`, a URL, ...).
    pub source: String,
    pub layers: Vec<Layer>,
    /// Seconds since the epoch.
    pub pulled: u64,
}

impl Manifest {
    pub fn model(&self) -> Option<&Layer> {
        self.layers.iter().find(|l| l.media_type == MODEL_LAYER)
    }

    pub fn size(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }
}

pub struct Store {
    root: PathBuf,
}

/// A blob's download lock: held until dropped, and its file removed then, so the store
/// is left as clean as it was.
pub struct BlobLock {
    path: PathBuf,
    _file: File,
}

impl Drop for BlobLock {
    fn drop(&mut self) {
        // Removed while still held (the file closes after this): a waiter that then
        // gets the lock finds its file gone from the store and takes a new one.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether the open `f` is the file at `p` now (not one a finished holder removed).
fn is_current(f: &File, p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (f.metadata(), std::fs::metadata(p)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (f, p);
        true
    }
}

/// A reference as a file name: bytes outside `[A-Za-z0-9._-]` as `%XX`, so no reference
/// can name a path outside `manifests/`.
fn encode(reference: &str) -> String {
    let mut out = String::new();
    for b in reference.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-') || (b == b'.' && !out.is_empty()) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl Store {
    /// `LLAMAY_MODELS`, else `$XDG_DATA_HOME/llamay/models`, else
    /// `~/.local/share/llamay/models`.
    pub fn default_root() -> PathBuf {
        if let Some(p) = std::env::var_os("LLAMAY_MODELS") {
            return PathBuf::from(p);
        }
        if let Some(p) = std::env::var_os("XDG_DATA_HOME") {
            return PathBuf::from(p).join("llamay/models");
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
        home.join(".local/share/llamay/models")
    }

    /// Opens (creating) the store at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        for d in ["blobs", "partial", "manifests"] {
            let p = root.join(d);
            std::fs::create_dir_all(&p).map_err(io(&p))?;
        }
        Ok(Store { root })
    }

    /// The store at `root` for reading only: nothing is created (a lookup of a name
    /// that is not there must not make directories).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Store { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of a verified blob (whether or not it is there).
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, StoreError> {
        let hex = check_digest(digest).map_err(StoreError::Digest)?;
        Ok(self.root.join("blobs").join(format!("sha256-{hex}")))
    }

    pub fn has_blob(&self, digest: &str) -> Result<bool, StoreError> {
        Ok(self.blob_path(digest)?.is_file())
    }

    /// Where a download keyed `key` (a digest's hex, or a hash of a URL) is kept.
    pub fn partial_path(&self, key: &str) -> PathBuf {
        debug_assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        self.root.join("partial").join(format!("{key}.partial"))
    }

    /// Blocks until this process holds `key`'s download lock (two pulls of one blob
    /// never write it at once).
    pub fn lock(&self, key: &str) -> Result<BlobLock, StoreError> {
        let p = self.root.join("partial").join(format!("{key}.lock"));
        loop {
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&p)
                .map_err(io(&p))?;
            f.lock().map_err(io(&p))?;
            if is_current(&f, &p) {
                return Ok(BlobLock { path: p, _file: f });
            }
        }
    }

    /// Moves a verified download into `blobs/` (atomic rename within the store).
    pub fn commit_blob(&self, partial: &Path, digest: &str) -> Result<PathBuf, StoreError> {
        let dest = self.blob_path(digest)?;
        std::fs::rename(partial, &dest).map_err(io(&dest))?;
        Ok(dest)
    }

    /// Writes `m` as `m.reference`'s manifest (atomically: a reader sees the old or the
    /// new one). Every layer's blob must be in the store.
    pub fn put_manifest(&self, m: &Manifest) -> Result<(), StoreError> {
        for l in &m.layers {
            if !self.has_blob(&l.digest)? {
                return Err(StoreError::BadManifest {
                    reference: m.reference.clone(),
                    what: format!("its layer {} is not in the store", l.digest),
                });
            }
        }
        let path = self.manifest_path(&m.reference);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(m).expect("a manifest serialises");
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }

    fn manifest_path(&self, reference: &str) -> PathBuf {
        self.root
            .join("manifests")
            .join(format!("{}.json", encode(reference)))
    }

    /// The manifest of `reference` exactly as it was given to `pull`.
    pub fn manifest(&self, reference: &str) -> Result<Manifest, StoreError> {
        let path = self.manifest_path(reference);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(reference.into()));
            }
            Err(e) => return Err(io(&path)(e)),
        };
        let m: Manifest = serde_json::from_str(&text).map_err(|e| StoreError::BadManifest {
            reference: reference.into(),
            what: e.to_string(),
        })?;
        for l in &m.layers {
            check_digest(&l.digest).map_err(|what| StoreError::BadManifest {
                reference: reference.into(),
                what,
            })?;
        }
        Ok(m)
    }

    /// The GGUF file of a pulled reference (no network).
    pub fn model_path(&self, reference: &str) -> Result<PathBuf, StoreError> {
        let m = self.manifest(reference)?;
        let layer = m.model().ok_or_else(|| StoreError::BadManifest {
            reference: reference.into(),
            what: "no model layer".into(),
        })?;
        let p = self.blob_path(&layer.digest)?;
        if !p.is_file() {
            return Err(StoreError::BadManifest {
                reference: reference.into(),
                what: format!("its model blob {} is missing", layer.digest),
            });
        }
        Ok(p)
    }

    /// Every manifest, sorted by reference.
    pub fn list(&self) -> Result<Vec<Manifest>, StoreError> {
        let dir = self.root.join("manifests");
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io(&dir)(e)),
        };
        for e in entries {
            let e = e.map_err(io(&dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            let Some(reference) = decode(stem) else {
                continue;
            };
            out.push(self.manifest(&reference)?);
        }
        out.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(out)
    }

    /// Removes `reference`'s manifest, and each of its blobs no other manifest uses.
    /// Returns the blobs removed.
    pub fn remove(&self, reference: &str) -> Result<Vec<String>, StoreError> {
        let m = self.manifest(reference)?;
        let path = self.manifest_path(reference);
        std::fs::remove_file(&path).map_err(io(&path))?;
        let others = self.list()?;
        let mut removed = Vec::new();
        for l in &m.layers {
            if others
                .iter()
                .any(|o| o.layers.iter().any(|x| x.digest == l.digest))
            {
                continue;
            }
            let p = self.blob_path(&l.digest)?;
            match std::fs::remove_file(&p) {
                Ok(()) => removed.push(l.digest.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&p)(e)),
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(b: u8) -> String {
        format!("sha256:{}", format!("{b:02x}").repeat(32))
    }

    #[test]
    fn manifests_blobs_and_shared_removal() {
        let dir = std::env::temp_dir().join(format!("llamay-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let s = Store::open(&dir).unwrap();
        for b in [1, 2] {
            std::fs::write(s.blob_path(&digest(b)).unwrap(), [b]).unwrap();
        }
        let layer = |b: u8| Layer {
            media_type: MODEL_LAYER.into(),
            digest: digest(b),
            size: 1,
        };
        let m = |r: &str, layers| Manifest {
            reference: r.into(),
            source: r.into(),
            layers,
            pulled: 0,
        };
        s.put_manifest(&m("a/b:c", vec![layer(1)])).unwrap();
        s.put_manifest(&m("hf.co/o/r:Q8_0", vec![layer(1)]))
            .unwrap();
        s.put_manifest(&m("../../etc/x", vec![layer(2)])).unwrap();
        assert!(
            dir.join("manifests").read_dir().unwrap().count() == 3,
            "nothing written outside manifests/"
        );
        let refs: Vec<String> = s.list().unwrap().into_iter().map(|m| m.reference).collect();
        assert_eq!(refs, ["../../etc/x", "a/b:c", "hf.co/o/r:Q8_0"]);
        assert_eq!(
            s.model_path("a/b:c").unwrap(),
            s.blob_path(&digest(1)).unwrap()
        );
        // A blob two references use survives the first removal.
        assert!(s.remove("a/b:c").unwrap().is_empty());
        assert!(s.has_blob(&digest(1)).unwrap());
        assert_eq!(s.remove("hf.co/o/r:Q8_0").unwrap(), [digest(1)]);
        assert!(!s.has_blob(&digest(1)).unwrap());
        assert!(matches!(
            s.model_path("a/b:c"),
            Err(StoreError::NotFound(_))
        ));
        // A manifest whose blob is absent is refused.
        assert!(s.put_manifest(&m("x", vec![layer(9)])).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn encoding_round_trips() {
        for r in ["a/b:c", "../x", ".hidden", "hf:o/r/f.gguf@main", "ünï"] {
            let e = encode(r);
            assert!(!e.contains('/') && !e.starts_with('.'), "{e}");
            assert_eq!(decode(&e).unwrap(), r);
        }
    }
}
