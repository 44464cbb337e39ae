//! Model references: one grammar for the five source forms, with errors that name the
//! part that is wrong.
//!
//! - a path: a file that exists always wins over a name;
//! - `https://…` (`http://…` only when the pull says `--insecure`): a GGUF at a URL;
//! - `hf.co/<owner>/<repo>[:<quant>]` (also `huggingface.co/`): a Hugging Face
//!   repository, the tag picking the quantisation (Q4_K_M by default);
//! - `hf:<owner>/<repo>/<path/file.gguf>[@<revision>]`: one file, optionally pinned;
//! - `[host[:port]/][namespace/]name[:tag]`: an Ollama-style registry
//!   (`registry.ollama.ai`, namespace `library`, tag `latest` by default).

use std::fmt;
use std::path::{Path, PathBuf};

pub const DEFAULT_REGISTRY: &str = "registry.ollama.ai";
pub const DEFAULT_NAMESPACE: &str = "library";
pub const DEFAULT_TAG: &str = "latest";
pub const DEFAULT_QUANT: &str = "Q4_K_M";
/// References longer than this are refused (they are outside input).
const MAX_LEN: usize = 2048;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reference {
    Path(PathBuf),
    Url(String),
    HfRepo {
        owner: String,
        repo: String,
        quant: String,
    },
    HfFile {
        owner: String,
        repo: String,
        file: String,
        revision: Option<String>,
    },
    Registry {
        /// `host` or `host:port`.
        host: String,
        namespace: String,
        name: String,
        tag: String,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("model reference {reference:?}: {what}")]
pub struct RefError {
    pub reference: String,
    pub what: String,
}

/// Letters, digits, `_`, `-`, `.`; starting with a letter or digit.
fn is_name(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !s.contains("..")
}

fn is_host(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
        && port
            .is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.chars().all(|c| c.is_ascii_digit()))
}

impl Reference {
    /// Parses a reference. A path that exists is a path whatever it looks like.
    pub fn parse(s: &str) -> Result<Self, RefError> {
        if Path::new(s).is_file() {
            return Ok(Reference::Path(PathBuf::from(s)));
        }
        Self::parse_name(s)
    }

    /// Parses a reference without looking at the file system. Its canonical form (every
    /// default spelled out, what the store and the APIs show) is held to the same length
    /// limit, so whatever parses here parses again from what it prints.
    pub fn parse_name(s: &str) -> Result<Self, RefError> {
        let r = Self::parse_as_written(s)?;
        let canonical = r.to_string().len();
        if canonical > MAX_LEN {
            return Err(RefError {
                reference: s.chars().take(200).collect(),
                what: format!(
                    "{canonical} bytes with its defaults spelled out, longer than {MAX_LEN}"
                ),
            });
        }
        Ok(r)
    }

    fn parse_as_written(s: &str) -> Result<Self, RefError> {
        let err = |what: String| RefError {
            reference: s.chars().take(200).collect(),
            what,
        };
        if s.is_empty() {
            return Err(err("empty".into()));
        }
        if s.len() > MAX_LEN {
            return Err(err(format!("longer than {MAX_LEN} bytes")));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(err("contains whitespace or control characters".into()));
        }
        if s.starts_with("https://") || s.starts_with("http://") {
            let rest = s.split_once("://").map_or("", |(_, r)| r);
            let host = rest.split(['/', '?', '#']).next().unwrap_or("");
            if host.is_empty() || host.contains('@') || !is_host(host) {
                return Err(err(format!(
                    "the URL's host {host:?} is not a host name[:port]"
                )));
            }
            return Ok(Reference::Url(s.to_string()));
        }
        if s.contains("://") {
            return Err(err(
                "only https:// (or http:// with --insecure) URLs are fetched".into(),
            ));
        }
        // The scheme ignores case, as URL schemes do: "hF:7/r/s" is not registry host
        // "hF" port 7, whose canonical (lower-cased) form would then read as hf:.
        let hf_file = (s.get(..3))
            .filter(|p| p.eq_ignore_ascii_case("hf:"))
            .map(|_| &s[3..]);
        if let Some(rest) = hf_file {
            let (path, revision) = match rest.split_once('@') {
                Some((p, r)) => (p, Some(r)),
                None => (rest, None),
            };
            let parts: Vec<&str> = path.split('/').collect();
            if parts.len() < 3 {
                return Err(err("hf: needs owner/repo/file.gguf".into()));
            }
            let (owner, repo) = (parts[0], parts[1]);
            if !is_name(owner) || !is_name(repo) {
                return Err(err(format!(
                    "hf: owner/repo {owner:?}/{repo:?} is not a repository name"
                )));
            }
            let file = parts[2..].join("/");
            if parts[2..]
                .iter()
                .any(|p| p.is_empty() || *p == "." || *p == ".." || !is_name(p))
            {
                return Err(err(format!(
                    "hf: file path {file:?} has an empty, '.', '..' or odd segment"
                )));
            }
            if !file.to_ascii_lowercase().ends_with(".gguf") {
                return Err(err(format!("hf: file {file:?} is not a .gguf file")));
            }
            if let Some(r) = revision
                && (r.is_empty()
                    || !r
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
                    || r.contains(".."))
            {
                return Err(err(format!(
                    "hf: revision {r:?} is neither a branch name nor a commit"
                )));
            }
            return Ok(Reference::HfFile {
                owner: owner.into(),
                repo: repo.into(),
                file,
                revision: revision.map(str::to_string),
            });
        }
        for prefix in ["hf.co/", "huggingface.co/"] {
            // Host names ignore case: "HF.CO/o/r" is this repository too, not a registry
            // reference whose canonical (lower-cased) host would then read as one.
            let rest = (s.get(..prefix.len()))
                .filter(|p| p.eq_ignore_ascii_case(prefix))
                .map(|_| &s[prefix.len()..]);
            if let Some(rest) = rest {
                let (path, quant) = match rest.split_once(':') {
                    Some((p, q)) => (p, q),
                    None => (rest, DEFAULT_QUANT),
                };
                let parts: Vec<&str> = path.split('/').collect();
                if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
                    return Err(err(format!("{prefix} needs exactly owner/repo")));
                }
                if !is_name(parts[0]) || !is_name(parts[1]) {
                    return Err(err(format!("{prefix}{path} is not a repository name")));
                }
                if !is_name(quant) || quant.contains(':') {
                    return Err(err(format!(
                        "the quantisation tag {quant:?} is not a name (e.g. Q4_K_M)"
                    )));
                }
                return Ok(Reference::HfRepo {
                    owner: parts[0].into(),
                    repo: parts[1].into(),
                    quant: quant.into(),
                });
            }
        }
        // [host[:port]/][namespace/]name[:tag]
        let parts: Vec<&str> = s.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(err("an empty part between '/'".into()));
        }
        let (host, namespace, last) = match parts.as_slice() {
            [last] => (DEFAULT_REGISTRY, DEFAULT_NAMESPACE, *last),
            [ns, last] => (DEFAULT_REGISTRY, *ns, *last),
            [host, ns, last] => (*host, *ns, *last),
            _ => {
                return Err(err(
                    "a registry reference is [host/][namespace/]name[:tag]: too many '/'".into(),
                ));
            }
        };
        if !is_host(host) {
            return Err(err(format!(
                "the registry host {host:?} is not host[:port]"
            )));
        }
        let (name, tag) = match last.split_once(':') {
            None => (last, DEFAULT_TAG),
            Some((_, t)) if t.contains(':') => {
                return Err(err(format!("more than one ':' in {last:?}")));
            }
            Some((n, t)) => (n, t),
        };
        if !is_name(namespace) {
            return Err(err(format!("the namespace {namespace:?} is not a name")));
        }
        if !is_name(name) {
            return Err(err(format!(
                "the model name {name:?} is not a name (letters, digits, '_', '-', '.')"
            )));
        }
        if !is_name(tag) || tag.len() > 128 {
            return Err(err(format!(
                "the tag {tag:?} is not a tag (letters, digits, '_', '-', '.', at most 128)"
            )));
        }
        Ok(Reference::Registry {
            host: host.to_ascii_lowercase(),
            namespace: namespace.into(),
            name: name.into(),
            tag: tag.into(),
        })
    }
}

impl fmt::Display for Reference {
    /// The canonical form (every default spelled out).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reference::Path(p) => write!(f, "{}", p.display()),
            Reference::Url(u) => f.write_str(u),
            Reference::HfRepo { owner, repo, quant } => write!(f, "hf.co/{owner}/{repo}:{quant}"),
            Reference::HfFile {
                owner,
                repo,
                file,
                revision,
            } => {
                write!(f, "hf:{owner}/{repo}/{file}")?;
                if let Some(r) = revision {
                    write!(f, "@{r}")?;
                }
                Ok(())
            }
            Reference::Registry {
                host,
                namespace,
                name,
                tag,
            } => write!(f, "{host}/{namespace}/{name}:{tag}"),
        }
    }
}

/// `sha256:<64 lowercase hex>`: the only digest form a path is ever built from.
pub fn check_digest(d: &str) -> Result<&str, String> {
    match d.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
        {
            Ok(hex)
        }
        _ => Err(format!(
            "digest {:?} is not sha256:<64 lowercase hex digits>",
            d.chars().take(80).collect::<String>()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(host: &str, ns: &str, name: &str, tag: &str) -> Reference {
        Reference::Registry {
            host: host.into(),
            namespace: ns.into(),
            name: name.into(),
            tag: tag.into(),
        }
    }

    #[test]
    fn the_five_forms() {
        let p = |s| Reference::parse_name(s).unwrap();
        assert_eq!(
            p("gemma3"),
            reg("registry.ollama.ai", "library", "gemma3", "latest")
        );
        assert_eq!(
            p("gemma3:270m"),
            reg("registry.ollama.ai", "library", "gemma3", "270m")
        );
        assert_eq!(
            p("me/tiny:q4"),
            reg("registry.ollama.ai", "me", "tiny", "q4")
        );
        assert_eq!(
            p("127.0.0.1:5000/me/tiny"),
            reg("127.0.0.1:5000", "me", "tiny", "latest")
        );
        assert_eq!(
            p("hf.co/unsloth/gemma-3-270m-it-GGUF"),
            Reference::HfRepo {
                owner: "unsloth".into(),
                repo: "gemma-3-270m-it-GGUF".into(),
                quant: "Q4_K_M".into()
            }
        );
        assert_eq!(
            p("hf.co/o/r:q8_0"),
            Reference::HfRepo {
                owner: "o".into(),
                repo: "r".into(),
                quant: "q8_0".into()
            }
        );
        assert_eq!(
            p("hf:o/r/sub/m-Q8_0.gguf@0123456789abcdef0123456789abcdef01234567"),
            Reference::HfFile {
                owner: "o".into(),
                repo: "r".into(),
                file: "sub/m-Q8_0.gguf".into(),
                revision: Some("0123456789abcdef0123456789abcdef01234567".into())
            }
        );
        assert_eq!(
            p("HF:o/r/m.gguf"),
            Reference::HfFile {
                owner: "o".into(),
                repo: "r".into(),
                file: "m.gguf".into(),
                revision: None
            }
        );
        assert_eq!(
            p("https://example.com/m.gguf"),
            Reference::Url("https://example.com/m.gguf".into())
        );
        assert_eq!(
            p("HF.co/o/r"),
            Reference::HfRepo {
                owner: "o".into(),
                repo: "r".into(),
                quant: "Q4_K_M".into()
            }
        );
        assert_eq!(
            p("gemma3").to_string(),
            "registry.ollama.ai/library/gemma3:latest"
        );
    }

    #[test]
    fn an_existing_file_wins_over_a_name() {
        let f = std::env::temp_dir().join(format!("gemma3-{}", std::process::id()));
        std::fs::write(&f, b"x").unwrap();
        let s = f.to_str().unwrap();
        assert_eq!(Reference::parse(s).unwrap(), Reference::Path(f.clone()));
        std::fs::remove_file(&f).unwrap();
        assert!(
            Reference::parse(s).is_err(),
            "gone: a name with '/' parts that do not parse"
        );
    }

    #[test]
    fn bad_references_name_the_wrong_part() {
        for (s, want) in [
            ("hf.co/onlyowner", "exactly owner/repo"),
            ("name:tag:extra", "more than one ':'"),
            ("hf:o/r/file.bin", "not a .gguf"),
            ("hf:o/r", "owner/repo/file.gguf"),
            ("hf:o/r/../x.gguf", "'..'"),
            ("hf:o/r/x.gguf@", "revision"),
            // The fuzzer's find: once registry host "hF" port 7, canonically "hf:7/…".
            ("hF:7/r/s", "not a .gguf"),
            ("a/b/c/d", "too many '/'"),
            ("a//b", "empty part"),
            ("", "empty"),
            ("ftp://x/m.gguf", "https://"),
            ("https://user@host/m.gguf", "host"),
            ("-x", "model name"),
            ("x:-t", "tag"),
            ("bad host!/ns/m", "whitespace"),
            ("ba$d/ns/m", "registry host"),
            ("ns/m..x", "model name"),
        ] {
            let e = Reference::parse_name(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn the_length_limit_holds_for_the_canonical_form() {
        // The fuzzer's find: a short form near the limit whose canonical form is over it
        // parsed, and then its own canonical form did not.
        let near = "a".repeat(MAX_LEN - 10);
        let e = Reference::parse_name(&near).unwrap_err().to_string();
        assert!(e.contains("defaults spelled out"), "{e}");
        let fits = "a".repeat(MAX_LEN - "registry.ollama.ai/library/:latest".len());
        let r = Reference::parse_name(&fits).unwrap();
        assert_eq!(r.to_string().len(), MAX_LEN);
        assert_eq!(Reference::parse_name(&r.to_string()).unwrap(), r);
        let hf = format!("hf.co/o/{}", "r".repeat(MAX_LEN - 12));
        assert!(
            Reference::parse_name(&hf).is_err(),
            "':Q4_K_M' takes it over"
        );
    }

    #[test]
    fn digests_are_checked_before_any_path() {
        assert!(check_digest(&format!("sha256:{}", "a".repeat(64))).is_ok());
        for d in [
            "sha256:../../etc/passwd",
            "sha256:ABC",
            &format!("sha256:{}", "A".repeat(64)),
            "md5:x",
            &format!("sha256:{}/", "a".repeat(63)),
        ] {
            assert!(check_digest(d).is_err(), "{d}");
        }
    }

    proptest::proptest! {
        /// Never a panic; a parsed reference re-parses from its canonical form as itself.
        #[test]
        fn parse_never_panics_and_round_trips(s in "\\PC{0,60}") {
            if let Ok(r) = Reference::parse_name(&s) {
                proptest::prop_assert_eq!(Reference::parse_name(&r.to_string()).unwrap(), r);
            }
        }
    }
}
