//! A long-lived scheduler world for one generation request: every run of the request
//! (its prefill, each decode step, a later turn) is armed in the same world
//! ([`hetsched_systems::rearm_world`]) and run by the same schedule, built once; the
//! request itself is an entity ([`Request`]) that outlives the runs.
//!
//! A decode step is a chain of a few dozen short subgraph instances: building a world and
//! a schedule for each (and initialising the schedule's systems on its first tick) was a
//! large part of a step's scheduling cost.

use std::sync::Arc;

use bevy_ecs::prelude::{Entity, World};
use bevy_ecs::schedule::Schedule;
use hetsched_systems::{
    DeviceProfile, Policy, PrefillPlan, Request, RequestPhase, rearm_world, scheduler_schedule,
    spawn_request, spawn_request_world,
};

use crate::backends::Backend;
use crate::engine::{
    EngineError, EngineOptions, RunOutcome, RunState, Step, Wait, finish, run_world,
};

/// One request's world and schedule.
pub struct RequestWorld {
    world: World,
    schedule: Schedule,
    request: Entity,
    decode_steps: u64,
    /// A prefill [`RequestWorld::start`]ed and not finished (paused between advances).
    started: Option<StartedRun>,
}

/// A run armed in the world and advanced piecewise.
struct StartedRun {
    plan: Arc<PrefillPlan>,
    policy: String,
    state: RunState,
}

/// Where [`RequestWorld::advance`] left a started run.
#[derive(Debug)]
pub enum Advance {
    /// Every subgraph is done.
    Finished(RunOutcome),
    /// Paused at a subgraph boundary with no job in flight; advance again to resume.
    Paused,
}

impl std::fmt::Debug for RequestWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestWorld")
            .field("request", &self.request())
            .finish()
    }
}

impl RequestWorld {
    /// A world holding request `id` (nothing armed yet: the first run spawns the
    /// processors of its plan's device).
    pub fn new(id: u64) -> Self {
        let mut world = spawn_request_world(&DeviceProfile {
            measured: None,
            name: String::new(),
            processors: Vec::new(),
        });
        let request = spawn_request(&mut world, id);
        Self {
            world,
            schedule: scheduler_schedule(),
            request,
            decode_steps: 0,
            started: None,
        }
    }

    /// The request entity's state.
    pub fn request(&self) -> Option<&Request> {
        self.world.get::<Request>(self.request)
    }

    /// Runs `plan` for the request (a decode step if `decode`, else a prefill) to
    /// completion on `backend`, then records the tokens now in its cache.
    ///
    /// # Errors
    /// As [`crate::engine::run_with`].
    pub fn run(
        &mut self,
        plan: Arc<PrefillPlan>,
        policy: Box<dyn Policy>,
        decode: bool,
        backend: &mut dyn Backend,
        options: &EngineOptions,
    ) -> Result<RunOutcome, EngineError> {
        let phase = if decode {
            self.decode_steps += 1;
            RequestPhase::Decode {
                step: self.decode_steps - 1,
            }
        } else {
            RequestPhase::Prefill
        };
        let policy_name = policy.name().to_string();
        rearm_world(&mut self.world, plan.clone(), policy, self.request, phase);
        let ticks = run_world(&mut self.world, &mut self.schedule, &plan, backend, options)?;
        Ok(finish(plan, policy_name, &mut self.world, ticks))
    }

    /// Arms a prefill of `plan` to be run piecewise by [`RequestWorld::advance`] (a run
    /// started before and not finished is dropped).
    pub fn start(
        &mut self,
        plan: Arc<PrefillPlan>,
        policy: Box<dyn Policy>,
        options: &EngineOptions,
    ) {
        let name = policy.name().to_string();
        rearm_world(
            &mut self.world,
            plan.clone(),
            policy,
            self.request,
            RequestPhase::Prefill,
        );
        self.started = Some(StartedRun {
            state: RunState::new(&plan, options),
            plan,
            policy: name,
        });
    }

    /// Runs the started prefill on `backend` until it finishes, or until `yield_now`
    /// (asked after each completion) says another run wants the queues: then the run
    /// pauses at the next subgraph boundary, its jobs in flight waited for. Another
    /// world may use the queues until the next advance resumes it.
    ///
    /// # Errors
    /// As [`crate::engine::run_with`]; an error ends the started run. Advancing with no
    /// started run is [`EngineError::NotStarted`].
    pub fn advance(
        &mut self,
        backend: &mut dyn Backend,
        yield_now: &dyn Fn() -> bool,
    ) -> Result<Advance, EngineError> {
        let Some(mut run) = self.started.take() else {
            return Err(EngineError::NotStarted);
        };
        loop {
            match run
                .state
                .step(&mut self.world, &mut self.schedule, backend, Wait::Next)?
            {
                Step::Finished => {
                    let ticks = run.state.into_tick_wall_ns();
                    return Ok(Advance::Finished(finish(
                        run.plan,
                        run.policy,
                        &mut self.world,
                        ticks,
                    )));
                }
                Step::Running { .. } if yield_now() => {
                    run.state.pause(&mut self.world, backend)?;
                    self.started = Some(run);
                    return Ok(Advance::Paused);
                }
                Step::Running { .. } => {}
            }
        }
    }

    /// Sets the tokens in the request's KV cache (the caller owns the cache).
    pub fn set_cached_tokens(&mut self, tokens: usize) {
        if let Some(mut r) = self.world.get_mut::<Request>(self.request) {
            r.cached_tokens = tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use hetsched_systems::testing::tiny_plan;
    use hetsched_systems::{DEFAULT_POLICY, PolicyRegistry};

    use super::*;
    use crate::backends::sim::SimBackend;

    #[test]
    fn runs_again_and_again_in_one_world_as_a_fresh_world_does() {
        let plan = Arc::new(tiny_plan(2, 8, 4));
        let policy = || PolicyRegistry::builtin().create(DEFAULT_POLICY).unwrap();
        let mut fresh = crate::engine::simulate(plan.clone(), policy()).unwrap();
        // The fresh world's request is id 0; this one's is 3: its slices say so.
        for slice in &mut fresh.timeline.slices {
            assert_eq!(slice.request.0, 0);
            slice.request = hetsched_systems::RequestId(3);
        }
        let mut world = RequestWorld::new(3);
        for step in 0..3 {
            let run = world
                .run(
                    plan.clone(),
                    policy(),
                    step > 0,
                    &mut SimBackend::default(),
                    &EngineOptions::default(),
                )
                .unwrap();
            assert_eq!(run.timeline.slices, fresh.timeline.slices);
            assert_eq!(run.makespan_ns, fresh.makespan_ns);
        }
        let request = world.request().unwrap();
        assert_eq!(
            (request.id.0, request.phase),
            (3, RequestPhase::Decode { step: 1 })
        );
    }

    /// A prefill paused at every third completion and resumed runs every instance once,
    /// as the uninterrupted run does; at each pause nothing runs, and nothing started
    /// while paused starts before the pause's end.
    #[test]
    fn a_paused_prefill_resumes_where_it_stood() {
        use std::cell::Cell;
        let plan = Arc::new(tiny_plan(3, 16, 4));
        let policy = || PolicyRegistry::builtin().create(DEFAULT_POLICY).unwrap();
        let whole = crate::engine::simulate(plan.clone(), policy()).unwrap();
        let mut world = RequestWorld::new(1);
        let mut queues = SimBackend::default();
        world.start(plan.clone(), policy(), &EngineOptions::default());
        let completions = Cell::new(0);
        let yield_now = || {
            completions.set(completions.get() + 1);
            completions.get() % 3 == 0
        };
        let (mut pauses, mut ran_at_pause) = (0, Vec::new());
        let outcome = loop {
            match world.advance(&mut queues, &yield_now).unwrap() {
                Advance::Finished(outcome) => break outcome,
                Advance::Paused => {
                    pauses += 1;
                    ran_at_pause.push(world.started.as_ref().unwrap().state.running().len());
                }
            }
        };
        assert!(pauses >= 2, "{pauses} pauses");
        assert!(ran_at_pause.iter().all(|&n| n == 0), "{ran_at_pause:?}");
        let keys = |slices: &[hetsched_systems::resources::SliceRecord]| {
            let mut k: Vec<_> = slices.iter().map(|s| s.key).collect();
            k.sort();
            k
        };
        assert_eq!(keys(&outcome.timeline.slices), keys(&whole.timeline.slices));
        assert_eq!(outcome.timeline.slices.len(), plan.instance_count());
        assert!(matches!(
            world.advance(&mut queues, &|| false),
            Err(EngineError::NotStarted)
        ));
    }
}
