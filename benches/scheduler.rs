//! Scheduler speed: a whole simulated prefill of the default scene (Qwen1.5-1.8B on a
//! Snapdragon 8 Gen 3, chunk 256) per policy and prompt length. Throughput is in prompt
//! tokens, so the report reads as simulated tokens per second of wall time.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched::engine::simulate;
use hetsched::scene::Scene;
use hetsched::systems::Policy;

fn simulated_prefill(c: &mut Criterion) {
    let scene = Scene::default_scene();
    let mut group = c.benchmark_group("sim/prefill");
    group.sample_size(20);
    for prompt_len in [1024u32, 4096] {
        for policy in Policy::ALL {
            let mut plan = scene.plan().expect("default scene");
            plan.workload.prompt_len = prompt_len;
            plan.workload.policy = policy;
            let plan = Arc::new(
                hetsched::systems::PrefillPlan::new(plan.model, plan.device, plan.workload)
                    .unwrap(),
            );
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

criterion_group!(benches, simulated_prefill);
criterion_main!(benches);
