//! Scheduler speed on the default scene (Qwen1.5-1.8B on a Snapdragon 8 Gen 3, chunk 256):
//! one policy decision over a full ready queue, one scheduler tick, and a whole simulated
//! prefill, at 1K, 4K and 32K-token prompts; and one tick of a world of 1 and of 16 live
//! requests (`tick/requests`). The median tick time of a run is in `simulate --json`
//! (`scheduler_us_per_tick`).

use std::collections::BTreeSet;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy_ecs::prelude::World;
use bevy_ecs::schedule::Schedule;
use hetsched::backends::Backend;
use hetsched::backends::sim::SimBackend;
use hetsched::systems::request_policy::create_request_policy;
use hetsched::systems::resources::{Clock, Inbox, Outbox};
use hetsched::systems::{
    ActiveRequestPolicy, Priority, Request, RequestId, RequestPhase, SloTargets, arm_request,
    disarm_request, scheduler_schedule, spawn_request_entity, spawn_request_world, spawn_world,
};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched::engine::simulate;
use hetsched::scene::Scene;
use hetsched::systems::policy::{HomeBacklog, LaneTimes, PickContext};
use hetsched::systems::{
    InstanceKey, LiveRuns, Policy, PolicyRegistry, PrefillPlan, ProcessorKind, StageProgress,
};

const PROMPTS: [u32; 3] = [1024, 4096, 32768];

fn plan(prompt_len: u32) -> Arc<PrefillPlan> {
    let mut scene = Scene::default_scene();
    scene.workload.prompt_len = prompt_len;
    Arc::new(scene.plan().expect("default scene"))
}

/// A fresh built-in policy.
fn builtin(name: &str) -> Box<dyn Policy> {
    PolicyRegistry::builtin()
        .create(name)
        .expect("a built-in policy")
}

/// Halfway through: every chunk has finished the first half of its stages, so the NPU
/// lane's ready queue holds one instance per chunk (the widest choice a decision faces).
fn halfway(plan: &PrefillPlan) -> (StageProgress, BTreeSet<u32>) {
    let mut progress = StageProgress::new(plan);
    let half = plan.stage_count() / 2;
    let stage = (half..plan.stage_count())
        .find(|&s| plan.stages[s as usize].class == hetsched::systems::model::ExecClass::Int8)
        .expect("an NPU stage");
    for s in 0..stage {
        for chunk in 0..plan.chunks {
            progress.mark_done(plan, InstanceKey { chunk, stage: s });
        }
    }
    let ready = (0..plan.chunks)
        .map(|chunk| plan.id(InstanceKey { chunk, stage }) as u32)
        .collect();
    (progress, ready)
}

/// One decision of the NPU lane over a ready queue of one instance per chunk, the float
/// lane idle, through the [`Policy`] trait as the dispatch system calls it (the policy's
/// own view of the other lanes included).
fn policy_decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy/decision");
    for prompt_len in PROMPTS {
        let plan = plan(prompt_len);
        let (progress, ready) = halfway(&plan);
        let times = LaneTimes {
            now_ns: 0,
            free_at_ns: vec![0; plan.lanes()],
        };
        let lanes = [BTreeSet::new(), ready.clone()];
        let backlog = HomeBacklog::of(&plan, &lanes);
        let ctx = PickContext {
            plan: &plan,
            progress: &progress,
            ready: &lanes,
            backlog: &backlog,
            arrivals: &[],
            times: &times,
            lane: 1,
            kind: ProcessorKind::Npu,
            request: None,
        };
        for name in ["stall", "lookahead", "balance"] {
            let mut policy = builtin(name);
            policy.start(&plan);
            group.bench_with_input(BenchmarkId::new(name, prompt_len), &prompt_len, |b, _| {
                b.iter(|| black_box(policy.pick(&ctx, &ready)))
            });
        }
    }
    group.finish();
}

/// A simulated prefill stepped one tick at a time, so a bench can time single ticks.
struct TickStepper {
    plan: Arc<PrefillPlan>,
    world: World,
    schedule: Schedule,
    backend: SimBackend,
    policy: String,
}

impl TickStepper {
    fn new(plan: Arc<PrefillPlan>, policy: &str) -> Self {
        Self {
            world: spawn_world(plan.clone(), builtin(policy)),
            policy: policy.to_string(),
            schedule: scheduler_schedule(),
            backend: SimBackend::default(),
            plan,
        }
    }

    /// Runs one tick (timed) and hands its jobs to the simulated queues and the next
    /// completions to the inbox (untimed); starts a new prefill when this one is done.
    fn tick(&mut self) -> Duration {
        let started = Instant::now();
        self.schedule.run(&mut self.world);
        let elapsed = started.elapsed();
        submit_jobs(&mut self.world, &mut self.backend);
        let outstanding = self.world.resource::<LiveRuns>().outstanding;
        if outstanding == 0 || self.backend.in_flight() == 0 {
            *self = TickStepper::new(self.plan.clone(), &self.policy);
        } else {
            deliver_next(&mut self.world, &mut self.backend);
        }
        elapsed
    }
}

/// Hands the tick's jobs to the simulated queues.
fn submit_jobs(world: &mut World, backend: &mut SimBackend) {
    for job in std::mem::take(&mut world.resource_mut::<Outbox>().0) {
        backend
            .submit(job)
            .expect("the simulated queue accepts jobs");
    }
}

/// Moves the clock to the next completions and delivers them to the inbox.
fn deliver_next(world: &mut World, backend: &mut SimBackend) {
    let (now, completions) = backend.wait().expect("simulated queues never fail");
    world.resource_mut::<Clock>().now_ns = now;
    world.resource_mut::<Inbox>().0.extend(completions);
}

fn one_tick(c: &mut Criterion) {
    let mut group = c.benchmark_group("tick");
    for prompt_len in PROMPTS {
        for policy in ["stall", "balance"] {
            let mut stepper = TickStepper::new(plan(prompt_len), policy);
            group.bench_with_input(BenchmarkId::new(policy, prompt_len), &prompt_len, |b, _| {
                b.iter_custom(|iters| (0..iters).map(|_| stepper.tick()).sum())
            });
        }
    }
    group.finish();
}

fn simulated_prefill(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim/prefill");
    group.sample_size(10);
    for prompt_len in PROMPTS {
        for policy in ["stall", "inorder", "lookahead", "balance"] {
            let plan = plan(prompt_len);
            group.throughput(Throughput::Elements(u64::from(prompt_len)));
            group.bench_with_input(BenchmarkId::new(policy, prompt_len), &plan, |b, plan| {
                b.iter(|| {
                    black_box(simulate(plan.clone(), builtin(policy)).expect("simulation runs"))
                })
            });
        }
    }
    group.finish();
}

/// `live` requests' 1K-token prefills in one world, every one live all the time (a
/// request whose prefill ends is armed again at once), one in four interactive and the
/// rest background, ordered across by `request_policy`, `balance` within each.
struct RequestsStepper {
    plan: Arc<PrefillPlan>,
    live: usize,
    request_policy: String,
    world: World,
    schedule: Schedule,
    backend: SimBackend,
}

impl RequestsStepper {
    fn new(plan: Arc<PrefillPlan>, live: usize, request_policy: &str) -> Self {
        let mut world = spawn_request_world(&plan.device);
        let policy = create_request_policy(request_policy).expect("a request policy");
        world.insert_resource(ActiveRequestPolicy(policy));
        for i in 0..live {
            let priority = match i % 4 {
                0 => Priority::INTERACTIVE,
                _ => Priority::BACKGROUND,
            };
            let request = Request::new(RequestId(i as u64), priority, SloTargets::default(), 0);
            let entity = spawn_request_entity(&mut world, request);
            arm(&mut world, entity, &plan);
        }
        Self {
            plan,
            live,
            request_policy: request_policy.to_string(),
            world,
            schedule: scheduler_schedule(),
            backend: SimBackend::default(),
        }
    }

    /// Runs one tick (timed), then (untimed) hands its jobs to the simulated queues,
    /// arms every finished request again and delivers the next completions.
    fn tick(&mut self) -> Duration {
        let started = Instant::now();
        self.schedule.run(&mut self.world);
        let elapsed = started.elapsed();
        submit_jobs(&mut self.world, &mut self.backend);
        let finished = std::mem::take(&mut self.world.resource_mut::<LiveRuns>().finished);
        for &entity in &finished {
            disarm_request(&mut self.world, entity).expect("a finished run has no jobs");
            arm(&mut self.world, entity, &self.plan);
        }
        if self.backend.in_flight() > 0 {
            deliver_next(&mut self.world, &mut self.backend);
        } else if finished.is_empty() {
            *self = RequestsStepper::new(self.plan.clone(), self.live, &self.request_policy);
        }
        elapsed
    }
}

fn arm(world: &mut World, request: bevy_ecs::entity::Entity, plan: &Arc<PrefillPlan>) {
    arm_request(
        world,
        request,
        plan.clone(),
        builtin("balance"),
        RequestPhase::Prefill,
    )
    .expect("the request arms");
}

/// One scheduler tick with 1 and with 16 live requests, under each request policy.
fn requests_tick(c: &mut Criterion) {
    let mut group = c.benchmark_group("tick/requests");
    let plan = plan(1024);
    for request_policy in ["fcfs", "priority", "slack"] {
        for live in [1, 16] {
            let mut stepper = RequestsStepper::new(plan.clone(), live, request_policy);
            group.bench_with_input(BenchmarkId::new(request_policy, live), &live, |b, _| {
                b.iter_custom(|iters| (0..iters).map(|_| stepper.tick()).sum())
            });
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    policy_decision,
    one_tick,
    requests_tick,
    simulated_prefill
);
criterion_main!(benches);
