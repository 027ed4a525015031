//! Builds the scheduler's world from a plan: processors, chunks, templates, instances
//! and tensors become entities; the first stage of every chunk starts Ready.

use std::collections::BTreeSet;
use std::sync::Arc;

use bevy_ecs::prelude::{Entity, Messages, World};

use crate::components::{
    BusySlot, Chunk, EstimatedCost, MemoryRegion, Placement, Processor, RemainingDeps,
    SubgraphInstance, SubgraphState, SubgraphTemplate, Tensor,
};
use crate::graph::StageDependency;
use crate::model::OpKind;
use crate::plan::{InstanceKey, PrefillPlan};
use crate::progress::StageProgress;
use crate::resources::{
    Clock, Inbox, Index, Outbox, Plan, PolicyState, ReadyQueues, RunStats, SubgraphFinished,
    TimelineLog,
};

/// A world ready for the first tick of `plan`.
pub fn spawn_world(plan: Arc<PrefillPlan>) -> World {
    let mut world = World::new();
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
                    MemoryRegion {
                        capacity_bytes: (p.memory_gib * (1u64 << 30) as f64) as u64,
                    },
                ))
                .id()
        })
        .collect();
    let chunk_len = plan.workload.chunk_len;
    let chunks: Vec<Entity> = (0..plan.chunks)
        .map(|index| {
            let first_token = index * chunk_len;
            let tokens = chunk_len.min(plan.workload.prompt_len - first_token);
            world
                .spawn(Chunk {
                    index,
                    first_token,
                    tokens,
                })
                .id()
        })
        .collect();
    let templates: Vec<Entity> = plan
        .stages
        .iter()
        .enumerate()
        .map(|(stage, t)| {
            world
                .spawn(SubgraphTemplate {
                    stage: stage as u32,
                    name: t.name.clone(),
                    ops: t.op_names().into_iter().map(String::from).collect(),
                    sharing: t.sharing,
                    class: t.class,
                })
                .id()
        })
        .collect();

    let mut instances = vec![None; plan.id_space()];
    let mut ready = vec![BTreeSet::new(); processors.len()];
    let mut sequences = vec![(Vec::new(), 0usize); processors.len()];
    for key in plan.instances() {
        let id = plan.id(key);
        let lane = plan.processor(key);
        let deps = match plan.stages[key.stage as usize].dependency {
            StageDependency::None => 0,
            // Cross-chunk waits are tracked as one condition: the done prefix of stage j-1
            // reaching this chunk (see `StageProgress`).
            StageDependency::IntraChunk | StageDependency::CrossChunk => 1,
        };
        let state = if deps == 0 {
            SubgraphState::Ready
        } else {
            SubgraphState::Pending
        };
        let entity = world
            .spawn((
                SubgraphInstance {
                    id: id as u32,
                    key,
                    template: templates[key.stage as usize],
                    chunk: chunks[key.chunk as usize],
                },
                state,
                RemainingDeps(deps),
                Placement {
                    processor: processors[lane],
                    index: lane,
                },
                EstimatedCost {
                    ns: plan.cost_ns(key),
                },
            ))
            .id();
        instances[id] = Some(entity);
        if deps == 0 {
            ready[lane].insert(id as u32);
        }
        sequences[lane].0.push(id as u32);
    }
    spawn_tensors(&mut world, &plan, &instances);

    world.insert_resource(Index {
        instances,
        processors,
    });
    world.insert_resource(ReadyQueues(ready));
    world.insert_resource(PolicyState {
        policy: plan.workload.policy,
        sequences,
        peer: Default::default(),
    });
    world.insert_resource(StageProgress::new(&plan));
    world.insert_resource(Clock::default());
    world.insert_resource(Inbox::default());
    world.insert_resource(Outbox::default());
    world.insert_resource(TimelineLog::default());
    world.insert_resource(RunStats::default());
    world.init_resource::<Messages<SubgraphFinished>>();
    world.insert_resource(Plan(plan));
    world
}

/// One output tensor per instance, consumed by the instances that depend on it.
fn spawn_tensors(world: &mut World, plan: &PrefillPlan, instances: &[Option<Entity>]) {
    for key in plan.instances() {
        let stage = &plan.stages[key.stage as usize];
        let mut consumers = Vec::new();
        let next = key.stage + 1;
        if next < plan.stage_count() {
            let chunks = match plan.stages[next as usize].dependency {
                StageDependency::CrossChunk => key.chunk..plan.chunks,
                _ => key.chunk..key.chunk + 1,
            };
            consumers.extend(
                chunks
                    .map(|chunk| InstanceKey { chunk, stage: next })
                    .filter(|k| plan.exists(*k))
                    .filter_map(|k| instances[plan.id(k)]),
            );
        }
        let last = stage.ops.last().expect("stages are never empty");
        let (tokens, width) = match last.kind {
            OpKind::LmHead => (1, plan.model.vocab),
            OpKind::SiluMul => (plan.workload.chunk_len, plan.model.ffn),
            _ => (
                plan.workload.chunk_len,
                last.out_features.unwrap_or(plan.model.hidden),
            ),
        };
        let element_bytes = if last.kind == OpKind::Quantize { 1 } else { 4 };
        let producer = instances[plan.id(key)].expect("instance entity");
        world.spawn(Tensor {
            shape: [tokens, width],
            element_bytes,
            producer,
            consumers,
        });
    }
}
