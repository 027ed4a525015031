//! Phase 3: policy + dispatch. Each idle processor takes one ready instance.

use std::borrow::Cow;
use std::collections::BTreeSet;

use bevy_ecs::prelude::{Commands, Has, Query, Res, ResMut};
use bevy_ecs::system::SystemParam;

use crate::components::{BusySlot, Offline, Processor, Ready, Running};
use crate::memory_dispatch::MemoryLedger;
use crate::plan::PrefillPlan;
use crate::policy::{LaneTimes, PickContext};
use crate::progress::StageProgress;
use crate::resources::{ActivePolicy, Clock, Index, Job, Outbox, Plan, ReadyQueues, RunStats};

/// For every idle processor, in lane order, asks the [`ActivePolicy`] for one of the ready
/// instances the [`MemoryLedger`] admits, and launches it. A processor never holds more
/// than one job (seed 000, Eq. 4). Its ready queue holds every ready instance it may run
/// (under flexible placement, also those of other processors); a launched instance leaves
/// every queue, so it runs exactly once, on the processor that took it. An [`Offline`]
/// processor takes nothing, and the policies see it free only in the far future.
pub fn dispatch_ready(
    plan: Res<Plan>,
    progress: Res<StageProgress>,
    mut policy: ResMut<ActivePolicy>,
    mut processors: Query<(&Processor, &mut BusySlot, Has<Offline>)>,
    mut launcher: Launcher,
) {
    let plan = &plan.0;
    let now_ns = launcher.clock.now_ns;
    let mut times = LaneTimes {
        now_ns,
        free_at_ns: launcher
            .index
            .processors
            .iter()
            .map(|&e| {
                let (_, slot, offline) = processors.get(e).expect("processor entity");
                match slot.running {
                    _ if offline => OFFLINE_FREE_AT_NS,
                    Some(_) => slot.expected_end_ns,
                    None => now_ns,
                }
            })
            .collect(),
    };
    for lane in 0..launcher.index.processors.len() {
        let entity = launcher.index.processors[lane];
        let (processor, mut slot, offline) = processors.get_mut(entity).expect("processor entity");
        if slot.running.is_some() || offline {
            continue;
        }
        let (candidates, held) = admitted(&launcher.ready.lanes[lane], &launcher.memory, plan);
        launcher.stats.held_for_memory += u64::from(held);
        if candidates.is_empty() {
            continue;
        }
        let ctx = PickContext {
            plan,
            progress: &progress,
            ready: &launcher.ready.lanes,
            backlog: launcher.ready.backlog(),
            arrivals: launcher.ready.arrivals(),
            times: &times,
            lane,
            kind: processor.kind,
        };
        let Some(id) = policy.0.pick(&ctx, &candidates) else {
            continue;
        };
        launcher.launch(plan, id, lane, &mut slot, &mut policy);
        times.free_at_ns[lane] = slot.expected_end_ns;
    }
    // Liveness under a budget: a policy with its own pipeline (`peer`'s barrier) may wait
    // for a job memory keeps out. With nothing running, the earliest ready job the
    // ledger admits runs (the first unfinished chunk's next job always is admitted).
    if launcher.memory.unconstrained()
        || !launcher.outbox.0.is_empty()
        || processors.iter().any(|(_, slot, _)| slot.running.is_some())
    {
        return;
    }
    let online: Vec<bool> = launcher
        .index
        .processors
        .iter()
        .map(|&e| !processors.get(e).is_ok_and(|(_, _, offline)| offline))
        .collect();
    let Some((id, lane)) = launcher.earliest_admitted(plan, &online) else {
        return;
    };
    let entity = launcher.index.processors[lane];
    let (processor, mut slot, _) = processors.get_mut(entity).expect("processor entity");
    if policy.0.strict_chunk_order() {
        // Such a policy never needs this (its next job is the first chunk's); if it ever
        // does, the job must be the one it would run next.
        let ctx = PickContext {
            plan,
            progress: &progress,
            ready: &launcher.ready.lanes,
            backlog: launcher.ready.backlog(),
            arrivals: launcher.ready.arrivals(),
            times: &times,
            lane,
            kind: processor.kind,
        };
        if policy.0.pick(&ctx, &BTreeSet::from([id])) != Some(id) {
            return;
        }
    }
    launcher.launch(plan, id, lane, &mut slot, &mut policy);
}

/// The ready instances of one lane's queue that memory admits now (borrowed when every
/// one is), and whether memory held any back.
fn admitted<'q>(
    queue: &'q BTreeSet<u32>,
    memory: &MemoryLedger,
    plan: &PrefillPlan,
) -> (Cow<'q, BTreeSet<u32>>, bool) {
    if memory.unconstrained() {
        return (Cow::Borrowed(queue), false);
    }
    let admitted: BTreeSet<u32> = queue
        .iter()
        .copied()
        .filter(|&id| memory.admits(plan.key(id as usize)))
        .collect();
    let held = admitted.len() < queue.len();
    (Cow::Owned(admitted), held)
}

/// When an [`Offline`] processor is modeled free: far in the future, but far from
/// `u64::MAX`, since policies add costs to it.
const OFFLINE_FREE_AT_NS: u64 = u64::MAX / 4;

/// What launching a job changes: the ready queues, the instance's state, the memory
/// ledger, the outbox and the statistics.
#[derive(SystemParam)]
pub struct Launcher<'w, 's> {
    index: Res<'w, Index>,
    clock: Res<'w, Clock>,
    ready: ResMut<'w, ReadyQueues>,
    commands: Commands<'w, 's>,
    outbox: ResMut<'w, Outbox>,
    stats: ResMut<'w, RunStats>,
    memory: ResMut<'w, MemoryLedger>,
}

impl Launcher<'_, '_> {
    /// The smallest ready id memory admits, over every `online` lane, with its lane.
    fn earliest_admitted(&self, plan: &PrefillPlan, online: &[bool]) -> Option<(u32, usize)> {
        self.ready
            .lanes
            .iter()
            .enumerate()
            .filter(|&(lane, _)| online[lane])
            .filter_map(|(lane, q)| {
                q.iter()
                    .find(|&&id| self.memory.admits(plan.key(id as usize)))
                    .map(|&id| (id, lane))
            })
            .min()
    }

    /// Starts ready instance `id` on `lane`: out of every ready queue, [`Running`] on
    /// `lane` at `lane`'s cost, in the lane's slot, memory allocated, the policy told, a
    /// [`Job`] in the [`Outbox`].
    fn launch(
        &mut self,
        plan: &PrefillPlan,
        id: u32,
        lane: usize,
        slot: &mut BusySlot,
        policy: &mut ActivePolicy,
    ) {
        let key = plan.key(id as usize);
        self.ready.remove(plan, id);
        let estimated_ns = plan
            .cost_on(key, lane)
            .expect("dispatched to a processor the instance may not run on");
        self.memory.start(key);
        policy.0.launched(plan, id, lane);
        let instance = self.index.instances[id as usize].expect("ready instance without an entity");
        let now_ns = self.clock.now_ns;
        self.commands
            .entity(instance)
            .remove::<Ready>()
            .insert(Running {
                lane,
                estimated_ns,
                dispatched_ns: now_ns,
            });
        slot.running = Some(id);
        slot.expected_end_ns = now_ns + estimated_ns;
        self.stats.dispatched += 1;
        self.outbox.0.push(Job {
            id,
            key,
            processor: lane,
            estimated_ns,
            dispatched_ns: now_ns,
        });
    }
}
