//! The thread pool: every task exactly once, under contention and from several
//! callers, in shared-counter and in contiguous regions; a panicking task is re-raised
//! on the caller and the pool keeps working.

use llamay_kernels::ThreadPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

#[test]
fn every_task_runs_exactly_once() {
    for threads in [1, 2, 3, 8] {
        let pool = ThreadPool::new(threads);
        assert_eq!(pool.n_threads(), threads);
        for n in [0usize, 1, 2, 7, 100, 5000] {
            for _ in 0..20 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, |i| {
                    hits[i].fetch_add(1, Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Relaxed) == 1),
                    "threads={threads} n={n}"
                );
            }
        }
    }
}

/// `run_contiguous` as `run`: every task once, whatever the thread count, and the two
/// kinds of region alternate on one pool.
#[test]
fn contiguous_regions_run_every_task_exactly_once() {
    for threads in [1, 2, 3, 8] {
        let pool = ThreadPool::new(threads);
        for n in [0usize, 1, 2, 3, 7, 100, 5000] {
            for round in 0..20 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                let count = |i: usize| {
                    hits[i].fetch_add(1, Relaxed);
                };
                if round % 2 == 0 {
                    pool.run_contiguous(n, count);
                } else {
                    pool.run(n, count);
                }
                assert!(
                    hits.iter().all(|h| h.load(Relaxed) == 1),
                    "threads={threads} n={n} round={round}"
                );
            }
        }
    }
}

/// Each thread takes its own run in order, and a thread held up in its first task has
/// the rest of its run taken from the back by the others instead of finishing it late.
#[test]
fn contiguous_runs_go_in_order_and_a_slow_thread_is_stolen_from() {
    let pool = ThreadPool::new(2);
    let n = 16;
    let ran: std::sync::Mutex<Vec<(std::thread::ThreadId, usize)>> = Default::default();
    let caller = std::thread::current().id();
    pool.run_contiguous(n, |i| {
        if i == 0 {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        ran.lock().unwrap().push((std::thread::current().id(), i));
    });
    let ran = ran.into_inner().unwrap();
    assert_eq!(ran.len(), n);
    // The caller's run is 0..8: it is held up in task 0, so the worker, done with
    // 8..16, steals from 7 down.
    let by_caller: Vec<usize> = ran.iter().filter(|r| r.0 == caller).map(|r| r.1).collect();
    let by_worker: Vec<usize> = ran.iter().filter(|r| r.0 != caller).map(|r| r.1).collect();
    if !by_caller.contains(&0) {
        // The caller was descheduled before it claimed its first task and the worker ran
        // everything: possible on a loaded machine, and nothing left to check.
        assert_eq!(by_worker.len(), n);
        return;
    }
    assert!(
        by_worker.starts_with(&(8..16).collect::<Vec<_>>()),
        "the worker's own run first, in order: {by_worker:?}"
    );
    assert!(
        by_worker.len() > 8 && by_worker[8] == 7,
        "the worker stole the caller's tasks from the back: {by_worker:?}"
    );
    assert!(
        by_worker[8..].windows(2).all(|w| w[0] > w[1]),
        "{by_worker:?}"
    );
}

#[test]
fn a_panic_in_a_contiguous_region_is_reraised_and_the_pool_survives() {
    let pool = ThreadPool::new(3);
    let done = AtomicUsize::new(0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.run_contiguous(90, |i| {
            if i == 45 {
                panic!("task {i} fails");
            }
            done.fetch_add(1, Relaxed);
        })
    }));
    assert!(r.is_err());
    assert_eq!(done.load(Relaxed), 89, "the other tasks still ran");
    let hits = AtomicUsize::new(0);
    pool.run_contiguous(1000, |_| {
        hits.fetch_add(1, Relaxed);
    });
    assert_eq!(hits.load(Relaxed), 1000);
}

#[test]
fn many_callers_share_one_pool() {
    let pool = Arc::new(ThreadPool::new(4));
    let total = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let (pool, total) = (Arc::clone(&pool), Arc::clone(&total));
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
                    pool.run(64, |i| {
                        hits[i].fetch_add(1, Relaxed);
                    });
                    assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
                    total.fetch_add(64, Relaxed);
                }
            })
        })
        .collect();
    for c in callers {
        c.join().unwrap();
    }
    assert_eq!(total.load(Relaxed), 4 * 200 * 64);
}

#[test]
fn nested_regions_run_inline() {
    let pool = ThreadPool::new(3);
    let count = AtomicUsize::new(0);
    pool.run(8, |_| {
        pool.run(5, |_| {
            count.fetch_add(1, Relaxed);
        });
    });
    assert_eq!(count.load(Relaxed), 40);
}

#[test]
fn a_panicking_task_is_reraised_and_the_pool_survives() {
    let pool = ThreadPool::new(4);
    for round in 0..10 {
        let done = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(100, |i| {
                if i == 7 + round {
                    panic!("task {i} fails");
                }
                done.fetch_add(1, Relaxed);
            })
        }));
        let msg = r.expect_err("the panic reaches the caller");
        assert!(
            msg.downcast_ref::<String>()
                .is_some_and(|m| m.contains("fails"))
        );
        assert_eq!(done.load(Relaxed), 99, "the other tasks still ran");
        let hits = AtomicUsize::new(0);
        pool.run(1000, |_| {
            hits.fetch_add(1, Relaxed);
        });
        assert_eq!(hits.load(Relaxed), 1000);
    }
}

#[test]
fn parked_workers_wake_up() {
    let pool = ThreadPool::new(3);
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let hits = AtomicUsize::new(0);
        pool.run(50, |_| {
            hits.fetch_add(1, Relaxed);
        });
        assert_eq!(hits.load(Relaxed), 50);
    }
}

#[test]
fn oversubscribed_pool_finishes() {
    let pool = ThreadPool::new(16);
    let start = std::time::Instant::now();
    for _ in 0..200 {
        let hits = AtomicUsize::new(0);
        pool.run(32, |_| {
            hits.fetch_add(1, Relaxed);
        });
        assert_eq!(hits.load(Relaxed), 32);
    }
    assert!(start.elapsed().as_secs() < 30);
}

/// Idle prefetching takes addresses only: a range that was freed, was never mapped or
/// wraps around the address space is prefetched harmlessly, and regions keep running
/// (and finishing) while workers are busy with one.
#[test]
fn idle_prefetch_takes_any_range() {
    let pool = ThreadPool::new(3);
    let freed = {
        let v = vec![7u8; 1 << 20];
        (v.as_ptr() as usize, v.len())
    };
    for (addr, len) in [freed, (0, 1 << 16), (usize::MAX - 4096, 1 << 20), (64, 0)] {
        pool.prefetch_while_idle(addr, len);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let hits = AtomicUsize::new(0);
        pool.run(64, |_| {
            hits.fetch_add(1, Relaxed);
        });
        assert_eq!(hits.load(Relaxed), 64);
    }
    // A live range, handed over and replaced before the workers are done with it.
    let data = vec![1u8; 8 << 20];
    for _ in 0..50 {
        pool.prefetch_while_idle(data.as_ptr() as usize, data.len());
        let sum = AtomicUsize::new(0);
        pool.run(8, |i| {
            let part = &data[i << 20..(i + 1) << 20];
            sum.fetch_add(part.iter().map(|&b| b as usize).sum(), Relaxed);
        });
        assert_eq!(sum.load(Relaxed), data.len());
    }
}
