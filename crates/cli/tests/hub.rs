//! `llamay pull` / `list` / `rm` and store resolution against real servers on loopback,
//! started here: Debian's nginx serving a Hugging-Face-shaped tree (API listing,
//! `resolve/` redirecting to a second "CDN" server with `X-Linked-Etag`, a rate-limited
//! location, one that ignores Range) and Debian's docker-registry (the CNCF
//! distribution registry) holding a model pushed as an Ollama-style manifest.
//! scripts/test installs both (scripts/apt-ensure).

mod common;

use common::fixture;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(port: u16) {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "server on {port} did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llamay-hub-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// About `len` bytes: the GGUF magic, then xorshift bytes (random, so identical pages
/// are not merged and nothing compresses).
fn random_gguf(len: usize, seed: u64) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    let mut x = seed;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn sha(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// nginx with the hub tree (port), the CDN (cdn port), files under `dir/www`, `dir/cdn`.
struct Nginx {
    _server: Server,
    port: u16,
    cdn: u16,
    dir: PathBuf,
}

impl Nginx {
    /// `etags`: (file name, sha256 hex) for `X-Linked-Etag`.
    fn start(dir: &Path, etags: &[(&str, &str)]) -> Nginx {
        let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("nginx is not installed (scripts/test installs it: scripts/apt-ensure)");
        let (port, cdn) = (free_port(), free_port());
        let map: String = etags
            .iter()
            .map(|(f, h)| format!("    \"{f}\" \"\\\"{h}\\\"\";\n"))
            .collect();
        let d = dir.display();
        let conf = format!(
            r#"daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;
error_log {d}/error.log;
events {{}}
http {{
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  log_format bytes '$request_method $uri $status $body_bytes_sent "$http_range" "$http_authorization" $server_port';
  access_log {d}/access.log bytes;
  map $f $etag {{
    default "";
{map}  }}
  server {{
    listen 127.0.0.1:{port};
    root {d}/www;
    location /api/ {{ default_type application/json; }}
    location /v2/secure/ {{
      default_type application/json;
      if ($http_authorization != "Bearer t0ken") {{
        add_header WWW-Authenticate 'Bearer realm="http://127.0.0.1:{port}/token",service="test",scope="repository:secure/m:pull"' always;
        return 401;
      }}
    }}
    location /v2/evil/ {{
      add_header WWW-Authenticate 'Bearer realm="http://localhost:{port}/token",service="test"' always;
      return 401;
    }}
    location = /token {{ default_type application/json; return 200 '{{"token": "t0ken"}}'; }}
    location /v2/ {{ default_type application/json; }}
    location /slow/ {{ limit_rate 1m; }}
    location /norange/ {{ max_ranges 0; }}
    location ~ ^/(?<o>[^/]+)/(?<r>[^/]+)/resolve/(?<rev>[^/]+)/(?<f>.+)$ {{
      add_header X-Linked-Etag $etag;
      return 302 http://127.0.0.1:{cdn}/$o/$r/$f;
    }}
  }}
  server {{ listen 127.0.0.1:{cdn}; root {d}/cdn; location /slowco/ {{ limit_rate 2m; }} }}
}}
"#
        );
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new(nginx)
            .args([
                "-p",
                &d.to_string(),
                "-e",
                &format!("{d}/error.log"),
                "-c",
                &format!("{d}/nginx.conf"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server(child);
        wait_for(port);
        wait_for(cdn);
        Nginx {
            _server: server,
            port,
            cdn,
            dir: dir.to_path_buf(),
        }
    }

    /// Body bytes nginx sent for `uri` (from its access log).
    fn bytes_sent(&self, uri: &str) -> u64 {
        std::thread::sleep(Duration::from_millis(200));
        std::fs::read_to_string(self.dir.join("access.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split(' ').nth(1) == Some(uri))
            .map(|l| l.split(' ').nth(3).unwrap().parse::<u64>().unwrap())
            .sum()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default()
    }
}

/// `llamay` with the store at `store` (and a hub endpoint when given).
fn llamay(store: &Path, hf: Option<String>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_llamay"));
    c.args(args)
        .env("LLAMAY_MODELS", store)
        .env_remove("HF_TOKEN");
    match hf {
        Some(h) => c.env("LLAMAY_HF_ENDPOINT", h),
        None => c.env_remove("LLAMAY_HF_ENDPOINT"),
    };
    c.output().unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn err(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(1),
        "expected failure: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Downloads in progress: the `.partial` files of the store and their sizes.
fn partials(store: &Path) -> Vec<(String, u64)> {
    leftovers(store)
        .into_iter()
        .filter(|(n, _)| n.ends_with(".partial"))
        .collect()
}

/// Everything in the store's partial/ (downloads, and lock files no pull holds).
fn leftovers(store: &Path) -> Vec<(String, u64)> {
    std::fs::read_dir(store.join("partial"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        e.metadata().unwrap().len(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn listed(store: &Path) -> Vec<String> {
    ok(&llamay(store, None, &["list"]))
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

#[test]
fn hugging_face_and_url_pulls_resolve_offline_and_share_blobs() {
    let dir = tempdir("hf");
    let model = std::fs::read(fixture("llama-Q4_0.gguf")).unwrap();
    let other = std::fs::read(fixture("llama-Q8_0.gguf")).unwrap();
    let (h, h8) = (sha(&model), sha(&other));
    for (sub, name, bytes) in [
        ("cdn/acme/tiny-GGUF", "tiny-Q4_0.gguf", &model),
        ("cdn/acme/tiny-GGUF", "tiny-Q8_0.gguf", &other),
        ("cdn/acme/tiny-GGUF", "mmproj-tiny-Q4_0.gguf", &other),
        ("www/files", "tiny.gguf", &model),
    ] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::fs::write(dir.join(sub).join(name), bytes).unwrap();
    }
    let tree = json!([
        {"type": "file", "path": "README.md", "size": 10, "oid": "x"},
        {"type": "file", "path": "mmproj-tiny-Q4_0.gguf", "size": other.len(), "lfs": {"oid": h8, "size": other.len()}},
        {"type": "file", "path": "tiny-Q4_0.gguf", "size": model.len(), "lfs": {"oid": h, "size": model.len()}},
        {"type": "file", "path": "tiny-Q8_0.gguf", "size": other.len(), "lfs": {"oid": h8, "size": other.len()}},
    ]);
    let api = dir.join("www/api/models/acme/tiny-GGUF/tree");
    std::fs::create_dir_all(&api).unwrap();
    std::fs::write(api.join("main"), tree.to_string()).unwrap();
    let ng = Nginx::start(&dir, &[("tiny-Q4_0.gguf", &h)]);
    let store = dir.join("store");
    let hub = Some(format!("http://127.0.0.1:{}", ng.port));

    // hf.co/owner/repo:quant — the tree API picks the file (mmproj skipped), the LFS
    // oid is the expected digest, the resolve/ redirect to the CDN host is followed.
    let out = ok(&llamay(
        &store,
        hub.clone(),
        &["pull", "hf.co/acme/tiny-GGUF:q4_0"],
    ));
    assert!(out.contains(&h), "{out}");
    // hf:owner/repo/file — the digest from X-Linked-Etag (a HEAD, not followed).
    ok(&llamay(
        &store,
        hub.clone(),
        &["pull", "hf:acme/tiny-GGUF/tiny-Q4_0.gguf"],
    ));
    assert!(
        ng.log()
            .contains("HEAD /acme/tiny-GGUF/resolve/main/tiny-Q4_0.gguf 302"),
        "{}",
        ng.log()
    );
    // HF_TOKEN goes to the hub host and not to the CDN it redirects to; without a
    // linked etag the digest comes from the tree API.
    let o = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args(["pull", "hf:acme/tiny-GGUF/tiny-Q8_0.gguf"])
        .env("LLAMAY_MODELS", &store)
        .env("LLAMAY_HF_ENDPOINT", hub.clone().unwrap())
        .env("HF_TOKEN", "hf_secret")
        .output()
        .unwrap();
    assert!(ok(&o).contains(&h8));
    let log = ng.log();
    let cdn = ng.cdn.to_string();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("tiny-Q8_0.gguf"))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("/resolve/") && l.contains("Bearer hf_secret")),
        "{log}"
    );
    assert!(
        lines.iter().any(|l| l.ends_with(&cdn)),
        "fetched from the CDN: {log}"
    );
    assert!(
        lines
            .iter()
            .filter(|l| l.ends_with(&cdn))
            .all(|l| !l.contains("hf_secret")),
        "{log}"
    );
    ok(&llamay(
        &store,
        None,
        &["rm", "hf:acme/tiny-GGUF/tiny-Q8_0.gguf"],
    ));
    // A URL: plain http only with --insecure; its digest is what it hashes to.
    let url = format!("http://127.0.0.1:{}/files/tiny.gguf", ng.port);
    let e = err(&llamay(&store, None, &["pull", &url]));
    assert!(e.contains("plain http") && e.contains("--insecure"), "{e}");
    ok(&llamay(&store, None, &["pull", &url, "--insecure"]));
    assert_eq!(
        listed(&store),
        [
            "hf.co/acme/tiny-GGUF:q4_0",
            "hf:acme/tiny-GGUF/tiny-Q4_0.gguf",
            url.as_str()
        ]
    );
    // One blob for the three (same bytes), nothing left in partial/.
    let blobs: Vec<_> = std::fs::read_dir(store.join("blobs")).unwrap().collect();
    assert_eq!(blobs.len(), 1);
    assert!(leftovers(&store).is_empty(), "{:?}", leftovers(&store));

    // Offline: the servers are gone; run resolves through the store.
    drop(ng);
    let direct = ok(&Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args([
            "run",
            fixture("llama-Q4_0.gguf").to_str().unwrap(),
            "-p",
            "hi",
            "-n",
            "6",
            "--temp",
            "0",
        ])
        .output()
        .unwrap());
    let via = ok(&llamay(
        &store,
        None,
        &[
            "run",
            "hf.co/acme/tiny-GGUF:q4_0",
            "-p",
            "hi",
            "-n",
            "6",
            "--temp",
            "0",
        ],
    ));
    assert_eq!(via, direct);
    // rm: the shared blob stays until its last reference goes.
    ok(&llamay(&store, None, &["rm", "hf.co/acme/tiny-GGUF:q4_0"]));
    ok(&llamay(&store, None, &["rm", &url]));
    assert_eq!(std::fs::read_dir(store.join("blobs")).unwrap().count(), 1);
    let out = ok(&llamay(
        &store,
        None,
        &["rm", "hf:acme/tiny-GGUF/tiny-Q4_0.gguf"],
    ));
    assert!(out.contains("1 blob freed"), "{out}");
    assert_eq!(std::fs::read_dir(store.join("blobs")).unwrap().count(), 0);
    // The store is as clean as it was: no lock file per blob left behind.
    assert!(leftovers(&store).is_empty(), "{:?}", leftovers(&store));
    let e = err(&llamay(
        &store,
        None,
        &["run", "hf:acme/tiny-GGUF/tiny-Q4_0.gguf", "-p", "x"],
    ));
    assert!(e.contains("no model pulled under that name"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_pull_resumes_and_a_200_to_a_range_starts_over() {
    let dir = tempdir("resume");
    let big = random_gguf(6 << 20, 0x9e3779b97f4a7c15);
    for sub in ["www/slow", "www/norange"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::fs::write(dir.join(sub).join("big.gguf"), &big).unwrap();
    }
    let ng = Nginx::start(&dir, &[]);
    let store = dir.join("store");
    let url = format!("http://127.0.0.1:{}/slow/big.gguf", ng.port);
    // Killed after about two seconds at 1 MB/s: a partial is kept, nothing listed.
    let mut child = Command::new(env!("CARGO_BIN_EXE_llamay"))
        .args(["pull", &url, "--insecure"])
        .env("LLAMAY_MODELS", &store)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2200));
    child.kill().unwrap();
    child.wait().unwrap();
    let p = partials(&store);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].1 > 0 && p[0].1 < big.len() as u64, "{p:?}");
    assert!(listed(&store).is_empty(), "a killed pull is not listed");
    // Resumed: the server sends little more than the file once.
    let out = ok(&llamay(&store, None, &["pull", &url, "--insecure"]));
    assert!(out.contains(&sha(&big)), "{out}");
    let sent = ng.bytes_sent("/slow/big.gguf");
    assert!(
        (sent as f64) < 1.3 * big.len() as f64,
        "{sent} bytes sent for {}",
        big.len()
    );
    assert!(
        ng.log().contains("\"bytes="),
        "the second pull asked for a range"
    );
    assert!(leftovers(&store).is_empty(), "{:?}", leftovers(&store));

    // Parallel parts (the threshold lowered from 64 MB for the test): four Range
    // requests at once, killed, then resumed part by part.
    ok(&llamay(&store, None, &["rm", &url]));
    let before = ng.bytes_sent("/slow/big.gguf");
    let parallel = |kill_after: Option<u64>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_llamay"));
        c.args(["pull", &url, "--insecure"])
            .env("LLAMAY_MODELS", &store)
            .env("LLAMAY_PULL_PARALLEL_MIN", "1048576")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match kill_after {
            Some(ms) => {
                let mut child = c.spawn().unwrap();
                std::thread::sleep(Duration::from_millis(ms));
                child.kill().unwrap();
                child.wait().unwrap();
                None
            }
            None => Some(c.output().unwrap()),
        }
    };
    parallel(Some(900));
    assert!(listed(&store).is_empty());
    let out = ok(&parallel(None).unwrap());
    assert!(out.contains(&sha(&big)), "{out}");
    let sent = ng.bytes_sent("/slow/big.gguf") - before;
    assert!(
        (sent as f64) < 1.3 * big.len() as f64,
        "{sent} bytes sent for {}",
        big.len()
    );
    let part_size = (big.len() as u64).div_ceil(4);
    for i in 1..4u64 {
        assert!(
            ng.log().contains(&format!("\"bytes={}-", i * part_size)),
            "part {i} requested: {}",
            ng.log()
        );
    }
    assert!(
        leftovers(&store).is_empty(),
        "no part or lock files left: {:?}",
        leftovers(&store)
    );

    // A server that answers a Range with 200: the partial is thrown away, the file
    // taken whole, and still verified.
    let url2 = format!("http://127.0.0.1:{}/norange/big.gguf", ng.port);
    // Half a download planted where a pull of url2 keeps its partial.
    let half = &big[..big.len() / 2];
    let partial_name = format!("url-{}.partial", sha(url2.as_bytes()));
    std::fs::write(store.join("partial").join(&partial_name), half).unwrap();
    let out = ok(&llamay(&store, None, &["pull", &url2, "--insecure"]));
    assert!(out.contains(&sha(&big)), "{out}");
    assert!(leftovers(&store).is_empty(), "{:?}", leftovers(&store));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_bytes_and_bad_digests_are_refused_and_leave_nothing() {
    let dir = tempdir("bad");
    let model = std::fs::read(fixture("llama-Q4_0.gguf")).unwrap();
    let h = sha(&model);
    let mut corrupt = model.clone();
    corrupt[1000] ^= 0xff;
    std::fs::create_dir_all(dir.join("cdn/acme/r")).unwrap();
    std::fs::write(dir.join("cdn/acme/r/m-Q4_0.gguf"), &corrupt).unwrap();
    let api = dir.join("www/api/models/acme/r/tree");
    std::fs::create_dir_all(&api).unwrap();
    std::fs::write(
        api.join("main"),
        json!([{"type": "file", "path": "m-Q4_0.gguf", "lfs": {"oid": h, "size": model.len()}}])
            .to_string(),
    )
    .unwrap();
    // A "registry" whose manifests carry hostile digests.
    for (name, digest) in [
        ("traversal", "sha256:../../../../tmp/evil"),
        ("upper", &format!("sha256:{}", h.to_uppercase())),
        ("short", "sha256:abc"),
    ] {
        let m = dir.join(format!("www/v2/library/{name}/manifests"));
        std::fs::create_dir_all(&m).unwrap();
        let doc = json!({"schemaVersion": 2, "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": 10}]});
        std::fs::write(m.join("latest"), doc.to_string()).unwrap();
    }
    let ng = Nginx::start(&dir, &[]);
    let store = dir.join("store");
    let hub = Some(format!("http://127.0.0.1:{}", ng.port));
    let e = err(&llamay(&store, hub, &["pull", "hf.co/acme/r:Q4_0"]));
    assert!(
        e.contains("mismatch") && e.contains(&format!("sha256:{h}")),
        "{e}"
    );
    assert!(leftovers(&store).is_empty() && listed(&store).is_empty());
    assert_eq!(std::fs::read_dir(store.join("blobs")).unwrap().count(), 0);
    for name in ["traversal", "upper", "short"] {
        let r = format!("127.0.0.1:{}/library/{name}", ng.port);
        let e = err(&llamay(&store, None, &["pull", &r, "--insecure"]));
        assert!(
            e.contains("is not sha256:<64 lowercase hex digits>"),
            "{name}: {e}"
        );
        assert!(!ng.log().contains("/blobs/"), "no blob requested");
    }
    assert!(
        std::fs::read_dir(store.join("blobs")).unwrap().count() == 0
            && !Path::new("/tmp/evil").exists()
    );
    // Not a GGUF (an error page served as the file).
    std::fs::write(dir.join("www/page.gguf"), b"<html>rate limited</html>").unwrap();
    let e = err(&llamay(
        &store,
        None,
        &[
            "pull",
            &format!("http://127.0.0.1:{}/page.gguf", ng.port),
            "--insecure",
        ],
    ));
    assert!(e.contains("not a GGUF file"), "{e}");
    assert_eq!(std::fs::read_dir(store.join("blobs")).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CNCF distribution registry (Debian's docker-registry), a model pushed to it as
/// Ollama pushes one: a config blob, the GGUF and a template layer, a v2 manifest.
#[test]
fn registry_pull_of_an_ollama_style_manifest() {
    let dir = tempdir("registry");
    let bin = ["/usr/bin/docker-registry", "/usr/sbin/docker-registry"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("docker-registry is not installed (scripts/test installs it: scripts/apt-ensure)");
    let port = free_port();
    let conf = format!(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}/data\nhttp:\n  addr: 127.0.0.1:{port}\n",
        dir.display()
    );
    std::fs::write(dir.join("config.yml"), conf).unwrap();
    let _server = Server(
        Command::new(bin)
            .args(["serve", dir.join("config.yml").to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(port);
    let base = format!("http://127.0.0.1:{port}/v2/me/tiny");
    let client = reqwest::blocking::Client::new();
    let push = |bytes: &[u8]| -> String {
        let digest = format!("sha256:{}", sha(bytes));
        let r = client
            .post(format!("{base}/blobs/uploads/"))
            .send()
            .unwrap();
        assert_eq!(r.status(), 202);
        let loc = r.headers()["location"].to_str().unwrap().to_string();
        let loc = if loc.starts_with("http") {
            loc
        } else {
            format!("http://127.0.0.1:{port}{loc}")
        };
        let sep = if loc.contains('?') { '&' } else { '?' };
        let r = client
            .put(format!("{loc}{sep}digest={digest}"))
            .body(bytes.to_vec())
            .send()
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().unwrap_or_default());
        digest
    };
    let model = std::fs::read(fixture("llama-Q4_0.gguf")).unwrap();
    let template = b"{{ .Prompt }}".to_vec();
    let config = br#"{"model_format":"gguf","model_family":"llama"}"#.to_vec();
    let (dm, dt, dc) = (push(&model), push(&template), push(&config));
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": dc, "size": config.len()},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": dm, "size": model.len()},
            {"mediaType": "application/vnd.ollama.image.template", "digest": dt, "size": template.len()},
        ]
    });
    let r = client
        .put(format!("{base}/manifests/q4"))
        .header(
            "content-type",
            "application/vnd.docker.distribution.manifest.v2+json",
        )
        .body(manifest.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().unwrap_or_default());

    let store = dir.join("store");
    let r = format!("127.0.0.1:{port}/me/tiny:q4");
    let e = err(&llamay(&store, None, &["pull", &r]));
    assert!(
        e.contains("plain http") && e.contains("--insecure"),
        "loopback is no exception: {e}"
    );
    let out = ok(&llamay(&store, None, &["pull", &r, "--insecure"]));
    assert!(out.contains(&dm), "{out}");
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::fs::read_dir(store.join("manifests"))
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path(),
        )
        .unwrap(),
    )
    .unwrap();
    let types: Vec<&str> = m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["media_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "application/vnd.ollama.image.model",
            "application/vnd.ollama.image.template"
        ],
        "the template layer is kept"
    );
    assert_eq!(listed(&store), [r.as_str()]);
    ok(&llamay(
        &store,
        None,
        &["run", &r, "-p", "hi", "-n", "4", "--temp", "0"],
    ));
    // A missing tag is an error naming it.
    let e = err(&llamay(
        &store,
        None,
        &[
            "pull",
            &format!("127.0.0.1:{port}/me/tiny:nope"),
            "--insecure",
        ],
    ));
    assert!(e.contains("nope"), "{e}");

    // A blob corrupted in the registry's storage: refused, nothing left.
    ok(&llamay(&store, None, &["rm", &r]));
    let hex = dm.trim_start_matches("sha256:");
    let data = dir.join(format!(
        "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[500] ^= 1;
    std::fs::write(&data, &bytes).unwrap();
    let e = err(&llamay(&store, None, &["pull", &r, "--insecure"]));
    assert!(e.contains("mismatch") && e.contains(&dm), "{e}");
    assert!(listed(&store).is_empty() && leftovers(&store).is_empty());
    assert!(!store.join("blobs").join(format!("sha256-{hex}")).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `validate` reads the header of the real Gemma file (262k-token vocabulary: several
/// MB of metadata) through Range requests, and stays under 8 MB of the file's 242 MB;
/// its verdict is the engine's. Without Range support it still stops at the bound.
#[test]
fn validate_reads_only_the_header() {
    let Some(gemma) =
        llamay_synth::reference::path("LLAMAY_GEMMA", "LLAMAY_GEMMA=$(scripts/fetch-models)")
    else {
        return;
    };
    let dir = tempdir("validate");
    for sub in ["www/files", "www/norange"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::os::unix::fs::symlink(&gemma, dir.join(sub).join("gemma.gguf")).unwrap();
    }
    std::fs::write(dir.join("www/files/junk.gguf"), vec![7u8; 4 << 20]).unwrap();
    let ng = Nginx::start(&dir, &[]);
    let store = dir.join("store");
    let url = format!("http://127.0.0.1:{}/files/gemma.gguf", ng.port);
    let out = ok(&llamay(&store, None, &["validate", &url, "--insecure"]));
    assert!(
        out.contains("architecture: gemma3")
            && out.contains("runs here: yes")
            && out.contains("Q4_K"),
        "{out}"
    );
    let len = std::fs::metadata(&gemma).unwrap().len();
    assert!(out.contains(&format!("size: {len} bytes")), "{out}");
    let sent = ng.bytes_sent("/files/gemma.gguf");
    assert!(sent > 0 && sent < 8 << 20, "{sent} bytes of {len} sent");
    // The same verdict as `info` on the local file.
    let local = ok(&llamay(
        &store,
        None,
        &["validate", gemma.to_str().unwrap()],
    ));
    assert_eq!(
        local
            .lines()
            .filter(|l| l.starts_with("runs here") || l.starts_with("tensors"))
            .collect::<Vec<_>>(),
        out.lines()
            .filter(|l| l.starts_with("runs here") || l.starts_with("tensors"))
            .collect::<Vec<_>>()
    );
    // A server without Range: the read stops at the bound (the header fits in it).
    let out = ok(&llamay(
        &store,
        None,
        &[
            "validate",
            &format!("http://127.0.0.1:{}/norange/gemma.gguf", ng.port),
            "--insecure",
        ],
    ));
    assert!(out.contains("runs here: yes"), "{out}");
    // Not a GGUF.
    let e = err(&llamay(
        &store,
        None,
        &[
            "validate",
            &format!("http://127.0.0.1:{}/files/junk.gguf", ng.port),
            "--insecure",
        ],
    ));
    assert!(e.contains("not a GGUF header"), "{e}");
    assert!(
        std::fs::read_dir(store.join("blobs")).map_or(0, |d| d.count()) == 0,
        "validate stores nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two pulls of the same blob at once: one downloads, the other waits on the blob's
/// lock and finds it done; both succeed, one blob, the bytes sent once.
#[test]
fn concurrent_pulls_of_one_blob_download_it_once() {
    let dir = tempdir("concurrent");
    let big = random_gguf(4 << 20, 0x2545f4914f6cdd1d);
    let h = sha(&big);
    std::fs::create_dir_all(dir.join("cdn/slowco/r")).unwrap();
    std::fs::write(dir.join("cdn/slowco/r/m-Q8_0.gguf"), &big).unwrap();
    let api = dir.join("www/api/models/slowco/r/tree");
    std::fs::create_dir_all(&api).unwrap();
    std::fs::write(
        api.join("main"),
        json!([{"type": "file", "path": "m-Q8_0.gguf", "lfs": {"oid": h, "size": big.len()}}])
            .to_string(),
    )
    .unwrap();
    let ng = Nginx::start(&dir, &[]);
    let store = dir.join("store");
    let spawn = |r: &str| {
        Command::new(env!("CARGO_BIN_EXE_llamay"))
            .args(["pull", r])
            .env("LLAMAY_MODELS", &store)
            .env(
                "LLAMAY_HF_ENDPOINT",
                format!("http://127.0.0.1:{}", ng.port),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let a = spawn("hf.co/slowco/r:Q8_0");
    let b = spawn("hf:slowco/r/m-Q8_0.gguf");
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(ok(&a).contains(&h) && ok(&b).contains(&h));
    assert_eq!(listed(&store).len(), 2);
    assert_eq!(std::fs::read_dir(store.join("blobs")).unwrap().count(), 1);
    let sent = ng.bytes_sent("/slowco/r/m-Q8_0.gguf");
    assert!(
        (sent as f64) < 1.3 * big.len() as f64,
        "{sent} bytes sent for {}",
        big.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A registry that answers 401 with a bearer challenge (as registry.ollama.ai does):
/// the token is fetched from the realm on the registry's own host and sent with the
/// manifest and blob requests; a realm on another host is refused, no token asked.
#[test]
fn bearer_challenge_is_answered_on_the_registry_host_only() {
    let dir = tempdir("bearer");
    let model = std::fs::read(fixture("llama-Q4_0.gguf")).unwrap();
    let h = sha(&model);
    for repo in ["secure", "evil"] {
        let base = dir.join(format!("www/v2/{repo}/m"));
        std::fs::create_dir_all(base.join("manifests")).unwrap();
        std::fs::create_dir_all(base.join("blobs")).unwrap();
        let doc = json!({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{h}"), "size": model.len()}]});
        std::fs::write(base.join("manifests/latest"), doc.to_string()).unwrap();
        std::fs::write(base.join(format!("blobs/sha256:{h}")), &model).unwrap();
    }
    let ng = Nginx::start(&dir, &[]);
    let store = dir.join("store");
    let out = ok(&llamay(
        &store,
        None,
        &[
            "pull",
            &format!("127.0.0.1:{}/secure/m", ng.port),
            "--insecure",
        ],
    ));
    assert!(out.contains(&h), "{out}");
    let log = ng.log();
    assert!(
        log.contains("GET /v2/secure/m/manifests/latest 401"),
        "{log}"
    );
    assert!(log.contains("GET /token 200"), "{log}");
    assert!(
        log.lines().any(|l| l.contains("/v2/secure/m/blobs/")
            && l.contains(" 200 ")
            && l.contains("Bearer t0ken")),
        "{log}"
    );
    let e = err(&llamay(
        &store,
        None,
        &[
            "pull",
            &format!("127.0.0.1:{}/evil/m", ng.port),
            "--insecure",
        ],
    ));
    assert!(e.contains("another host"), "{e}");
    assert_eq!(
        ng.log().matches("GET /token").count(),
        1,
        "no token asked of another realm"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
