//! Runs on the host's own queues.
//!
//! The host registers one queue per processor lane of the plan: a `submit` callback the
//! engine calls with each job it dispatches there, and an optional `cancel` callback. The
//! host runs the job however it likes (its own threads, a DSP queue, a GPU stream) and
//! reports the end from any of its threads with `hs_engine_complete` (or
//! `hs_engine_fail`). The engine starts no thread: it calls the callbacks on the thread
//! that drives it, through `hs_engine_run` (blocks until the run ends) or
//! `hs_engine_step` (runs what the reports so far allow, returns at once).
//!
//! Two clocks. `HS_CLOCK_WALL`: times are ns since the first `hs_engine_run` /
//! `hs_engine_step` (`hs_engine_now_ns`), completions are taken as they come, and a job
//! that runs far past its modeled cost fails the run (the engine's deadline check).
//! `HS_CLOCK_VIRTUAL`: the host reports modeled times (a job starting at its
//! `dispatched_ns` ends `estimated_ns` later on a simulated queue); the engine releases
//! completions in end-time order once every running job is reported, as its own
//! simulated queues do, so the schedule equals `hs_simulate`'s.
//!
//! Cancel. `hs_engine_cancel`, from any thread, stops the run at the next subgraph
//! boundary: no job is dispatched once the driver sees it, the jobs already on the host's
//! queues run to their end and are reported as usual (their slices are kept), and the
//! driver returns `HS_ERR_CANCELLED`. A blocking `hs_engine_run` sees the cancel at its
//! next wake-up; a stepped engine at its next `hs_engine_step`, which never waits for
//! the jobs still running: it returns at once (`*finished` 0) until they are reported.
//!
//! The engine trusts no host: a completion for a job not running (never submitted,
//! reported twice, after its run ended) is refused at the call with
//! `HS_ERR_UNKNOWN_JOB`; everything that does reach the scheduler passes the engine's own
//! guard as any Rust backend's does.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use hetsched_runtime::engine::{EngineOptions, Stepper, Wait};
use parking_lot::{Condvar, Mutex};

use crate::error::{CapiError, guarded, hs_status};
use crate::handles;
use crate::run::{RunObject, hs_run, policy_for};
use crate::scene::{PlanObject, hs_plan};
use crate::strings::{optional_str_arg, out_arg};

mod driver;
mod host_queue;

pub(crate) use driver::EngineObject;
use driver::{CancelRequest, Driver, Phase};
use host_queue::{Clock, HostQueue, HostQueues, Record, Reports, Slot};

/// The host reports modeled (virtual) times: the schedule equals the simulation's.
pub const HS_CLOCK_VIRTUAL: u32 = 0;
/// The host reports wall-clock times, ns since the run started (`hs_engine_now_ns`).
pub const HS_CLOCK_WALL: u32 = 1;

/// A job the engine hands a host queue: one subgraph instance of the plan.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct hs_job {
    /// The job's id: pass it to `hs_engine_complete` / `hs_engine_fail`.
    pub id: u32,
    /// The prompt chunk it belongs to.
    pub chunk: u32,
    /// Its stage (subgraph) within the chunk.
    pub stage: u32,
    /// The processor lane (the queue it was submitted to).
    pub processor: u32,
    /// The request it serves (one per run on this engine).
    pub request: u64,
    /// Its modeled duration on this processor, ns (a prediction).
    pub estimated_ns: u64,
    /// The engine's time when it was dispatched, ns (on the engine's clock).
    pub dispatched_ns: u64,
}

/// Starts `job` on the host's queue; returns 0 if it was accepted, anything else to fail
/// the run. Called on the thread driving the engine; `job` is valid for the call only
/// (copy what you keep). It may call `hs_engine_complete` itself (a synchronous queue).
pub type hs_submit_fn =
    Option<unsafe extern "C" fn(job: *const hs_job, user_data: *mut c_void) -> i32>;

/// Asks the host to drop `job`, which the engine no longer waits for (its run failed).
/// Called on the thread driving the engine; `job` is valid for the call only.
pub type hs_cancel_fn = Option<unsafe extern "C" fn(job: *const hs_job, user_data: *mut c_void)>;

/// A host queue behind one processor lane.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hs_queue {
    /// Required.
    pub submit: hs_submit_fn,
    /// Optional (NULL: the host has nothing to cancel).
    pub cancel: hs_cancel_fn,
    /// Passed back to both callbacks unchanged; the library never reads it.
    pub user_data: *mut c_void,
}

/// A run on host queues. Opaque; from `hs_engine_create`, ended with `hs_engine_destroy`.
pub struct hs_engine {
    _opaque: [u8; 0],
}

/// A run of `plan` on host queues under the policy `policy` (a name from
/// `hs_policy_names`, or NULL for the scene's own), with `clock` `HS_CLOCK_VIRTUAL` or
/// `HS_CLOCK_WALL`. `policy` is the caller's, only read. `*out`: a new engine the caller
/// ends with `hs_engine_destroy`; register a queue for every processor
/// (`hs_engine_set_queue`) before running it.
///
/// # Safety
/// `policy` is NULL or NUL-terminated; `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_engine_create(
    plan: *const hs_plan,
    policy: *const c_char,
    clock: u32,
    out: *mut *mut hs_engine,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<PlanObject>(plan, "plan")?;
        // SAFETY: the contract above.
        let (name, out) = unsafe { (optional_str_arg(policy, "policy")?, out_arg(out, "out")?) };
        let (clock, mut options) = match clock {
            HS_CLOCK_VIRTUAL => (Clock::Virtual, EngineOptions::default()),
            HS_CLOCK_WALL => (Clock::Wall, EngineOptions::real_queues()),
            other => {
                return Err(CapiError::InvalidArgument(format!(
                    "clock {other} is neither HS_CLOCK_VIRTUAL (0) nor HS_CLOCK_WALL (1)"
                )));
            }
        };
        let plan = object.plan.clone();
        let lanes = plan.lanes();
        let reports = Arc::new(Reports {
            clock,
            record: Mutex::new(Record {
                slots: vec![Slot::Free; plan.id_space()],
                running: 0,
                unreported: 0,
                done: Vec::new(),
                failure: None,
                origin: None,
                virtual_now: 0,
            }),
            changed: Condvar::new(),
        });
        let cancel = CancelRequest::default();
        options.cancel = Some(cancel.flag.clone());
        let stepper = Stepper::new(plan, policy_for(&object, name)?, &options);
        *out = handles::register(EngineObject {
            scene_name: object.scene_name.clone(),
            lanes,
            reports: reports.clone(),
            cancel,
            driver: Mutex::new(Driver {
                phase: Phase::Ready(stepper),
                queues: HostQueues {
                    reports,
                    queues: vec![None; lanes],
                },
            }),
        });
        Ok(())
    })
}

/// Registers the host queue behind processor lane `processor` (copied; `submit`
/// required). Only before the run starts.
///
/// # Safety
/// `queue` is NULL or points to a readable `hs_queue` whose callbacks, if non-NULL, are
/// functions of the signatures declared here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_engine_set_queue(
    engine: *const hs_engine,
    processor: u32,
    queue: *const hs_queue,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<EngineObject>(engine, "engine")?;
        // SAFETY: the contract above: NULL or readable.
        let queue = unsafe { queue.as_ref() }
            .copied()
            .ok_or(CapiError::Null("queue"))?;
        if queue.submit.is_none() {
            return Err(CapiError::Null("queue->submit"));
        }
        if processor as usize >= object.lanes {
            return Err(CapiError::InvalidArgument(format!(
                "processor {processor} is not a lane of the plan, which has {}",
                object.lanes
            )));
        }
        let mut driver = object.driver()?;
        if !matches!(driver.phase, Phase::Ready(_)) {
            return Err(CapiError::State(
                "queues are registered before the run starts".into(),
            ));
        }
        driver.queues.queues[processor as usize] = Some(HostQueue(queue));
        Ok(())
    })
}

/// Runs the plan to its end on the host queues, blocking the calling thread, which the
/// callbacks are called on; host threads report with `hs_engine_complete`. On
/// `HS_ERR_RUN_FAILED` every job still running was passed to its queue's `cancel`.
#[unsafe(no_mangle)]
pub extern "C" fn hs_engine_run(engine: *const hs_engine) -> hs_status {
    guarded(|| {
        let object = handles::get::<EngineObject>(engine, "engine")?;
        object.advance(Wait::Block).map(|_| ())
    })
}

/// Runs whatever the reports so far allow (scheduling, submitting through the callbacks
/// on the calling thread) and returns without waiting; `*finished` is 1 once the run is
/// over, else 0. For hosts that own their event loop: call it again after
/// `hs_engine_complete`. On `HS_ERR_RUN_FAILED`, as for `hs_engine_run`.
///
/// # Safety
/// `finished` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_engine_step(engine: *const hs_engine, finished: *mut i32) -> hs_status {
    guarded(|| {
        let object = handles::get::<EngineObject>(engine, "engine")?;
        // SAFETY: the contract above.
        let finished = unsafe { out_arg(finished, "finished") }?;
        *finished = i32::from(object.advance(Wait::Poll)?);
        Ok(())
    })
}

/// Cancels the run from any thread (a host thread, a signal-handling thread, one of the
/// queue callbacks): no job is dispatched after the driver sees it, the jobs already on
/// the host's queues run to their end and are reported with `hs_engine_complete` as
/// usual, and the driver (`hs_engine_run`, or the `hs_engine_step` after the last of
/// those reports) returns `HS_ERR_CANCELLED`, its message saying how many subgraphs were
/// done. Should one of those jobs fail instead, the run fails as any run does
/// (`HS_ERR_RUN_FAILED`, the others passed to `cancel`). A cancel before the first run
/// or step ends the run there, with nothing dispatched; a cancel of a run that already
/// ended does nothing. Asking twice is asking once.
#[unsafe(no_mangle)]
pub extern "C" fn hs_engine_cancel(engine: *const hs_engine) -> hs_status {
    guarded(|| {
        let object = handles::get::<EngineObject>(engine, "engine")?;
        // A blocked driver sees the flag when its wait returns: the drain needs the
        // reports it waits for anyway, so there is nothing to wake it for.
        object.cancel.request();
        Ok(())
    })
}

/// Reports that job `job` ran from `start_ns` to `end_ns` (on the engine's clock: ns
/// since the run started for `HS_CLOCK_WALL`, modeled times for `HS_CLOCK_VIRTUAL`).
/// Callable from any thread, also from inside `submit`. A job not running, or reported
/// before, is `HS_ERR_UNKNOWN_JOB`; `end_ns < start_ns` is `HS_ERR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub extern "C" fn hs_engine_complete(
    engine: *const hs_engine,
    job: u32,
    start_ns: u64,
    end_ns: u64,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<EngineObject>(engine, "engine")?;
        if end_ns < start_ns {
            return Err(CapiError::InvalidArgument(format!(
                "job {job} ends at {end_ns} ns, before its start at {start_ns} ns"
            )));
        }
        object.reports.complete(job, start_ns, end_ns)
    })
}

/// Reports that job `job` failed, with `reason` (UTF-8, the caller's, only read; NULL for
/// none). The run then fails: its driver returns `HS_ERR_RUN_FAILED` and cancels the
/// other running jobs. Callable from any thread; errors as `hs_engine_complete`.
///
/// # Safety
/// `reason` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_engine_fail(
    engine: *const hs_engine,
    job: u32,
    reason: *const c_char,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<EngineObject>(engine, "engine")?;
        // SAFETY: the contract above.
        let reason = unsafe { optional_str_arg(reason, "reason") }?;
        let reason = reason.unwrap_or("the host reported a failure").to_string();
        object.reports.fail(job, reason)
    })
}

/// The engine's time, ns, written to `*out`: since the run started for `HS_CLOCK_WALL`
/// (0 before), the latest modeled time handed to the scheduler for `HS_CLOCK_VIRTUAL`.
/// Callable from any thread.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_engine_now_ns(engine: *const hs_engine, out: *mut u64) -> hs_status {
    guarded(|| {
        let object = handles::get::<EngineObject>(engine, "engine")?;
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        *out = object.reports.record.lock().now_ns(object.reports.clock);
        Ok(())
    })
}

/// The finished run. `*out`: a new run the caller ends with `hs_run_destroy` (its report
/// is measured for `HS_CLOCK_WALL`: the bound from its own durations). Before the run
/// finished, or after it failed, `HS_ERR_STATE`.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_engine_result(
    engine: *const hs_engine,
    out: *mut *mut hs_run,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<EngineObject>(engine, "engine")?;
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        let driver = object.driver()?;
        let Phase::Finished(outcome) = &driver.phase else {
            return Err(CapiError::State("the run has not finished".into()));
        };
        *out = handles::register(RunObject {
            scene_name: object.scene_name.clone(),
            outcome: outcome.clone(),
            measured: object.reports.clock == Clock::Wall,
        });
        Ok(())
    })
}

/// Ends an engine. NULL is a no-op; a handle already destroyed is
/// `HS_ERR_INVALID_HANDLE`. A run still being driven on another thread keeps the engine
/// alive until that call returns; later reports for it are `HS_ERR_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn hs_engine_destroy(engine: *mut hs_engine) -> hs_status {
    guarded(|| handles::destroy::<EngineObject>(engine, "engine"))
}
