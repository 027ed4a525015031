//! The host's queues as the engine's [`Backend`]: the record of jobs on them that host
//! threads report into, released to the scheduler by the run's clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hetsched_runtime::backends::{Backend, BackendError};
use hetsched_systems::resources::{Completion, Job};
use parking_lot::{Condvar, Mutex};

use super::{hs_job, hs_queue};
use crate::error::CapiError;

#[derive(Debug, Clone, Copy)]
pub(super) struct HostQueue(pub(super) hs_queue);

// SAFETY: the library never dereferences `user_data`; it hands it back to the host's own
// callbacks, on the thread that drives the engine, which the host chose by calling
// `hs_engine_run` / `hs_engine_step` there. The function pointers are plain code.
unsafe impl Send for HostQueue {}
// SAFETY: as above: shared only to be copied and passed back.
unsafe impl Sync for HostQueue {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Clock {
    Virtual,
    Wall,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Slot {
    Free,
    Running { job: hs_job, reported: bool },
}

/// The record host threads and the engine share: jobs running and what was reported.
#[derive(Debug)]
pub(super) struct Record {
    pub(super) slots: Vec<Slot>,
    pub(super) running: usize,
    pub(super) unreported: usize,
    /// Reported, not yet handed to the scheduler.
    pub(super) done: Vec<Completion>,
    pub(super) failure: Option<BackendError>,
    /// Wall clock: when the run started.
    pub(super) origin: Option<Instant>,
    /// Virtual clock: the latest time handed to the scheduler.
    pub(super) virtual_now: u64,
}

impl Record {
    pub(super) fn now_ns(&self, clock: Clock) -> u64 {
        match (clock, self.origin) {
            (Clock::Wall, Some(origin)) => origin.elapsed().as_nanos() as u64,
            (Clock::Wall, None) => 0,
            (Clock::Virtual, _) => self.virtual_now,
        }
    }

    /// The completions the scheduler may see now, and the time they bring.
    pub(super) fn release(&mut self, clock: Clock) -> Option<(u64, Vec<Completion>)> {
        if self.done.is_empty() {
            return None;
        }
        let (now, batch) = match clock {
            Clock::Wall => {
                let batch = std::mem::take(&mut self.done);
                let last_end = batch.iter().map(|c| c.end_ns).max().unwrap_or(0);
                (self.now_ns(clock).max(last_end), batch)
            }
            // As the simulated queues: the earliest end, once no running job could still
            // report an earlier one; ties in lane order.
            Clock::Virtual => {
                if self.unreported > 0 {
                    return None;
                }
                let now = self.done.iter().map(|c| c.end_ns).min()?;
                let (mut batch, rest): (Vec<_>, Vec<_>) =
                    self.done.drain(..).partition(|c| c.end_ns == now);
                self.done = rest;
                batch.sort_by_key(|c| c.processor);
                self.virtual_now = self.virtual_now.max(now);
                (now, batch)
            }
        };
        for c in &batch {
            self.slots[c.id as usize] = Slot::Free;
        }
        self.running -= batch.len();
        Some((now, batch))
    }

    /// Ends the record's run: every job still running on the host, to cancel.
    pub(super) fn close(&mut self) -> Vec<hs_job> {
        let to_cancel = self
            .slots
            .iter()
            .filter_map(|slot| match *slot {
                Slot::Running {
                    job,
                    reported: false,
                } => Some(job),
                _ => None,
            })
            .collect();
        self.slots.fill(Slot::Free);
        self.running = 0;
        self.unreported = 0;
        self.done.clear();
        to_cancel
    }

    /// The running, unreported job `id`, marked reported.
    pub(super) fn take_report(&mut self, id: u32) -> Result<hs_job, CapiError> {
        match self.slots.get_mut(id as usize) {
            Some(Slot::Running { job, reported }) if !*reported => {
                *reported = true;
                self.unreported -= 1;
                Ok(*job)
            }
            Some(Slot::Running { .. }) => Err(CapiError::UnknownJob(format!(
                "job {id} was already reported: a job is reported once"
            ))),
            _ => Err(CapiError::UnknownJob(format!(
                "job {id} is not running: never submitted, or its run is over"
            ))),
        }
    }
}

#[derive(Debug)]
pub(super) struct Reports {
    pub(super) clock: Clock,
    pub(super) record: Mutex<Record>,
    pub(super) changed: Condvar,
}

impl Reports {
    pub(super) fn complete(&self, id: u32, start_ns: u64, end_ns: u64) -> Result<(), CapiError> {
        let mut record = self.record.lock();
        let job = record.take_report(id)?;
        record.done.push(Completion {
            id,
            processor: job.processor as usize,
            start_ns,
            end_ns,
        });
        self.changed.notify_all();
        Ok(())
    }

    pub(super) fn fail(&self, id: u32, reason: String) -> Result<(), CapiError> {
        let mut record = self.record.lock();
        let job = record.take_report(id)?;
        record.failure.get_or_insert(BackendError {
            processor: job.processor as usize,
            job: id,
            reason,
        });
        self.changed.notify_all();
        Ok(())
    }

    /// Blocks until completions may be released, a failure was reported, or `until`.
    pub(super) fn take(
        &self,
        until: Option<Instant>,
    ) -> Result<(u64, Vec<Completion>), BackendError> {
        let mut record = self.record.lock();
        loop {
            if let Some(failure) = record.failure.take() {
                return Err(failure);
            }
            if let Some(batch) = record.release(self.clock) {
                return Ok(batch);
            }
            let timed_out = match until {
                None => {
                    self.changed.wait(&mut record);
                    false
                }
                Some(until) => self.changed.wait_until(&mut record, until).timed_out(),
            };
            if timed_out {
                if let Some(failure) = record.failure.take() {
                    return Err(failure);
                }
                let now = record.now_ns(self.clock);
                return Ok(record.release(self.clock).unwrap_or((now, Vec::new())));
            }
        }
    }
}

/// The engine's [`Backend`]: jobs go to the host's callbacks, completions come from
/// [`Reports`].
pub(super) struct HostQueues {
    pub(super) reports: Arc<Reports>,
    pub(super) queues: Vec<Option<HostQueue>>,
}

impl Backend for HostQueues {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        let failed = |reason: String| BackendError {
            processor: job.processor,
            job: job.id,
            reason,
        };
        let descriptor = hs_job {
            id: job.id,
            chunk: job.key.chunk,
            stage: job.key.stage,
            processor: job.processor as u32,
            request: job.request.0,
            estimated_ns: job.estimated_ns,
            dispatched_ns: job.dispatched_ns,
        };
        let Some(HostQueue(queue)) = self.queues.get(job.processor).copied().flatten() else {
            return Err(failed(
                "no host queue is registered for this processor".into(),
            ));
        };
        let Some(submit) = queue.submit else {
            return Err(failed("the host queue has no submit callback".into()));
        };
        {
            let mut record = self.reports.record.lock();
            record.slots[job.id as usize] = Slot::Running {
                job: descriptor,
                reported: false,
            };
            record.running += 1;
            record.unreported += 1;
        }
        // Recorded before the call: a queue may complete the job inside `submit`.
        // SAFETY: `submit` is the host's callback, registered non-null with
        // `hs_engine_set_queue`; the descriptor lives across the call and `user_data` is
        // the host's own pointer, passed back unread.
        let code = unsafe { submit(&descriptor, queue.user_data) };
        if code != 0 {
            let mut record = self.reports.record.lock();
            if let Slot::Running { reported, .. } = record.slots[job.id as usize] {
                if !reported {
                    record.unreported -= 1;
                }
                record.running -= 1;
                record.done.retain(|c| c.id != job.id);
                record.slots[job.id as usize] = Slot::Free;
            }
            return Err(failed(format!(
                "the host's submit callback returned {code}"
            )));
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.reports.record.lock().running
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        self.reports.take(None)
    }

    fn wait_for(&mut self, timeout: Duration) -> Result<(u64, Vec<Completion>), BackendError> {
        self.reports.take(Some(Instant::now() + timeout))
    }
}
