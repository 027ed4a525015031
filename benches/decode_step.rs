//! The scheduling cost of one decode step, without its kernels: SmolLM2-135M's one-token
//! plan on the desktop scene's CPU lane (as `hetsched generate --decode scheduled` plans
//! it), re-armed and run to completion in one long-lived [`RequestWorld`] against a queue
//! that completes every job the moment it is submitted. What this times is what
//! `decode_overhead` counts as overhead inside the engine run: re-arming the step's
//! instances, every tick of the schedule, the backend guard and the finished run's
//! outcome.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use hetsched::backends::{Backend, BackendError};
use hetsched::engine::EngineOptions;
use hetsched::scene::Scene;
use hetsched::systems::resources::{Completion, Job};
use hetsched::systems::{PlacementConfig, PolicyRegistry, PrefillPlan, ProcessorKind};
use hetsched_runtime::request_world::RequestWorld;

/// A queue whose jobs take no time: each completes when it is submitted.
#[derive(Default)]
struct Instant0 {
    done: Vec<Completion>,
}

impl Backend for Instant0 {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        self.done.push(Completion {
            id: job.id,
            processor: job.processor,
            start_ns: 0,
            end_ns: 0,
        });
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        Ok((0, std::mem::take(&mut self.done)))
    }
}

/// SmolLM2-135M's decode step on the desktop scene's CPU lane (the decode device of a
/// session: the CPU processors only), `layers` decoder layers an instance.
fn decode_plan(layers: u32) -> Arc<PrefillPlan> {
    let scene = Scene::load("smollm2-135m-desktop".as_ref()).expect("a shipped scene");
    let mut device = scene.device.clone();
    device.processors.retain(|p| p.kind == ProcessorKind::Cpu);
    let placement = PlacementConfig::default();
    let plan = PrefillPlan::decode_step(scene.model.clone(), device, placement, layers);
    Arc::new(plan.expect("a decode plan"))
}

fn decode_step(c: &mut Criterion) {
    let registry = PolicyRegistry::builtin();
    let mut group = c.benchmark_group("decode_step");
    for layers in [1, 5] {
        let plan = decode_plan(layers);
        let name = format!("schedule/{}_instances", plan.instance_count());
        group.bench_function(name, |b| {
            let mut world = RequestWorld::new(0);
            let mut queue = Instant0::default();
            let options = EngineOptions::default();
            b.iter(|| {
                let policy = registry.create("balance").expect("a built-in policy");
                let run = world.run(plan.clone(), policy, true, &mut queue, &options);
                black_box(run.expect("a decode step runs"))
            });
        });
    }
    group.finish();
}

criterion_group!(benches, decode_step);
criterion_main!(benches);
