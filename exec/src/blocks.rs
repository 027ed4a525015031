//! One job's parallel loop over blocks, on the shared pool, that never waits on another
//! lane's work.
//!
//! The lanes share one rayon pool ([`crate::ThreadQueues`]). With rayon's parallel
//! iterators a job's loop waits for halves that another worker stole, and a worker that
//! waits in rayon looks for other work meanwhile: it may take the *other lane's* next job
//! from the pool's queue and run it whole before it returns to its own. The job then
//! ends only after that other job (traced at 2 threads, SmolLM2 w8a8 pp512: the O and QKV
//! projections that overlapped part of an attention job took 1.4-1.9x their one-thread
//! time), and the lane behind it idles. Here the blocks are claimed from a shared counter
//! instead: the calling thread works through them, and helpers (spawned once per other
//! worker) join it only while blocks are left. At the end the caller waits, spinning,
//! until every helper it spawned has returned: one still queued on its own worker it runs
//! itself (`rayon::yield_local` takes only this worker's queue), one another worker took
//! is running there. A helper that starts after the last block was claimed returns at
//! once. So the scope ends with nothing left to wait for, but for the moment rayon takes
//! to complete a helper that has just returned.
//!
//! That keeps a job out of rayon's waits, where it could start the other lane's job under
//! locks it holds; the executor's `unnested` module makes sure such a job does not start
//! even then. Helpers mark their thread as working for a job while they run.
//!
//! Results do not depend on how the blocks are shared: each block is computed by one
//! call of `work`, as before.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::unnested;

/// Elements per block of an element-wise pass split with [`for_each_block`]: 64 KiB of
/// f32, a few microseconds of work; a chunk's FFN activation (128 × 1536) is 12 blocks,
/// and a pass over fewer than two blocks runs on the caller alone.
pub const ELEMENTS_PER_BLOCK: usize = 16 * 1024;

/// Spins of [`for_each_block`]'s final wait before it yields the core between checks.
const SPINS_BEFORE_YIELD: u32 = 64;

/// Runs `work(block)` once for every element of `blocks`, claimed in their order, on the
/// calling thread and on up to one helper per other worker of the current rayon pool.
/// Put the heaviest blocks first: the last ones claimed decide when the loop ends.
pub fn for_each_block<T: Send>(blocks: Vec<T>, work: impl Fn(T) + Sync) {
    let n = blocks.len();
    let helpers = rayon::current_num_threads()
        .saturating_sub(1)
        .min(n.saturating_sub(1));
    if helpers == 0 {
        blocks.into_iter().for_each(work);
        return;
    }
    let slots: Vec<Mutex<Option<T>>> = blocks.into_iter().map(|b| Mutex::new(Some(b))).collect();
    let next = AtomicUsize::new(0);
    // Helpers that have not returned yet, counted before any is spawned.
    let unfinished = AtomicUsize::new(helpers);
    let claim = || {
        loop {
            let i = next.fetch_add(1, Ordering::SeqCst);
            let Some(slot) = slots.get(i) else { break };
            if let Some(block) = slot.lock().take() {
                work(block);
            }
        }
    };
    rayon::in_place_scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|_| {
                let _working = unnested::working();
                // Counted out also when a block panics: the caller's wait below ends,
                // and the scope hands the panic on.
                let _returned = Returned(&unfinished);
                claim();
            });
        }
        claim();
        // Every block is claimed; wait here, not in the scope, where rayon would run
        // other work (see the module): helpers still queued here run now and return at
        // once, those running elsewhere finish at most one block each.
        let mut spins = 0u32;
        while unfinished.load(Ordering::SeqCst) > 0 {
            if rayon::yield_local() == Some(rayon::Yield::Executed) {
                continue;
            }
            if spins < SPINS_BEFORE_YIELD {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    });
}

/// Counts a helper out of [`for_each_block`]'s wait when it returns or unwinds.
struct Returned<'a>(&'a AtomicUsize);

impl Drop for Returned<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_runs_once_on_any_pool() {
        for threads in [1, 2, 4] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for n in [0, 1, 2, 3, 17, 100] {
                let mut out = vec![0u32; n];
                let blocks: Vec<(usize, &mut u32)> = out.iter_mut().enumerate().collect();
                pool.install(|| {
                    for_each_block(blocks, |(i, o)| *o += i as u32 + 1);
                });
                let want: Vec<u32> = (1..=n as u32).collect();
                assert_eq!(out, want, "{threads} threads, {n} blocks");
            }
        }
    }

    #[test]
    fn helpers_share_the_blocks_of_a_long_loop() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let runners = Mutex::new(std::collections::HashSet::new());
        pool.install(|| {
            for_each_block((0..64).collect(), |_: usize| {
                runners.lock().insert(std::thread::current().id());
                std::thread::sleep(std::time::Duration::from_millis(2));
            });
        });
        assert_eq!(runners.lock().len(), 2, "both workers ran blocks");
    }

    #[test]
    fn a_panic_in_a_helpers_block_reaches_the_caller() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let helper_failed = std::sync::atomic::AtomicBool::new(false);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| {
                let caller = std::thread::current().id();
                // The caller's blocks leave time (up to 2 s) for the helper to start.
                for_each_block((0..2000).collect(), |_: usize| {
                    if std::thread::current().id() != caller {
                        helper_failed.store(true, Ordering::SeqCst);
                        panic!("a helper's block fails");
                    }
                    if !helper_failed.load(Ordering::SeqCst) {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                });
            })
        }));
        assert!(
            helper_failed.load(Ordering::SeqCst),
            "the helper ran a block"
        );
        assert!(caught.is_err(), "the helper's panic reached the caller");
        // The pool goes on.
        let mut out = vec![0u8; 4];
        pool.install(|| for_each_block(out.iter_mut().collect(), |o| *o = 1));
        assert_eq!(out, [1; 4]);
    }
}
