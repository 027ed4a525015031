//! Queue backends: where dispatched jobs run.
//!
//! The contract: the engine hands every [`Job`] the scheduler dispatched to
//! [`Backend::submit`], then blocks in [`Backend::wait`] for the next completions and the
//! time they carry. A backend never decides what runs next; the scheduler systems do.
//! An embedder plugs in its own queues (a QNN queue on a phone, say) by implementing this
//! trait.
//!
//! The engine trusts no backend: every completion is checked against what was submitted
//! (`engine::guard`), panics in `submit`/`wait` and waits that make no progress become
//! [`crate::engine::BackendFault`]s, never a panic or a hang.

pub mod shared_pool;
pub mod sim;
pub mod worker_pool;

use std::time::Duration;

use hetsched_systems::resources::{Completion, Job};
use thiserror::Error;

/// A queue failure, reported instead of a completion.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("processor {processor} failed job {job}: {reason}")]
pub struct BackendError {
    /// Processor lane.
    pub processor: usize,
    /// Instance id of the failed job.
    pub job: u32,
    /// What went wrong.
    pub reason: String,
}

/// Processor queues behind the scheduler.
///
/// # The contract
/// - [`Backend::submit`] gets each [`Job`] once, on an idle processor: `id` (the instance
///   to report back), `key` (its chunk and stage), `processor` (the lane it must run on),
///   `estimated_ns` (its modeled cost there: a simulated queue takes exactly this long,
///   a real one may use it for a deadline) and `dispatched_ns` (the engine's clock when it
///   was dispatched). Return quickly: run the job elsewhere (a thread, a device queue)
///   and report it through `wait`. An `Err` fails the run.
/// - [`Backend::wait`] blocks until at least one job has finished and returns
///   `(now_ns, completions)`: each [`Completion`] names the job's `id` and its own
///   `processor`, with `start_ns <= end_ns`. Every time is on one clock of the
///   backend's choosing whose origin is the run's start (the engine's clock starts at 0
///   and `dispatched_ns` is read from it; a simulation's virtual clock, or wall time
///   since the first submit); `now_ns` never runs behind the completions it returns.
/// - Failures: one job's failure is a [`BackendError`] naming it, returned from `submit`
///   or `wait`; a failure not tied to one job (a device lost) is returned from `wait`
///   naming any job it stops, and ends the run. The engine checks everything it is told
///   ([`crate::engine::BackendFault`]: unknown or duplicate completions, wrong lanes,
///   time reversed, panics, waits without progress, jobs past their deadline).
pub trait Backend {
    /// Starts `job` on its processor. The scheduler guarantees the processor is idle.
    fn submit(&mut self, job: Job) -> Result<(), BackendError>;
    /// Jobs submitted and not yet reported.
    fn in_flight(&self) -> usize;
    /// Blocks until at least one job finishes; returns the current time in ns and every
    /// completion up to it. Called only while [`Backend::in_flight`] is non-zero.
    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError>;
    /// Like [`Backend::wait`], but returns no completions once `timeout` has passed with
    /// none: the engine calls it when jobs have deadlines ([`crate::engine::Deadline`]).
    /// The default waits without a bound, so a backend that can lose a job should
    /// implement it.
    fn wait_for(&mut self, timeout: Duration) -> Result<(u64, Vec<Completion>), BackendError> {
        let _ = timeout;
        self.wait()
    }
    /// The engine gives up on job `id` on `processor` (it ran past its deadline) to run
    /// it on another processor. Return `true` only if the job's late effects are
    /// discarded (cancelled, or its outputs isolated): the engine then drops its late
    /// completion, if one comes, and never submits to `processor` again. The default,
    /// `false`, keeps the job: the run fails with a deadline error instead.
    fn abandon(&mut self, id: u32, processor: usize) -> bool {
        let _ = (id, processor);
        false
    }
}
