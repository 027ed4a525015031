//! Builds the scheduler's world from a plan: processors and subgraph instances become
//! entities; the first stage of every chunk starts Ready.

use std::sync::Arc;

use bevy_ecs::prelude::{Entity, Messages, World};

use crate::components::{BusySlot, Processor, Ready, RemainingDeps, SubgraphInstance};
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
        let template = &plan.stages[key.stage as usize];
        let deps = match template.dependency {
            StageDependency::None => 0,
            // One condition per stage waited for; a cross-chunk wait is one too: the done
            // prefix of that stage reaching this chunk (see `StageProgress`).
            StageDependency::IntraChunk | StageDependency::CrossChunk => {
                template.after.len() as u32
            }
        };
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
    world.insert_resource(ready);
    world.insert_resource(MemoryLedger::new(&plan, !policy.strict_chunk_order()));
    world.insert_resource(ActivePolicy(policy));
    world.insert_resource(StageProgress::new(&plan));
    world.insert_resource(Clock::default());
    world.insert_resource(Inbox::default());
    world.insert_resource(Outbox::default());
    world.insert_resource(TimelineLog::default());
    world.insert_resource(RunStats::default());
    world.insert_resource(Plan(plan));
}
