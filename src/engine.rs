//! The engine: runs the scheduler schedule tick after tick against a backend.
//!
//! Each tick runs the [`SchedulerSystems`](hetsched_systems::SchedulerSystems) phases;
//! the engine then hands dispatched jobs to the backend and waits for the next
//! completions, which it puts in the inbox for the next tick's collect phase.

use std::sync::Arc;
use std::time::Instant;

use bevy_ecs::prelude::World;
use hetsched_systems::resources::{Clock, Inbox, Outbox, RunStats, TimelineLog};
use hetsched_systems::{PrefillPlan, StageProgress, scheduler_schedule, spawn_world};
use thiserror::Error;

use crate::backends::{Backend, BackendError, sim::SimBackend};

mod guard;

pub(crate) use guard::panic_message;
pub use guard::{BackendFault, Deadline, EngineOptions};

/// Why a run stopped before every subgraph was done.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// A queue failed a job.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A queue broke the backend contract (a bad completion, a panic, no progress).
    #[error(transparent)]
    Fault(#[from] BackendFault),
    /// Nothing is running and nothing can start: a scheduler bug or an impossible plan.
    #[error("scheduler stalled with {done} of {total} subgraphs done and nothing running")]
    Stalled {
        /// Instances done.
        done: usize,
        /// Instances in the plan.
        total: usize,
    },
}

/// The outcome of a finished run.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The plan that ran.
    pub plan: Arc<PrefillPlan>,
    /// What the run recorded.
    pub timeline: TimelineLog,
    /// Time of the last completion, in ns.
    pub makespan_ns: u64,
    /// Scheduler statistics.
    pub stats: RunStats,
    /// Wall time of every tick (one schedule run), in ns.
    pub tick_wall_ns: Vec<u64>,
}

/// Runs `plan` to completion on `backend`, with the default [`EngineOptions`].
pub fn run(plan: Arc<PrefillPlan>, backend: &mut dyn Backend) -> Result<RunOutcome, EngineError> {
    run_with(plan, backend, &EngineOptions::default())
}

/// Runs `plan` to completion on `backend`; every completion is checked before the
/// scheduler sees it, and `options` bound how long jobs and waits may take.
pub fn run_with(
    plan: Arc<PrefillPlan>,
    backend: &mut dyn Backend,
    options: &EngineOptions,
) -> Result<RunOutcome, EngineError> {
    let mut guard = guard::Guard::new(&plan, options);
    let total = plan.instance_count();
    let mut world = spawn_world(plan.clone());
    let mut schedule = scheduler_schedule();
    let mut tick_wall_ns = Vec::new();
    loop {
        let started = Instant::now();
        schedule.run(&mut world);
        tick_wall_ns.push(started.elapsed().as_nanos() as u64);
        for job in std::mem::take(&mut world.resource_mut::<Outbox>().0) {
            guard.submit(backend, job)?;
        }
        let done = world.resource::<StageProgress>().done_count();
        if done == total {
            break;
        }
        if guard.in_flight() == 0 {
            return Err(EngineError::Stalled { done, total });
        }
        let (now, completions) = guard.wait(backend)?;
        world.resource_mut::<Clock>().now_ns = now;
        world.resource_mut::<Inbox>().0.extend(completions);
    }
    Ok(finish(plan, world, tick_wall_ns))
}

/// Runs `plan` on simulated queues.
pub fn simulate(plan: Arc<PrefillPlan>) -> Result<RunOutcome, EngineError> {
    run(plan, &mut SimBackend::default())
}

fn finish(plan: Arc<PrefillPlan>, mut world: World, tick_wall_ns: Vec<u64>) -> RunOutcome {
    let timeline = std::mem::take(&mut *world.resource_mut::<TimelineLog>());
    let makespan_ns = timeline.slices.iter().map(|s| s.end_ns).max().unwrap_or(0);
    RunOutcome {
        plan,
        timeline,
        makespan_ns,
        stats: world.resource::<RunStats>().clone(),
        tick_wall_ns,
    }
}
