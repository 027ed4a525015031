//! Giving up on a processor: a job that ran past its deadline is taken back from its
//! processor and made ready again, to run on another processor it may run on.
//!
//! The engine decides when a job is overdue and whether its backend can let go of it;
//! this module answers whether the plan and the policy allow another processor
//! ([`retry_lanes`]) and changes the world when they do ([`requeue_elsewhere`]). The
//! processor is marked [`Offline`]: dispatch never starts a job there again, and the
//! policies see it free only in the far future.

use bevy_ecs::prelude::{Entity, World};

use crate::components::{BusySlot, Offline, Running};
use crate::request::{OfRequest, RequestRun};
use crate::resources::{Index, RunStats};
use crate::ride::{Carries, RidingIn};

/// The processors other than the one running `id` (a world id) that could take it if it
/// were requeued now: eligible for it (all of them under a placement-choosing policy,
/// only its home under a fixed one) and not [`Offline`]. Empty when `id` is not running.
pub fn retry_lanes(world: &World, id: u32) -> Vec<usize> {
    let Some((running, owner)) = running(world, id) else {
        return Vec::new();
    };
    let Some(run) = world.get::<RequestRun>(owner) else {
        return Vec::new();
    };
    let index = world.resource::<Index>();
    let plan = &run.plan;
    run.ready
        .lanes_of(plan, plan.key((id - run.base) as usize))
        .iter()
        .copied()
        .filter(|&lane| lane != running.lane)
        .filter(|&lane| world.get::<Offline>(index.processors[lane]).is_none())
        .collect()
}

/// Takes running instance `id` (a world id) back from its processor, which goes
/// [`Offline`], and makes it ready again in its request's run; returns the processor
/// given up, or `None` (nothing changed) when no other processor could take it
/// ([`retry_lanes`] is empty).
pub fn requeue_elsewhere(world: &mut World, id: u32) -> Option<usize> {
    if retry_lanes(world, id).is_empty() {
        return None;
    }
    let (job, owner) = running(world, id)?;
    let lane = job.lane;
    let (instance, processor) = {
        let index = world.resource::<Index>();
        (index.instances[id as usize]?, index.processors[lane])
    };
    // The decode rows riding in the job are taken back with it: each is ready again in
    // its own run, to ride a later job or run alone.
    let riders = world
        .entity_mut(instance)
        .take::<Carries>()
        .map_or_else(Vec::new, |c| c.0);
    for rider in riders {
        let rider_entity = world.resource::<Index>().instances[rider as usize]?;
        let (rode, rider_owner) = running(world, rider)?;
        world
            .entity_mut(rider_entity)
            .remove::<Running>()
            .remove::<RidingIn>();
        make_ready(world, rider_owner, rider, rode.lane)?;
    }
    world.entity_mut(instance).remove::<Running>();
    make_ready(world, owner, id, lane)?;
    world.resource_mut::<RunStats>().retried += 1;
    let mut processor = world.entity_mut(processor);
    processor.insert(Offline);
    if let Some(mut slot) = processor.get_mut::<BusySlot>() {
        slot.running = None;
    }
    Some(lane)
}

/// Makes instance `id` (a world id) of `owner`'s run, just taken off `lane`, ready
/// again: undispatched, its memory and policy state as before its dispatch.
fn make_ready(world: &mut World, owner: Entity, id: u32, lane: usize) -> Option<()> {
    let mut run = world.get_mut::<RequestRun>(owner)?;
    let run = &mut *run;
    let local = id - run.base;
    let key = run.plan.key(local as usize);
    run.ready.insert(&run.plan, local);
    run.memory.abandon(key);
    run.policy.abandoned(&run.plan, local, lane);
    run.work_left_ns += run.plan.cost_ns(key);
    run.undispatched += 1;
    run.undispatched_by_stage[key.stage as usize] += 1;
    Some(())
}

/// The instance `id`'s dispatch and its request, while it runs.
fn running(world: &World, id: u32) -> Option<(Running, Entity)> {
    let entity = (*world.resource::<Index>().instances.get(id as usize)?)?;
    let running = world.get::<Running>(entity).copied()?;
    Some((running, world.get::<OfRequest>(entity)?.0))
}
