//! Builds the scheduler's world from a plan: processors, chunks, templates, instances
//! and tensors become entities; the first stage of every chunk starts Ready.

use std::sync::Arc;

use bevy_ecs::prelude::{Entity, Messages, World};

use crate::components::{
    BusySlot, Chunk, EstimatedCost, KvCacheLayer, MemoryRegion, Placement, Processor,
    RemainingDeps, SubgraphInstance, SubgraphState, SubgraphTemplate, Tensor,
};
use crate::graph::StageDependency;
use crate::memory::KvCache;
use crate::memory_dispatch::MemoryLedger;
use crate::plan::{InstanceKey, PrefillPlan};
use crate::policy::Policy;
use crate::progress::StageProgress;
use crate::resources::{
    ActivePolicy, Clock, Inbox, Index, Outbox, Plan, ReadyQueues, RunStats, SubgraphFinished,
    TimelineLog,
};

/// A world ready for the first tick of `plan`, scheduled by `policy` (started here).
pub fn spawn_world(plan: Arc<PrefillPlan>, mut policy: Box<dyn Policy>) -> World {
    policy.start(&plan);
    let mut world = World::new();
    let regions = &plan.memory_profile().regions;
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
                        capacity_bytes: regions[index].capacity_bytes,
                        budget_bytes: regions[index].budget_bytes,
                        alignment: regions[index].alignment,
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
    let mut ready = ReadyQueues::new(processors.len(), !policy.chooses_placement());
    for key in plan.instances() {
        let id = plan.id(key);
        let lane = plan.processor(key);
        let template = &plan.stages[key.stage as usize];
        let deps = match template.dependency {
            StageDependency::None => 0,
            // One condition per stage waited for; a cross-chunk wait is one too: the done
            // prefix of that stage reaching this chunk (see `StageProgress`).
            StageDependency::IntraChunk | StageDependency::CrossChunk => {
                template.after.len() as u32
            }
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
            ready.insert(&plan, id as u32);
        }
    }
    spawn_tensors(&mut world, &plan, &instances);

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
    world.init_resource::<Messages<SubgraphFinished>>();
    world.insert_resource(Plan(plan));
    world
}

/// Every chunk's tensors (exported activations and stage workspaces, see
/// [`chunk_tensors`]) and one KV cache buffer per layer.
fn spawn_tensors(world: &mut World, plan: &PrefillPlan, instances: &[Option<Entity>]) {
    let kv = KvCache::of(plan);
    world.spawn_batch((0..kv.layers).map(move |layer| KvCacheLayer {
        layer,
        bytes: kv.bytes_per_layer,
        region: kv.region,
    }));
    let templates = &plan.memory_profile().tensors;
    let mut tensors = Vec::with_capacity(templates.len() * plan.chunks as usize);
    for chunk in 0..plan.chunks {
        let entity = |stage: u32| {
            let key = InstanceKey { chunk, stage };
            plan.exists(key).then(|| instances[plan.id(key)]).flatten()
        };
        for t in templates {
            let Some(producer) = entity(t.producer) else {
                continue;
            };
            tensors.push(Tensor {
                bytes: t.bytes,
                region: t.region,
                kind: t.kind,
                producer,
                consumers: t.consumers.iter().filter_map(|&s| entity(s)).collect(),
            });
        }
    }
    world.spawn_batch(tensors);
}
