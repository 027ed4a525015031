//! Requests in a long-lived world: a generation request is an entity ([`Request`]) that
//! outlives the runs of its steps, and [`rearm_world`] arms the world for the next run
//! (a prefill, or one decode step) without building a new world or schedule.
//!
//! A run's processors and subgraph instances are spawned for that run and despawned by
//! the next [`rearm_world`]; request entities stay, so that a runtime can keep several
//! requests in one world (one in its prefill on the NPU while another decodes on the
//! CPU) and the systems can read which request a run belongs to ([`RunOf`]).

use std::sync::Arc;

use bevy_ecs::prelude::{Component, Entity, Resource, With, World};

use crate::components::{Processor, SubgraphInstance};
use crate::plan::PrefillPlan;
use crate::policy::Policy;
use crate::resources::Plan;
use crate::world::{arm_world, rearm_in_place};

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestPhase {
    /// Created, nothing run yet.
    Waiting,
    /// A prefill (the prompt, or a later turn's new tokens) is running.
    Prefill,
    /// Decoding: `step` is the decode step running (0-based, over the request's life).
    Decode {
        /// Decode steps started so far, minus one.
        step: u64,
    },
}

/// A generation request: its id, phase and tokens in its KV cache.
#[derive(Component, Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Caller's id.
    pub id: u64,
    /// Phase of the run in progress (or the last one).
    pub phase: RequestPhase,
    /// Tokens whose keys and values are in the request's cache.
    pub cached_tokens: usize,
}

/// The request the world's current run serves.
#[derive(Resource, Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOf(pub Entity);

/// Spawns a request entity (phase [`RequestPhase::Waiting`]) into `world`.
pub fn spawn_request(world: &mut World, id: u64) -> Entity {
    world
        .spawn(Request {
            id,
            phase: RequestPhase::Waiting,
            cached_tokens: 0,
        })
        .id()
}

/// Arms `world` (made by [`crate::spawn_world`] or an earlier rearm) for a run of `plan`
/// by `policy` for `request`: the last run's processors and instances are despawned, the
/// plan's spawned, every run resource replaced; request entities stay, `request`'s phase
/// becomes `phase`. When the last run was of this very plan (the same `Arc`: a session's
/// decode steps), its entities are reset in place instead, to the same state.
pub fn rearm_world(
    world: &mut World,
    plan: Arc<PrefillPlan>,
    policy: Box<dyn Policy>,
    request: Entity,
    phase: RequestPhase,
) {
    let same_plan = world
        .get_resource::<Plan>()
        .is_some_and(|armed| Arc::ptr_eq(&armed.0, &plan));
    if same_plan {
        rearm_in_place(world, plan, policy);
    } else {
        respawn(world, plan, policy);
    }
    if let Some(mut r) = world.get_mut::<Request>(request) {
        r.phase = phase;
    }
    world.insert_resource(RunOf(request));
}

/// Despawns the last run's processors and instances and arms `plan`'s.
fn respawn(world: &mut World, plan: Arc<PrefillPlan>, policy: Box<dyn Policy>) {
    let mut old = world.query_filtered::<Entity, With<SubgraphInstance>>();
    let mut stale: Vec<Entity> = old.iter(world).collect();
    let mut processors = world.query_filtered::<Entity, With<Processor>>();
    stale.extend(processors.iter(world));
    for entity in stale {
        world.despawn(entity);
    }
    arm_world(world, plan, policy);
}

#[cfg(test)]
mod tests {
    use bevy_ecs::prelude::{Has, World};

    use super::*;
    use crate::testing::tiny_plan;
    use crate::{DEFAULT_POLICY, PolicyRegistry, spawn_world};

    fn instances(world: &mut World) -> usize {
        world.query::<&SubgraphInstance>().iter(world).count()
    }

    #[test]
    fn rearming_replaces_the_runs_entities_and_keeps_requests() {
        let plan = Arc::new(tiny_plan(2, 8, 4));
        let policy = || PolicyRegistry::builtin().create(DEFAULT_POLICY).unwrap();
        let mut world = spawn_world(plan.clone(), policy());
        let request = spawn_request(&mut world, 7);
        let per_run = instances(&mut world);
        assert_eq!(per_run, plan.instance_count());
        for step in 0..3 {
            let phase = RequestPhase::Decode { step };
            rearm_world(&mut world, plan.clone(), policy(), request, phase);
            assert_eq!(instances(&mut world), per_run);
            let processors = world.query::<&Processor>().iter(&world).count();
            assert_eq!(processors, plan.device.processors.len());
            assert_eq!(world.get::<Request>(request).unwrap().phase, phase);
            assert_eq!(world.resource::<RunOf>().0, request);
        }
    }

    fn instance_entities(world: &mut World) -> Vec<Entity> {
        let mut q = world.query_filtered::<Entity, With<SubgraphInstance>>();
        let mut all: Vec<Entity> = q.iter(world).collect();
        all.sort();
        all
    }

    #[test]
    fn the_same_plan_is_rearmed_in_place_and_another_respawned() {
        use crate::components::{Ready, RemainingDeps};
        let plan = Arc::new(tiny_plan(2, 8, 4));
        let policy = || PolicyRegistry::builtin().create(DEFAULT_POLICY).unwrap();
        let mut world = spawn_world(plan.clone(), policy());
        let request = spawn_request(&mut world, 1);
        let first = instance_entities(&mut world);
        // Leave the run half-done: some instances marked ready elsewhere, deps spent.
        for &e in &first {
            world.entity_mut(e).insert(Ready);
            world.get_mut::<RemainingDeps>(e).unwrap().0 = 0;
        }
        let phase = RequestPhase::Decode { step: 0 };
        rearm_world(&mut world, plan.clone(), policy(), request, phase);
        assert_eq!(
            instance_entities(&mut world),
            first,
            "same plan: same entities"
        );
        let mut fresh = spawn_world(plan.clone(), policy());
        let state = |w: &mut World| {
            let mut q = w.query::<(&SubgraphInstance, &RemainingDeps, Has<Ready>)>();
            let mut s: Vec<_> = q.iter(w).map(|(i, d, r)| (i.id, d.0, r)).collect();
            s.sort();
            s
        };
        assert_eq!(state(&mut world), state(&mut fresh));
        let other = Arc::new(tiny_plan(2, 8, 4));
        rearm_world(&mut world, other, policy(), request, phase);
        assert_ne!(
            instance_entities(&mut world),
            first,
            "another plan: respawned"
        );
        assert_eq!(state(&mut world), state(&mut fresh));
    }
}
