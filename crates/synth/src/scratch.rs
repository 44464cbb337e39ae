//! Scratch paths for tests: a name under the system temp directory, unique to the
//! process, removed (file or directory) when the guard drops, so a test run leaves
//! nothing behind — not even when an assertion fails, since unwinding drops it too.

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};

/// `$TMPDIR/llamay-<pid>-<name>`, removed on drop.
#[derive(Debug)]
pub struct TempPath(PathBuf);

impl TempPath {
    /// The path for `name` (nothing is created; anything already there is removed, a
    /// leftover of an earlier process with the same id).
    pub fn new(name: &str) -> TempPath {
        let p = std::env::temp_dir().join(format!("llamay-{}-{name}", std::process::id()));
        remove(&p);
        TempPath(p)
    }

    /// As [`TempPath::new`], and creates the directory.
    pub fn dir(name: &str) -> TempPath {
        let t = TempPath::new(name);
        std::fs::create_dir_all(&t.0).expect("creating a scratch directory");
        t
    }

    /// As [`TempPath::new`], and writes `bytes` there.
    pub fn file(name: &str, bytes: impl AsRef<[u8]>) -> TempPath {
        let t = TempPath::new(name);
        std::fs::write(&t.0, bytes).expect("writing a scratch file");
        t
    }
}

fn remove(p: &Path) {
    if p.is_dir() {
        let _ = std::fs::remove_dir_all(p);
    } else {
        let _ = std::fs::remove_file(p);
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        remove(&self.0);
    }
}

impl Deref for TempPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for TempPath {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_directories_go_when_the_guard_drops() {
        let f = TempPath::file("scratch-test.txt", "x");
        let d = TempPath::dir("scratch-test-dir");
        std::fs::write(d.join("inner"), "y").unwrap();
        let (fp, dp) = (f.to_path_buf(), d.to_path_buf());
        assert!(fp.is_file() && dp.join("inner").is_file());
        drop((f, d));
        assert!(!fp.exists() && !dp.exists());
    }
}
