//! The engine: runs the scheduler schedule tick after tick against a backend.
//!
//! Each tick runs the [`SchedulerSystems`](hetsched_systems::SchedulerSystems) phases;
//! the engine then hands dispatched jobs to the backend and waits for the next
//! completions, which it puts in the inbox for the next tick's collect phase.

use std::sync::Arc;

use bevy_ecs::prelude::World;
use bevy_ecs::schedule::Schedule;
use hetsched_systems::resources::{RunStats, TimelineLog};
use hetsched_systems::{Policy, PrefillPlan, scheduler_schedule, spawn_world};
use thiserror::Error;

use crate::backends::{Backend, BackendError, sim::SimBackend};

mod fault;
mod guard;
mod options;
mod step;

pub use fault::BackendFault;
pub use guard::panic_message;
pub use options::{Deadline, EngineOptions};
pub use step::{RunState, Step, Stepper, Wait};

/// Why a run stopped before every subgraph was done.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineError {
    /// A queue failed a job.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A queue broke the backend contract (a bad completion, a panic, no progress).
    #[error(transparent)]
    Fault(#[from] BackendFault),
    /// The caller cancelled the run ([`EngineOptions::cancel`]); the jobs in flight were
    /// waited for, and the world's timeline holds every finished slice.
    #[error("cancelled with {done} of {total} subgraphs done")]
    Cancelled {
        /// Instances done.
        done: usize,
        /// Instances in the plan.
        total: usize,
    },
    /// A piecewise run was advanced without being started
    /// ([`crate::request_world::RequestWorld::start`]).
    #[error("no run was started to advance")]
    NotStarted,
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
    /// The name of the policy that scheduled it.
    pub policy: String,
    /// What the run recorded.
    pub timeline: TimelineLog,
    /// Time of the last completion, in ns.
    pub makespan_ns: u64,
    /// Scheduler statistics.
    pub stats: RunStats,
    /// Wall time of every tick (one schedule run), in ns.
    pub tick_wall_ns: Vec<u64>,
}

/// Runs `plan` to completion on `backend`, scheduled by `policy`, with the default
/// [`EngineOptions`].
pub fn run(
    plan: Arc<PrefillPlan>,
    policy: Box<dyn Policy>,
    backend: &mut dyn Backend,
) -> Result<RunOutcome, EngineError> {
    run_with(plan, policy, backend, &EngineOptions::default())
}

/// Runs `plan` to completion on `backend`, scheduled by `policy`; every completion is
/// checked before the scheduler sees it, and `options` bound how long jobs and waits may
/// take.
pub fn run_with(
    plan: Arc<PrefillPlan>,
    policy: Box<dyn Policy>,
    backend: &mut dyn Backend,
    options: &EngineOptions,
) -> Result<RunOutcome, EngineError> {
    let policy_name = policy.name().to_string();
    let mut world = spawn_world(plan.clone(), policy);
    let mut schedule = scheduler_schedule();
    let tick_wall_ns = run_world(&mut world, &mut schedule, &plan, backend, options)?;
    Ok(finish(plan, policy_name, &mut world, tick_wall_ns))
}

/// Runs the plan armed in `world` (by [`spawn_world`] or
/// [`hetsched_systems::rearm_world`]) to completion with `schedule` (kept across runs,
/// so that a long-lived world pays for its schedule once); returns every tick's wall
/// time, ns. The world keeps what the run recorded ([`TimelineLog`], [`RunStats`]).
pub fn run_world(
    world: &mut World,
    schedule: &mut Schedule,
    plan: &PrefillPlan,
    backend: &mut dyn Backend,
    options: &EngineOptions,
) -> Result<Vec<u64>, EngineError> {
    let mut state = RunState::new(plan, options);
    while state.step(world, schedule, backend, Wait::Block)? != Step::Finished {}
    Ok(state.into_tick_wall_ns())
}

/// Why nothing runs with work left: a processor given up that the rest of the work needs,
/// else a scheduler stall.
fn stalled(guard: &guard::Guard, done: usize, total: usize) -> EngineError {
    match guard.first_abandoned() {
        Some((chunk, stage, processor)) => BackendFault::LaneLost {
            chunk,
            stage,
            processor,
            waiting: total - done,
        }
        .into(),
        None => EngineError::Stalled { done, total },
    }
}

/// Runs `plan` on simulated queues, scheduled by `policy`.
pub fn simulate(
    plan: Arc<PrefillPlan>,
    policy: Box<dyn Policy>,
) -> Result<RunOutcome, EngineError> {
    run(plan, policy, &mut SimBackend::default())
}

/// The outcome of the run of `plan` that finished in `world`: its timeline is taken out
/// of the world (a long-lived world starts its next run with an empty one).
pub fn finish(
    plan: Arc<PrefillPlan>,
    policy: String,
    world: &mut World,
    tick_wall_ns: Vec<u64>,
) -> RunOutcome {
    let timeline = std::mem::take(&mut *world.resource_mut::<TimelineLog>());
    let makespan_ns = timeline.slices.iter().map(|s| s.end_ns).max().unwrap_or(0);
    RunOutcome {
        plan,
        policy,
        timeline,
        makespan_ns,
        stats: world.resource::<RunStats>().clone(),
        tick_wall_ns,
    }
}
