//! The driver of one engine: its run's phase, stepped or run to the end on the host's
//! thread, and a cancel that reaches the run when it may.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use hetsched_runtime::cancel::CancelFlag;
use hetsched_runtime::engine::{RunOutcome, Step, Stepper, Wait};
use parking_lot::Mutex;

use super::host_queue::{HostQueue, HostQueues, Reports};
use super::{hs_engine, hs_queue};
use crate::error::CapiError;
use crate::handles::HandleKind;

pub(super) enum Phase {
    Ready(Stepper),
    Running(Stepper),
    Finished(RunOutcome),
    Failed(String),
}

pub(super) struct Driver {
    pub(super) phase: Phase,
    pub(super) queues: HostQueues,
}

/// A cancel asked for by the host, and when the run's own flag takes it.
///
/// The run checks its [`CancelFlag`] before every tick and then drains the jobs in
/// flight, blocking until the host reports them. A blocking driver may block, so the
/// flag is set at once; a stepped driver must not (a host that reports from its own
/// event loop would never get back to it), so the flag waits until every running job is
/// reported and the drain finds them all. `requested` and `blocking` are each written by
/// one side and read by the other (sequentially consistent): whichever side comes second
/// sets the flag.
#[derive(Debug, Default)]
pub(super) struct CancelRequest {
    pub(super) requested: AtomicBool,
    /// Whether the driver is inside a blocking `hs_engine_run`.
    pub(super) blocking: AtomicBool,
    /// The run's flag ([`EngineOptions::cancel`]).
    pub(super) flag: CancelFlag,
}

impl CancelRequest {
    /// The host's side (`hs_engine_cancel`).
    pub(super) fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
        if self.blocking.load(Ordering::SeqCst) {
            self.flag.cancel();
        }
    }

    /// The driver's side, before a step: whether the run may step now. A stepped run
    /// with a cancel pending and jobs unreported waits for their reports.
    pub(super) fn before_step(&self, wait: Wait, reports: &Reports) -> bool {
        self.blocking.store(wait == Wait::Block, Ordering::SeqCst);
        if !self.requested.load(Ordering::SeqCst) {
            return true;
        }
        if wait == Wait::Poll && reports.record.lock().unreported > 0 {
            return false;
        }
        self.flag.cancel();
        true
    }
}

/// An engine: the run's driver (taken by the thread driving it) and the record host
/// threads report to.
pub(crate) struct EngineObject {
    pub(super) scene_name: String,
    pub(super) lanes: usize,
    pub(super) reports: Arc<Reports>,
    pub(super) cancel: CancelRequest,
    pub(super) driver: Mutex<Driver>,
}

impl HandleKind for EngineObject {
    const KIND: &'static str = "engine";
    type C = hs_engine;
}

impl EngineObject {
    pub(super) fn driver(&self) -> Result<parking_lot::MutexGuard<'_, Driver>, CapiError> {
        self.driver.try_lock().ok_or_else(|| {
            CapiError::State(
                "the engine is being driven on another thread, or this call came from one of its queue callbacks".into(),
            )
        })
    }

    /// Runs or steps the run; `Ok(true)` once it finished.
    pub(super) fn advance(&self, wait: Wait) -> Result<bool, CapiError> {
        let mut driver = self.driver()?;
        let Driver { phase, queues } = &mut *driver;
        if let Phase::Ready(_) = phase {
            if let Some(lane) = queues.queues.iter().position(Option::is_none) {
                return Err(CapiError::State(format!(
                    "processor {lane} has no queue: register one with hs_engine_set_queue for each of the plan's {} processors",
                    self.lanes
                )));
            }
            self.reports.record.lock().origin = Some(Instant::now());
            let Phase::Ready(stepper) = std::mem::replace(phase, Phase::Failed(String::new()))
            else {
                unreachable!("matched above");
            };
            *phase = Phase::Running(stepper);
        }
        let stepper = match phase {
            Phase::Running(stepper) => stepper,
            Phase::Finished(_) => return Ok(true),
            Phase::Failed(message) => {
                return Err(CapiError::State(format!(
                    "the run already ended: {message}"
                )));
            }
            Phase::Ready(_) => unreachable!("started above"),
        };
        if !self.cancel.before_step(wait, &self.reports) {
            return Ok(false);
        }
        let stepped = stepper.step(queues, wait);
        self.cancel.blocking.store(false, Ordering::SeqCst);
        match stepped {
            Ok(Step::Running { .. }) => Ok(false),
            Ok(Step::Finished) => {
                let Phase::Running(stepper) =
                    std::mem::replace(phase, Phase::Failed(String::new()))
                else {
                    unreachable!("running");
                };
                let outcome = stepper
                    .finish()
                    .ok_or_else(|| CapiError::Internal("a finished run had no outcome".into()))?;
                *phase = Phase::Finished(outcome);
                self.reports.record.lock().close();
                Ok(true)
            }
            Err(error) => {
                *phase = Phase::Failed(error.to_string());
                let to_cancel = self.reports.record.lock().close();
                for job in to_cancel {
                    let queue = queues.queues.get(job.processor as usize).copied().flatten();
                    if let Some(HostQueue(hs_queue {
                        cancel: Some(cancel),
                        user_data,
                        ..
                    })) = queue
                    {
                        // SAFETY: the host's own callback and pointer, as for `submit`;
                        // the descriptor lives across the call.
                        unsafe { cancel(&job, user_data) };
                    }
                }
                Err(CapiError::Run(error))
            }
        }
    }
}
