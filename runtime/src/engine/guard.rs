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

use super::EngineError;
use super::fault::BackendFault;
use super::options::EngineOptions;
use crate::backends::Backend;
use hetsched_systems::PrefillPlan;
use hetsched_systems::resources::{Completion, Job};

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
