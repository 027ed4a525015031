//! Phase 3: policy + dispatch. Each idle processor takes one ready instance.

use std::collections::BTreeSet;

use bevy_ecs::prelude::{Query, Res, ResMut};

use crate::components::{BusySlot, EstimatedCost, Placement, Processor, SubgraphState};
use crate::memory_dispatch::MemoryLedger;
use crate::plan::PrefillPlan;
use crate::policy::{
    BalanceView, LaneTimes, Policy, float_threatens_tail, pick_balance, pick_cpf, pick_heft,
    pick_in_order, pick_lookahead, pick_peer, pick_stall, queue_lanes,
};
use crate::progress::StageProgress;
use crate::resources::{Clock, Index, Job, Outbox, Plan, PolicyState, ReadyQueues, RunStats};

/// For every idle processor, in lane order, asks the policy for a ready instance, marks
/// it Running and hands it to the engine through the [`Outbox`]. A processor never holds
/// more than one job (seed 000, Eq. 4). Its ready queue holds every ready instance it
/// may run (under flexible placement, also those of other processors); a taken instance
/// leaves every queue, so it runs exactly once, on the processor that took it. The policy
/// chooses among the ready instances the [`MemoryLedger`] admits; the others wait until
/// memory frees.
#[allow(clippy::too_many_arguments)]
pub fn dispatch_ready(
    plan: Res<Plan>,
    index: Res<Index>,
    clock: Res<Clock>,
    progress: Res<StageProgress>,
    mut policy: ResMut<PolicyState>,
    mut ready: ResMut<ReadyQueues>,
    mut processors: Query<(&Processor, &mut BusySlot)>,
    mut states: Query<(&mut SubgraphState, &mut Placement, &mut EstimatedCost)>,
    mut outbox: ResMut<Outbox>,
    mut stats: ResMut<RunStats>,
    mut memory: ResMut<MemoryLedger>,
) {
    let plan = &plan.0;
    let policy = &mut *policy;
    let mut times = LaneTimes {
        now_ns: clock.now_ns,
        free_at_ns: index
            .processors
            .iter()
            .map(|&e| {
                let (_, slot) = processors.get(e).expect("processor entity");
                slot.running.map_or(clock.now_ns, |_| slot.expected_end_ns)
            })
            .collect(),
    };
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
            Policy::Heft => pick_heft(plan, lane_ready, lane, &times),
            Policy::Cpf => pick_cpf(plan, lane_ready),
            Policy::Lookahead => {
                let others_idle = others_idle(plan, &ready, lane);
                let here = (lane, processor.kind);
                pick_lookahead(plan, &progress, lane_ready, here, &times, others_idle)
            }
            Policy::Balance => {
                let view = BalanceView {
                    times: &times,
                    remaining_ns: &policy.remaining_ns,
                    ready_ns: &ready_work(plan, &ready),
                    others_idle: others_idle(plan, &ready, lane),
                    float_threatens_tail: float_threatens_tail(plan, &policy.remaining_ns),
                };
                pick_balance(plan, &progress, lane_ready, (lane, processor.kind), view)
            }
        };
        let Some(id) = choice else { continue };
        launch(
            id,
            lane,
            plan,
            policy,
            &index,
            &clock,
            &mut ready,
            &mut slot,
            &mut states,
            &mut outbox,
            &mut stats,
            &mut memory,
        );
        times.free_at_ns[lane] = slot.expected_end_ns;
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
            policy,
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

/// Modeled work of the ready instances by home lane (ns): each lane's own backlog.
fn ready_work(plan: &PrefillPlan, ready: &ReadyQueues) -> Vec<u64> {
    ready
        .0
        .iter()
        .enumerate()
        .map(|(lane, q)| {
            q.iter()
                .map(|&id| plan.key(id as usize))
                .filter(|&key| plan.processor(key) == lane)
                .map(|key| plan.cost_ns(key))
                .sum()
        })
        .collect()
}

/// Whether no processor other than `lane` has ready work of its own (instances whose home
/// it is; under flexible placement a queue also holds other processors' instances).
fn others_idle(plan: &PrefillPlan, ready: &ReadyQueues, lane: usize) -> bool {
    ready.0.iter().enumerate().all(|(l, q)| {
        l == lane
            || !q
                .iter()
                .any(|&id| plan.processor(plan.key(id as usize)) == l)
    })
}

/// Starts ready instance `id` on `lane`: out of every ready queue, Running, placed on
/// `lane` at `lane`'s cost, in the lane's slot, memory allocated, a [`Job`] in the
/// [`Outbox`].
#[allow(clippy::too_many_arguments)]
fn launch(
    id: u32,
    lane: usize,
    plan: &PrefillPlan,
    policy: &mut PolicyState,
    index: &Index,
    clock: &Clock,
    ready: &mut ReadyQueues,
    slot: &mut BusySlot,
    states: &mut Query<(&mut SubgraphState, &mut Placement, &mut EstimatedCost)>,
    outbox: &mut Outbox,
    stats: &mut RunStats,
    memory: &mut MemoryLedger,
) {
    let key = plan.key(id as usize);
    for &l in queue_lanes(plan, policy.policy, key) {
        ready.0[l].remove(&id);
    }
    let estimated_ns = plan
        .cost_on(key, lane)
        .expect("dispatched to a processor the instance may not run on");
    policy.remaining_ns[plan.processor(key)] -= plan.cost_ns(key);
    memory.start(key);
    let instance = index.instances[id as usize].expect("ready instance without an entity");
    let (mut state, mut placement, mut cost) = states.get_mut(instance).expect("instance state");
    *state = SubgraphState::Running;
    *placement = Placement {
        processor: index.processors[lane],
        index: lane,
    };
    cost.ns = estimated_ns;
    slot.running = Some(id);
    slot.expected_end_ns = clock.now_ns + estimated_ns;
    stats.dispatched += 1;
    outbox.0.push(Job {
        id,
        key,
        processor: lane,
        estimated_ns,
        dispatched_ns: clock.now_ns,
    });
}
