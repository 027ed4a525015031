//! A lane's job starts only on a pool thread that is not already working for a job.
//!
//! The lanes share one rayon pool, and a job holds the executor's locks (its chunk's
//! values, a layer's key and value rows) while it works. A rayon worker that waits inside
//! rayon (the end of a scope, a join) runs whatever work it finds meanwhile, the other
//! lane's next job included. Run there, that job may ask for a lock that the job further
//! down the same thread's stack holds: the inner job waits for the outer one, the outer
//! one cannot go on until the inner returns, and the prefill stops until the engine's
//! deadline. It did, about one run in three, with both lanes on the CPU at 2 threads.
//!
//! [`for_each_block`](crate::blocks::for_each_block) keeps a job out of rayon's waits
//! almost always, but not always: a helper that has returned is still being completed by
//! rayon for a moment, and a caller that arrives at the scope's end in that moment waits
//! there (a loop of two blocks run 200,000 times while a second lane handed the pool
//! jobs ran one of them inside such a wait in 4 of 5 runs). So the guarantee is made
//! here: a thread marks itself [`working`] for the span of a job and of every helper it
//! runs for one, and a job handed to such a thread ([`install`]) does not start: the
//! lane hands it to the pool again.

use std::cell::Cell;

thread_local! {
    /// Whether this thread is running a job, or a helper's share of one.
    static WORKING: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as working for a job until the guard drops (nested marks restore
/// the state they found).
#[must_use = "the mark lasts as long as the guard"]
pub struct Working {
    was: bool,
}

/// Marks this thread as working for a job (see the module).
pub fn working() -> Working {
    Working {
        was: WORKING.with(|w| w.replace(true)),
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        WORKING.with(|w| w.set(self.was));
    }
}

/// Runs `job` on a worker of `pool` that is not working for another job: a worker that
/// is (it took the job inside a wait of its own) hands it back at once and the pool is
/// asked again, after this thread lets others run.
pub fn install<R: Send>(pool: &rayon::ThreadPool, job: impl Fn() -> R + Sync) -> R {
    loop {
        let ran = pool.install(|| {
            if WORKING.with(Cell::get) {
                return None;
            }
            let _working = working();
            Some(job())
        });
        match ran {
            Some(result) => return result,
            None => std::thread::yield_now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::blocks::for_each_block;

    #[test]
    fn a_job_never_starts_inside_another_jobs_wait() {
        // One lane's jobs loop over blocks again and again while a second lane keeps
        // handing the pool jobs: a second-lane job that found its thread inside a loop
        // ran within that loop's wait (where a lock the loop's job holds could stop both
        // for good).
        thread_local! {
            static IN_LOOP: Cell<bool> = const { Cell::new(false) };
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let done = AtomicBool::new(false);
        let (nested, other_jobs) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    install(&pool, || {
                        if IN_LOOP.with(Cell::get) {
                            nested.fetch_add(1, Ordering::SeqCst);
                        }
                        other_jobs.fetch_add(1, Ordering::SeqCst);
                    });
                }
            });
            for _ in 0..2_000 {
                install(&pool, || {
                    for _ in 0..100 {
                        IN_LOOP.with(|f| f.set(true));
                        for_each_block(vec![(); 2], |()| std::hint::spin_loop());
                        IN_LOOP.with(|f| f.set(false));
                    }
                });
            }
            done.store(true, Ordering::SeqCst);
        });
        assert!(other_jobs.load(Ordering::SeqCst) > 0, "the second lane ran");
        assert_eq!(nested.load(Ordering::SeqCst), 0, "jobs ran inside a wait");
    }

    #[test]
    fn the_mark_lasts_as_long_as_its_guard_and_nests() {
        assert!(!WORKING.with(Cell::get));
        {
            let _outer = working();
            {
                let _inner = working();
                assert!(WORKING.with(Cell::get));
            }
            assert!(
                WORKING.with(Cell::get),
                "the inner guard kept the outer mark"
            );
        }
        assert!(!WORKING.with(Cell::get));
    }
}
