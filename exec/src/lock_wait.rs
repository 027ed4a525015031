//! Time a job spends waiting for the executor's locks, kept out of its compute time.
//!
//! A stage locks its chunk's values, a layer's KV cache or a shadow slot; when another
//! job holds one, the wait is not the stage's work, and a measured profile that counted
//! it would price the stage by its neighbours. Every lock the executor takes goes through
//! these functions: an uncontended lock costs one `try_lock`; a contended one is timed
//! and the wait added to a per-thread counter that the queue reads around each job
//! ([`take`]) and reports with the job's queue wait.
//!
//! ```
//! use parking_lot::Mutex;
//! use hetsched_exec::lock_wait;
//!
//! let m = Mutex::new(1);
//! lock_wait::take();
//! *lock_wait::lock(&m) += 1;
//! assert_eq!(lock_wait::take(), 0); // nobody held it
//! ```

use std::cell::Cell;
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

thread_local! {
    static WAITED_NS: Cell<u64> = const { Cell::new(0) };
}

/// The guard `try_now` gives, else `block`'s, with the time `block` took added to this
/// thread's wait.
fn timed<G>(try_now: impl FnOnce() -> Option<G>, block: impl FnOnce() -> G) -> G {
    if let Some(guard) = try_now() {
        return guard;
    }
    let waiting = Instant::now();
    let guard = block();
    let ns = waiting.elapsed().as_nanos() as u64;
    WAITED_NS.with(|w| w.set(w.get().saturating_add(ns)));
    guard
}

/// Locks `m`, counting any wait for it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    timed(|| m.try_lock(), || m.lock())
}

/// Read-locks `l`, counting any wait for it.
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    timed(|| l.try_read(), || l.read())
}

/// Write-locks `l`, counting any wait for it.
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    timed(|| l.try_write(), || l.write())
}

/// The lock wait this thread counted since the last call (ns), and resets it.
pub fn take() -> u64 {
    WAITED_NS.with(|w| w.replace(0))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_held_lock_is_counted_and_a_free_one_is_not() {
        let m = Arc::new(Mutex::new(0u32));
        take();
        drop(lock(&m));
        assert_eq!(take(), 0);
        let held = m.lock();
        let other = {
            let m = m.clone();
            std::thread::spawn(move || {
                take();
                *lock(&m) += 1;
                take()
            })
        };
        std::thread::sleep(Duration::from_millis(30));
        drop(held);
        let waited = other.join().unwrap();
        assert!(waited >= 20_000_000, "waited {waited} ns");
        // Counted on the waiting thread only.
        assert_eq!(take(), 0);
    }

    #[test]
    fn reader_and_writer_waits_are_counted() {
        let l = Arc::new(RwLock::new(0u32));
        let reading = l.read();
        let writer = {
            let l = l.clone();
            std::thread::spawn(move || {
                take();
                *write(&l) += 1;
                take()
            })
        };
        std::thread::sleep(Duration::from_millis(30));
        drop(reading);
        assert!(writer.join().unwrap() >= 20_000_000);
        take();
        drop(read(&l));
        assert_eq!(take(), 0);
    }
}
