//! A run driven a step at a time, for hosts that own their event loop (a phone runtime's
//! looper, an async executor, a C host): [`Stepper::step`] with [`Wait::Poll`] runs every
//! tick the completions already reported allow and returns at once; with [`Wait::Block`]
//! it waits for them as [`super::run_with`] does (which is a loop of blocking steps).

use std::sync::Arc;
use std::time::Instant;

use bevy_ecs::prelude::World;
use bevy_ecs::schedule::Schedule;
use hetsched_systems::resources::{Clock, Inbox, Job, Outbox};
use hetsched_systems::retry::{requeue_elsewhere, retry_lanes};
use hetsched_systems::{LiveRuns, Policy, PrefillPlan, scheduler_schedule, spawn_world};

use super::guard::{Guard, Waited};
use super::{EngineError, EngineOptions, RunOutcome, finish, stalled};
use crate::backends::Backend;

/// How a step gets its completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Block in [`Backend::wait`] (or `wait_for` up to the next deadline) until the run
    /// ends: a whole run in one step.
    Block,
    /// Take what [`Backend::wait_for`] with a zero timeout returns, and return when it
    /// returns nothing.
    Poll,
    /// Block for the next completions, then return: the tick they allow runs at the start
    /// of the next step, so between the two the caller may [`RunState::pause`] the run at
    /// a subgraph boundary instead.
    Next,
}

/// Where a run stands after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Every subgraph is done.
    Finished,
    /// Jobs are running: step again once the backend has completions.
    Running {
        /// Jobs submitted and not yet completed.
        in_flight: usize,
    },
}

/// The engine's state between the steps of one run over a world armed by
/// [`spawn_world`] or [`hetsched_systems::rearm_world`].
#[derive(Debug)]
pub struct RunState {
    guard: Guard,
    tick_wall_ns: Vec<u64>,
    /// The outbox's buffer, handed back after each tick: no allocation per tick.
    jobs: Vec<Job>,
    /// Whether the world has news (the start, completions, a retried job) for a tick.
    tick_due: bool,
    retry: bool,
    finished: bool,
    /// Checked before every tick: once set, the run stops at the next subgraph boundary.
    cancel: Option<crate::cancel::CancelFlag>,
}

impl RunState {
    /// The state of a run of `plan` about to start.
    pub fn new(plan: &PrefillPlan, options: &EngineOptions) -> Self {
        Self {
            guard: Guard::new(plan, options),
            // A chain of instances (a decode step) takes one tick per instance and one more.
            tick_wall_ns: Vec::with_capacity(plan.instance_count() + 1),
            jobs: Vec::new(),
            tick_due: true,
            retry: options.deadline.is_some_and(|d| d.retry),
            finished: false,
            cancel: options.cancel.clone(),
        }
    }

    /// Ticks and hands the dispatched jobs to `backend` while completions come (see
    /// [`Wait`]); returns where the run stands. After an error the run is over: the jobs
    /// [`RunState::running`] names are the backend's to cancel.
    pub fn step(
        &mut self,
        world: &mut World,
        schedule: &mut Schedule,
        backend: &mut dyn Backend,
        wait: Wait,
    ) -> Result<Step, EngineError> {
        loop {
            if self.finished {
                return Ok(Step::Finished);
            }
            if self.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
                return Err(self.drain_cancelled(world, schedule, backend));
            }
            if self.tick_due {
                self.tick(world, schedule, backend)?;
            }
            let live = world.resource::<LiveRuns>();
            let (total, outstanding) = (live.armed, live.outstanding);
            if outstanding == 0 {
                self.finished = true;
                return Ok(Step::Finished);
            }
            if self.guard.in_flight() == 0 {
                return Err(stalled(&self.guard, total - outstanding, total));
            }
            let waited = match wait {
                Wait::Block | Wait::Next => self.guard.wait(backend)?,
                Wait::Poll => self.guard.poll(backend)?,
            };
            let news = !(waited.completions.is_empty() && waited.overdue.is_empty());
            self.absorb(world, backend, waited)?;
            // A blocking wait ticks after every wait, as the engine always has.
            self.tick_due = news || wait != Wait::Poll;
            if !self.tick_due || wait == Wait::Next {
                return Ok(Step::Running {
                    in_flight: self.guard.in_flight(),
                });
            }
        }
    }

    /// Pauses the run at a subgraph boundary: waits for the jobs in flight and queues
    /// their completions without a tick, so nothing new is dispatched and the queues are
    /// idle when it returns. The next [`RunState::step`] resumes the run where it stood
    /// (its first tick sees those completions). An error ends the run, as a step's does.
    pub fn pause(
        &mut self,
        world: &mut World,
        backend: &mut dyn Backend,
    ) -> Result<(), EngineError> {
        while self.guard.in_flight() > 0 {
            let waited = self.guard.wait(backend)?;
            self.absorb(world, backend, waited)?;
            self.tick_due = true;
        }
        Ok(())
    }

    /// Jobs submitted and not yet completed, as (id, processor lane), in id order.
    pub fn running(&self) -> Vec<(u32, usize)> {
        self.guard.running()
    }

    /// The wall time of every tick so far, ns.
    pub fn into_tick_wall_ns(self) -> Vec<u64> {
        self.tick_wall_ns
    }

    fn tick(
        &mut self,
        world: &mut World,
        schedule: &mut Schedule,
        backend: &mut dyn Backend,
    ) -> Result<(), EngineError> {
        let started = Instant::now();
        schedule.run(world);
        self.tick_wall_ns.push(started.elapsed().as_nanos() as u64);
        std::mem::swap(&mut self.jobs, &mut world.resource_mut::<Outbox>().0);
        self.tick_due = false;
        for job in self.jobs.drain(..) {
            self.guard.submit(backend, job)?;
        }
        Ok(())
    }

    /// Stops a cancelled run at a subgraph boundary: waits for the jobs in flight, lets one
    /// schedule tick record their completions (what it dispatches is dropped, not
    /// submitted), and says how far the run got.
    fn drain_cancelled(
        &mut self,
        world: &mut World,
        schedule: &mut Schedule,
        backend: &mut dyn Backend,
    ) -> EngineError {
        while self.guard.in_flight() > 0 {
            let waited = match self.guard.wait(backend) {
                Ok(waited) => waited,
                Err(fault) => return fault,
            };
            if let Some(overdue) = waited.overdue.into_iter().next() {
                return overdue.fault.into();
            }
            let mut clock = world.resource_mut::<Clock>();
            clock.now_ns = clock.now_ns.max(waited.now_ns);
            world.resource_mut::<Inbox>().0.extend(waited.completions);
        }
        schedule.run(world);
        world.resource_mut::<Outbox>().0.clear();
        let live = world.resource::<LiveRuns>();
        EngineError::Cancelled {
            done: live.armed - live.outstanding,
            total: live.armed,
        }
    }

    /// Retries or fails overdue jobs, moves the clock, queues the completions.
    fn absorb(
        &mut self,
        world: &mut World,
        backend: &mut dyn Backend,
        waited: Waited,
    ) -> Result<(), EngineError> {
        for overdue in waited.overdue {
            let retry = self.retry
                && !retry_lanes(world, overdue.id).is_empty()
                && self.guard.ask_abandon(backend, overdue.id, overdue.lane)?;
            if !retry {
                return Err(overdue.fault.into());
            }
            requeue_elsewhere(world, overdue.id);
            self.guard.abandon(overdue.id, overdue.lane);
        }
        // An empty wait may report no time (0): the clock never runs backwards.
        let mut clock = world.resource_mut::<Clock>();
        clock.now_ns = clock.now_ns.max(waited.now_ns);
        world.resource_mut::<Inbox>().0.extend(waited.completions);
        Ok(())
    }
}

/// One run that owns its world: [`Stepper::step`] until [`Step::Finished`], then
/// [`Stepper::finish`].
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use hetsched_runtime::backends::sim::SimBackend;
/// use hetsched_runtime::engine::{EngineOptions, Step, Stepper, Wait, simulate};
/// use hetsched_runtime::scene::Scene;
///
/// let scene = Scene::default_scene();
/// let plan = Arc::new(scene.plan()?);
/// let mut stepper = Stepper::new(plan.clone(), scene.new_policy()?, &EngineOptions::default());
/// let mut queues = SimBackend::default();
/// // A simulated queue always has its next completion ready: each poll makes progress.
/// while stepper.step(&mut queues, Wait::Poll)? != Step::Finished {}
/// let stepped = stepper.finish().expect("finished");
/// let whole = simulate(plan, scene.new_policy()?)?;
/// assert_eq!(stepped.makespan_ns, whole.makespan_ns);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Stepper {
    plan: Arc<PrefillPlan>,
    policy: String,
    world: World,
    schedule: Schedule,
    state: RunState,
}

impl std::fmt::Debug for Stepper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stepper")
            .field("policy", &self.policy)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Stepper {
    /// A run of `plan` scheduled by `policy`, not started: the first step dispatches.
    pub fn new(plan: Arc<PrefillPlan>, policy: Box<dyn Policy>, options: &EngineOptions) -> Self {
        let state = RunState::new(&plan, options);
        Self {
            policy: policy.name().to_string(),
            world: spawn_world(plan.clone(), policy),
            schedule: scheduler_schedule(),
            plan,
            state,
        }
    }

    /// One step on `backend` (see [`RunState::step`]).
    pub fn step(&mut self, backend: &mut dyn Backend, wait: Wait) -> Result<Step, EngineError> {
        self.state
            .step(&mut self.world, &mut self.schedule, backend, wait)
    }

    /// Jobs submitted and not yet completed, as (id, processor lane): after an error,
    /// the ones to cancel.
    pub fn running(&self) -> Vec<(u32, usize)> {
        self.state.running()
    }

    /// The plan being run.
    pub fn plan(&self) -> &Arc<PrefillPlan> {
        &self.plan
    }

    /// The outcome, once a step returned [`Step::Finished`]; `None` before.
    pub fn finish(mut self) -> Option<RunOutcome> {
        if !self.state.finished {
            return None;
        }
        Some(finish(
            self.plan,
            self.policy,
            &mut self.world,
            self.state.into_tick_wall_ns(),
        ))
    }
}
