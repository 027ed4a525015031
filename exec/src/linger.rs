//! A pool worker that has finished a job stays awake a little while, polling for work.
//!
//! A rayon worker with nothing to do sleeps within microseconds, and waking it takes a
//! futex and, on a virtual machine, a halted virtual CPU brought back by the host: long
//! next to this executor's jobs (a chunk's INT8 GEMM is 100-300 µs). Jobs come one at a
//! time per lane with an engine round trip between them, so without this the second
//! worker was asleep at the start of most parallel loops and joined late: a job alone
//! on 2 workers ran 1.2-1.7x faster than on one where the same GEMM, back to back, runs
//! 1.9-2.1x (`cargo bench -p hetsched-exec --bench gemm_split`). llama.cpp's pool spins
//! between operations for the same reason.
//!
//! After each job [`after_job`] queues one [`LINGER`]-long polling loop on the worker:
//! it runs whatever work appears (the next lane job, another job's helper) through
//! `rayon::yield_now` as soon as it appears, and lets the OS run other threads between
//! polls. It never holds work back: it runs after the job it follows, and anything that
//! arrives meanwhile runs at once, inside it. One per worker at a time.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// How long a worker polls after its last work before it goes back to rayon (and sleeps):
/// longer than the engine's round trip between a lane's jobs and than most stretches in
/// which one lane has no job, short enough that an idle process stops spinning at once.
pub const LINGER: Duration = Duration::from_millis(2);

thread_local! {
    /// Whether this worker is inside its polling loop (jobs it runs there queue no other).
    static LINGERING: Cell<bool> = const { Cell::new(false) };
}

/// Queues a polling loop on the current rayon worker, unless one is already running on
/// it (the job that calls this ran inside it) or this is not a pool thread.
pub fn after_job() {
    if rayon::current_thread_index().is_none() || LINGERING.with(Cell::get) {
        return;
    }
    rayon::spawn(linger);
}

/// Polls for work until [`LINGER`] has passed since the last work it ran. A loop queued
/// by another worker and run here, inside this worker's own loop (`yield_now` runs
/// whatever it finds, stolen loops included), returns at once: nested, each would clear
/// the flag of the loop around it on return, so that jobs run after it queued loops
/// again, and loops nested in loops grew the stack until it overflowed.
fn linger() {
    if LINGERING.with(|l| l.replace(true)) {
        return;
    }
    let mut until = Instant::now() + LINGER;
    while Instant::now() < until {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => until = Instant::now() + LINGER,
            // The lane and engine threads share these cores: let them run between polls.
            Some(rayon::Yield::Idle) => std::thread::yield_now(),
            None => break,
        }
    }
    LINGERING.with(|l| l.set(false));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_run_inside_another_returns_at_once_and_leaves_it_lingering() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let flag_after = pool.install(|| {
            LINGERING.with(|l| l.set(true));
            linger();
            let after = LINGERING.with(Cell::get);
            LINGERING.with(|l| l.set(false));
            after
        });
        assert!(flag_after, "the outer loop's flag was cleared");
    }

    #[test]
    fn a_lingering_worker_runs_work_that_arrives_and_then_stops() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // A job queues the polling loop on the only worker and holds the worker until a
        // second job has been injected, so that the loop, when it starts, finds that job
        // waiting (however late this thread gets a core: injecting it after the loop had
        // begun raced the loop's LINGER on a loaded machine).
        let (release, held) = std::sync::mpsc::channel::<()>();
        pool.spawn(move || {
            after_job();
            held.recv().unwrap();
        });
        let tx2 = tx.clone();
        pool.spawn(move || tx2.send(LINGERING.with(Cell::get)).unwrap());
        release.send(()).unwrap();
        // The worker's own queue comes first: its polling loop, which runs the injected
        // job inside it.
        assert!(rx.recv().unwrap(), "ran inside the polling loop");
        // Long after LINGER the worker has stopped polling: new work runs outside it.
        std::thread::sleep(LINGER * 100);
        pool.spawn(move || tx.send(LINGERING.with(Cell::get)).unwrap());
        assert!(
            !rx.recv().unwrap(),
            "the loop ended after LINGER without work"
        );
    }

    #[test]
    fn outside_a_pool_it_does_nothing() {
        after_job();
        assert!(!LINGERING.with(Cell::get));
    }
}
