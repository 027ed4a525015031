//! Builds the scheduler's world for one run of a plan: processors and subgraph instances
//! become entities, the instances belonging to one request entity; the first stage of
//! every chunk starts ready. A world of several requests is built by
//! [`crate::request::spawn_request_world`] and [`crate::request::arm_request`].

use std::sync::Arc;

use bevy_ecs::prelude::World;

use crate::plan::PrefillPlan;
use crate::policy::Policy;
use crate::request::{RequestPhase, RunOf, arm_request, spawn_request, spawn_request_world};

/// A world ready for the first tick of `plan`, scheduled by `policy` (started here): one
/// request (id 0, [`RequestPhase::Prefill`]) holding the run, its ids the plan's own.
pub fn spawn_world(plan: Arc<PrefillPlan>, policy: Box<dyn Policy>) -> World {
    let mut world = spawn_request_world(&plan.device);
    let request = spawn_request(&mut world, 0);
    arm_request(&mut world, request, plan, policy, RequestPhase::Prefill)
        .expect("a fresh world on the plan's own device arms it");
    world.insert_resource(RunOf(request));
    world
}
