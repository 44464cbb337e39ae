//! Safe by default: while bound to loopback, only requests naming a loopback host are
//! served (a DNS-rebinding page names its own); `--api-key` is required of every route
//! but `/health` and `/metrics` (the inference gateway's scraper sends no credentials,
//! as vLLM's `/metrics` takes none); bodies over `--max-body` are refused with 413 before they are read;
//! CORS admits localhost origins and those `--cors-origin` adds.

use crate::AppState;
use crate::error::{ApiError, OaiError};
use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};

/// `localhost`, `127.0.0.1` or `[::1]`, with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, port)) if port.is_empty() || valid_port(port) => return h == "::1",
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((h, port)) if valid_port(port) => h,
            Some(_) => return false,
            None => host,
        }
    };
    name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1"
}

fn valid_port(p: &str) -> bool {
    p.strip_prefix(':')
        .unwrap_or(p)
        .parse::<u16>()
        .is_ok_and(|_| !p.is_empty())
}

/// An origin (`scheme://host[:port]`) on a loopback host.
fn is_loopback_origin(origin: &str) -> bool {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    rest.is_some_and(is_loopback_host)
}

/// Constant-time comparison (the length is not secret).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut d = 0u8;
    for (x, y) in a.iter().zip(b) {
        d |= x ^ y;
    }
    std::hint::black_box(d) == 0
}

fn presented_key(h: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = h.get(header::AUTHORIZATION) {
        let v = v.as_bytes();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
            return Some(&v[7..]);
        }
    }
    h.get("x-api-key").map(HeaderValue::as_bytes)
}

/// An error in the shape the route's API uses.
fn refuse(path: &str, e: ApiError) -> Response {
    if path.starts_with("/v1/") {
        OaiError(e).into_response()
    } else {
        e.into_response()
    }
}

async fn check(
    axum::extract::State((state, loopback)): axum::extract::State<(Arc<AppState>, bool)>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path().to_string();
    if loopback
        && let Some(host) = req.headers().get(header::HOST)
        && !host.to_str().is_ok_and(is_loopback_host)
    {
        return refuse(
            &path,
            ApiError::new(
                StatusCode::FORBIDDEN,
                "this server listens on loopback and serves only requests for localhost, 127.0.0.1 or [::1] (Host header); bind another --host to serve others",
            ),
        );
    }
    if let Some(key) = &state.config.api_key
        && path != "/health"
        && path != "/metrics"
        && req.method() != axum::http::Method::OPTIONS
        && !presented_key(req.headers()).is_some_and(|k| same_secret(k, key.as_bytes()))
    {
        let mut r = refuse(
            &path,
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key: send Authorization: Bearer KEY or X-Api-Key: KEY",
            ),
        );
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return r;
    }
    let max = state.config.max_body;
    if let Some(n) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok())
        && n > max as u64
    {
        return refuse(&path, too_large(max));
    }
    next.run(req).await
}

pub fn too_large(max: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body larger than {max} bytes (--max-body)"),
    )
}

/// Wraps `api` in the guards and CORS.
pub fn apply(
    api: Router<Arc<AppState>>,
    state: Arc<AppState>,
    loopback: bool,
) -> Router<Arc<AppState>> {
    let extra: Vec<String> = state.config.cors_origins.clone();
    let any = extra.iter().any(|o| o == "*");
    let cors = CorsLayer::new()
        .allow_methods(AllowMethods::mirror_request())
        .allow_headers(AllowHeaders::mirror_request())
        .allow_origin(AllowOrigin::predicate(move |origin, _| {
            let o = origin.to_str().unwrap_or("");
            any || is_loopback_origin(o) || extra.iter().any(|e| e == o)
        }));
    api.layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(
            (state, loopback),
            check,
        ))
        .layer(cors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_with_and_without_ports() {
        for h in [
            "localhost",
            "localhost:11434",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:11434",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "evil.com",
            "localhost.evil.com",
            "127.0.0.1.nip.io",
            "[::2]",
            "localhost:",
            "localhost:99999",
            "::1",
            "127.0.0.2",
            "",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn origins_and_secrets() {
        assert!(is_loopback_origin("http://localhost:3000"));
        assert!(is_loopback_origin("https://127.0.0.1"));
        assert!(!is_loopback_origin("http://example.com"));
        assert!(!is_loopback_origin("localhost"));
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
    }
}
