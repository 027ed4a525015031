//! The scheduling cost of one decode step, without its kernels: SmolLM2-135M's one-token
//! plan on the desktop scene's CPU lane (as `hetsched generate --decode scheduled` plans
//! it), re-armed and run to completion in one long-lived [`RequestWorld`], one instance
//! per layer and five layers an instance. What is timed is what `decode_overhead` counts
//! as overhead inside the engine run: re-arming the step's instances, every tick of the
//! schedule, the backend guard and the finished run's outcome.
//!
//! Two queues: `warm`, whose jobs take no time (every job completes when it is
//! submitted), and `cold`, whose jobs each stream a buffer larger than the last-level
//! cache as a real stage streams its weights (a W8A8 layer of SmolLM2 reads 3.5 MB, the
//! f32 head 113 MB), so that the scheduler's next tick finds its data evicted, as it does
//! in a real step. The job's own time is measured around it and left out (as
//! `InlineQueue` leaves a stage's time out of `decode_overhead`): `cold` reports the
//! scheduler's time alone, with cold caches.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use hetsched::backends::{Backend, BackendError};
use hetsched::engine::EngineOptions;
use hetsched::scene::Scene;
use hetsched::systems::resources::{Completion, Job};
use hetsched::systems::{PlacementConfig, PolicyRegistry, PrefillPlan, ProcessorKind};
use hetsched_runtime::request_world::RequestWorld;

/// Bytes a `cold` job streams: more than this machine's last-level cache.
const EVICT_BYTES: usize = 64 << 20;

/// A queue whose jobs complete when they are submitted; with `evict`, each job first
/// streams the buffer (its time kept apart in `busy`).
#[derive(Default)]
struct Immediate {
    done: Vec<Completion>,
    evict: Vec<u8>,
    busy: Duration,
}

impl Immediate {
    fn cold() -> Self {
        Self {
            evict: (0..EVICT_BYTES).map(|i| i as u8).collect(),
            ..Self::default()
        }
    }
}

impl Backend for Immediate {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        let started = Instant::now();
        if !self.evict.is_empty() {
            let sum = self.evict.iter().step_by(64).fold(0u8, |s, &b| s ^ b);
            black_box(sum);
        }
        self.busy += started.elapsed();
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
        for (caches, mut queue) in [("warm", Immediate::default()), ("cold", Immediate::cold())] {
            let name = format!("{caches}/{}_instances", plan.instance_count());
            let mut world = RequestWorld::new(0);
            let options = EngineOptions::default();
            group.bench_function(name, |b| {
                b.iter_custom(|steps| {
                    queue.busy = Duration::ZERO;
                    let started = Instant::now();
                    for _ in 0..steps {
                        let policy = registry.create("balance").expect("a built-in policy");
                        let run = world.run(plan.clone(), policy, true, &mut queue, &options);
                        black_box(run.expect("a decode step runs"));
                    }
                    started.elapsed().saturating_sub(queue.busy)
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, decode_step);
criterion_main!(benches);
