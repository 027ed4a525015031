//! The engine's side of the backend contract: nothing a [`Backend`] reports reaches the
//! scheduler systems unchecked.
//!
//! The systems (`collect_completions`) assert their invariants: a completion names an
//! instance that is running on the lane that reports it. An embedder's queue can break
//! that contract (a job reported twice, a lane index out of range, a `wait` that
//! returns nothing forever, a panic), so the [`Guard`] sits between the engine and the
//! backend: it records every submitted job, checks every completion against that record
//! before it enters the `Inbox`, turns panics into errors, and stops a run whose jobs
//! overrun their deadline or whose waits make no progress. Every violation is a
//! [`BackendFault`] naming the instance (chunk, stage) and lane.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use hetsched_systems::PrefillPlan;
use hetsched_systems::resources::{Completion, Job};
use thiserror::Error;

use super::EngineError;
use crate::backends::Backend;

/// How much the engine trusts its backend's timing, and whether its caller may stop it.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// When a job has run too long, or `None` for never (simulation: virtual time).
    pub deadline: Option<Deadline>,
    /// Consecutive [`Backend::wait`] calls that may return no completion while jobs are
    /// in flight before the run fails with [`BackendFault::NoProgress`].
    pub max_empty_waits: u32,
    /// When set, the run stops at the next tick: jobs in flight are waited for (their
    /// slices recorded), no new job is submitted, and the run fails with
    /// [`EngineError::Cancelled`](super::EngineError::Cancelled).
    pub cancel: Option<crate::cancel::CancelFlag>,
}

impl Default for EngineOptions {
    /// No deadline, 1024 empty waits: what `engine::run` and `engine::simulate` use.
    fn default() -> Self {
        Self {
            deadline: None,
            max_empty_waits: 1024,
            cancel: None,
        }
    }
}

impl EngineOptions {
    /// Options for real queues: the default [`Deadline`].
    pub fn real_queues() -> Self {
        Self {
            deadline: Some(Deadline::default()),
            ..Self::default()
        }
    }
}

/// A job's wall-clock deadline: `estimated × factor + floor` after it was submitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadline {
    /// Multiple of the job's modeled cost it may take.
    pub factor: f64,
    /// Time every job may take whatever its estimate (cost models of a scene can be off
    /// by orders of magnitude on another host, and debug builds are slow).
    pub floor: Duration,
    /// Whether an overdue job is retried on another processor it may run on, when the
    /// policy chooses placement and the backend lets go of it ([`Backend::abandon`]);
    /// its processor is then given up for the rest of the run. Otherwise, or when no
    /// other processor may take it, the run fails with
    /// [`BackendFault::DeadlineExceeded`].
    pub retry: bool,
}

impl Default for Deadline {
    /// 100 × the estimate plus 60 s: generous enough for a debug build on a busy host,
    /// short enough that a lost job does not block a run forever. Retry where allowed.
    fn default() -> Self {
        Self {
            factor: 100.0,
            floor: Duration::from_secs(60),
            retry: true,
        }
    }
}

impl Deadline {
    /// How long a job with a modeled cost of `estimated_ns` may run.
    pub fn allowance(&self, estimated_ns: u64) -> Duration {
        let scaled = estimated_ns as f64 * self.factor.max(0.0);
        // A NaN factor or an overflowing product saturates: no deadline beyond the floor
        // is better than a panic in Duration::from_secs_f64.
        let scaled = if scaled.is_finite() && scaled < 1e18 {
            Duration::from_nanos(scaled as u64)
        } else {
            Duration::from_secs(u32::MAX as u64)
        };
        scaled.saturating_add(self.floor)
    }
}

/// A backend broke its contract (docs/robustness.md).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendFault {
    /// A completion for an id outside the plan.
    #[error(
        "processor {processor} reported job {id}, which is not in the plan ({ids} ids): the backend must report the ids it was given"
    )]
    UnknownInstance {
        /// The reported id.
        id: u32,
        /// The reporting lane.
        processor: usize,
        /// Size of the plan's id space.
        ids: usize,
    },
    /// A completion on a lane the device does not have.
    #[error(
        "a completion of chunk {chunk} stage {stage} names processor {processor}, but the device has {lanes}: report the job's own `processor`"
    )]
    LaneOutOfRange {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reported lane.
        processor: usize,
        /// Lanes of the device.
        lanes: usize,
    },
    /// A completion for an instance never submitted.
    #[error(
        "processor {processor} reported chunk {chunk} stage {stage}, which was never dispatched: the backend reported a job it was not given"
    )]
    NotDispatched {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reporting lane.
        processor: usize,
    },
    /// A second completion for one instance.
    #[error(
        "processor {processor} reported chunk {chunk} stage {stage} a second time: a backend reports each job once"
    )]
    CompletedTwice {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reporting lane.
        processor: usize,
    },
    /// A completion on another lane than the one the job was dispatched to.
    #[error(
        "chunk {chunk} stage {stage} was dispatched to processor {dispatched} but reported by processor {processor}: a backend runs a job on `Job::processor`"
    )]
    WrongLane {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reporting lane.
        processor: usize,
        /// The lane it was dispatched to.
        dispatched: usize,
    },
    /// A completion that ends before it starts.
    #[error(
        "processor {processor} reported chunk {chunk} stage {stage} ending at {end_ns} ns, before its start at {start_ns} ns"
    )]
    TimeReversed {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reporting lane.
        processor: usize,
        /// Reported start.
        start_ns: u64,
        /// Reported end.
        end_ns: u64,
    },
    /// `submit` or `wait` panicked.
    #[error("the backend panicked in `{call}`: {message}")]
    Panicked {
        /// `submit` or `wait`.
        call: &'static str,
        /// The panic's message.
        message: String,
    },
    /// Waits kept returning nothing while jobs were in flight.
    #[error(
        "{waits} waits in a row returned no completion with {in_flight} jobs in flight: the backend lost a job or its `wait` does not block"
    )]
    NoProgress {
        /// Consecutive empty waits.
        waits: u32,
        /// Jobs in flight.
        in_flight: usize,
    },
    /// A job ran past its deadline.
    #[error(
        "chunk {chunk} stage {stage} on processor {processor} has run {elapsed_ms} ms, past its deadline of {limit_ms} ms (modeled {estimated_ns} ns): the job is lost or hung"
    )]
    DeadlineExceeded {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The lane running it.
        processor: usize,
        /// Modeled cost.
        estimated_ns: u64,
        /// Time since submission.
        elapsed_ms: u64,
        /// The allowance.
        limit_ms: u64,
    },
    /// A processor was given up (a job there ran past its deadline and was retried
    /// elsewhere), and work that only it may run is left.
    #[error(
        "processor {processor} was given up after chunk {chunk} stage {stage} ran past its deadline there; {waiting} subgraphs are left, waiting on work only it may run"
    )]
    LaneLost {
        /// Chunk of the overdue job.
        chunk: u32,
        /// Stage of the overdue job.
        stage: u32,
        /// The processor given up.
        processor: usize,
        /// Instances not done.
        waiting: usize,
    },
}

/// A job past its deadline, found by [`Guard::wait`]: the engine retries it elsewhere or
/// fails the run with `fault`.
#[derive(Debug, Clone)]
pub(super) struct Overdue {
    pub(super) id: u32,
    pub(super) lane: usize,
    pub(super) fault: BackendFault,
}

/// What one [`Guard::wait`] brought: the backend's time, the checked completions, and the
/// jobs now past their deadline.
#[derive(Debug)]
pub(super) struct Waited {
    pub(super) now_ns: u64,
    pub(super) completions: Vec<Completion>,
    pub(super) overdue: Vec<Overdue>,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Idle,
    Running {
        lane: usize,
        estimated_ns: u64,
        due: Option<Instant>,
    },
    Done,
}

/// The engine's record of what it gave the backend.
#[derive(Debug)]
pub(super) struct Guard {
    slots: Vec<Slot>,
    stages: usize,
    lanes: usize,
    in_flight: usize,
    empty_waits: u32,
    options: EngineOptions,
    /// Jobs given up, by (id, lane): a late completion of one is dropped.
    abandoned: Vec<(u32, usize)>,
}

impl Guard {
    pub(super) fn new(plan: &PrefillPlan, options: &EngineOptions) -> Self {
        Self {
            slots: vec![Slot::Idle; plan.id_space()],
            stages: plan.stage_count() as usize,
            lanes: plan.lanes(),
            in_flight: 0,
            empty_waits: 0,
            options: options.clone(),
            abandoned: Vec::new(),
        }
    }

    /// Jobs submitted and not yet completed, by the engine's own count (a backend's
    /// `in_flight` is not trusted).
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Hands `job` to `backend`, a panic there becoming an error.
    pub(super) fn submit(
        &mut self,
        backend: &mut dyn Backend,
        job: Job,
    ) -> Result<(), EngineError> {
        let due = self
            .options
            .deadline
            .map(|d| Instant::now() + d.allowance(job.estimated_ns));
        // Ids are global in a world that holds several runs: a later run's range may lie
        // past this plan's id space, so the slots grow to the ids the engine submits.
        let id = job.id as usize;
        if id >= self.slots.len() {
            self.slots.resize(id + 1, Slot::Idle);
        }
        self.slots[id] = Slot::Running {
            lane: job.processor,
            estimated_ns: job.estimated_ns,
            due,
        };
        self.in_flight += 1;
        guarded("submit", || backend.submit(job))??;
        Ok(())
    }

    /// Waits for completions (at most until the earliest deadline) and checks each; a
    /// late completion of a job given up is dropped.
    pub(super) fn wait(&mut self, backend: &mut dyn Backend) -> Result<Waited, EngineError> {
        let (now_ns, completions) = match self.earliest_due() {
            Some(due) => {
                let timeout = due.saturating_duration_since(Instant::now());
                guarded("wait", || backend.wait_for(timeout))??
            }
            None => guarded("wait", || backend.wait())??,
        };
        self.check(now_ns, completions, true)
    }

    /// Takes the completions the backend already has, without blocking
    /// ([`Backend::wait_for`] with a zero timeout), and checks each. An empty poll is no
    /// sign of a lost job: a host that owns its event loop polls before its jobs end.
    pub(super) fn poll(&mut self, backend: &mut dyn Backend) -> Result<Waited, EngineError> {
        let (now_ns, completions) = guarded("wait", || backend.wait_for(Duration::ZERO))??;
        self.check(now_ns, completions, false)
    }

    /// Jobs submitted and not yet completed, as (id, lane), in id order.
    pub(super) fn running(&self) -> Vec<(u32, usize)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(id, slot)| match *slot {
                Slot::Running { lane, .. } => Some((id as u32, lane)),
                _ => None,
            })
            .collect()
    }

    /// Checks what one wait or poll brought; `count_empty`: whether a wait that brought
    /// nothing counts towards [`BackendFault::NoProgress`].
    fn check(
        &mut self,
        now_ns: u64,
        mut completions: Vec<Completion>,
        count_empty: bool,
    ) -> Result<Waited, EngineError> {
        // Filtered in place: the backend's vector goes on to the inbox.
        let mut kept = 0;
        for i in 0..completions.len() {
            if self.complete(&completions[i])? {
                completions.swap(kept, i);
                kept += 1;
            }
        }
        completions.truncate(kept);
        let kept = completions;
        let overdue = self.overdue();
        if kept.is_empty() && overdue.is_empty() {
            if !count_empty {
                return Ok(Waited {
                    now_ns,
                    completions: kept,
                    overdue,
                });
            }
            self.empty_waits += 1;
            if self.empty_waits >= self.options.max_empty_waits.max(1) {
                return Err(BackendFault::NoProgress {
                    waits: self.empty_waits,
                    in_flight: self.in_flight,
                }
                .into());
            }
        } else {
            self.empty_waits = 0;
        }
        Ok(Waited {
            now_ns,
            completions: kept,
            overdue,
        })
    }

    /// Asks `backend` to let go of overdue job `id` on `lane` (a panic there is an error).
    pub(super) fn ask_abandon(
        &mut self,
        backend: &mut dyn Backend,
        id: u32,
        lane: usize,
    ) -> Result<bool, EngineError> {
        Ok(guarded("abandon", || backend.abandon(id, lane))?)
    }

    /// Lets go of overdue job `id` on `lane`: the backend has dropped it and the
    /// scheduler will run it elsewhere.
    pub(super) fn abandon(&mut self, id: u32, lane: usize) {
        self.slots[id as usize] = Slot::Idle;
        self.in_flight -= 1;
        self.abandoned.push((id, lane));
    }

    /// The first job given up, as (chunk, stage, lane), if any.
    pub(super) fn first_abandoned(&self) -> Option<(u32, u32, usize)> {
        let &(id, lane) = self.abandoned.first()?;
        let (chunk, stage) = self.key(id);
        Some((chunk, stage, lane))
    }

    fn key(&self, id: u32) -> (u32, u32) {
        let id = id as usize;
        ((id / self.stages) as u32, (id % self.stages) as u32)
    }

    /// Checks completion `c` and records it; `Ok(false)` for the late completion of a
    /// job given up, which the scheduler must not see.
    fn complete(&mut self, c: &Completion) -> Result<bool, BackendFault> {
        let processor = c.processor;
        // The processor given up never gets another job, so (id, lane) names only the
        // job abandoned there.
        if self.abandoned.contains(&(c.id, processor)) {
            return Ok(false);
        }
        let Some(slot) = self.slots.get(c.id as usize).copied() else {
            return Err(BackendFault::UnknownInstance {
                id: c.id,
                processor,
                ids: self.slots.len(),
            });
        };
        let (chunk, stage) = self.key(c.id);
        if processor >= self.lanes {
            let lanes = self.lanes;
            return Err(BackendFault::LaneOutOfRange {
                chunk,
                stage,
                processor,
                lanes,
            });
        }
        match slot {
            Slot::Idle => Err(BackendFault::NotDispatched {
                chunk,
                stage,
                processor,
            }),
            Slot::Done => Err(BackendFault::CompletedTwice {
                chunk,
                stage,
                processor,
            }),
            Slot::Running { lane, .. } if lane != processor => Err(BackendFault::WrongLane {
                chunk,
                stage,
                processor,
                dispatched: lane,
            }),
            Slot::Running { .. } if c.end_ns < c.start_ns => Err(BackendFault::TimeReversed {
                chunk,
                stage,
                processor,
                start_ns: c.start_ns,
                end_ns: c.end_ns,
            }),
            Slot::Running { .. } => {
                self.slots[c.id as usize] = Slot::Done;
                self.in_flight -= 1;
                Ok(true)
            }
        }
    }

    fn earliest_due(&self) -> Option<Instant> {
        self.options.deadline?;
        self.slots
            .iter()
            .filter_map(|s| match s {
                Slot::Running { due, .. } => *due,
                _ => None,
            })
            .min()
    }

    /// Every running job past its deadline.
    fn overdue(&self) -> Vec<Overdue> {
        let Some(deadline) = self.options.deadline else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut overdue = Vec::new();
        for (id, slot) in self.slots.iter().enumerate() {
            if let Slot::Running {
                lane,
                estimated_ns,
                due: Some(due),
            } = *slot
                && now >= due
            {
                let limit = deadline.allowance(estimated_ns);
                let elapsed = limit + now.duration_since(due);
                let (chunk, stage) = self.key(id as u32);
                overdue.push(Overdue {
                    id: id as u32,
                    lane,
                    fault: BackendFault::DeadlineExceeded {
                        chunk,
                        stage,
                        processor: lane,
                        estimated_ns,
                        elapsed_ms: elapsed.as_millis() as u64,
                        limit_ms: limit.as_millis() as u64,
                    },
                });
            }
        }
        overdue
    }
}

/// Runs one backend call, a panic in it becoming [`BackendFault::Panicked`].
fn guarded<T>(call: &'static str, f: impl FnOnce() -> T) -> Result<T, BackendFault> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| BackendFault::Panicked {
        call,
        message: panic_message(&*panic),
    })
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}
