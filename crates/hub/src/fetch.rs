//! HTTP: one client, the plain-http rule, and the download of one blob — streamed
//! through SHA-256 into the store's partial area, resumed from what an earlier pull
//! left there (`Range` trusted only on a 206 that starts where asked), retried with
//! backoff, and moved into `blobs/` only once its digest is checked.

use crate::store::Store;
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{url}: {what}")]
    Http { url: String, what: String },
    #[error("plain http ({url}) is refused without --insecure")]
    Insecure { url: String },
    #[error(
        "{what}: sha256 mismatch: expected sha256:{expected}, got sha256:{got} (the bad bytes were deleted)"
    )]
    Mismatch {
        what: String,
        expected: String,
        got: String,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Progress of one download, for a progress bar or the server's pull stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// What is fetched (a digest or a file name).
    pub what: String,
    pub done: u64,
    pub total: Option<u64>,
}

/// Bodies of JSON documents (manifests, file lists, tokens) past this are refused.
pub const MAX_DOCUMENT: u64 = 16 << 20;
const ATTEMPTS: u32 = 4;

pub struct Http {
    pub(crate) client: Client,
    insecure: bool,
}

impl Http {
    /// `insecure`: plain http allowed (`--insecure`, or an http:// hub endpoint the user
    /// set). Redirects are followed only where the same rule allows them, and drop
    /// credentials when the host changes (reqwest's policy).
    pub fn new(insecure: bool) -> Result<Self, PullError> {
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > 10 {
                attempt.error("more than 10 redirects")
            } else if attempt.url().scheme() != "https" && !insecure {
                attempt.error("a redirect to plain http is refused without --insecure")
            } else {
                attempt.follow()
            }
        });
        let client = Client::builder()
            .redirect(policy)
            .connect_timeout(Duration::from_secs(20))
            .timeout(None)
            .user_agent(concat!("llamay/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| PullError::Invalid(format!("HTTP client: {e}")))?;
        Ok(Http { client, insecure })
    }

    /// A client that does not follow redirects (HEAD for Hugging Face's linked etag).
    pub(crate) fn no_redirect_client(&self) -> Result<Client, PullError> {
        Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(20))
            .build()
            .map_err(|e| PullError::Invalid(format!("HTTP client: {e}")))
    }

    pub fn check_scheme(&self, url: &str) -> Result<(), PullError> {
        if url.starts_with("https://") || (self.insecure && url.starts_with("http://")) {
            Ok(())
        } else if url.starts_with("http://") {
            Err(PullError::Insecure { url: url.into() })
        } else {
            Err(PullError::Invalid(format!("{url}: not an http(s) URL")))
        }
    }

    /// Sends `req` (for `url`), mapping transport errors and non-success statuses.
    pub(crate) fn send(&self, url: &str, req: RequestBuilder) -> Result<Response, PullError> {
        self.check_scheme(url)?;
        let r = req.send().map_err(|e| PullError::Http {
            url: url.into(),
            what: describe(&e),
        })?;
        Ok(r)
    }

    /// A JSON document, bounded in size.
    pub(crate) fn json(
        &self,
        url: &str,
        headers: HeaderMap,
    ) -> Result<serde_json::Value, PullError> {
        let r = self.send(url, self.client.get(url).headers(headers))?;
        let status = r.status();
        if !status.is_success() {
            return Err(PullError::Http {
                url: url.into(),
                what: format!("HTTP {status}"),
            });
        }
        let mut body = Vec::new();
        r.take(MAX_DOCUMENT + 1)
            .read_to_end(&mut body)
            .map_err(|e| PullError::Http {
                url: url.into(),
                what: e.to_string(),
            })?;
        if body.len() as u64 > MAX_DOCUMENT {
            return Err(PullError::Invalid(format!(
                "{url}: the document is over {} MiB",
                MAX_DOCUMENT >> 20
            )));
        }
        serde_json::from_slice(&body)
            .map_err(|e| PullError::Invalid(format!("{url}: not JSON: {e}")))
    }

    /// Downloads `url` into the store as one blob. `expected`: the sha256 hex it must
    /// have (`None`: whatever it hashes to, for a bare URL). `key` names the partial
    /// file, so a later pull of the same thing resumes it. Returns (`sha256:<hex>`, size).
    pub fn download(
        &self,
        store: &Store,
        url: &str,
        headers: &HeaderMap,
        expected: Option<&str>,
        key: &str,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(String, u64), PullError> {
        let what = expected.map_or_else(|| url.to_string(), |e| format!("sha256:{e}"));
        if let Some(done) = have_blob(store, expected, &what, progress)? {
            return Ok(done);
        }
        let _lock = store.lock(key)?;
        // Another pull may have finished this blob while we waited for the lock.
        if let Some(done) = have_blob(store, expected, &what, progress)? {
            return Ok(done);
        }
        if let Some(total) = self.ranged_size(url, headers)
            && total >= parallel_min()
            && !store.partial_path(key).exists()
        {
            return self.download_parts(store, url, headers, expected, key, total, &what, progress);
        }
        let partial = store.partial_path(key);
        let ioerr = |source| PullError::Io {
            path: partial.clone(),
            source,
        };
        let mut last_err = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(250 << attempt));
            }
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&partial)
                .map_err(ioerr)?;
            let mut have = file.metadata().map_err(ioerr)?.len();
            let mut req = self.client.get(url).headers(headers.clone());
            if have > 0 {
                req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
            }
            let resp = match self.send(url, req) {
                Ok(r) => r,
                Err(e @ (PullError::Insecure { .. } | PullError::Invalid(_))) => return Err(e),
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let status = resp.status();
            let resumed = have > 0
                && status == reqwest::StatusCode::PARTIAL_CONTENT
                && resp
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with(&format!("bytes {have}-")));
            if status == reqwest::StatusCode::RANGE_NOT_SATISFIABLE && have > 0 {
                // What is kept is no prefix of the file: start over.
                file.set_len(0).map_err(ioerr)?;
                last_err = Some(PullError::Http {
                    url: url.into(),
                    what: "HTTP 416 on resume".into(),
                });
                continue;
            }
            if !status.is_success() {
                let e = PullError::Http {
                    url: url.into(),
                    what: format!("HTTP {status}"),
                };
                if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                    last_err = Some(e);
                    continue;
                }
                return Err(e);
            }
            let mut hasher = Sha256::new();
            if resumed {
                // Hash what is kept; the new bytes follow it.
                file.rewind().map_err(ioerr)?;
                let mut buf = vec![0u8; 1 << 20];
                let mut left = have;
                while left > 0 {
                    let n = file
                        .read(&mut buf[..left.min(1 << 20) as usize])
                        .map_err(ioerr)?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                    left -= n as u64;
                }
                file.seek(std::io::SeekFrom::Start(have)).map_err(ioerr)?;
            } else {
                // A 200 (or a 206 that starts elsewhere) is the whole file.
                file.set_len(0).map_err(ioerr)?;
                file.rewind().map_err(ioerr)?;
                have = 0;
            }
            let total = resp.content_length().map(|n| n + have);
            let mut body = resp;
            let mut buf = vec![0u8; 1 << 16];
            let mut done = have;
            let mut failed = None;
            let mut last_report = 0u64;
            loop {
                match body.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        file.write_all(&buf[..n]).map_err(ioerr)?;
                        hasher.update(&buf[..n]);
                        done += n as u64;
                        if done - last_report >= 1 << 20 {
                            last_report = done;
                            progress(Progress {
                                what: what.clone(),
                                done,
                                total,
                            });
                        }
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            file.flush().map_err(ioerr)?;
            drop(file);
            if let Some(e) = failed {
                // Keep what arrived: the next attempt (or pull) resumes it.
                last_err = Some(PullError::Http {
                    url: url.into(),
                    what: format!("transfer broke off: {e}"),
                });
                continue;
            }
            if let Some(t) = total
                && done < t
            {
                last_err = Some(PullError::Http {
                    url: url.into(),
                    what: format!("transfer ended at {done} of {t} bytes"),
                });
                continue;
            }
            progress(Progress {
                what: what.clone(),
                done,
                total: Some(done),
            });
            let got = format!("{:x}", hasher.finalize());
            if let Some(e) = expected
                && e != got
            {
                let _ = std::fs::remove_file(&partial);
                return Err(PullError::Mismatch {
                    what,
                    expected: e.into(),
                    got,
                });
            }
            let digest = format!("sha256:{got}");
            store.commit_blob(&partial, &digest)?;
            return Ok((digest, done));
        }
        Err(last_err.unwrap_or_else(|| PullError::Http {
            url: url.into(),
            what: "failed".into(),
        }))
    }
}

/// Files at least this large are fetched as [`PARTS`] parallel Range parts
/// (`LLAMAY_PULL_PARALLEL_MIN` overrides it, for tests).
pub const PARALLEL_MIN: u64 = 64 << 20;
pub const PARTS: u64 = 4;

fn parallel_min() -> u64 {
    std::env::var("LLAMAY_PULL_PARALLEL_MIN")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(PARALLEL_MIN)
}

/// `Some((digest, size))` when the expected blob is already in the store.
fn have_blob(
    store: &Store,
    expected: Option<&str>,
    what: &str,
    progress: &mut dyn FnMut(Progress),
) -> Result<Option<(String, u64)>, PullError> {
    let Some(e) = expected else { return Ok(None) };
    let digest = format!("sha256:{e}");
    let p = store.blob_path(&digest)?;
    if !p.is_file() {
        return Ok(None);
    }
    let size = std::fs::metadata(&p)
        .map_err(|source| PullError::Io {
            path: p.clone(),
            source,
        })?
        .len();
    progress(Progress {
        what: what.into(),
        done: size,
        total: Some(size),
    });
    Ok(Some((digest, size)))
}

/// Where each part stands, kept beside the partial file so a later pull resumes the
/// parts: one line `total parts`, then one `start end done` per part.
fn read_parts(path: &std::path::Path, total: u64) -> Option<Vec<(u64, u64, u64)>> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let head: Vec<u64> = lines
        .next()?
        .split(' ')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if head != [total, PARTS] {
        return None;
    }
    let parts: Vec<(u64, u64, u64)> = lines
        .map(|l| {
            let v: Vec<u64> = l
                .split(' ')
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            (v.len() == 3 && v[0] <= v[2] && v[2] <= v[1] && v[1] <= total)
                .then(|| (v[0], v[1], v[2]))
        })
        .collect::<Option<_>>()?;
    (parts.len() as u64 == PARTS).then_some(parts)
}

fn write_parts(
    path: &std::path::Path,
    total: u64,
    parts: &[(u64, u64, u64)],
) -> std::io::Result<()> {
    let mut text = format!("{total} {PARTS}\n");
    for (a, b, d) in parts {
        text.push_str(&format!("{a} {b} {d}\n"));
    }
    let tmp = path.with_extension("parts.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

impl Http {
    /// The file's size if the server answers a one-byte Range with a 206 (so parts can
    /// be fetched in parallel); `None` otherwise.
    fn ranged_size(&self, url: &str, headers: &HeaderMap) -> Option<u64> {
        let r = self
            .send(
                url,
                self.client
                    .get(url)
                    .headers(headers.clone())
                    .header(reqwest::header::RANGE, "bytes=0-0"),
            )
            .ok()?;
        if r.status() != reqwest::StatusCode::PARTIAL_CONTENT {
            return None;
        }
        let cr = r
            .headers()
            .get(reqwest::header::CONTENT_RANGE)?
            .to_str()
            .ok()?;
        cr.strip_prefix("bytes 0-0/")?.parse().ok()
    }

    /// The parallel download: [`PARTS`] Range requests write their slices of one
    /// pre-sized partial file; their progress is kept in `<key>.parts` (a killed pull
    /// resumes each part); the whole file is hashed and checked before the commit.
    #[allow(clippy::too_many_arguments)]
    fn download_parts(
        &self,
        store: &Store,
        url: &str,
        headers: &HeaderMap,
        expected: Option<&str>,
        key: &str,
        total: u64,
        what: &str,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(String, u64), PullError> {
        use std::os::unix::fs::FileExt;
        use std::sync::Mutex;
        use std::sync::atomic::{AtomicU64, Ordering};
        let partial = store.partial_path(key).with_extension("parallel");
        let sidecar = store.partial_path(key).with_extension("parts");
        let ioerr = |p: &std::path::Path| {
            let p = p.to_path_buf();
            move |source| PullError::Io { path: p, source }
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&partial)
            .map_err(ioerr(&partial))?;
        let parts = match read_parts(&sidecar, total) {
            Some(p) if file.metadata().map_err(ioerr(&partial))?.len() == total => p,
            _ => {
                file.set_len(total).map_err(ioerr(&partial))?;
                let size = total.div_ceil(PARTS);
                let p: Vec<(u64, u64, u64)> = (0..PARTS)
                    .map(|i| {
                        (
                            (i * size).min(total),
                            ((i + 1) * size).min(total),
                            (i * size).min(total),
                        )
                    })
                    .collect();
                write_parts(&sidecar, total, &p).map_err(ioerr(&sidecar))?;
                p
            }
        };
        let done: Vec<AtomicU64> = parts.iter().map(|p| AtomicU64::new(p.2)).collect();
        let saving = Mutex::new(());
        let save = |done: &[AtomicU64]| {
            let _g = saving.lock().unwrap_or_else(|e| e.into_inner());
            let now: Vec<(u64, u64, u64)> = parts
                .iter()
                .zip(done)
                .map(|(p, d)| (p.0, p.1, d.load(Ordering::SeqCst)))
                .collect();
            let _ = write_parts(&sidecar, total, &now);
        };
        let errors: Mutex<Vec<PullError>> = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for (i, &(_, end, _)) in parts.iter().enumerate() {
                let (done, file, errors, save) = (&done, &file, &errors, &save);
                handles.push(scope.spawn(move || {
                    let mut last = None;
                    for attempt in 0..ATTEMPTS {
                        let from = done[i].load(Ordering::SeqCst);
                        if from >= end {
                            return;
                        }
                        if attempt > 0 {
                            std::thread::sleep(Duration::from_millis(250 << attempt));
                        }
                        let req = self
                            .client
                            .get(url)
                            .headers(headers.clone())
                            .header(reqwest::header::RANGE, format!("bytes={from}-{}", end - 1));
                        let mut r = match self.send(url, req) {
                            Ok(r) => r,
                            Err(e) => {
                                last = Some(e);
                                continue;
                            }
                        };
                        let starts_right = r
                            .headers()
                            .get(reqwest::header::CONTENT_RANGE)
                            .and_then(|v| v.to_str().ok())
                            .is_some_and(|v| v.starts_with(&format!("bytes {from}-")));
                        if r.status() != reqwest::StatusCode::PARTIAL_CONTENT || !starts_right {
                            last = Some(PullError::Http {
                                url: url.into(),
                                what: format!("part {i}: HTTP {} to a Range request", r.status()),
                            });
                            break;
                        }
                        let mut buf = vec![0u8; 1 << 16];
                        let mut at = from;
                        let mut saved = std::time::Instant::now();
                        loop {
                            let want = ((end - at) as usize).min(buf.len());
                            if want == 0 {
                                break;
                            }
                            match r.read(&mut buf[..want]) {
                                Ok(0) => break,
                                Ok(n) => {
                                    if let Err(e) = file.write_at(&buf[..n], at) {
                                        last = Some(PullError::Io {
                                            path: PathBuf::from(url),
                                            source: e,
                                        });
                                        break;
                                    }
                                    at += n as u64;
                                    done[i].store(at, Ordering::SeqCst);
                                    // Recorded often: a kill loses at most ~100 ms of a part.
                                    if saved.elapsed() >= Duration::from_millis(100) {
                                        saved = std::time::Instant::now();
                                        save(done);
                                    }
                                }
                                Err(e) => {
                                    last = Some(PullError::Http {
                                        url: url.into(),
                                        what: format!("part {i} broke off: {e}"),
                                    });
                                    break;
                                }
                            }
                        }
                        save(done);
                        if at >= end {
                            return;
                        }
                    }
                    if let Some(e) = last {
                        errors.lock().unwrap_or_else(|e| e.into_inner()).push(e);
                    }
                }));
            }
            while handles.iter().any(|h| !h.is_finished()) {
                let sum: u64 = done
                    .iter()
                    .zip(&parts)
                    .map(|(d, p)| d.load(Ordering::SeqCst) - p.0)
                    .sum();
                progress(Progress {
                    what: what.into(),
                    done: sum,
                    total: Some(total),
                });
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        if let Some(e) = errors
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_iter()
            .next()
        {
            // The parts stay for the next pull.
            return Err(e);
        }
        progress(Progress {
            what: what.into(),
            done: total,
            total: Some(total),
        });
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < total {
            let n = file.read_at(&mut buf, at).map_err(ioerr(&partial))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            at += n as u64;
        }
        drop(file);
        let got = format!("{:x}", hasher.finalize());
        let _ = std::fs::remove_file(&sidecar);
        if let Some(e) = expected
            && e != got
        {
            let _ = std::fs::remove_file(&partial);
            return Err(PullError::Mismatch {
                what: what.into(),
                expected: e.into(),
                got,
            });
        }
        let digest = format!("sha256:{got}");
        store.commit_blob(&partial, &digest)?;
        Ok((digest, total))
    }
}

/// A reqwest error with its causes (reqwest's own message omits them).
pub(crate) fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

pub(crate) fn bearer(token: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("Bearer {token}")).ok()
}
