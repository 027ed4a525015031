//! Giving up on a processor: a job that ran past its deadline is taken back from its
//! processor and made ready again, to run on another processor it may run on.
//!
//! The engine decides when a job is overdue and whether its backend can let go of it;
//! this module answers whether the plan and the policy allow another processor
//! ([`retry_lanes`]) and changes the world when they do ([`requeue_elsewhere`]). The
//! processor is marked [`Offline`]: dispatch never starts a job there again, and the
//! policies see it free only in the far future.

use bevy_ecs::prelude::World;

use crate::components::{BusySlot, Offline, Ready, Running};
use crate::memory_dispatch::MemoryLedger;
use crate::resources::{ActivePolicy, Index, Plan, ReadyQueues, RunStats};

/// The processors other than the one running `id` that could take it if it were
/// requeued now: eligible for it (all of them under a placement-choosing policy, only its
/// home under a fixed one) and not [`Offline`]. Empty when `id` is not running.
pub fn retry_lanes(world: &World, id: u32) -> Vec<usize> {
    let Some(running) = running(world, id) else {
        return Vec::new();
    };
    let plan = &world.resource::<Plan>().0;
    let index = world.resource::<Index>();
    world
        .resource::<ReadyQueues>()
        .lanes_of(plan, plan.key(id as usize))
        .iter()
        .copied()
        .filter(|&lane| lane != running.lane)
        .filter(|&lane| world.get::<Offline>(index.processors[lane]).is_none())
        .collect()
}

/// Takes running instance `id` back from its processor, which goes [`Offline`], and makes
/// it ready again; returns the processor given up, or `None` (nothing changed) when no
/// other processor could take it ([`retry_lanes`] is empty).
pub fn requeue_elsewhere(world: &mut World, id: u32) -> Option<usize> {
    if retry_lanes(world, id).is_empty() {
        return None;
    }
    let lane = running(world, id)?.lane;
    let plan = world.resource::<Plan>().0.clone();
    let key = plan.key(id as usize);
    let (instance, processor) = {
        let index = world.resource::<Index>();
        (index.instances[id as usize]?, index.processors[lane])
    };
    world.entity_mut(instance).remove::<Running>().insert(Ready);
    world.resource_mut::<ReadyQueues>().insert(&plan, id);
    world.resource_mut::<MemoryLedger>().abandon(key);
    world
        .resource_mut::<ActivePolicy>()
        .0
        .abandoned(&plan, id, lane);
    world.resource_mut::<RunStats>().retried += 1;
    let mut processor = world.entity_mut(processor);
    processor.insert(Offline);
    if let Some(mut slot) = processor.get_mut::<BusySlot>() {
        slot.running = None;
    }
    Some(lane)
}

fn running(world: &World, id: u32) -> Option<Running> {
    let entity = (*world.resource::<Index>().instances.get(id as usize)?)?;
    world.get::<Running>(entity).copied()
}
