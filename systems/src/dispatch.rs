//! Phase 3: policies + dispatch. Each idle processor takes one ready instance of one
//! request: the request policy orders the requests, the request's own policy picks.

use std::borrow::Cow;
use std::collections::BTreeSet;

use bevy_ecs::prelude::{Commands, Entity, Has, Local, Query, Res, ResMut, With};
use bevy_ecs::system::SystemParam;

use crate::components::{BusySlot, Offline, Processor, Running};
use crate::device::ProcessorKind;
use crate::memory_dispatch::MemoryLedger;
use crate::plan::{InstanceKey, PrefillPlan};
use crate::policy::{LaneTimes, PickContext};
use crate::progress::StageProgress;
use crate::request::{LiveRuns, Request, RequestId, RequestRun};
use crate::request_policy::{ActiveRequestPolicy, LiveRequest};
use crate::resources::{Clock, Index, Job, Outbox, ReadyQueues, RunStats};
use crate::ride::{Carries, RidesOn, RidingIn, about_to_dispatch, merged_ns};

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
    riders: Query<(Entity, &RidesOn)>,
    running: Query<(), With<Running>>,
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
    let rides = live_rides(&riders, &runs, &live, |base, id| {
        launcher.index.instances[(base + id) as usize].is_some_and(|e| running.contains(e))
    });
    let mut times = lane_times(&launcher.index, &processors, now_ns);
    offer_idle_lanes(
        &request_policy,
        &mut runs,
        &mut processors,
        &mut launcher,
        (&live, &rides),
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

/// A decode step riding a host's prefill this tick ([`RidesOn`]), with the stages it
/// holds back: those whose host job is about to be dispatched ([`about_to_dispatch`])
/// by a host the request policy offers processors to. Any other stage of it runs as a
/// job of its own.
struct LiveRide {
    rider: Entity,
    host: Entity,
    stages: std::sync::Arc<[Option<u32>]>,
    rows: u32,
    waits: Vec<bool>,
}

/// The rides of `live` riders on `live` hosts; `is_running(base, id)` tells whether the
/// instance of plan id `id` of the run at `base` is running.
fn live_rides(
    riders: &Query<(Entity, &RidesOn)>,
    runs: &Runs,
    live: &[LiveRequest],
    is_running: impl Fn(u32, u32) -> bool,
) -> Vec<LiveRide> {
    let offered = |e: Entity| live.iter().any(|l| l.entity == e);
    riders
        .iter()
        .filter(|(rider, ride)| offered(*rider) && offered(ride.host))
        .filter_map(|(rider, ride)| {
            let (_, host) = runs.get(ride.host).ok()?;
            let plan = host.plan();
            let dispatched = |key: InstanceKey| {
                host.progress().is_done(plan, key) || is_running(host.base(), plan.id(key) as u32)
            };
            let waits = ride
                .stages
                .iter()
                .map(|m| {
                    m.is_some_and(|s| {
                        host.undispatched_of_stage(s) > 0 && about_to_dispatch(host, s, dispatched)
                    })
                })
                .collect();
            Some(LiveRide {
                rider,
                host: ride.host,
                stages: ride.stages.clone(),
                rows: ride.rows,
                waits,
            })
        })
        .collect()
}

/// Offers every idle online processor, in lane order, to the `live` requests in their
/// order: the first whose policy picks an instance its memory admits (and, behind the
/// first request, that the request policy lets fill the gap) launches it there. A rider
/// offers none of the stages it holds back for its host; a host's job is never held for
/// the slack of a request riding it (that request waits for the host's jobs), and takes
/// every rider ready for it along ([`launch_with_riders`]).
fn offer_idle_lanes(
    request_policy: &ActiveRequestPolicy,
    runs: &mut Runs,
    processors: &mut Processors,
    launcher: &mut Launcher,
    (live, rides): (&[LiveRequest], &[LiveRide]),
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
            let candidates = match rides.iter().find(|r| r.rider == contender.entity) {
                Some(ride) => without_held_back(candidates, ride, &run.plan),
                None => candidates,
            };
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
                let riding_it = |a: &&LiveRequest| {
                    rides
                        .iter()
                        .any(|r| r.rider == a.entity && r.host == contender.entity)
                };
                let ahead: Cow<[LiveRequest]> = match rides.is_empty() {
                    true => Cow::Borrowed(&live[..rank]),
                    false => Cow::Owned(
                        live[..rank]
                            .iter()
                            .filter(|a| !riding_it(a))
                            .copied()
                            .collect(),
                    ),
                };
                if !request_policy.0.may_fill(now_ns, &ahead, contender, job_ns) {
                    continue;
                }
            }
            let request_id = request.id;
            launch_with_riders(
                runs,
                launcher,
                rides,
                contender.entity,
                request_id,
                id,
                lane,
                &mut slot,
            );
            times.free_at_ns[lane] = slot.expected_end_ns;
            break;
        }
    }
}

/// `candidates` without the stages `ride` holds back for its host.
fn without_held_back<'q>(
    candidates: Cow<'q, BTreeSet<u32>>,
    ride: &LiveRide,
    plan: &PrefillPlan,
) -> Cow<'q, BTreeSet<u32>> {
    let waits = |id: u32| {
        let stage = plan.key(id as usize).stage as usize;
        ride.waits.get(stage).copied().unwrap_or(false)
    };
    if !candidates.iter().any(|&id| waits(id)) {
        return candidates;
    }
    Cow::Owned(
        candidates
            .iter()
            .copied()
            .filter(|&id| !waits(id))
            .collect(),
    )
}

/// Launches `host`'s instance `id` on `lane`, with every rider of `host` whose stage
/// matching it is ready there (and admitted by its memory) inside the same job, priced
/// for the chunk's rows plus theirs ([`merged_ns`]); alone when none is, or when no
/// graph of the processor holds the rows.
#[allow(clippy::too_many_arguments)]
fn launch_with_riders(
    runs: &mut Runs,
    launcher: &mut Launcher,
    rides: &[LiveRide],
    host: Entity,
    request: RequestId,
    id: u32,
    lane: usize,
    slot: &mut BusySlot,
) {
    let mut joining: Vec<(Entity, u32)> = Vec::new();
    let mut rows = 0;
    if rides.iter().any(|r| r.host == host) {
        let (_, run) = runs.get(host).expect("a live request");
        let stage = run.plan.key(id as usize).stage;
        for ride in rides.iter().filter(|r| r.host == host) {
            let Some(s) = ride.stages.iter().position(|&m| m == Some(stage)) else {
                continue;
            };
            let Ok((_, rider)) = runs.get(ride.rider) else {
                continue;
            };
            let key = InstanceKey {
                chunk: 0,
                stage: s as u32,
            };
            let local = rider.plan.id(key) as u32;
            let ready_here = rider
                .ready
                .lanes
                .get(lane)
                .is_some_and(|q| q.contains(&local));
            if ready_here && rider.memory.admits(key) {
                joining.push((ride.rider, local));
                rows += ride.rows;
            }
        }
    }
    let (host_global, merged) = {
        let (_, mut run) = runs.get_mut(host).expect("a live request");
        let merged = match joining.is_empty() {
            true => None,
            false => merged_ns(&run.plan, run.plan.key(id as usize), lane, rows),
        };
        let global = launcher.launch(&mut run, request, id, lane, slot, merged);
        match merged {
            Some(merged) => (global, merged),
            None => return,
        }
    };
    let mut carried = Vec::with_capacity(joining.len());
    for (rider, local) in joining {
        let (_, mut run) = runs.get_mut(rider).expect("a live request");
        carried.push(launcher.ride(&mut run, local, lane, host_global, merged));
    }
    let host_instance =
        launcher.index.instances[host_global as usize].expect("a launched instance");
    launcher
        .commands
        .entity(host_instance)
        .insert(Carries(carried));
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
        launcher.launch(run, request.id, id, lane, &mut slot, None);
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
    /// ready queue, [`Running`] on `lane` at `lane`'s cost (or `merged_ns`, a job with
    /// riders), in the lane's slot, memory allocated, the policy told, a [`Job`] naming
    /// `request` in the [`Outbox`]. Returns the instance's world id.
    fn launch(
        &mut self,
        run: &mut RequestRun,
        request: RequestId,
        id: u32,
        lane: usize,
        slot: &mut BusySlot,
        merged_ns: Option<u64>,
    ) -> u32 {
        let key = run.plan.key(id as usize);
        let estimated_ns = match merged_ns {
            Some(ns) => ns,
            None => run
                .plan
                .cost_on(key, lane)
                .expect("dispatched to a processor the instance may not run on"),
        };
        let global = self.start(run, id, lane, estimated_ns);
        slot.running = Some(global);
        slot.expected_end_ns = self.clock.now_ns + estimated_ns;
        self.outbox.0.push(Job {
            id: global,
            request,
            key,
            processor: lane,
            estimated_ns,
            dispatched_ns: self.clock.now_ns,
        });
        global
    }

    /// Starts rider `run`'s ready instance `id` inside the job of host instance `host`
    /// (world id) on `lane`, for `estimated_ns`: as [`Launcher::launch`], but it takes no
    /// slot and no job of its own ([`RidingIn`]); it completes with the host's job.
    /// Returns its world id.
    fn ride(
        &mut self,
        run: &mut RequestRun,
        id: u32,
        lane: usize,
        host: u32,
        estimated_ns: u64,
    ) -> u32 {
        let global = self.start(run, id, lane, estimated_ns);
        let instance = self.index.instances[global as usize].expect("a launched instance");
        self.commands.entity(instance).insert(RidingIn(host));
        global
    }

    /// What every start changes: the run's queues, memory, policy and counters, the
    /// instance [`Running`]. Returns the instance's world id.
    fn start(&mut self, run: &mut RequestRun, id: u32, lane: usize, estimated_ns: u64) -> u32 {
        let plan = &run.plan;
        let key = plan.key(id as usize);
        run.ready.remove(plan, id);
        run.memory.start(key);
        run.policy.launched(plan, id, lane);
        run.work_left_ns -= plan.cost_ns(key);
        run.undispatched -= 1;
        run.undispatched_by_stage[key.stage as usize] -= 1;
        let global = run.base + id;
        let instance =
            self.index.instances[global as usize].expect("ready instance without an entity");
        self.commands.entity(instance).insert(Running {
            lane,
            estimated_ns,
            dispatched_ns: self.clock.now_ns,
        });
        self.stats.dispatched += 1;
        global
    }
}
