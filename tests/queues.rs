//! The thread queues behind real execution: every job runs once, a lane runs one job at
//! a time, and a job that fails or panics ends the run with a clear error, not a hang.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hetsched::engine::{self, EngineError};
use hetsched::exec::{JobError, JobRunner, ThreadQueues};
use hetsched::systems::PolicyRegistry;
use hetsched::systems::resources::Job;
use hetsched::systems::testing::{Timing, check_schedule, tiny_plan};

/// Busy-waits a little per job so jobs on different lanes overlap.
struct Counting {
    runs: Vec<AtomicUsize>,
    fail: Option<u32>,
    panic: Option<u32>,
}

impl Counting {
    fn new(ids: usize, fail: Option<u32>, panic: Option<u32>) -> Self {
        Self {
            runs: (0..ids).map(|_| AtomicUsize::new(0)).collect(),
            fail,
            panic,
        }
    }
}

impl JobRunner for Counting {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        self.runs[job.id as usize].fetch_add(1, Ordering::SeqCst);
        if self.panic == Some(job.id) {
            panic!("kernel invariant broken in job {}", job.id);
        }
        if self.fail == Some(job.id) {
            return Err("device lost".into());
        }
        let until = std::time::Instant::now() + std::time::Duration::from_micros(200);
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

fn stall() -> Box<dyn hetsched::systems::Policy> {
    PolicyRegistry::builtin().create("stall").unwrap()
}

fn pool() -> Arc<rayon::ThreadPool> {
    Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap(),
    )
}

#[test]
fn every_job_runs_once_and_lanes_never_overlap() {
    let plan = Arc::new(tiny_plan(3, 64, 16));
    let runner = Arc::new(Counting::new(plan.id_space(), None, None));
    let lanes = plan.device.processors.len();
    let mut queues = ThreadQueues::start(lanes, runner.clone(), pool()).unwrap();
    let run = engine::run(plan.clone(), stall(), &mut queues).unwrap();
    for key in plan.instances() {
        let id = plan.id(key);
        assert_eq!(runner.runs[id].load(Ordering::SeqCst), 1, "{key:?}");
    }
    check_schedule(&plan, &run.timeline.slices, Timing::Measured, false).unwrap();
}

#[test]
fn a_failed_job_stops_the_run_with_its_reason() {
    let plan = Arc::new(tiny_plan(2, 64, 16));
    let victim = plan.id(plan.instances().nth(5).unwrap()) as u32;
    let runner = Arc::new(Counting::new(plan.id_space(), Some(victim), None));
    let mut queues = ThreadQueues::start(plan.device.processors.len(), runner, pool()).unwrap();
    let err = engine::run(plan, stall(), &mut queues).unwrap_err();
    assert!(
        matches!(&err, EngineError::Backend(e) if e.job == victim),
        "{err}"
    );
    assert!(err.to_string().contains("device lost"), "{err}");
}

#[test]
fn a_panicking_job_is_reported_not_propagated() {
    let plan = Arc::new(tiny_plan(2, 64, 16));
    let victim = plan.id(plan.instances().nth(3).unwrap()) as u32;
    let runner = Arc::new(Counting::new(plan.id_space(), None, Some(victim)));
    let mut queues = ThreadQueues::start(plan.device.processors.len(), runner, pool()).unwrap();
    let err = engine::run(plan, stall(), &mut queues).unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
    assert!(err.to_string().contains("kernel invariant broken"), "{err}");
}

/// Job 0 holds a lock for 80 ms; job 1, on the other lane, works 10 ms and then waits for
/// it. Taken through `lock_wait`, job 1's wait leaves its slice (which holds its 10 ms of
/// work) for its queue wait.
struct Contending(parking_lot::Mutex<()>);

impl JobRunner for Contending {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        let ms = std::time::Duration::from_millis;
        if job.id == 0 {
            let _held = hetsched::exec::lock_wait::lock(&self.0);
            std::thread::sleep(ms(80));
        } else {
            std::thread::sleep(ms(10));
            drop(hetsched::exec::lock_wait::lock(&self.0));
        }
        Ok(())
    }
}

#[test]
fn a_wait_for_another_jobs_lock_is_queue_wait_not_compute() {
    use hetsched::backends::Backend;
    let runner = Arc::new(Contending(parking_lot::Mutex::new(())));
    let mut queues = ThreadQueues::start(2, runner, pool()).unwrap();
    for id in 0..2u32 {
        let job = Job {
            id,
            request: Default::default(),
            key: hetsched::systems::InstanceKey {
                chunk: 0,
                stage: id,
            },
            processor: id as usize,
            estimated_ns: 1,
            dispatched_ns: 0,
        };
        queues.submit(job).unwrap();
    }
    let mut done = Vec::new();
    while done.len() < 2 {
        done.extend(queues.wait().unwrap().1);
    }
    let second = done.iter().find(|c| c.id == 1).unwrap();
    let slice_ms = (second.end_ns - second.start_ns) as f64 / 1e6;
    assert!(
        slice_ms < 45.0,
        "job 1's slice {slice_ms} ms holds its lock wait"
    );
    let wait = queues.queue_waits().iter().find(|w| w.id == 1).unwrap();
    assert!(wait.wait_ns() >= 40_000_000, "{wait:?}");
}
