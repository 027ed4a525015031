//! Requests in one world: a generation request is an entity ([`Request`]: its id,
//! priority class, latency targets, arrival and phase) that outlives the runs of its
//! steps. A run (its prefill, one decode step) is armed on the request
//! ([`arm_request`]): the run's subgraph instances are entities that belong to the
//! request ([`OfRequest`]), and the request carries the run's scheduling state
//! ([`RequestRun`]: plan, done prefixes, ready queues, memory ledger, the policy that
//! decides within it). Every system works across all armed requests in one tick; a
//! [`RequestPolicy`](crate::request_policy::RequestPolicy) orders the requests an idle
//! processor is offered to.
//!
//! Instance ids are global in the world: each armed run holds a range of the id space
//! (`base .. base + plan.id_space()`), so a [`Job`](crate::resources::Job) and a
//! [`Completion`](crate::resources::Completion) name one instance of one request; a
//! world with one request starts its range at 0, so its ids are the plan's own.

use std::sync::Arc;

use bevy_ecs::prelude::{Component, Entity, Resource, World};
use thiserror::Error;

use crate::components::{BusySlot, Offline, Processor, RemainingDeps, Running, SubgraphInstance};
use crate::graph::StageDependency;
use crate::memory_dispatch::MemoryLedger;
use crate::plan::PrefillPlan;
use crate::policy::Policy;
use crate::progress::StageProgress;
pub use crate::request_entity::{
    Priority, Request, RequestId, RequestPhase, SloTargets, UnknownPriority,
};
use crate::resources::{Clock, Inbox, Index, Outbox, ReadyQueues, RunStats, TimelineLog};

/// On a subgraph instance: the request entity whose run it belongs to.
#[derive(Component, Clone, Copy, Debug, PartialEq, Eq)]
pub struct OfRequest(pub Entity);

/// On a request entity while one of its runs is armed: that run's scheduling state.
/// Instance ids in it are the plan's own (local); `base` turns one into the world's id.
#[derive(Component)]
pub struct RequestRun {
    pub(crate) plan: Arc<PrefillPlan>,
    pub(crate) base: u32,
    pub(crate) progress: StageProgress,
    pub(crate) ready: ReadyQueues,
    pub(crate) memory: MemoryLedger,
    pub(crate) policy: Box<dyn Policy>,
    /// Modeled work (ns, at home) of the instances not yet dispatched.
    pub(crate) work_left_ns: u64,
    /// Instances not yet dispatched.
    pub(crate) undispatched: usize,
    /// Per stage, its instances not yet dispatched (a decode step riding this run waits
    /// for one of its stage while there is one: `crate::ride`).
    pub(crate) undispatched_by_stage: Vec<u32>,
    /// Modeled work (ns, at home) of every instance of the run.
    pub(crate) work_total_ns: u64,
    /// The plan's lower bound alone on the device, ns.
    pub(crate) alone_bound_ns: u64,
    /// When the run was armed, ns on the world's clock.
    pub(crate) armed_ns: u64,
}

impl RequestRun {
    /// The plan this run schedules.
    pub fn plan(&self) -> &Arc<PrefillPlan> {
        &self.plan
    }

    /// The world id of the plan's instance 0.
    pub fn base(&self) -> u32 {
        self.base
    }

    /// Which of the run's instances are done.
    pub fn progress(&self) -> &StageProgress {
        &self.progress
    }

    /// The run's memory ledger.
    pub fn memory(&self) -> &MemoryLedger {
        &self.memory
    }

    /// The name of the policy deciding within the run.
    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    /// Whether every instance of the run is done.
    pub fn is_done(&self) -> bool {
        self.progress.done_count() == self.plan.instance_count()
    }

    /// Modeled work (ns, each instance at its home processor) not yet dispatched.
    pub fn work_left_ns(&self) -> u64 {
        self.work_left_ns
    }

    /// Instances of `stage` not yet dispatched.
    pub fn undispatched_of_stage(&self, stage: u32) -> u32 {
        self.undispatched_by_stage
            .get(stage as usize)
            .copied()
            .unwrap_or(0)
    }
}

/// Armed runs across the world: instances armed and not done, and the requests whose
/// run finished since the engine last looked.
#[derive(Resource, Debug, Default, Clone)]
pub struct LiveRuns {
    /// Instances of the armed runs.
    pub armed: usize,
    /// Of those, not yet done.
    pub outstanding: usize,
    /// Request entities whose armed run completed, in completion order.
    pub finished: Vec<Entity>,
    /// Request entities with a run armed, in the order they were armed (dispatch lists
    /// them in this order, so that ties between requests are deterministic).
    pub requests: Vec<Entity>,
}

/// The request the world's current run serves (a world armed by [`crate::spawn_world`] or
/// [`rearm_world`]).
#[derive(Resource, Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOf(pub Entity);

/// Why a run could not be armed on a request.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The entity is not a request of this world.
    #[error("entity {0:?} is not a request of this world")]
    NotARequest(Entity),
    /// The plan's device has another number of processors than the world's.
    #[error(
        "the plan runs on {plan} processors but the world has {world}: every request of one world runs on one device"
    )]
    DeviceMismatch {
        /// Processors in the plan's device.
        plan: usize,
        /// Processors in the world.
        world: usize,
    },
    /// The world's id space (u32) is used up by the armed runs.
    #[error("the armed runs use up the world's instance ids; finish or cancel requests first")]
    IdsExhausted,
    /// The request still has jobs running: it cannot be disarmed until they report.
    #[error("request {0} still has jobs running")]
    JobsRunning(RequestId),
}

/// Spawns a request entity with `request`'s fields into `world`; nothing armed.
pub fn spawn_request_entity(world: &mut World, request: Request) -> Entity {
    world.spawn(request).id()
}

/// Spawns a request entity (id `id`, the default priority, no targets, arriving now,
/// phase [`RequestPhase::Waiting`]) into `world`.
pub fn spawn_request(world: &mut World, id: u64) -> Entity {
    let now = world.get_resource::<Clock>().map_or(0, |c| c.now_ns);
    spawn_request_entity(
        world,
        Request::new(
            RequestId(id),
            Priority::default(),
            SloTargets::default(),
            now,
        ),
    )
}

/// Arms a run of `plan`, decided within by `policy`, on `request` (phase becomes
/// `phase`), beside whatever else is armed: its instances are spawned (those of its
/// last run despawned first), its first stages ready. When the last run of `request`
/// was of this very plan (the same `Arc`: a session's decode steps), its entities are
/// reset in place instead, to the same state. The clock and the timeline go on.
///
/// # Errors
/// [`RequestError`]: not a request, another device, ids used up, or jobs of its last
/// run still running.
pub fn arm_request(
    world: &mut World,
    request: Entity,
    plan: Arc<PrefillPlan>,
    mut policy: Box<dyn Policy>,
    phase: RequestPhase,
) -> Result<(), RequestError> {
    let Some(id) = world.get::<Request>(request).map(|r| r.id) else {
        return Err(RequestError::NotARequest(request));
    };
    let lanes = world.resource::<Index>().processors.len();
    if plan.lanes() != lanes {
        return Err(RequestError::DeviceMismatch {
            plan: plan.lanes(),
            world: lanes,
        });
    }
    if has_running_jobs(world, request) {
        return Err(RequestError::JobsRunning(id));
    }
    policy.start(&plan);
    let same_plan = world
        .get::<RequestRun>(request)
        .is_some_and(|run| Arc::ptr_eq(&run.plan, &plan));
    let settle = !policy.strict_chunk_order();
    let mut ready = ReadyQueues::new(lanes, !policy.chooses_placement());
    let (base, memory) = if same_plan {
        let mut old = world
            .entity_mut(request)
            .take::<RequestRun>()
            .expect("checked above");
        {
            let mut live = world.resource_mut::<LiveRuns>();
            live.armed -= plan.instance_count();
            live.outstanding -= plan.instance_count() - old.progress.done_count();
        }
        let base = old.base;
        reset_instances(world, &plan, base, &mut ready);
        let memory = if old.memory.settles() == settle {
            old.memory.restart();
            old.memory
        } else {
            MemoryLedger::new(&plan, settle)
        };
        (base, memory)
    } else {
        disarm_request(world, request)?;
        let base = allocate_ids(world, plan.id_space())?;
        spawn_instances(world, &plan, base, request, &mut ready);
        (base, MemoryLedger::new(&plan, settle))
    };
    let count = plan.instance_count();
    let work_left_ns = plan.instances().map(|k| plan.cost_ns(k)).sum();
    let mut undispatched_by_stage = vec![0; plan.stages.len()];
    for key in plan.instances() {
        undispatched_by_stage[key.stage as usize] += 1;
    }
    let armed_ns = world.resource::<Clock>().now_ns;
    world.entity_mut(request).insert(RequestRun {
        alone_bound_ns: plan.lower_bound().ns(),
        work_total_ns: work_left_ns,
        armed_ns,
        progress: StageProgress::new(&plan),
        plan,
        base,
        ready,
        memory,
        policy,
        work_left_ns,
        undispatched: count,
        undispatched_by_stage,
    });
    if let Some(mut r) = world.get_mut::<Request>(request) {
        r.phase = phase;
    }
    let mut live = world.resource_mut::<LiveRuns>();
    live.armed += count;
    live.outstanding += count;
    if !live.requests.contains(&request) {
        live.requests.push(request);
    }
    Ok(())
}

/// Takes `request`'s armed run out of the world, if it has one: its instances despawned,
/// its ids freed, its undone instances no longer outstanding. Ready work it had is
/// dropped; the request entity stays.
///
/// # Errors
/// [`RequestError::JobsRunning`] while one of its jobs is running (wait for it to report).
pub fn disarm_request(world: &mut World, request: Entity) -> Result<(), RequestError> {
    if has_running_jobs(world, request) {
        let id = world.get::<Request>(request).map_or(RequestId(0), |r| r.id);
        return Err(RequestError::JobsRunning(id));
    }
    let Some(run) = world.entity_mut(request).take::<RequestRun>() else {
        return Ok(());
    };
    let (base, space) = (run.base as usize, run.plan.id_space());
    let mut stale = Vec::new();
    {
        let mut index = world.resource_mut::<Index>();
        for slot in &mut index.instances[base..base + space] {
            stale.extend(slot.take());
        }
        index.free.push((run.base, space as u32));
    }
    for entity in stale {
        world.despawn(entity);
    }
    let count = run.plan.instance_count();
    let mut live = world.resource_mut::<LiveRuns>();
    live.armed -= count;
    live.outstanding -= count - run.progress.done_count();
    live.finished.retain(|&e| e != request);
    live.requests.retain(|&e| e != request);
    Ok(())
}

/// Whether an instance of `request`'s armed run is dispatched and not yet reported.
fn has_running_jobs(world: &World, request: Entity) -> bool {
    let Some(run) = world.get::<RequestRun>(request) else {
        return false;
    };
    let index = world.resource::<Index>();
    let base = run.base as usize;
    index.instances[base..base + run.plan.id_space()]
        .iter()
        .flatten()
        .any(|&e| world.get::<Running>(e).is_some())
}

/// A free range of `space` ids (first fit, else past the end).
fn allocate_ids(world: &mut World, space: usize) -> Result<u32, RequestError> {
    let mut index = world.resource_mut::<Index>();
    let fit = index
        .free
        .iter()
        .position(|&(_, len)| len as usize >= space);
    if let Some(at) = fit {
        let (base, len) = index.free.swap_remove(at);
        if len as usize > space {
            index.free.push((base + space as u32, len - space as u32));
        }
        return Ok(base);
    }
    let base = index.instances.len();
    if base + space > u32::MAX as usize {
        return Err(RequestError::IdsExhausted);
    }
    index.instances.resize(base + space, None);
    Ok(base as u32)
}

/// Spawns `plan`'s instances for `request` at ids from `base`; first stages ready.
fn spawn_instances(
    world: &mut World,
    plan: &PrefillPlan,
    base: u32,
    request: Entity,
    ready: &mut ReadyQueues,
) {
    for key in plan.instances() {
        let local = plan.id(key);
        let deps = initial_deps(plan, key.stage);
        let entity = world
            .spawn((
                SubgraphInstance {
                    id: base + local as u32,
                    key,
                },
                RemainingDeps(deps),
                OfRequest(request),
            ))
            .id();
        world.resource_mut::<Index>().instances[base as usize + local] = Some(entity);
        if deps == 0 {
            ready.insert(plan, local as u32);
        }
    }
}

/// Resets the instances of the run of `plan` at `base` to their armed state.
fn reset_instances(world: &mut World, plan: &PrefillPlan, base: u32, ready: &mut ReadyQueues) {
    for key in plan.instances() {
        let local = plan.id(key);
        let deps = initial_deps(plan, key.stage);
        let entity = world.resource::<Index>().instances[base as usize + local]
            .expect("an armed run has every instance");
        if let Some(mut remaining) = world.get_mut::<RemainingDeps>(entity) {
            remaining.0 = deps;
        }
        if deps == 0 {
            ready.insert(plan, local as u32);
        }
    }
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

/// Spawns one processor entity per processor of `device`, by lane.
pub(crate) fn spawn_processors(
    world: &mut World,
    device: &crate::device::DeviceProfile,
) -> Vec<Entity> {
    device
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
        .collect()
}

/// Replaces the resources a run of the whole world starts from: clock at 0, empty
/// queues of jobs and completions, empty timeline and statistics, no armed instances.
pub(crate) fn reset_run_resources(world: &mut World) {
    world.insert_resource(Clock::default());
    world.insert_resource(Inbox::default());
    world.insert_resource(Outbox::default());
    world.insert_resource(TimelineLog::default());
    world.insert_resource(RunStats::default());
    world.insert_resource(LiveRuns::default());
}

/// Arms `world` (made by [`crate::spawn_world`] or an earlier rearm) for a run of `plan`
/// by `policy` for `request`, as a fresh world would be: every other armed run and the
/// last run's timeline, statistics and clock are dropped, the processors made idle (and
/// respawned when the plan's device differs); request entities stay, `request`'s phase
/// becomes `phase`. When the last run was of this very plan (the same `Arc`: a session's
/// decode steps), its entities are reset in place instead.
///
/// # Panics
/// If `request` is not a request of `world` (a caller's bug: it spawned it there).
pub fn rearm_world(
    world: &mut World,
    plan: Arc<PrefillPlan>,
    policy: Box<dyn Policy>,
    request: Entity,
    phase: RequestPhase,
) {
    let others: Vec<Entity> = world
        .query::<(bevy_ecs::prelude::Entity, &RequestRun)>()
        .iter(world)
        .map(|(e, _)| e)
        .filter(|&e| e != request)
        .collect();
    // A whole-world re-arm: nothing of the last run is still in flight.
    clear_running(world);
    for other in others {
        disarm_request(world, other).expect("nothing runs after clear_running");
    }
    let same_device = {
        let index = world.resource::<Index>();
        let names: Vec<(String, crate::device::ProcessorKind)> = index
            .processors
            .iter()
            .filter_map(|&e| world.get::<Processor>(e))
            .map(|p| (p.name.clone(), p.kind))
            .collect();
        names.len() == plan.device.processors.len()
            && names
                .iter()
                .zip(&plan.device.processors)
                .all(|((n, k), p)| *n == p.name && *k == p.kind)
    };
    if !same_device {
        disarm_request(world, request).expect("nothing runs after clear_running");
        let stale = std::mem::take(&mut world.resource_mut::<Index>().processors);
        for entity in stale {
            world.despawn(entity);
        }
        let processors = spawn_processors(world, &plan.device);
        world.resource_mut::<Index>().processors = processors;
    }
    let processors = world.resource::<Index>().processors.clone();
    for entity in processors {
        let mut processor = world.entity_mut(entity);
        processor.remove::<Offline>();
        processor.insert(BusySlot::default());
    }
    let kept = world.remove_resource::<LiveRuns>().unwrap_or_default();
    reset_run_resources(world);
    world.insert_resource(LiveRuns {
        finished: Vec::new(),
        ..kept
    });
    arm_request(world, request, plan, policy, phase).expect("a request of this world");
    world.insert_resource(RunOf(request));
}

/// Forgets every dispatched job of the world (a whole-world re-arm starts from idle).
fn clear_running(world: &mut World) {
    let mut q = world.query_filtered::<Entity, bevy_ecs::prelude::With<Running>>();
    let running: Vec<Entity> = q.iter(world).collect();
    for entity in running {
        world.entity_mut(entity).remove::<Running>();
    }
}

#[cfg(test)]
mod tests {
    use bevy_ecs::prelude::World;

    use super::*;
    use crate::testing::tiny_plan;
    use crate::{DEFAULT_POLICY, PolicyRegistry, spawn_request_world, spawn_world};

    fn instances(world: &mut World) -> usize {
        world.query::<&SubgraphInstance>().iter(world).count()
    }

    #[test]
    fn priorities_parse_by_class_or_number_and_refuse_others() {
        assert_eq!("interactive".parse(), Ok(Priority::INTERACTIVE));
        assert_eq!("background".parse(), Ok(Priority::BACKGROUND));
        assert_eq!("7".parse(), Ok(Priority(7)));
        assert!("urgent".parse::<Priority>().is_err());
        assert!("256".parse::<Priority>().is_err());
        assert!(Priority::INTERACTIVE > Priority::BACKGROUND);
    }

    #[test]
    fn rearming_replaces_the_runs_entities_and_keeps_requests() {
        let plan = Arc::new(tiny_plan(2, 8, 4));
        let policy = || PolicyRegistry::builtin().create(DEFAULT_POLICY).unwrap();
        let mut world = spawn_world(plan.clone(), policy());
        let request = spawn_request(&mut world, 7);
        let per_run = instances(&mut world);
        assert_eq!(per_run, plan.instance_count());
        for step in 0..3 {
            let phase = RequestPhase::Decode { step };
            rearm_world(&mut world, plan.clone(), policy(), request, phase);
            assert_eq!(instances(&mut world), per_run);
            let processors = world.query::<&Processor>().iter(&world).count();
            assert_eq!(processors, plan.device.processors.len());
            assert_eq!(world.get::<Request>(request).unwrap().phase, phase);
            assert_eq!(world.resource::<RunOf>().0, request);
        }
    }

    fn instance_entities(world: &mut World) -> Vec<Entity> {
        let mut q = world.query_filtered::<Entity, bevy_ecs::prelude::With<SubgraphInstance>>();
        let mut all: Vec<Entity> = q.iter(world).collect();
        all.sort();
        all
    }

    #[test]
    fn the_same_plan_is_rearmed_in_place_and_another_respawned() {
        let plan = Arc::new(tiny_plan(2, 8, 4));
        let policy = || PolicyRegistry::builtin().create(DEFAULT_POLICY).unwrap();
        let mut world = spawn_world(plan.clone(), policy());
        let request = world.resource::<RunOf>().0;
        let first = instance_entities(&mut world);
        // Leave the run half-done: dependencies spent.
        for &e in &first {
            world.get_mut::<RemainingDeps>(e).unwrap().0 = 0;
        }
        let phase = RequestPhase::Decode { step: 0 };
        rearm_world(&mut world, plan.clone(), policy(), request, phase);
        assert_eq!(
            instance_entities(&mut world),
            first,
            "same plan: same entities"
        );
        let mut fresh = spawn_world(plan.clone(), policy());
        let state = |w: &mut World| {
            let mut q = w.query::<(&SubgraphInstance, &RemainingDeps)>();
            let mut s: Vec<_> = q.iter(w).map(|(i, d)| (i.id, d.0)).collect();
            s.sort();
            s
        };
        assert_eq!(state(&mut world), state(&mut fresh));
        let other = Arc::new(tiny_plan(2, 8, 4));
        rearm_world(&mut world, other, policy(), request, phase);
        assert_ne!(
            instance_entities(&mut world),
            first,
            "another plan: respawned"
        );
        assert_eq!(state(&mut world), state(&mut fresh));
    }

    #[test]
    fn requests_armed_together_hold_disjoint_ids_and_free_them() {
        let plan = Arc::new(tiny_plan(2, 8, 4));
        let policy = || PolicyRegistry::builtin().create(DEFAULT_POLICY).unwrap();
        let mut world = spawn_request_world(&plan.device);
        let a = spawn_request(&mut world, 1);
        let b = spawn_request(&mut world, 2);
        arm_request(&mut world, a, plan.clone(), policy(), RequestPhase::Prefill).unwrap();
        arm_request(&mut world, b, plan.clone(), policy(), RequestPhase::Prefill).unwrap();
        let (ba, bb) = (
            world.get::<RequestRun>(a).unwrap().base(),
            world.get::<RequestRun>(b).unwrap().base(),
        );
        assert_eq!(ba, 0);
        assert_eq!(bb as usize, plan.id_space());
        assert_eq!(instances(&mut world), 2 * plan.instance_count());
        assert_eq!(
            world.resource::<LiveRuns>().outstanding,
            2 * plan.instance_count()
        );
        disarm_request(&mut world, a).unwrap();
        assert_eq!(instances(&mut world), plan.instance_count());
        let c = spawn_request(&mut world, 3);
        arm_request(&mut world, c, plan.clone(), policy(), RequestPhase::Prefill).unwrap();
        assert_eq!(
            world.get::<RequestRun>(c).unwrap().base(),
            0,
            "freed ids reused"
        );
        let mut owners = world.query::<&OfRequest>();
        assert!(owners.iter(&world).all(|o| o.0 == b || o.0 == c));
        let mut device = crate::testing::tiny_device();
        device.processors.truncate(1);
        let workload = crate::plan::Workload {
            prompt_len: 8,
            chunk_len: 4,
            float_processor: None,
        };
        let model = crate::testing::tiny_model(2);
        let other_device = Arc::new(PrefillPlan::new(model, device, workload).unwrap());
        assert!(matches!(
            arm_request(&mut world, c, other_device, policy(), RequestPhase::Prefill),
            Err(RequestError::DeviceMismatch { .. })
        ));
    }
}
