//! The thread pool: every task exactly once, under contention and from several
//! callers; a panicking task is re-raised on the caller and the pool keeps working.

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
