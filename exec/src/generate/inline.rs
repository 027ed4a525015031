//! A backend that runs each job on the engine's own thread as it is submitted: the queue
//! of a decode step.
//!
//! A decode step is one chain of subgraph instances (each waits for the one before), so
//! no two of its jobs ever overlap and a queue thread buys nothing; handing each job to a
//! lane thread and its completion back costs two thread wake-ups per instance, which for
//! a one-token stage of tens of microseconds was most of the step. Here the engine (run
//! inside the session's pool) calls the stage runner directly and the completion is
//! there at the next wait. Times are taken around the job as the thread queues do.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use hetsched_runtime::backends::{Backend, BackendError};
use hetsched_runtime::engine::panic_message;
use hetsched_systems::resources::{Completion, Job};

use crate::JobRunner;

/// Runs jobs inline on `runner`; times from `started`.
pub(super) struct InlineQueue<'a> {
    runner: &'a dyn JobRunner,
    started: Instant,
    done: Vec<Completion>,
}

impl<'a> InlineQueue<'a> {
    /// A queue for one run of `runner`, its clock starting now.
    pub(super) fn new(runner: &'a dyn JobRunner) -> Self {
        Self {
            runner,
            started: Instant::now(),
            done: Vec::new(),
        }
    }

    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }
}

impl Backend for InlineQueue<'_> {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        let start_ns = self.now_ns();
        // A kernel that panics (a broken invariant) fails the job instead of the process.
        let outcome = catch_unwind(AssertUnwindSafe(|| self.runner.run(&job)));
        let reason = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(panic) => Some(format!("panicked: {}", panic_message(&*panic))),
        };
        if let Some(reason) = reason {
            return Err(BackendError {
                processor: job.processor,
                job: job.id,
                reason,
            });
        }
        let end_ns = self.now_ns().max(start_ns);
        self.done.push(Completion {
            id: job.id,
            processor: job.processor,
            start_ns,
            end_ns,
        });
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        Ok((self.now_ns(), std::mem::take(&mut self.done)))
    }
}
