//! A run's lower bound from its own measured durations (busiest lane, critical path
//! through the measured instance times): no run, simulated or real, ends before it, and
//! the real queues' slices hold compute time only (queue waits are recorded apart).

use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use hetsched::engine;
use hetsched::exec::{JobError, JobRunner, ThreadQueues, wait_per_lane};
use hetsched::report::RunReport;
use hetsched::systems::resources::Job;
use hetsched::systems::testing::tiny_plan;
use hetsched::systems::{PolicyRegistry, measured_lower_bound};

/// Spins for a per-job time drawn from `micros` (by id), on the calling pool worker.
struct Spins {
    micros: Vec<u64>,
}

impl JobRunner for Spins {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        let us = self.micros[job.id as usize % self.micros.len()];
        let until = Instant::now() + Duration::from_micros(us);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

fn policy(index: usize) -> Box<dyn hetsched::systems::Policy> {
    let registry = PolicyRegistry::builtin();
    let names: Vec<String> = registry.names().map(str::to_string).collect();
    registry.create(&names[index % names.len()]).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Simulated runs: the measured bound never exceeds the makespan.
    #[test]
    fn no_simulated_run_ends_before_its_measured_bound(
        layers in 1u32..4, chunks in 1u32..6, chunk_len in prop::sample::select(vec![16u32, 32, 64]),
        which in 0usize..8,
    ) {
        let plan = Arc::new(tiny_plan(layers, chunks * chunk_len, chunk_len));
        let run = engine::simulate(plan.clone(), policy(which)).unwrap();
        let bound = measured_lower_bound(&plan, &run.timeline.slices);
        prop_assert!(bound.ns() <= run.makespan_ns, "{bound:?} > {}", run.makespan_ns);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    /// Real queues over one pool worker: two lanes can never compute at once, so the
    /// slices (compute time only, waits apart) add up to at most the makespan, and the
    /// makespan is never below the measured bound.
    #[test]
    fn no_real_run_ends_before_its_measured_bound(
        micros in prop::collection::vec(20u64..300, 1..16), which in 0usize..8,
    ) {
        let plan = Arc::new(tiny_plan(2, 64, 16));
        let runner = Arc::new(Spins { micros });
        let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap());
        let mut queues = ThreadQueues::start(plan.lanes(), runner, pool).unwrap();
        let run = engine::run(plan.clone(), policy(which), &mut queues).unwrap();
        let waits = queues.take_queue_waits();
        prop_assert_eq!(waits.len(), plan.instance_count());
        let busy: u64 = run.timeline.slices.iter().map(|s| s.end_ns - s.start_ns).sum();
        prop_assert!(busy <= run.makespan_ns, "busy {busy} > makespan {}", run.makespan_ns);
        let report = RunReport::measured("spins", &run, &wait_per_lane(&waits, plan.lanes()));
        prop_assert!(report.lower_bound_ms <= report.makespan_ms);
        prop_assert!(report.model_lower_bound.is_some());
        prop_assert!(report.processors.iter().all(|p| p.queue_wait_ms.is_some()));
    }
}
