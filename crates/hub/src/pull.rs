//! `pull`: a reference's files fetched into the store, verified, then its manifest
//! written — the last step, so an interrupted pull is never listed.

use crate::fetch::{Http, Progress, PullError, bearer};
use crate::reference::{Reference, check_digest};
use crate::store::{Layer, MODEL_LAYER, Manifest, Store};
use reqwest::Url;
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderMap, HeaderValue, WWW_AUTHENTICATE};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Where and how to pull.
#[derive(Clone, Debug, Default)]
pub struct PullOptions {
    /// Plain-http registries and URLs allowed.
    pub insecure: bool,
    /// Hugging Face endpoint (`LLAMAY_HF_ENDPOINT`; default `https://huggingface.co`).
    pub hf_endpoint: Option<String>,
    /// `HF_TOKEN`: sent to the hub host only.
    pub hf_token: Option<String>,
}

impl PullOptions {
    /// From the environment (`LLAMAY_HF_ENDPOINT`, `HF_TOKEN`).
    pub fn from_env(insecure: bool) -> Self {
        PullOptions {
            insecure,
            hf_endpoint: std::env::var("LLAMAY_HF_ENDPOINT")
                .ok()
                .filter(|s| !s.is_empty()),
            hf_token: std::env::var("HF_TOKEN").ok().filter(|s| !s.is_empty()),
        }
    }

    fn endpoint(&self) -> String {
        self.hf_endpoint
            .clone()
            .unwrap_or_else(|| "https://huggingface.co".into())
            .trim_end_matches('/')
            .to_string()
    }
}

const MANIFEST_V2: &str = "application/vnd.docker.distribution.manifest.v2+json";
const LAYER_TYPES: [&str; 5] = [
    MODEL_LAYER,
    "application/vnd.ollama.image.template",
    "application/vnd.ollama.image.system",
    "application/vnd.ollama.image.params",
    "application/vnd.ollama.image.license",
];

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn key_of(s: &str) -> String {
    format!("url-{:x}", Sha256::digest(s.as_bytes()))
}

/// Pulls `given` (as the user wrote it) into `store`; returns its manifest.
pub fn pull(
    store: &Store,
    given: &str,
    opts: &PullOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Manifest, PullError> {
    let reference = Reference::parse_name(given).map_err(|e| PullError::Invalid(e.to_string()))?;
    let layers = match &reference {
        Reference::Path(_) => {
            return Err(PullError::Invalid(format!(
                "{given}: a local file needs no pull"
            )));
        }
        Reference::Url(url) => {
            let http = Http::new(opts.insecure)?;
            let (digest, size) =
                http.download(store, url, &HeaderMap::new(), None, &key_of(url), progress)?;
            vec![Layer {
                media_type: MODEL_LAYER.into(),
                digest,
                size,
            }]
        }
        Reference::HfRepo { owner, repo, quant } => {
            let (http, ep, auth) = hf_client(opts)?;
            let (url, sha) = hf_quant_file(&http, &ep, &auth, (owner, repo, quant), given)?;
            vec![hf_download(
                store,
                &http,
                &url,
                &auth,
                sha.as_deref(),
                progress,
            )?]
        }
        Reference::HfFile {
            owner,
            repo,
            file,
            revision,
        } => {
            let (http, ep, auth) = hf_client(opts)?;
            let rev = revision.as_deref().unwrap_or("main");
            let url = hf_resolve(&ep, owner, repo, rev, file);
            let sha = match linked_etag(&http, &url, &auth)? {
                Some(s) => Some(s),
                None => {
                    hf_files(&http, &ep, &auth, owner, repo, rev)?
                        .into_iter()
                        .find(|(p, _, _)| p == file)
                        .ok_or_else(|| {
                            PullError::Invalid(format!(
                                "{given}: no file {file} in {owner}/{repo} at {rev}"
                            ))
                        })?
                        .1
                }
            };
            vec![hf_download(
                store,
                &http,
                &url,
                &auth,
                sha.as_deref(),
                progress,
            )?]
        }
        Reference::Registry {
            host,
            namespace,
            name,
            tag,
        } => registry_pull(store, opts, (host, namespace, name, tag), progress)?,
    };
    check_gguf(store, &layers)?;
    let m = Manifest {
        reference: given.to_string(),
        source: reference.to_string(),
        layers,
        pulled: now(),
    };
    store.put_manifest(&m)?;
    Ok(m)
}

/// The model blob must start as a GGUF: an HTML error page or a wrong file is refused
/// (and its blob deleted, unless another reference uses it).
fn check_gguf(store: &Store, layers: &[Layer]) -> Result<(), PullError> {
    let model = layers
        .iter()
        .find(|l| l.media_type == MODEL_LAYER)
        .ok_or_else(|| PullError::Invalid("the manifest has no model layer".into()))?;
    let p = store.blob_path(&model.digest)?;
    let mut magic = [0u8; 4];
    let ok = std::fs::File::open(&p)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"GGUF";
    if !ok {
        let used = store
            .list()?
            .iter()
            .any(|m| m.layers.iter().any(|l| l.digest == model.digest));
        if !used {
            let _ = std::fs::remove_file(&p);
        }
        return Err(PullError::Invalid(format!(
            "{}: the downloaded file is not a GGUF file",
            model.digest
        )));
    }
    Ok(())
}

fn host_of(url: &str) -> Option<String> {
    let u = Url::parse(url).ok()?;
    Some(match u.port() {
        Some(p) => format!("{}:{p}", u.host_str()?),
        None => u.host_str()?.to_string(),
    })
}

/// The client for the hub (plain http only when the user's endpoint is http), the
/// endpoint, and the token header for the hub host.
fn hf_client(opts: &PullOptions) -> Result<(Http, String, HeaderMap), PullError> {
    let ep = opts.endpoint();
    let http = Http::new(opts.insecure || ep.starts_with("http://"))?;
    let mut auth = HeaderMap::new();
    if let Some(t) = &opts.hf_token
        && let Some(v) = bearer(t)
    {
        auth.insert(AUTHORIZATION, v);
    }
    Ok((http, ep, auth))
}

/// (path, sha256 hex of its LFS object if known, size) of every file in a repository.
fn hf_files(
    http: &Http,
    ep: &str,
    auth: &HeaderMap,
    owner: &str,
    repo: &str,
    rev: &str,
) -> Result<Vec<(String, Option<String>, u64)>, PullError> {
    let url = format!("{ep}/api/models/{owner}/{repo}/tree/{rev}?recursive=true");
    let v = http.json(&url, auth.clone())?;
    let items = v
        .as_array()
        .ok_or_else(|| PullError::Invalid(format!("{url}: not a list of files")))?;
    let mut out = Vec::new();
    for it in items {
        if it.get("type").and_then(Value::as_str) != Some("file") {
            continue;
        }
        let Some(path) = it.get("path").and_then(Value::as_str) else {
            continue;
        };
        let lfs = it.get("lfs");
        let sha = lfs
            .and_then(|l| l.get("oid").or_else(|| l.get("sha256")))
            .and_then(Value::as_str)
            .map(str::to_string);
        let size = lfs
            .and_then(|l| l.get("size"))
            .or_else(|| it.get("size"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        out.push((path.to_string(), sha, size));
    }
    Ok(out)
}

/// The repository's GGUF for `quant`, as llama.cpp picks it: the name contains the
/// quantisation (any case) followed by `.` or `-`; `mmproj`/`imatrix` files skipped.
fn pick_quant(
    files: &[(String, Option<String>, u64)],
    quant: &str,
) -> Result<(String, Option<String>, u64), String> {
    let q = quant.to_ascii_lowercase();
    let ggufs: Vec<&(String, Option<String>, u64)> = files
        .iter()
        .filter(|(p, _, _)| {
            let n = p.rsplit('/').next().unwrap_or(p).to_ascii_lowercase();
            n.ends_with(".gguf") && !n.contains("mmproj") && !n.contains("imatrix")
        })
        .collect();
    let mut hits: Vec<&&(String, Option<String>, u64)> = ggufs
        .iter()
        .filter(|(p, _, _)| {
            let n = p.rsplit('/').next().unwrap_or(p).to_ascii_lowercase();
            [".", "-"].iter().any(|s| n.contains(&format!("{q}{s}")))
        })
        .collect();
    hits.sort_by(|a, b| a.0.cmp(&b.0));
    match hits.first() {
        Some(h) if h.0.to_ascii_lowercase().contains("-00001-of-") => Err(format!(
            "{} is the first of a split GGUF set, which pull does not fetch yet",
            h.0
        )),
        Some(h) => Ok((h.0.clone(), h.1.clone(), h.2)),
        None => Err(format!(
            "no .gguf file for quantisation {quant}; the repository has: {}",
            ggufs
                .iter()
                .map(|f| f.0.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// A file's download URL on the hub.
fn hf_resolve(ep: &str, owner: &str, repo: &str, rev: &str, file: &str) -> String {
    format!("{ep}/{owner}/{repo}/resolve/{rev}/{file}")
}

/// `hf.co/owner/repo:quant`: the picked file's URL and its LFS sha256 when listed.
fn hf_quant_file(
    http: &Http,
    ep: &str,
    auth: &HeaderMap,
    (owner, repo, quant): (&str, &str, &str),
    given: &str,
) -> Result<(String, Option<String>), PullError> {
    let files = hf_files(http, ep, auth, owner, repo, "main")?;
    let (path, sha, _) =
        pick_quant(&files, quant).map_err(|what| PullError::Invalid(format!("{given}: {what}")))?;
    Ok((hf_resolve(ep, owner, repo, "main", &path), sha))
}

/// Hugging Face's `X-Linked-Etag` (the LFS object's sha256) from a HEAD that does not
/// follow the redirect to the CDN.
fn linked_etag(http: &Http, url: &str, auth: &HeaderMap) -> Result<Option<String>, PullError> {
    http.check_scheme(url)?;
    let c = http.no_redirect_client()?;
    let r = c
        .head(url)
        .headers(auth.clone())
        .send()
        .map_err(|e| PullError::Http {
            url: url.into(),
            what: crate::fetch::describe(&e),
        })?;
    if r.status().is_client_error() {
        return Err(PullError::Http {
            url: url.into(),
            what: format!("HTTP {}", r.status()),
        });
    }
    let tag = r
        .headers()
        .get("x-linked-etag")
        .and_then(|v| v.to_str().ok())
        .map(|s| {
            s.trim_matches('"')
                .trim_start_matches("W/")
                .trim_matches('"')
                .to_string()
        });
    Ok(tag
        .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|t| t.to_ascii_lowercase()))
}

fn hf_download(
    store: &Store,
    http: &Http,
    url: &str,
    auth: &HeaderMap,
    sha: Option<&str>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Layer, PullError> {
    if let Some(s) = sha {
        check_digest(&format!("sha256:{s}")).map_err(PullError::Invalid)?;
    }
    let key = match sha {
        Some(s) => format!("sha256-{s}"),
        None => key_of(url),
    };
    let (digest, size) = http.download(store, url, auth, sha, &key, progress)?;
    Ok(Layer {
        media_type: MODEL_LAYER.into(),
        digest,
        size,
    })
}

/// Ollama's bearer challenge: `Bearer realm="…",service="…",scope="…"`. The realm must
/// be on the registry's own host.
fn bearer_token(http: &Http, registry: &str, challenge: &str) -> Result<String, PullError> {
    let rest = challenge.strip_prefix("Bearer ").ok_or_else(|| {
        PullError::Invalid(format!(
            "{registry}: unsupported auth challenge {challenge:?}"
        ))
    })?;
    let mut realm = None;
    let mut query = Vec::new();
    for part in rest.split(',') {
        let Some((k, v)) = part.trim().split_once('=') else {
            continue;
        };
        let v = v.trim_matches('"');
        match k {
            "realm" => realm = Some(v.to_string()),
            "service" | "scope" => query.push((k.to_string(), v.to_string())),
            _ => {}
        }
    }
    let realm = realm.ok_or_else(|| {
        PullError::Invalid(format!("{registry}: the auth challenge has no realm"))
    })?;
    let realm_host = host_of(&realm).unwrap_or_default();
    let reg_host = registry.split(':').next().unwrap_or(registry);
    if realm_host.split(':').next() != Some(reg_host) {
        return Err(PullError::Invalid(format!(
            "{registry}: the token realm {realm} is on another host; refused (credentials go to the registry's host only)"
        )));
    }
    let mut url =
        Url::parse(&realm).map_err(|e| PullError::Invalid(format!("realm {realm}: {e}")))?;
    for (k, v) in &query {
        url.query_pairs_mut().append_pair(k, v);
    }
    let v = http.json(url.as_str(), HeaderMap::new())?;
    v.get("token")
        .or_else(|| v.get("access_token"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| PullError::Invalid(format!("{realm}: no token in the answer")))
}

/// A registry model's manifest: the blob URL base, the headers (a bearer token when
/// the registry asked for one) and the layers llamay keeps, every digest checked.
fn registry_manifest(
    http: &Http,
    opts: &PullOptions,
    (host, namespace, name, tag): (&str, &str, &str, &str),
) -> Result<(String, HeaderMap, Vec<Layer>), PullError> {
    let scheme = if opts.insecure { "http" } else { "https" };
    let base = format!("{scheme}://{host}/v2/{namespace}/{name}");
    let murl = format!("{base}/manifests/{tag}");
    let mut headers = HeaderMap::new();
    headers.insert(ACCEPT, HeaderValue::from_static(MANIFEST_V2));
    let first = http
        .send(&murl, http.client.get(&murl).headers(headers.clone()))
        .map_err(|e| match e {
            PullError::Http { url, what } if !opts.insecure => PullError::Http {
                url,
                what: format!("{what} (a registry that serves plain http needs --insecure)"),
            },
            e => e,
        })?;
    if first.status() == reqwest::StatusCode::UNAUTHORIZED
        && let Some(ch) = first
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
    {
        let token = bearer_token(http, host, ch)?;
        if let Some(v) = bearer(&token) {
            headers.insert(AUTHORIZATION, v);
        }
    } else if first.status() == reqwest::StatusCode::NOT_FOUND {
        return Err(PullError::Http {
            url: murl,
            what: format!("no model {namespace}/{name}:{tag} in the registry"),
        });
    }
    let manifest = http.json(&murl, headers.clone())?;
    let layers = manifest
        .get("layers")
        .and_then(Value::as_array)
        .ok_or_else(|| PullError::Invalid(format!("{murl}: the manifest has no layers")))?;
    // Every digest checked before any path is built or byte written.
    let mut wanted = Vec::new();
    for l in layers {
        let media = l.get("mediaType").and_then(Value::as_str).unwrap_or("");
        let digest = l.get("digest").and_then(Value::as_str).unwrap_or("");
        let size = l.get("size").and_then(Value::as_u64).unwrap_or(0);
        check_digest(digest).map_err(|e| PullError::Invalid(format!("{murl}: {e}")))?;
        if LAYER_TYPES.contains(&media) {
            wanted.push(Layer {
                media_type: media.into(),
                digest: digest.into(),
                size,
            });
        }
    }
    if !wanted.iter().any(|l| l.media_type == MODEL_LAYER) {
        return Err(PullError::Invalid(format!(
            "{murl}: the manifest has no {MODEL_LAYER} layer"
        )));
    }
    Ok((base, headers, wanted))
}

fn registry_pull(
    store: &Store,
    opts: &PullOptions,
    at: (&str, &str, &str, &str),
    progress: &mut dyn FnMut(Progress),
) -> Result<Vec<Layer>, PullError> {
    let http = Http::new(opts.insecure)?;
    let (base, headers, wanted) = registry_manifest(&http, opts, at)?;
    let mut out = Vec::new();
    for l in wanted {
        let hex = check_digest(&l.digest)
            .map_err(PullError::Invalid)?
            .to_string();
        let url = format!("{base}/blobs/{}", l.digest);
        let (digest, size) = http.download(
            store,
            &url,
            &headers,
            Some(&hex),
            &format!("sha256-{hex}"),
            progress,
        )?;
        out.push(Layer {
            media_type: l.media_type,
            digest,
            size,
        });
    }
    Ok(out)
}

/// Where a reference's GGUF is served: the client, the URL and the headers to send.
pub(crate) fn locate(
    given: &str,
    opts: &PullOptions,
) -> Result<(Http, String, HeaderMap), PullError> {
    let reference = Reference::parse_name(given).map_err(|e| PullError::Invalid(e.to_string()))?;
    match &reference {
        Reference::Path(_) => Err(PullError::Invalid(format!(
            "{given}: a local file (llamay info reads it)"
        ))),
        Reference::Url(url) => Ok((Http::new(opts.insecure)?, url.clone(), HeaderMap::new())),
        Reference::HfRepo { owner, repo, quant } => {
            let (http, ep, auth) = hf_client(opts)?;
            let (url, _) = hf_quant_file(&http, &ep, &auth, (owner, repo, quant), given)?;
            Ok((http, url, auth))
        }
        Reference::HfFile {
            owner,
            repo,
            file,
            revision,
        } => {
            let (http, ep, auth) = hf_client(opts)?;
            let rev = revision.as_deref().unwrap_or("main");
            Ok((http, hf_resolve(&ep, owner, repo, rev, file), auth))
        }
        Reference::Registry {
            host,
            namespace,
            name,
            tag,
        } => {
            let http = Http::new(opts.insecure)?;
            let (base, headers, layers) =
                registry_manifest(&http, opts, (host, namespace, name, tag))?;
            let model = layers
                .iter()
                .find(|l| l.media_type == MODEL_LAYER)
                .expect("checked above");
            Ok((http, format!("{base}/blobs/{}", model.digest), headers))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantisation_is_picked_as_llama_cpp_picks_it() {
        let f = |names: &[&str]| {
            names
                .iter()
                .map(|n| (n.to_string(), None, 0))
                .collect::<Vec<_>>()
        };
        let files = f(&[
            "README.md",
            "m-Q4_K_M.gguf",
            "m-q8_0.gguf",
            "mmproj-m-Q4_K_M.gguf",
            "m-Q4_K_M-imatrix.gguf",
            "m-Q4_K.gguf",
        ]);
        assert_eq!(pick_quant(&files, "Q4_K_M").unwrap().0, "m-Q4_K_M.gguf");
        assert_eq!(pick_quant(&files, "Q8_0").unwrap().0, "m-q8_0.gguf");
        assert_eq!(
            pick_quant(&files, "q4_k").unwrap().0,
            "m-Q4_K.gguf",
            "Q4_K is not Q4_K_M's prefix match"
        );
        let e = pick_quant(&files, "IQ2_XS").unwrap_err();
        assert!(
            e.contains("no .gguf file for quantisation IQ2_XS") && e.contains("m-q8_0.gguf"),
            "{e}"
        );
        let split = f(&["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"]);
        assert!(pick_quant(&split, "Q8_0").unwrap_err().contains("split"));
    }

    #[test]
    fn a_token_realm_on_another_host_is_refused() {
        let http = Http::new(false).unwrap();
        let e = bearer_token(
            &http,
            "registry.example",
            "Bearer realm=\"https://evil.example/token\",service=\"x\"",
        )
        .unwrap_err();
        assert!(e.to_string().contains("another host"), "{e}");
    }
}
