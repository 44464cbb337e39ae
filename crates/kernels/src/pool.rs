//! A small persistent compute pool: workers live as long as the pool, a region is
//! published by bumping an epoch, tasks are claimed from an atomic counter (or, for
//! `run_contiguous`, each thread takes its own run of tasks in order and then steals
//! from the back of the others'), the calling thread works too, and everyone meets at a
//! spin-then-park barrier.
//!
//! Why not rayon: a decode step runs a few hundred tiny regions; the per-region cost
//! must be a few hundred nanoseconds while workers are hot, and idle workers must not
//! burn a core (oversubscribed spin pools collapse), hence a bounded spin, then a park.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker (or the waiting caller) spins before it parks.
const SPIN: Duration = Duration::from_micros(200);

type Task<'a> = dyn Fn(usize) + Sync + 'a;

struct Shared {
    /// Bumped once per region; workers compare it with the last one they served.
    epoch: AtomicUsize,
    /// The region's task function, valid from the epoch bump until every worker has
    /// checked out (`pending == 0`). Written only by the caller holding `run_lock`.
    job: UnsafeCell<Option<*const Task<'static>>>,
    n_tasks: AtomicUsize,
    next: AtomicUsize,
    /// Whether the region's tasks are claimed from `runs` (`run_contiguous`) rather than
    /// from `next`.
    contiguous: AtomicBool,
    /// Per participant (the caller is 0, worker `i` is `i`): the tasks of its run not
    /// yet claimed, `[front, back)` packed as `front | back << 32`.
    runs: Box<[AtomicU64]>,
    /// Workers that have not yet finished the current region.
    pending: AtomicUsize,
    /// Workers parked (or about to park) on `work_cv`.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    /// Bytes for idle workers to prefetch (`prefetch_while_idle`): the next address to
    /// claim and the end. Addresses only, never dereferenced: a prefetch cannot fault,
    /// so a stale range costs nothing but the prefetches.
    idle_next: AtomicUsize,
    idle_end: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    lock: Mutex<()>,
    work_cv: Condvar,
    done_cv: Condvar,
}

// SAFETY: `job` is written only by the thread that holds `run_lock`, strictly before the
// epoch bump (Release) that publishes it, and read by workers only after they observe
// that epoch (Acquire) and before they decrement `pending`; the writer does not touch it
// again until `pending` reaches 0. Everything else is atomics and mutexes.
unsafe impl Sync for Shared {}
// SAFETY: the raw task pointer is only dereferenced under the protocol above.
unsafe impl Send for Shared {}

/// A persistent pool of `n_threads - 1` workers plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

thread_local! {
    /// Set while this thread executes a pool task: a nested `run` then runs inline.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

impl ThreadPool {
    /// A pool that runs regions on `n_threads` threads (the caller counts as one;
    /// 0 is taken as 1). Spawns `n_threads - 1` workers once. A wasm32 build has one
    /// thread whatever is asked (WASI preview 1 cannot start another; the command line
    /// refuses `-t` above 1 there).
    pub fn new(n_threads: usize) -> Self {
        let n = if cfg!(target_family = "wasm") {
            1
        } else {
            n_threads.max(1)
        };
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            n_tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            contiguous: AtomicBool::new(false),
            runs: (0..n).map(|_| AtomicU64::new(0)).collect(),
            pending: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            idle_next: AtomicUsize::new(0),
            idle_end: AtomicUsize::new(0),
            panic: Mutex::new(None),
            lock: Mutex::new(()),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
        });
        let workers = (1..n)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("llamay-compute-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("spawning a compute thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// Threads that take part in a region, the caller included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Hands `bytes` to the workers to prefetch (into their L2) while they wait for the
    /// next region, replacing any range handed before: the weights of a matrix the
    /// caller will multiply by soon, after work that reads little memory (a decode
    /// step's norms and attention leave the memory bus idle; this fills the gap). The
    /// call returns at once; workers stop at the next region and resume after it.
    ///
    /// The range is an address and a length, not a borrow: nothing is read through it,
    /// so it may outlive the memory (prefetches of an unmapped address are dropped).
    pub fn prefetch_while_idle(&self, addr: usize, len: usize) {
        if self.workers.is_empty() {
            return;
        }
        // The claims below add past `end`: keep them far from wrapping around.
        let Some(end) = addr.checked_add(len).filter(|&e| e < usize::MAX / 2) else {
            return;
        };
        let start = addr;
        let s = &*self.shared;
        // End first: a worker that claims between the two stores prefetches a few
        // lines of the old range, harmlessly.
        s.idle_end.store(end, Relaxed);
        s.idle_next.store(start, Release);
    }

    /// `f(i, chunk)` for every `chunk`-long piece `i` of `data` (the last may be
    /// shorter), the pieces spread over the pool: element-wise work on a large buffer.
    pub fn for_each_chunk_mut<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let chunk = chunk.max(1);
        let (len, base) = (data.len(), crate::SyncPtr(data.as_mut_ptr()));
        self.run(len.div_ceil(chunk), |i| {
            let start = i * chunk;
            let n = chunk.min(len - start);
            // SAFETY: task i alone touches data[start..start + n] (disjoint for distinct
            // i, inside `data`), and `data` stays borrowed until `run` returns.
            let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), n) };
            f(i, piece);
        });
    }

    /// Runs `f(i)` exactly once for every `i` in `0..n_tasks`, spread over the pool's
    /// threads (the caller participates), and returns when all have finished.
    ///
    /// A panic in a task does not deadlock the pool: the remaining tasks still run,
    /// and the first panic is re-raised on the caller after the region. Called from
    /// inside a task (nested) or while another thread holds the pool, the region runs
    /// inline on the calling thread.
    pub fn run(&self, n_tasks: usize, f: impl Fn(usize) + Sync) {
        self.region(n_tasks, false, &f);
    }

    /// As `run`, but the tasks are cut into one run of consecutive indices per thread,
    /// each thread works through its own run in order, and a thread that finishes its
    /// run takes the others' remaining tasks from their ends. For tasks that stream
    /// consecutive memory (a one-token matmul's rows): each thread then reads one
    /// stream, and its prefetches ahead land in the next task it runs itself. Claimed
    /// from one shared counter, the threads' tasks interleave and every task starts a
    /// stream cold: a Llama-1B-shaped decode step ran 5–18% slower that way (AMD Zen 5,
    /// two threads, four in-process A/B runs). Tasks of about equal cost split best.
    pub fn run_contiguous(&self, n_tasks: usize, f: impl Fn(usize) + Sync) {
        let contiguous = u32::try_from(n_tasks).is_ok();
        self.region(n_tasks, contiguous, &f);
    }

    fn region(&self, n_tasks: usize, contiguous: bool, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        let nested = IN_TASK.with(|c| c.get());
        let guard = if nested || self.workers.is_empty() || n_tasks == 1 {
            None
        } else {
            match self.run_lock.try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        };
        let Some(_guard) = guard else {
            for i in 0..n_tasks {
                f(i);
            }
            return;
        };
        let s = &*self.shared;
        let task: &Task<'_> = f;
        // SAFETY: the lifetime is erased only for the duration of this region: `run`
        // does not return before every worker has checked out (`pending == 0`), and
        // tasks are run under catch_unwind, so no path leaves early.
        let task: *const Task<'static> =
            unsafe { std::mem::transmute::<&Task<'_>, &'static Task<'static>>(task) };
        // SAFETY: we hold `run_lock` and `pending == 0` (the previous region ended),
        // so no worker reads `job` now.
        unsafe { *s.job.get() = Some(task) };
        s.n_tasks.store(n_tasks, Relaxed);
        s.next.store(0, Relaxed);
        s.contiguous.store(contiguous, Relaxed);
        if contiguous {
            let parts = s.runs.len();
            for (t, run) in s.runs.iter().enumerate() {
                // n_tasks < 2^32 (checked by the caller), so both ends fit.
                let (front, back) = (n_tasks * t / parts, n_tasks * (t + 1) / parts);
                run.store(pack(front, back), Relaxed);
            }
        }
        s.pending.store(self.workers.len(), Relaxed);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.work_cv.notify_all();
        }
        execute(s, f, 0);
        // Barrier: spin, then park until every worker has checked out.
        let start = Instant::now();
        let mut spins = 0u32;
        while s.pending.load(Acquire) != 0 {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                let mut l = s.lock.lock().unwrap_or_else(|p| p.into_inner());
                while s.pending.load(Acquire) != 0 {
                    l = s.done_cv.wait(l).unwrap_or_else(|p| p.into_inner());
                }
                break;
            }
        }
        // SAFETY: all workers have checked out; clear the dangling pointer.
        unsafe { *s.job.get() = None };
        let payload = s.panic.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(p) = payload {
            resume_unwind(p);
        }
    }
}

/// Lines a waiting worker prefetches between two looks at the epoch.
const IDLE_CHUNK: usize = 1024;

/// Prefetches the next `IDLE_CHUNK` bytes of the idle range, if any is left (claimed
/// atomically, so several workers split it). Returns whether it did.
fn prefetch_idle_chunk(s: &Shared) -> bool {
    let end = s.idle_end.load(Relaxed);
    if s.idle_next.load(Relaxed) >= end {
        return false;
    }
    let at = s.idle_next.fetch_add(IDLE_CHUNK, Acquire);
    if at >= end {
        return false;
    }
    for line in (at..end.min(at + IDLE_CHUNK)).step_by(64) {
        prefetch_l2(line);
    }
    true
}

/// Asks for the cache line at `addr` in L2. A prefetch reads nothing architecturally
/// and never faults, whatever the address.
#[inline(always)]
fn prefetch_l2(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht1` cannot fault and has no architectural effect; SSE is part of
    // x86-64.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Claims and runs tasks of the current region until none are left; `me` is the
/// participant's index (the caller 0, worker `i` `i`).
fn execute(s: &Shared, f: &Task<'_>, me: usize) {
    IN_TASK.with(|c| c.set(true));
    if s.contiguous.load(Relaxed) {
        while let Some(i) = claim(&s.runs[me], true) {
            run_task(s, f, i);
        }
        // Steal from the ends of the others' runs until all are empty.
        let parts = s.runs.len();
        loop {
            let stolen = (1..parts).find_map(|d| claim(&s.runs[(me + d) % parts], false));
            match stolen {
                Some(i) => run_task(s, f, i),
                None => break,
            }
        }
    } else {
        let n = s.n_tasks.load(Relaxed);
        loop {
            let i = s.next.fetch_add(1, Relaxed);
            if i >= n {
                break;
            }
            run_task(s, f, i);
        }
    }
    IN_TASK.with(|c| c.set(false));
}

/// Runs task `i`; a panic is kept for the caller to re-raise after the region.
fn run_task(s: &Shared, f: &Task<'_>, i: usize) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(i))) {
        let mut slot = s.panic.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(p);
        }
    }
}

fn pack(front: usize, back: usize) -> u64 {
    front as u64 | (back as u64) << 32
}

/// Takes the first (`front`) or last task left in `run`, if any.
fn claim(run: &AtomicU64, front: bool) -> Option<usize> {
    let mut cur = run.load(Relaxed);
    loop {
        let (f, b) = (cur & 0xFFFF_FFFF, cur >> 32);
        if f >= b {
            return None;
        }
        let (next, i) = if front {
            (cur + 1, f)
        } else {
            (cur - (1 << 32), b - 1)
        };
        match run.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
            Ok(_) => return Some(i as usize),
            Err(seen) => cur = seen,
        }
    }
}

fn worker(s: &Shared, me: usize) {
    let mut seen = 0usize;
    loop {
        // Wait for a new epoch: spin, then park.
        let mut start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Acquire) {
                return;
            }
            if s.epoch.load(Acquire) != seen {
                break;
            }
            if prefetch_idle_chunk(s) {
                // Prefetching is work: the spin before parking starts after it.
                start = Instant::now();
                continue;
            }
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                let mut l = s.lock.lock().unwrap_or_else(|p| p.into_inner());
                s.sleepers.fetch_add(1, SeqCst);
                while s.epoch.load(SeqCst) == seen && !s.shutdown.load(SeqCst) {
                    l = s.work_cv.wait(l).unwrap_or_else(|p| p.into_inner());
                }
                s.sleepers.fetch_sub(1, SeqCst);
                drop(l);
                spins = 0;
            }
        }
        if s.shutdown.load(Acquire) {
            return;
        }
        seen = s.epoch.load(Acquire);
        // SAFETY: the epoch we observed (Acquire) was published after `job` was set,
        // and the caller keeps the task alive until we decrement `pending` below.
        if let Some(task) = unsafe { *s.job.get() } {
            // SAFETY: see above; the pointee outlives this use.
            execute(s, unsafe { &*task }, me);
        }
        if s.pending.fetch_sub(1, AcqRel) == 1 {
            let _l = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.done_cv.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.work_cv.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}
