//! The models a server can answer with: `-m` files under their aliases, names made by
//! `/api/copy`, and the model store's references; each loaded on first use and kept
//! until its keep-alive runs out.

use crate::scheduler::{DeviceOpener, EngineConfig, Placement, Scheduler};
use llamay_engine::Model;
use llamay_hub::Store;
use llamay_template::ChatFormat;
use llamay_tokenizer::Tokenizer;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// A model given with `-m`.
#[derive(Clone, Debug)]
pub struct Served {
    pub name: String,
    pub path: PathBuf,
}

/// A loaded model: its engine thread, tokenizer and chat format.
pub struct Loaded {
    pub path: PathBuf,
    pub scheduler: Scheduler,
    pub tok: Arc<Tokenizer>,
    /// `None`: the file has no chat template and the server was given none.
    pub format: Option<ChatFormat>,
    pub size: u64,
    pub load_duration: Duration,
    /// The latest request's keep-alive (`None`: forever), and when the model was last
    /// busy: it unloads once idle for that long.
    keep: Mutex<(Option<Duration>, Instant, SystemTime)>,
    /// The name it was first loaded under (for `/api/ps`).
    pub name: String,
    /// Whether a `num_ctx` above `--ctx-size` has been clamped (and logged) yet.
    pub num_ctx_clamped: std::sync::atomic::AtomicBool,
}

impl Loaded {
    /// Ollama's `size_vram`: on the device, the file's size less the matrices the
    /// device declines (weights are placed in their GGUF formats); 0 on the CPU.
    pub fn size_vram(&self) -> u64 {
        match self.scheduler.placement() {
            Placement::Device { host_bytes, .. } => self.size.saturating_sub(*host_bytes),
            Placement::Cpu | Placement::CpuDeclined(_) => 0,
        }
    }

    /// A request asked to keep the model for `keep` (`None`: forever) after it is idle.
    pub fn keep_for(&self, keep: Option<Duration>) {
        *self.keep.lock().unwrap_or_else(|e| e.into_inner()) =
            (keep, Instant::now(), SystemTime::now());
    }

    pub fn expires_at(&self) -> Option<SystemTime> {
        let (keep, _, wall) = *self.keep.lock().unwrap_or_else(|e| e.into_inner());
        keep.map(|k| wall + k)
    }

    /// Whether it is idle and its keep-alive has run out; a busy model's clock starts
    /// again (the keep-alive counts from the end of the last request).
    fn expired(&self, now: Instant) -> bool {
        let mut k = self.keep.lock().unwrap_or_else(|e| e.into_inner());
        if !self.scheduler.idle() {
            k.1 = now;
            k.2 = SystemTime::now();
            return false;
        }
        k.0.is_some_and(|keep| now.duration_since(k.1) >= keep)
    }
}

/// Why a model could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model '{0}' not found")]
    NotFound(String),
    #[error("model '{name}' could not be loaded: {why}")]
    Load { name: String, why: String },
}

/// A file's loaded model, if any; its lock is held while it loads.
type LoadSlot = Arc<tokio::sync::Mutex<Option<Arc<Loaded>>>>;

pub struct Registry {
    served: RwLock<Vec<Served>>,
    store: Option<Store>,
    /// Loaded models by file; the async lock serialises a file's loading.
    loaded: Mutex<HashMap<PathBuf, LoadSlot>>,
    /// Files being loaded (`/health` answers 503 while any is).
    loading: std::sync::atomic::AtomicUsize,
    engine: EngineConfig,
    chat_template: Option<String>,
    /// `--keep-alive`: for requests that give none.
    keep_alive: Option<Duration>,
    /// `--device`: where loaded models run (`None`: the CPU).
    device: Option<DeviceOpener>,
}

/// `X:latest` and `X` are one name, as Ollama treats them.
fn same_name(a: &str, b: &str) -> bool {
    let strip = |s: &'_ str| -> String { s.strip_suffix(":latest").unwrap_or(s).to_string() };
    strip(a) == strip(b)
}

impl Registry {
    pub fn new(
        served: Vec<Served>,
        store: Option<Store>,
        engine: EngineConfig,
        chat_template: Option<String>,
        keep_alive: Option<Duration>,
    ) -> Self {
        Registry {
            served: RwLock::new(served),
            store,
            loaded: Mutex::new(HashMap::new()),
            loading: 0.into(),
            engine,
            chat_template,
            keep_alive,
            device: None,
        }
    }

    /// Loaded models run on the device `open` opens (`serve --device`).
    pub fn with_device(mut self, open: Option<DeviceOpener>) -> Self {
        self.device = open;
        self
    }

    /// The keep-alive of requests that give none.
    pub fn default_keep_alive(&self) -> Option<Duration> {
        self.keep_alive
    }

    /// The names given with `-m` (what `--preload` loads).
    pub fn served(&self) -> Vec<String> {
        (self.served.read().unwrap_or_else(|e| e.into_inner()))
            .iter()
            .map(|s| s.name.clone())
            .collect()
    }

    pub fn engine(&self) -> EngineConfig {
        self.engine
    }

    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    pub fn is_loading(&self) -> bool {
        self.loading.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// `--preload` under way: counts as a load from before the first model starts.
    pub fn preloading(&self, on: bool) {
        use std::sync::atomic::Ordering::SeqCst;
        if on {
            self.loading.fetch_add(1, SeqCst);
        } else {
            self.loading.fetch_sub(1, SeqCst);
        }
    }

    /// The file a name stands for.
    pub fn resolve(&self, name: &str) -> Result<PathBuf, ModelError> {
        let served = self.served.read().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = served.iter().find(|s| same_name(&s.name, name)) {
            return Ok(s.path.clone());
        }
        drop(served);
        if let Some(store) = &self.store
            && llamay_hub::Reference::parse_name(name).is_ok()
            && let Ok(p) = store.model_path(name)
        {
            return Ok(p);
        }
        Err(ModelError::NotFound(name.to_string()))
    }

    /// Every name, with its file: `-m` and copied names first, then the store's.
    pub fn names(&self) -> Vec<(String, PathBuf, Option<SystemTime>)> {
        let mut out: Vec<_> = (self.served.read().unwrap_or_else(|e| e.into_inner()))
            .iter()
            .map(|s| {
                let t = std::fs::metadata(&s.path).and_then(|m| m.modified()).ok();
                (s.name.clone(), s.path.clone(), t)
            })
            .collect();
        if let Some(store) = &self.store
            && let Ok(list) = store.list()
        {
            for m in list {
                if let Ok(p) = store.model_path(&m.reference) {
                    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(m.pulled);
                    out.push((m.reference.clone(), p, Some(t)));
                }
            }
        }
        out
    }

    /// `/api/copy`: `dest` names what `source` names.
    pub fn copy(&self, source: &str, dest: &str) -> Result<(), ModelError> {
        let path = self.resolve(source)?;
        let mut served = self.served.write().unwrap_or_else(|e| e.into_inner());
        served.retain(|s| !same_name(&s.name, dest));
        served.push(Served {
            name: dest.to_string(),
            path,
        });
        Ok(())
    }

    /// `/api/delete` of a name given with `-m` or copied: forgets the name (the file
    /// stays). `false` when it is not such a name.
    pub fn forget(&self, name: &str) -> bool {
        let mut served = self.served.write().unwrap_or_else(|e| e.into_inner());
        let before = served.len();
        served.retain(|s| !same_name(&s.name, name));
        served.len() != before
    }

    /// The loaded model a name stands for, loading it first if need be.
    pub async fn get(&self, name: &str) -> Result<Arc<Loaded>, ModelError> {
        let path = self.resolve(name)?;
        let cell = {
            let mut map = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(path.clone()).or_default().clone()
        };
        let mut slot = cell.lock().await;
        if let Some(l) = slot.as_ref()
            && !l
                .scheduler
                .gauges
                .stopped
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(l.clone());
        }
        self.loading
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let engine = self.engine;
        let template = self.chat_template.clone();
        let (p, n) = (path.clone(), name.to_string());
        let keep = self.keep_alive;
        let device = self.device.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            load(&p, &n, engine, device.as_ref(), template.as_deref(), keep)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the loader stopped: {e}")));
        self.loading
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        let loaded = Arc::new(loaded.map_err(|why| ModelError::Load {
            name: name.to_string(),
            why,
        })?);
        *slot = Some(loaded.clone());
        Ok(loaded)
    }

    /// Models loaded now.
    pub fn running(&self) -> Vec<Arc<Loaded>> {
        let cells: Vec<_> = (self.loaded.lock().unwrap_or_else(|e| e.into_inner()))
            .values()
            .cloned()
            .collect();
        cells
            .iter()
            .filter_map(|c| c.try_lock().ok().and_then(|g| g.clone()))
            .collect()
    }

    /// Unloads the model at `path` now if nothing is running on it.
    pub fn unload(&self, path: &Path) {
        let cell = self
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .cloned();
        if let Some(c) = cell
            && let Ok(mut g) = c.try_lock()
            && g.as_ref().is_some_and(|l| l.scheduler.idle())
        {
            *g = None;
        }
    }

    /// Drops the models whose keep-alive ran out (their engine threads end when the
    /// last handle goes).
    pub fn reap(&self) {
        let now = Instant::now();
        let cells: Vec<_> = (self.loaded.lock().unwrap_or_else(|e| e.into_inner()))
            .values()
            .cloned()
            .collect();
        for c in cells {
            if let Ok(mut g) = c.try_lock()
                && g.as_ref().is_some_and(|l| l.expired(now))
            {
                *g = None;
            }
        }
    }

    /// Gauges of every loaded model, summed.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for l in self.running() {
            use std::sync::atomic::Ordering::Relaxed;
            let g = &l.scheduler.gauges;
            t.waiting += g.waiting.load(Relaxed);
            t.running += g.running.load(Relaxed);
            t.kv_used += g.kv_pages_used.load(Relaxed);
            t.kv_total += g.kv_pages_total.load(Relaxed);
        }
        t
    }
}

#[derive(Default, Debug, Clone, Copy)]
pub struct Totals {
    pub waiting: usize,
    pub running: usize,
    pub kv_used: usize,
    pub kv_total: usize,
}

fn load(
    path: &Path,
    name: &str,
    engine: EngineConfig,
    device: Option<&DeviceOpener>,
    chat_template: Option<&str>,
    keep_alive: Option<Duration>,
) -> Result<Loaded, String> {
    let t0 = Instant::now();
    let mapped = llamay_gguf::MappedModel::open(path).map_err(|e| e.to_string())?;
    let gguf = mapped.parse().map_err(|e| e.to_string())?;
    let tok = Tokenizer::from_metadata(gguf.metadata())
        .map_err(|e| format!("the tokenizer cannot be loaded: {e}"))?;
    // The server's --chat-template serves files that have none of their own.
    let own = gguf
        .metadata()
        .get_str("tokenizer.chat_template")
        .ok()
        .flatten()
        .is_some();
    let flag = if own { None } else { chat_template };
    let format =
        llamay_template::format::resolve(flag, gguf.metadata(), &tok).map_err(|e| e.to_string())?;
    drop(gguf);
    drop(mapped);
    let model = Model::open(path, engine.threads).map_err(|e| e.to_string())?;
    let tok = Arc::new(tok);
    let scheduler = Scheduler::start(Arc::new(model), tok.clone(), engine, device)?;
    match scheduler.placement() {
        Placement::Cpu => {}
        Placement::Device { name: dev, .. } => eprintln!("llamay serve: {name} runs on {dev}"),
        Placement::CpuDeclined(why) => eprintln!("llamay serve: {name} runs on the CPU ({why})"),
    }
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let l = Loaded {
        path: path.to_path_buf(),
        scheduler,
        tok,
        format,
        size,
        load_duration: t0.elapsed(),
        keep: Mutex::new((keep_alive, Instant::now(), SystemTime::now())),
        name: name.to_string(),
        num_ctx_clamped: Default::default(),
    };
    Ok(l)
}

/// The names `-m` files are served under: `--alias` as given, else the file stem.
pub fn served_names(models: &[(PathBuf, Option<String>)]) -> Result<Vec<Served>, String> {
    let mut out: Vec<Served> = Vec::new();
    let mut seen = BTreeMap::new();
    for (path, alias) in models {
        let name = match alias {
            Some(a) => a.clone(),
            None => path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .ok_or_else(|| format!("-m {}: not a file name", path.display()))?,
        };
        if let Some(prev) = seen.insert(name.clone(), path.clone()) {
            return Err(format!(
                "two models are named '{name}' ({} and {}): give one an --alias",
                prev.display(),
                path.display()
            ));
        }
        out.push(Served {
            name,
            path: path.clone(),
        });
    }
    Ok(out)
}
