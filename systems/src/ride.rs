//! Decode rows riding in another request's prefill chunks (mixed batches).
//!
//! A decode step whose request [`RidesOn`] a prefilling request of the same model does
//! not run its INT8 linears as jobs of its own: each joins a job of the host's matching
//! stage (the same layer's same linears) as extra rows, the way chunked prefill in
//! continuous-batching servers mixes decode rows into a prefill chunk. The host's job
//! then costs its processor's price for the chunk's rows plus the step's
//! ([`merged_ns`]); the step's float stages (norms, its attention over its own cache)
//! stay jobs of its own. Dispatch holds a riding stage back while the host still has a
//! job of its matching stage to come, launches it inside the first such job it is ready
//! for ([`RidingIn`] on the rider's instance, [`Carries`] on the host's), and lets it
//! run alone once the host has none left (or is no longer armed): dependencies stay
//! each run's own, every instance runs once, and a processor still holds one job.
//! The collect system completes a host's riders with it.

use std::sync::Arc;

use bevy_ecs::prelude::{Component, Entity, World};

use crate::components::Running;
use crate::model::ChunkShape;
use crate::op::ExecClass;
use crate::plan::{InstanceKey, PrefillPlan};
use crate::request::RequestRun;
use crate::resources::{Clock, Index};

/// On a request entity whose armed run (a decode step) rides the prefill chunks of the
/// request `host`: the relation dispatch reads.
#[derive(Component, Clone, Debug, PartialEq, Eq)]
pub struct RidesOn {
    /// The request whose prefill jobs the step's linears join.
    pub host: Entity,
    /// Per stage of the rider's plan, the host plan's stage whose jobs it joins
    /// ([`ride_stages`]); `None`: it runs as a job of its own.
    pub stages: Arc<[Option<u32>]>,
    /// Sequences the step holds: the rows it adds to each job it joins.
    pub rows: u32,
}

/// On a host instance while its job runs with riders: the world ids of the rider
/// instances in that job.
#[derive(Component, Clone, Debug, Default, PartialEq, Eq)]
pub struct Carries(pub Vec<u32>);

/// On a rider instance while it rides: the world id of the host instance whose job it is
/// in.
#[derive(Component, Clone, Copy, Debug, PartialEq, Eq)]
pub struct RidingIn(pub u32);

/// Per stage of `rider` (a decode step's one-token plan), the stage of `host` (a prefill
/// plan of the same model) whose jobs it may join: an INT8 stage of the same layer with
/// the same operators (the same weights), run every chunk. Float stages, a shadow and a
/// stage the host does not have map to `None`.
pub fn ride_stages(rider: &PrefillPlan, host: &PrefillPlan) -> Vec<Option<u32>> {
    rider
        .stages
        .iter()
        .map(|r| {
            if r.class != ExecClass::Int8 || r.is_shadow() || r.last_chunk_only {
                return None;
            }
            host.stages
                .iter()
                .position(|h| {
                    h.class == ExecClass::Int8
                        && !h.last_chunk_only
                        && h.layer == r.layer
                        && h.layer_span == r.layer_span
                        && h.ops == r.ops
                })
                .map(|s| s as u32)
        })
        .collect()
}

/// The modeled time of `host`'s instance `key` on `lane` with `rows` decode rows riding
/// in it: the processor's price of the stage for the chunk's priced tokens plus the
/// rows, each linear a GEMM of that many rows (on a kind of static graphs, an NPU, the
/// rows padded to its decode shape: a graph built for the chunk plus that shape). `None`
/// where the instance may not run on `lane`, or the kind has no graph for the rows.
pub fn merged_ns(host: &PrefillPlan, key: InstanceKey, lane: usize, rows: u32) -> Option<u64> {
    host.cost_on(key, lane)?;
    let processor = host.device.processors.get(lane)?;
    let ops = &host.stages.get(key.stage as usize)?.ops;
    let shape = processor.kind.priced_shape(
        &processor.cost,
        &host.model,
        ops,
        host.executed_shape(key),
        host.workload.chunk_len,
    );
    let padded = processor
        .kind
        .decode_rows(&vec![1; rows.max(1) as usize])?
        .len() as u64;
    let merged = ChunkShape {
        tokens: shape.tokens + padded,
        past: shape.past,
    };
    processor.cost.subgraph_ns(&host.model, ops, merged)
}

/// Whether the host `run`'s job of `stage` is about to be dispatched in some chunk: an
/// instance of it not yet dispatched whose predecessors in its chunk all are (it is
/// ready, or will be when a job running now ends). `dispatched` tells whether an
/// instance of the run is running or done. A riding stage waits for such a job only:
/// a chunk that has not reached the stage yet may be far behind.
pub fn about_to_dispatch(
    run: &RequestRun,
    stage: u32,
    dispatched: impl Fn(InstanceKey) -> bool,
) -> bool {
    let plan = run.plan();
    (0..plan.chunks).any(|chunk| {
        let key = InstanceKey { chunk, stage };
        plan.exists(key)
            && !dispatched(key)
            && plan
                .predecessors(key)
                .into_iter()
                .filter(|p| p.chunk == chunk)
                .all(&dispatched)
    })
}

/// When a decode step of `rider`'s plan with `rows` sequences, armed now on the world's
/// clock, is predicted to end riding the prefill run armed on `host` with the stage map
/// `stages` ([`ride_stages`]); `None` where the host has no run, or no job left of any
/// stage the step could join.
///
/// Each chunk of the host is predicted along its own chain from its state now (its
/// running jobs to their modeled end, each stage after its predecessors in the chunk at
/// its cheapest cost). A riding stage joins a host job of its stage about to be
/// dispatched when the step gets there ([`about_to_dispatch`]: its predecessors in its
/// chunk dispatched by then), the one that ends first, priced merged; without one, and
/// for a stage of its own, it runs when the one before it ends, at its own cost. Nothing else running is counted (chunks waiting for earlier
/// ones, other requests), so the prediction is the earliest the ride can end: a policy
/// that rides only when even this end is in time never rides a step into chunks that
/// cannot carry it in time.
pub fn predicted_ride_end_ns(
    world: &World,
    host: Entity,
    rider: &PrefillPlan,
    stages: &[Option<u32>],
    rows: u32,
) -> Option<u64> {
    let now = world.resource::<Clock>().now_ns;
    let run = world.get::<RequestRun>(host)?;
    if run.is_done() {
        return None;
    }
    let plan = run.plan();
    let index = world.resource::<Index>();
    let running = |key: InstanceKey| -> Option<&Running> {
        let entity = index
            .instances
            .get((run.base() + plan.id(key) as u32) as usize)?;
        world.get::<Running>((*entity)?)
    };
    // Per host instance (plan id), its predicted start; `None` once dispatched.
    let stage_count = plan.stages.len();
    let mut start: Vec<Option<u64>> = vec![None; plan.id_space()];
    let mut end = vec![now; stage_count];
    for chunk in 0..plan.chunks {
        end.fill(now);
        for stage in 0..stage_count as u32 {
            let key = InstanceKey { chunk, stage };
            if !plan.exists(key) || run.progress().is_done(plan, key) {
                continue;
            }
            let s = stage as usize;
            if let Some(r) = running(key) {
                end[s] = (r.dispatched_ns + r.estimated_ns).max(now);
                continue;
            }
            let at = plan
                .predecessors(key)
                .into_iter()
                .filter(|p| p.chunk == chunk)
                .map(|p| end[p.stage as usize])
                .max()
                .unwrap_or(now);
            start[plan.id(key)] = Some(at);
            end[s] = at + plan.min_cost_ns(key);
        }
    }
    let mut joined = false;
    let mut at = now;
    for (s, mapped) in stages.iter().enumerate() {
        let own = InstanceKey {
            chunk: 0,
            stage: s as u32,
        };
        if !rider.exists(own) {
            continue;
        }
        let join = mapped.and_then(|h| {
            (0..plan.chunks)
                .map(|chunk| InstanceKey { chunk, stage: h })
                .filter_map(|key| {
                    let begins = start.get(plan.id(key)).copied().flatten()?;
                    // Its predecessors in the chunk dispatched by the time the step is
                    // here (`None`: dispatched already).
                    let reached = plan
                        .predecessors(key)
                        .into_iter()
                        .filter(|p| p.chunk == key.chunk)
                        .all(|p| start[plan.id(p)].is_none_or(|b| b <= at));
                    if !reached {
                        return None;
                    }
                    let merged = merged_ns(plan, key, plan.processor(key), rows)?;
                    Some(at.max(begins) + merged)
                })
                .min()
        });
        joined |= join.is_some();
        at = join.unwrap_or(at + rider.cost_ns(own));
    }
    joined.then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_placement::{DecodePlacement, DecodePlans};
    use crate::testing::{tiny_device, tiny_model, tiny_plan};

    #[test]
    fn a_step_rides_the_same_linears_and_pays_the_merged_chunk() {
        let model = tiny_model(2);
        let device = tiny_device();
        let host = tiny_plan(2, 8, 4);
        let plans = DecodePlans::new(&model, &device, 5).unwrap();
        let rider = plans.priced(DecodePlacement::Npu, &[9]).unwrap();
        let map = ride_stages(&rider, &host);
        assert_eq!(map.len(), rider.stages.len());
        for (s, m) in map.iter().enumerate() {
            let r = &rider.stages[s];
            match m {
                Some(h) => {
                    let h = &host.stages[*h as usize];
                    assert_eq!((h.layer, &h.ops), (r.layer, &r.ops));
                    assert_eq!(r.class, ExecClass::Int8);
                }
                None => assert!(r.class != ExecClass::Int8 || r.last_chunk_only),
            }
        }
        assert!(map.iter().any(Option::is_some), "the linears ride");
        for key in host.instances() {
            let lane = host.processor(key);
            if host.stages[key.stage as usize].class != ExecClass::Int8 {
                continue;
            }
            let alone = host.cost_on(key, lane).unwrap();
            let one = merged_ns(&host, key, lane, 1).unwrap();
            let four = merged_ns(&host, key, lane, 4).unwrap();
            assert!(one >= alone, "rows never make a job cheaper");
            assert!(four >= one);
            // The merged price is the cost model's for the chunk's rows plus the step's.
            let p = &host.device.processors[lane];
            let ops = &host.stages[key.stage as usize].ops;
            let shape = p.kind.priced_shape(
                &p.cost,
                &host.model,
                ops,
                host.executed_shape(key),
                host.workload.chunk_len,
            );
            let want = p
                .cost
                .subgraph_ns(
                    &host.model,
                    ops,
                    ChunkShape {
                        tokens: shape.tokens + 1,
                        past: shape.past,
                    },
                )
                .unwrap();
            assert_eq!(one, want);
        }
        // A lane the instance may not run on, and rows no graph holds, price nothing.
        let key = InstanceKey { chunk: 0, stage: 0 };
        assert_eq!(merged_ns(&host, key, 99, 1), None);
    }
}
