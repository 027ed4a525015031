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
use crate::engine::{EngineError, EngineOptions, RunOutcome, finish, run_world};

/// One request's world and schedule.
pub struct RequestWorld {
    world: World,
    schedule: Schedule,
    request: Entity,
    decode_steps: u64,
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
}
