//! Phase 3: policy + dispatch. Each idle processor takes one ready instance.

use std::collections::BTreeSet;

use bevy_ecs::prelude::{Query, Res, ResMut};

use crate::components::{BusySlot, Processor, SubgraphState};
use crate::memory_dispatch::MemoryLedger;
use crate::plan::PrefillPlan;
use crate::policy::{
    Policy, pick_cpf, pick_heft, pick_in_order, pick_lookahead, pick_peer, pick_stall,
};
use crate::progress::StageProgress;
use crate::resources::{Clock, Index, Job, Outbox, Plan, PolicyState, ReadyQueues, RunStats};

/// For every idle processor, in lane order, asks the policy for a ready instance, marks
/// it Running and hands it to the engine through the [`Outbox`]. A processor never holds
/// more than one job (seed 000, Eq. 4). The policy chooses among the ready instances the
/// [`MemoryLedger`] admits; the others wait until memory frees.
#[allow(clippy::too_many_arguments)]
pub fn dispatch_ready(
    plan: Res<Plan>,
    index: Res<Index>,
    clock: Res<Clock>,
    progress: Res<StageProgress>,
    mut policy: ResMut<PolicyState>,
    mut ready: ResMut<ReadyQueues>,
    mut processors: Query<(&Processor, &mut BusySlot)>,
    mut states: Query<&mut SubgraphState>,
    mut outbox: ResMut<Outbox>,
    mut stats: ResMut<RunStats>,
    mut memory: ResMut<MemoryLedger>,
) {
    let plan = &plan.0;
    let policy = &mut *policy;
    for (lane, &entity) in index.processors.iter().enumerate() {
        let (processor, mut slot) = processors.get_mut(entity).expect("processor entity");
        if slot.running.is_some() || ready.0[lane].is_empty() {
            continue;
        }
        let admitted: BTreeSet<u32>;
        let lane_ready = if memory.unconstrained() {
            &ready.0[lane]
        } else {
            admitted = ready.0[lane]
                .iter()
                .copied()
                .filter(|&id| memory.admits(plan.key(id as usize)))
                .collect();
            if admitted.len() < ready.0[lane].len() {
                stats.held_for_memory += 1;
            }
            &admitted
        };
        if lane_ready.is_empty() {
            continue;
        }
        let choice = match policy.policy {
            Policy::Stall => pick_stall(plan, &progress, lane_ready, processor.kind),
            Policy::InOrder => {
                let (sequence, cursor) = &mut policy.sequences[lane];
                pick_in_order(sequence, cursor, lane_ready)
            }
            Policy::Peer => pick_peer(plan, &progress, &mut policy.peer, lane_ready),
            Policy::Heft => pick_heft(plan, lane_ready),
            Policy::Cpf => pick_cpf(plan, lane_ready),
            Policy::Lookahead => {
                let others_ready =
                    ready.0.iter().map(|q| q.len()).sum::<usize>() - ready.0[lane].len();
                pick_lookahead(plan, &progress, lane_ready, processor.kind, others_ready)
            }
        };
        let Some(id) = choice else { continue };
        launch(
            id,
            lane,
            plan,
            &index,
            &clock,
            &mut ready,
            &mut slot,
            &mut states,
            &mut outbox,
            &mut stats,
            &mut memory,
        );
    }
    // Liveness under a budget: a policy with its own pipeline (`peer`'s barrier) may wait
    // for a job memory keeps out. With nothing running, the earliest ready job the
    // ledger admits runs (the first unfinished chunk's next job always is admitted).
    if memory.unconstrained()
        || !outbox.0.is_empty()
        || processors.iter().any(|(_, slot)| slot.running.is_some())
    {
        return;
    }
    let earliest = ready
        .0
        .iter()
        .enumerate()
        .filter_map(|(lane, q)| {
            q.iter()
                .find(|&&id| memory.admits(plan.key(id as usize)))
                .map(|&id| (id, lane))
        })
        .min();
    if let Some((id, lane)) = earliest {
        if policy.policy == Policy::InOrder {
            // In-order never needs this (its next job is the first chunk's); if it ever
            // does, the job must be the lane's next in order.
            let (sequence, cursor) = &mut policy.sequences[lane];
            if sequence.get(*cursor) != Some(&id) {
                return;
            }
            *cursor += 1;
        }
        let (_, mut slot) = processors
            .get_mut(index.processors[lane])
            .expect("processor entity");
        launch(
            id,
            lane,
            plan,
            &index,
            &clock,
            &mut ready,
            &mut slot,
            &mut states,
            &mut outbox,
            &mut stats,
            &mut memory,
        );
    }
}

/// Starts ready instance `id` on `lane`: Running, in the lane's slot, memory allocated,
/// a [`Job`] in the [`Outbox`].
#[allow(clippy::too_many_arguments)]
fn launch(
    id: u32,
    lane: usize,
    plan: &PrefillPlan,
    index: &Index,
    clock: &Clock,
    ready: &mut ReadyQueues,
    slot: &mut BusySlot,
    states: &mut Query<&mut SubgraphState>,
    outbox: &mut Outbox,
    stats: &mut RunStats,
    memory: &mut MemoryLedger,
) {
    ready.0[lane].remove(&id);
    let key = plan.key(id as usize);
    memory.start(key);
    let instance = index.instances[id as usize].expect("ready instance without an entity");
    *states.get_mut(instance).expect("instance state") = SubgraphState::Running;
    slot.running = Some(id);
    stats.dispatched += 1;
    outbox.0.push(Job {
        id,
        key,
        processor: lane,
        estimated_ns: plan.cost_ns(key),
        dispatched_ns: clock.now_ns,
    });
}
