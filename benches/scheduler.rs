//! Scheduler speed on the default scene (Qwen1.5-1.8B on a Snapdragon 8 Gen 3, chunk 256):
//! one policy decision over a full ready queue, one scheduler tick, and a whole simulated
//! prefill, at 1K, 4K and 32K-token prompts. The median tick time of a run is in `simulate --json`
//! (`scheduler_us_per_tick`).

use std::collections::BTreeSet;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy_ecs::prelude::World;
use bevy_ecs::schedule::Schedule;
use hetsched::backends::Backend;
use hetsched::backends::sim::SimBackend;
use hetsched::systems::resources::{Clock, Inbox, Outbox};
use hetsched::systems::{scheduler_schedule, spawn_world};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched::engine::simulate;
use hetsched::scene::Scene;
use hetsched::systems::policy::{BalanceView, LaneTimes, pick_balance, pick_lookahead, pick_stall};
use hetsched::systems::{InstanceKey, Policy, PrefillPlan, ProcessorKind, StageProgress};

const PROMPTS: [u32; 3] = [1024, 4096, 32768];

fn plan(prompt_len: u32, policy: Policy) -> Arc<PrefillPlan> {
    let mut scene = Scene::default_scene();
    scene.workload.prompt_len = prompt_len;
    scene.workload.policy = policy;
    Arc::new(scene.plan().expect("default scene"))
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

fn policy_decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy/decision");
    for prompt_len in PROMPTS {
        let plan = plan(prompt_len, Policy::Stall);
        let (progress, ready) = halfway(&plan);
        group.bench_with_input(
            BenchmarkId::new("stall", prompt_len),
            &prompt_len,
            |b, _| b.iter(|| black_box(pick_stall(&plan, &progress, &ready, ProcessorKind::Npu))),
        );
        let npu = (1, ProcessorKind::Npu);
        let times = LaneTimes {
            now_ns: 0,
            free_at_ns: vec![0; plan.lanes()],
        };
        group.bench_with_input(
            BenchmarkId::new("lookahead", prompt_len),
            &prompt_len,
            |b, _| {
                b.iter(|| black_box(pick_lookahead(&plan, &progress, &ready, npu, &times, true)))
            },
        );
        // The NPU's whole ready queue is its own backlog; the float side is idle.
        let backlog: u64 = ready
            .iter()
            .map(|&id| plan.cost_ns(plan.key(id as usize)))
            .sum();
        let view = BalanceView {
            times: &times,
            remaining_ns: &plan.work_per_processor(),
            ready_ns: &[0, backlog],
            others_idle: true,
            float_threatens_tail: false,
        };
        group.bench_with_input(
            BenchmarkId::new("balance", prompt_len),
            &prompt_len,
            |b, _| b.iter(|| black_box(pick_balance(&plan, &progress, &ready, npu, view))),
        );
    }
    group.finish();
}

/// A simulated prefill stepped one tick at a time, so a bench can time single ticks.
struct TickStepper {
    plan: Arc<PrefillPlan>,
    world: World,
    schedule: Schedule,
    backend: SimBackend,
}

impl TickStepper {
    fn new(plan: Arc<PrefillPlan>) -> Self {
        Self {
            world: spawn_world(plan.clone()),
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
        for job in std::mem::take(&mut self.world.resource_mut::<Outbox>().0) {
            self.backend
                .submit(job)
                .expect("the simulated queue accepts jobs");
        }
        let done = self.world.resource::<StageProgress>().done_count();
        if done == self.plan.instance_count() || self.backend.in_flight() == 0 {
            *self = TickStepper::new(self.plan.clone());
        } else {
            let (now, completions) = self.backend.wait().expect("simulated queues never fail");
            self.world.resource_mut::<Clock>().now_ns = now;
            self.world.resource_mut::<Inbox>().0.extend(completions);
        }
        elapsed
    }
}

fn one_tick(c: &mut Criterion) {
    let mut group = c.benchmark_group("tick");
    for prompt_len in PROMPTS {
        for policy in [Policy::Stall, Policy::Balance] {
            let mut stepper = TickStepper::new(plan(prompt_len, policy));
            group.bench_with_input(
                BenchmarkId::new(policy.name(), prompt_len),
                &prompt_len,
                |b, _| b.iter_custom(|iters| (0..iters).map(|_| stepper.tick()).sum()),
            );
        }
    }
    group.finish();
}

fn simulated_prefill(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim/prefill");
    group.sample_size(10);
    for prompt_len in PROMPTS {
        for policy in [
            Policy::Stall,
            Policy::InOrder,
            Policy::Lookahead,
            Policy::Balance,
        ] {
            let plan = plan(prompt_len, policy);
            group.throughput(Throughput::Elements(u64::from(prompt_len)));
            group.bench_with_input(
                BenchmarkId::new(policy.name(), prompt_len),
                &plan,
                |b, plan| b.iter(|| black_box(simulate(plan.clone()).expect("simulation runs"))),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, policy_decision, one_tick, simulated_prefill);
criterion_main!(benches);
