//! Phase 3: policies + dispatch. Each idle processor takes one ready instance of one
//! request: the request policy orders the requests, the request's own policy picks.

use std::borrow::Cow;
use std::collections::BTreeSet;

use bevy_ecs::prelude::{Commands, Has, Local, Query, Res, ResMut};
use bevy_ecs::system::SystemParam;

use crate::components::{BusySlot, Offline, Processor, Running};
use crate::device::ProcessorKind;
use crate::memory_dispatch::MemoryLedger;
use crate::plan::PrefillPlan;
use crate::policy::{LaneTimes, PickContext};
use crate::progress::StageProgress;
use crate::request::{LiveRuns, Request, RequestId, RequestRun};
use crate::request_policy::{ActiveRequestPolicy, LiveRequest};
use crate::resources::{Clock, Index, Job, Outbox, ReadyQueues, RunStats};

/// Lists the armed requests whose run is not done and lets the
/// [`ActiveRequestPolicy`] order them; then for every idle processor, in lane order,
/// offers it to those requests in that order: the first whose own policy picks one of
/// its ready instances that its [`MemoryLedger`] admits launches it. A processor never holds more
/// than one job (seed 000, Eq. 4). Its ready queue holds every ready instance it may run
/// (under flexible placement, also those of other processors); a launched instance leaves
/// every queue, so it runs exactly once, on the processor that took it. An [`Offline`]
/// processor takes nothing, and the policies see it free only in the far future.
pub fn dispatch_ready(
    mut request_policy: ResMut<ActiveRequestPolicy>,
    mut runs: Runs,
    mut processors: Processors,
    mut launcher: Launcher,
    mut live: Local<Vec<LiveRequest>>,
) {
    let now_ns = launcher.clock.now_ns;
    live.clear();
    live.extend(
        launcher
            .owners
            .requests
            .iter()
            .filter_map(|&e| runs.get(e).ok().map(|(r, run)| (e, r, run)))
            .filter(|(_, _, run)| !run.is_done())
            .map(|(entity, r, run)| LiveRequest::of(entity, r, run)),
    );
    if live.is_empty() {
        return;
    }
    request_policy.0.order(now_ns, &mut live);
    let mut times = lane_times(&launcher.index, &processors, now_ns);
    offer_idle_lanes(
        &request_policy,
        &mut runs,
        &mut processors,
        &mut launcher,
        &live,
        &mut times,
    );
    // Liveness under a budget: a policy with its own pipeline (`peer`'s barrier) may wait
    // for a job memory keeps out. With nothing running, the earliest ready job the
    // ledger admits runs (the first unfinished chunk's next job always is admitted), for
    // the first request in the request policy's order that has one.
    if !launcher.outbox.0.is_empty() || processors.iter().any(|(_, slot, _)| slot.running.is_some())
    {
        return;
    }
    launch_earliest_admitted(&mut runs, &mut processors, &mut launcher, &live, &times);
}

/// The requests' runs, with the requests they belong to.
type Runs<'w, 's> = Query<'w, 's, (&'static Request, &'static mut RequestRun)>;

/// Every processor with its slot, and whether it is [`Offline`].
type Processors<'w, 's> = Query<'w, 's, (&'static Processor, &'static mut BusySlot, Has<Offline>)>;

/// When each lane is modeled free, as the policies see it: now when idle, the running
/// job's expected end when busy, far in the future when offline.
fn lane_times(index: &Index, processors: &Processors, now_ns: u64) -> LaneTimes {
    LaneTimes {
        now_ns,
        free_at_ns: index
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
    }
}

/// Offers every idle online processor, in lane order, to the `live` requests in their
/// order: the first whose policy picks an instance its memory admits (and, behind the
/// first request, that the request policy lets fill the gap) launches it there.
fn offer_idle_lanes(
    request_policy: &ActiveRequestPolicy,
    runs: &mut Runs,
    processors: &mut Processors,
    launcher: &mut Launcher,
    live: &[LiveRequest],
    times: &mut LaneTimes,
) {
    let now_ns = times.now_ns;
    for lane in 0..launcher.index.processors.len() {
        let entity = launcher.index.processors[lane];
        let (processor, mut slot, offline) = processors.get_mut(entity).expect("processor entity");
        if slot.running.is_some() || offline {
            continue;
        }
        for (rank, contender) in live.iter().enumerate() {
            let (request, mut run) = runs.get_mut(contender.entity).expect("a live request");
            let run = &mut *run;
            let (candidates, held) = admitted(&run.ready.lanes[lane], &run.memory, &run.plan);
            launcher.stats.held_for_memory += u64::from(held);
            if candidates.is_empty() {
                continue;
            }
            let ctx = pick_context(
                &run.plan,
                &run.progress,
                &run.ready,
                request,
                times,
                lane,
                processor.kind,
            );
            let Some(id) = run.policy.pick(&ctx, &candidates) else {
                continue;
            };
            drop(candidates);
            if rank > 0 {
                let job_ns = run.plan.cost_on(run.plan.key(id as usize), lane);
                let job_ns = job_ns.unwrap_or(u64::MAX);
                if !request_policy
                    .0
                    .may_fill(now_ns, &live[..rank], contender, job_ns)
                {
                    continue;
                }
            }
            launcher.launch(run, request.id, id, lane, &mut slot);
            times.free_at_ns[lane] = slot.expected_end_ns;
            break;
        }
    }
}

/// With nothing running: launches, for the first `live` request under a memory budget
/// that has one, the earliest ready job its ledger admits on an online lane.
fn launch_earliest_admitted(
    runs: &mut Runs,
    processors: &mut Processors,
    launcher: &mut Launcher,
    live: &[LiveRequest],
    times: &LaneTimes,
) {
    let online: Vec<bool> = launcher
        .index
        .processors
        .iter()
        .map(|&e| !processors.get(e).is_ok_and(|(_, _, offline)| offline))
        .collect();
    for contender in live.iter() {
        let (request, mut run) = runs.get_mut(contender.entity).expect("a live request");
        let run = &mut *run;
        if run.memory.unconstrained() {
            continue;
        }
        let Some((id, lane)) = earliest_admitted(run, &online) else {
            continue;
        };
        let entity = launcher.index.processors[lane];
        let (processor, mut slot, _) = processors.get_mut(entity).expect("processor entity");
        if run.policy.strict_chunk_order() {
            // Such a policy never needs this (its next job is the first chunk's); if it ever
            // does, the job must be the one it would run next.
            let ctx = pick_context(
                &run.plan,
                &run.progress,
                &run.ready,
                request,
                times,
                lane,
                processor.kind,
            );
            if run.policy.pick(&ctx, &BTreeSet::from([id])) != Some(id) {
                continue;
            }
        }
        launcher.launch(run, request.id, id, lane, &mut slot);
        return;
    }
}

/// What a run's policy decides from when the idle `lane` (of `kind`) asks it for a job:
/// the run's plan, progress and ready queues, borrowed apart from its policy, which then
/// picks.
fn pick_context<'a>(
    plan: &'a PrefillPlan,
    progress: &'a StageProgress,
    ready: &'a ReadyQueues,
    request: &'a Request,
    times: &'a LaneTimes,
    lane: usize,
    kind: ProcessorKind,
) -> PickContext<'a> {
    PickContext {
        plan,
        progress,
        ready: &ready.lanes,
        backlog: ready.backlog(),
        arrivals: ready.arrivals(),
        times,
        lane,
        kind,
        request: Some(request),
    }
}

/// The smallest ready id of `run` its memory admits, over every `online` lane, with its
/// lane.
fn earliest_admitted(run: &RequestRun, online: &[bool]) -> Option<(u32, usize)> {
    run.ready
        .lanes
        .iter()
        .enumerate()
        .filter(|&(lane, _)| online[lane])
        .filter_map(|(lane, q)| {
            q.iter()
                .find(|&&id| run.memory.admits(run.plan.key(id as usize)))
                .map(|&id| (id, lane))
        })
        .min()
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
pub(crate) const OFFLINE_FREE_AT_NS: u64 = u64::MAX / 4;

/// What launching a job changes beside the request's run: the instance's state, the
/// outbox and the statistics; and the requests in the order they were armed.
#[derive(SystemParam)]
pub struct Launcher<'w, 's> {
    index: Res<'w, Index>,
    clock: Res<'w, Clock>,
    commands: Commands<'w, 's>,
    outbox: ResMut<'w, Outbox>,
    stats: ResMut<'w, RunStats>,
    owners: Res<'w, LiveRuns>,
}

impl Launcher<'_, '_> {
    /// Starts `run`'s ready instance `id` (the plan's own id) on `lane`: out of every
    /// ready queue, [`Running`] on `lane` at `lane`'s cost, in the lane's slot, memory
    /// allocated, the policy told, a [`Job`] naming `request` in the [`Outbox`].
    fn launch(
        &mut self,
        run: &mut RequestRun,
        request: RequestId,
        id: u32,
        lane: usize,
        slot: &mut BusySlot,
    ) {
        let plan = &run.plan;
        let key = plan.key(id as usize);
        run.ready.remove(plan, id);
        let estimated_ns = plan
            .cost_on(key, lane)
            .expect("dispatched to a processor the instance may not run on");
        run.memory.start(key);
        run.policy.launched(plan, id, lane);
        run.work_left_ns -= plan.cost_ns(key);
        run.undispatched -= 1;
        let global = run.base + id;
        let instance =
            self.index.instances[global as usize].expect("ready instance without an entity");
        let now_ns = self.clock.now_ns;
        self.commands.entity(instance).insert(Running {
            lane,
            estimated_ns,
            dispatched_ns: now_ns,
        });
        slot.running = Some(global);
        slot.expected_end_ns = now_ns + estimated_ns;
        self.stats.dispatched += 1;
        self.outbox.0.push(Job {
            id: global,
            request,
            key,
            processor: lane,
            estimated_ns,
            dispatched_ns: now_ns,
        });
    }
}
