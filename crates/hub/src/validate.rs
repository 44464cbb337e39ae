//! `validate`: a remote GGUF's header through bounded HTTP Range requests — a few MB
//! at most, never the whole file — so its architecture, size and tensor formats (and
//! the engine's verdict, which the caller asks) are known before a pull.

use crate::fetch::PullError;
use crate::pull::{PullOptions, locate};
use llamay_gguf::{ErrorKind, GgufFile};
use reqwest::header::{CONTENT_RANGE, RANGE};
use std::io::Read;

/// The first range read; doubled while the header does not fit.
const FIRST: u64 = 1 << 20;
/// Never more than this is read.
pub const MAX_HEADER_READ: u64 = 8 << 20;

/// The start of a remote file: enough bytes for its header (parse it with
/// `GgufFile::parse_header(&bytes, len)`), its length, and the bytes read.
pub struct RemoteHeader {
    pub url: String,
    pub bytes: Vec<u8>,
    pub len: u64,
    /// Whether the server honoured Range (if not, the read was cut at the bound).
    pub ranged: bool,
}

/// Reads `given`'s header. Plain http only as `opts.insecure` (or an http hub
/// endpoint) allows, as for a pull.
pub fn remote_header(given: &str, opts: &PullOptions) -> Result<RemoteHeader, PullError> {
    let (http, url, headers) = locate(given, opts)?;
    let mut bytes: Vec<u8> = Vec::new();
    let mut want = FIRST;
    let mut ranged = true;
    loop {
        let have = bytes.len() as u64;
        let r = http.send(
            &url,
            http.client
                .get(&url)
                .headers(headers.clone())
                .header(RANGE, format!("bytes={have}-{}", want - 1)),
        )?;
        let status = r.status();
        let total = if status == reqwest::StatusCode::PARTIAL_CONTENT {
            let cr = r
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let (start, total) = cr
                .strip_prefix("bytes ")
                .and_then(|s| s.split_once('/'))
                .and_then(|(range, total)| {
                    Some((
                        range.split('-').next()?.parse::<u64>().ok()?,
                        total.parse::<u64>().ok()?,
                    ))
                })
                .ok_or_else(|| PullError::Http {
                    url: url.clone(),
                    what: format!("bad Content-Range {cr:?}"),
                })?;
            if start != have {
                return Err(PullError::Http {
                    url: url.clone(),
                    what: format!("asked for bytes from {have}, got {cr}"),
                });
            }
            r.take(want - have)
                .read_to_end(&mut bytes)
                .map_err(|e| PullError::Http {
                    url: url.clone(),
                    what: e.to_string(),
                })?;
            total
        } else if status.is_success() {
            // No Range support: read up to the bound, then hang up.
            ranged = false;
            let len = r.content_length();
            bytes.clear();
            r.take(MAX_HEADER_READ)
                .read_to_end(&mut bytes)
                .map_err(|e| PullError::Http {
                    url: url.clone(),
                    what: e.to_string(),
                })?;
            len.unwrap_or(bytes.len() as u64)
        } else {
            return Err(PullError::Http {
                url: url.clone(),
                what: format!("HTTP {status}"),
            });
        };
        // Too short: the parser says where and how much more it needed.
        let need = match GgufFile::parse_header(&bytes, total) {
            Err(e) => match e.kind {
                ErrorKind::Truncated { need, .. } => Some(e.offset.saturating_add(need)),
                _ => None,
            },
            Ok(_) => None,
        };
        let at_end = bytes.len() as u64 >= total;
        let Some(need) = need.filter(|_| !at_end && ranged && want < MAX_HEADER_READ) else {
            return Ok(RemoteHeader {
                url,
                bytes,
                len: total,
                ranged,
            });
        };
        // What the parser asked for plus a margin, and at least half again as much.
        want = need
            .saturating_add(256 << 10)
            .max(want + want / 2)
            .min(MAX_HEADER_READ)
            .min(total);
    }
}
