//! Builds the scheduler's world for one run of a plan: processors and subgraph instances
//! become entities, the instances belonging to one request entity; the first stage of
//! every chunk starts ready. A world of several requests is built by
//! [`spawn_request_world`] and [`crate::request::arm_request`].

use std::sync::Arc;

use bevy_ecs::prelude::{Messages, World};

use crate::device::DeviceProfile;
use crate::plan::PrefillPlan;
use crate::policy::Policy;
use crate::request::{
    RequestPhase, RunOf, arm_request, reset_run_resources, spawn_processors, spawn_request,
};
use crate::request_policy::{ActiveRequestPolicy, default_request_policy};
use crate::resources::{Index, SubgraphFinished};

/// An empty world for requests on `device`'s processors: the processors, every shared
/// resource, the default request policy
/// ([`DEFAULT_REQUEST_POLICY`](crate::request_policy::DEFAULT_REQUEST_POLICY)); no
/// request yet.
pub fn spawn_request_world(device: &DeviceProfile) -> World {
    let mut world = World::new();
    world.init_resource::<Messages<SubgraphFinished>>();
    let processors = spawn_processors(&mut world, device);
    world.insert_resource(Index {
        instances: Vec::new(),
        processors,
        free: Vec::new(),
    });
    world.insert_resource(ActiveRequestPolicy(default_request_policy()));
    reset_run_resources(&mut world);
    world
}

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
