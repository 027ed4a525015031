//! Builds the scheduler's world from a plan: processors and subgraph instances become
//! entities; the first stage of every chunk starts Ready.

use std::sync::Arc;

use bevy_ecs::prelude::{Entity, Messages, World};

use crate::components::{
    BusySlot, Done, Offline, Processor, Ready, RemainingDeps, Running, SubgraphInstance,
};
use crate::graph::StageDependency;
use crate::memory_dispatch::MemoryLedger;
use crate::plan::PrefillPlan;
use crate::policy::Policy;
use crate::progress::StageProgress;
use crate::resources::{
    ActivePolicy, Clock, Inbox, Index, Outbox, Plan, ReadyQueues, RunStats, SubgraphFinished,
    TimelineLog,
};

/// A world ready for the first tick of `plan`, scheduled by `policy` (started here).
pub fn spawn_world(plan: Arc<PrefillPlan>, policy: Box<dyn Policy>) -> World {
    let mut world = World::new();
    world.init_resource::<Messages<SubgraphFinished>>();
    arm_world(&mut world, plan, policy);
    world
}

/// Spawns `plan`'s processors and instances into `world` and (re)places every resource a
/// run reads, except the finished-message queue (its readers keep their cursors).
pub(crate) fn arm_world(world: &mut World, plan: Arc<PrefillPlan>, mut policy: Box<dyn Policy>) {
    policy.start(&plan);
    let processors: Vec<Entity> = plan
        .device
        .processors
        .iter()
        .enumerate()
        .map(|(index, p)| {
            world
                .spawn((
                    Processor {
                        index,
                        name: p.name.clone(),
                        kind: p.kind,
                    },
                    BusySlot::default(),
                ))
                .id()
        })
        .collect();
    let mut instances = vec![None; plan.id_space()];
    let mut ready = ReadyQueues::new(processors.len(), !policy.chooses_placement());
    for key in plan.instances() {
        let id = plan.id(key);
        let deps = initial_deps(&plan, key.stage);
        let mut entity =
            world.spawn((SubgraphInstance { id: id as u32, key }, RemainingDeps(deps)));
        if deps == 0 {
            entity.insert(Ready);
        }
        instances[id] = Some(entity.id());
        if deps == 0 {
            ready.insert(&plan, id as u32);
        }
    }

    world.insert_resource(Index {
        instances,
        processors,
    });
    world.insert_resource(MemoryLedger::new(&plan, !policy.strict_chunk_order()));
    insert_run_resources(world, plan, policy, ready);
}

/// Dependencies an instance of `stage` starts with: one per stage it waits for (a
/// cross-chunk wait is one too: the done prefix of that stage reaching its chunk, see
/// `StageProgress`), none for a first stage.
fn initial_deps(plan: &PrefillPlan, stage: u32) -> u32 {
    let template = &plan.stages[stage as usize];
    match template.dependency {
        StageDependency::None => 0,
        StageDependency::IntraChunk | StageDependency::CrossChunk => template.after.len() as u32,
    }
}

/// Re-arms `world`, whose last run was of this very `plan` (armed by [`arm_world`] or
/// here), for another run of it: the same processor and instance entities are reset to
/// the state [`arm_world`] spawns them in (no despawn, no spawn, no new [`Index`]), the
/// memory ledger restarted, every other run resource replaced. A decode step re-runs one
/// plan many times; spawning its few dozen instances each time was part of its cost.
pub(crate) fn rearm_in_place(
    world: &mut World,
    plan: Arc<PrefillPlan>,
    mut policy: Box<dyn Policy>,
) {
    policy.start(&plan);
    let index = world
        .remove_resource::<Index>()
        .expect("an armed world has an index");
    for &entity in &index.processors {
        let mut processor = world.entity_mut(entity);
        processor.remove::<Offline>();
        processor.insert(BusySlot::default());
    }
    let mut ready = ReadyQueues::new(index.processors.len(), !policy.chooses_placement());
    for key in plan.instances() {
        let id = plan.id(key);
        let deps = initial_deps(&plan, key.stage);
        let entity = index.instances[id].expect("an armed world has every instance");
        let mut instance = world.entity_mut(entity);
        instance.remove::<(Ready, Running, Done)>();
        if let Some(mut remaining) = instance.get_mut::<RemainingDeps>() {
            remaining.0 = deps;
        }
        if deps == 0 {
            instance.insert(Ready);
            ready.insert(&plan, id as u32);
        }
    }
    world.insert_resource(index);
    let settle = !policy.strict_chunk_order();
    match world.get_resource_mut::<MemoryLedger>() {
        Some(mut ledger) if ledger.settles() == settle => ledger.restart(),
        _ => world.insert_resource(MemoryLedger::new(&plan, settle)),
    }
    insert_run_resources(world, plan, policy, ready);
}

/// The run resources both arms replace: the policy, ready queues, progress, clock, queues
/// of jobs and completions, timeline, statistics, plan.
fn insert_run_resources(
    world: &mut World,
    plan: Arc<PrefillPlan>,
    policy: Box<dyn Policy>,
    ready: ReadyQueues,
) {
    world.insert_resource(ready);
    world.insert_resource(ActivePolicy(policy));
    world.insert_resource(StageProgress::new(&plan));
    world.insert_resource(Clock::default());
    world.insert_resource(Inbox::default());
    world.insert_resource(Outbox::default());
    world.insert_resource(TimelineLog::default());
    world.insert_resource(RunStats::default());
    world.insert_resource(Plan(plan));
}
