//! Scheduler speed on the default scene (Qwen1.5-1.8B on a Snapdragon 8 Gen 3, chunk 256):
//! one policy decision over a full ready queue, and a whole simulated prefill, at 1K, 4K
//! and 32K-token prompts. The median tick time of a run is in `simulate --json`
//! (`scheduler_us_per_tick`).

use std::collections::BTreeSet;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched::engine::simulate;
use hetsched::scene::Scene;
use hetsched::systems::policy::{pick_lookahead, pick_stall};
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
        group.bench_with_input(
            BenchmarkId::new("lookahead", prompt_len),
            &prompt_len,
            |b, _| {
                b.iter(|| {
                    black_box(pick_lookahead(
                        &plan,
                        &progress,
                        &ready,
                        ProcessorKind::Npu,
                        0,
                    ))
                })
            },
        );
    }
    group.finish();
}

fn simulated_prefill(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim/prefill");
    group.sample_size(10);
    for prompt_len in PROMPTS {
        for policy in [Policy::Stall, Policy::InOrder, Policy::Lookahead] {
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

criterion_group!(benches, policy_decision, simulated_prefill);
criterion_main!(benches);
