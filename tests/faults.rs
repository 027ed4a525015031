//! Fault injection through the public `Backend` trait: a queue that breaks the contract
//! (reports a job twice, on the wrong lane, never, or panics) ends the run with a typed
//! `EngineError`, quickly, never with a panic inside the scheduler systems or a hang.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hetsched::backends::{Backend, BackendError, sim::SimBackend};
use hetsched::engine::{self, BackendFault, Deadline, EngineError, EngineOptions};
use hetsched::exec::{JobRunner, ThreadQueues};
use hetsched::systems::resources::{Completion, Job};
use hetsched::systems::testing::tiny_plan;
use hetsched::systems::{Policy, PolicyRegistry, PrefillPlan};

/// The policy every test here schedules with.
fn stall() -> Box<dyn Policy> {
    PolicyRegistry::builtin().create("stall").unwrap()
}

/// What the scripted queue does wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Reports the first completion of the run twice.
    Double,
    /// Adds a completion for an id outside the plan.
    UnknownId,
    /// Reports the first completion on another (existing) lane.
    WrongLane,
    /// Reports the first completion on a lane the device lacks.
    LaneOutOfRange,
    /// Adds a completion for an instance of the last chunk, never dispatched yet.
    Undispatched,
    /// Every wait returns nothing.
    EmptyWait,
    /// `submit` panics.
    PanicInSubmit,
    /// `wait` panics.
    PanicInWait,
    /// The first job is swallowed: never reported, waits return nothing.
    Lost,
    /// The first job takes forever; `wait_for` honours its timeout.
    Slow,
}

/// A simulated queue with one scripted fault.
struct Faulty {
    inner: SimBackend,
    fault: Fault,
    waits: usize,
    lost: Option<Job>,
    lanes: usize,
    last_id: u32,
    /// Whether [`Backend::abandon`] lets go of the lost job.
    lets_go: bool,
    /// The lost job, once let go: its late completion is reported at the next wait.
    late: Option<Job>,
}

impl Faulty {
    fn new(fault: Fault, plan: &PrefillPlan) -> Self {
        Self {
            inner: SimBackend::default(),
            fault,
            waits: 0,
            lost: None,
            lanes: plan.device.processors.len(),
            last_id: plan.id_space() as u32 - 1,
            lets_go: false,
            late: None,
        }
    }
}

impl Backend for Faulty {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        if self.fault == Fault::PanicInSubmit {
            panic!("submit exploded on job {}", job.id);
        }
        if matches!(self.fault, Fault::Lost | Fault::Slow) && self.lost.is_none() {
            self.lost = Some(job);
            return Ok(());
        }
        self.inner.submit(job)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + usize::from(self.lost.is_some())
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        self.waits += 1;
        match self.fault {
            Fault::PanicInWait => panic!("wait exploded"),
            Fault::EmptyWait => return Ok((0, Vec::new())),
            _ => {}
        }
        if self.inner.in_flight() == 0 && self.late.is_none() {
            // Only the lost job is left.
            return Ok((0, Vec::new()));
        }
        let (now, mut done) = self.inner.wait()?;
        if let Some(job) = self.late.take() {
            done.push(Completion {
                id: job.id,
                processor: job.processor,
                start_ns: 0,
                end_ns: now,
            });
        }
        if self.waits == 1 {
            let first = done[0];
            match self.fault {
                Fault::Double => done.push(first),
                Fault::UnknownId => done.push(Completion {
                    id: u32::MAX - 1,
                    ..first
                }),
                Fault::WrongLane => done[0].processor = (first.processor + 1) % self.lanes,
                Fault::LaneOutOfRange => done[0].processor = self.lanes + 7,
                Fault::Undispatched => done.push(Completion {
                    id: self.last_id,
                    ..first
                }),
                _ => {}
            }
        }
        Ok((now, done))
    }

    fn wait_for(&mut self, timeout: Duration) -> Result<(u64, Vec<Completion>), BackendError> {
        if self.fault == Fault::Slow && self.inner.in_flight() == 0 {
            std::thread::sleep(timeout);
            return Ok((0, Vec::new()));
        }
        self.wait()
    }

    fn abandon(&mut self, id: u32, processor: usize) -> bool {
        let lost = self.lost.filter(|j| (j.id, j.processor) == (id, processor));
        if self.lets_go && lost.is_some() {
            self.late = lost;
        }
        self.lets_go && lost.is_some()
    }
}

fn plan() -> Arc<PrefillPlan> {
    Arc::new(tiny_plan(2, 64, 16))
}

/// Runs `fault` and returns the error, asserting the run ended within `limit`.
fn run_faulty(fault: Fault, options: &EngineOptions, limit: Duration) -> EngineError {
    let plan = plan();
    let mut backend = Faulty::new(fault, &plan);
    let started = Instant::now();
    let err = engine::run_with(plan, stall(), &mut backend, options)
        .expect_err("a faulty backend must fail the run");
    assert!(
        started.elapsed() < limit,
        "{fault:?} took {:?}",
        started.elapsed()
    );
    err
}

fn fault(fault: Fault) -> BackendFault {
    match run_faulty(fault, &EngineOptions::default(), Duration::from_secs(2)) {
        EngineError::Fault(f) => f,
        other => panic!("{fault:?}: expected a BackendFault, got {other}"),
    }
}

#[test]
fn a_job_completed_twice_is_a_typed_error() {
    let f = fault(Fault::Double);
    assert!(matches!(f, BackendFault::CompletedTwice { .. }), "{f}");
    assert!(f.to_string().contains("second time"), "{f}");
}

#[test]
fn an_unknown_id_is_a_typed_error() {
    let f = fault(Fault::UnknownId);
    assert!(
        matches!(f, BackendFault::UnknownInstance { id, .. } if id == u32::MAX - 1),
        "{f}"
    );
}

#[test]
fn a_completion_on_the_wrong_lane_is_a_typed_error() {
    let f = fault(Fault::WrongLane);
    assert!(
        matches!(f, BackendFault::WrongLane { processor, dispatched, .. } if processor != dispatched),
        "{f}"
    );
}

#[test]
fn a_completion_on_an_out_of_range_lane_is_a_typed_error() {
    let f = fault(Fault::LaneOutOfRange);
    assert!(matches!(f, BackendFault::LaneOutOfRange { .. }), "{f}");
}

#[test]
fn a_completion_for_an_undispatched_instance_is_a_typed_error() {
    let f = fault(Fault::Undispatched);
    assert!(matches!(f, BackendFault::NotDispatched { .. }), "{f}");
    assert!(f.to_string().contains("never dispatched"), "{f}");
}

#[test]
fn waits_that_return_nothing_do_not_spin_forever() {
    let f = fault(Fault::EmptyWait);
    assert!(
        matches!(f, BackendFault::NoProgress { waits: 1024, .. }),
        "{f}"
    );
}

#[test]
fn a_panic_in_submit_is_a_typed_error() {
    let f = fault(Fault::PanicInSubmit);
    assert!(
        matches!(&f, BackendFault::Panicked { call: "submit", message } if message.contains("exploded")),
        "{f}"
    );
}

#[test]
fn a_panic_in_wait_is_a_typed_error() {
    let f = fault(Fault::PanicInWait);
    assert!(
        matches!(f, BackendFault::Panicked { call: "wait", .. }),
        "{f}"
    );
}

#[test]
fn a_lost_job_is_no_progress_not_a_hang() {
    let f = fault(Fault::Lost);
    assert!(matches!(f, BackendFault::NoProgress { .. }), "{f}");
}

fn short_deadline() -> EngineOptions {
    EngineOptions {
        deadline: Some(Deadline {
            factor: 0.0,
            floor: Duration::from_millis(150),
            retry: true,
        }),
        ..EngineOptions::default()
    }
}

#[test]
fn a_job_past_its_deadline_fails_the_run_naming_it_and_its_processor() {
    let err = run_faulty(Fault::Slow, &short_deadline(), Duration::from_secs(3));
    let EngineError::Fault(BackendFault::DeadlineExceeded {
        chunk,
        stage,
        limit_ms,
        elapsed_ms,
        ..
    }) = err
    else {
        panic!("expected DeadlineExceeded, got {err}");
    };
    assert_eq!((chunk, stage), (0, 0), "the first job was the slow one");
    assert_eq!(limit_ms, 150);
    assert!(elapsed_ms >= 150, "{elapsed_ms}");
}

#[test]
fn a_good_backend_passes_the_guard_unchanged() {
    let plan = plan();
    let plain = engine::simulate(plan.clone(), stall()).unwrap();
    let guarded =
        engine::run_with(plan, stall(), &mut SimBackend::default(), &short_deadline()).unwrap();
    assert_eq!(plain.makespan_ns, guarded.makespan_ns);
    assert_eq!(plain.timeline.slices, guarded.timeline.slices);
}

/// A runner whose chosen job blocks until released (a hung kernel).
struct Hangs {
    victim: u32,
    release: Arc<AtomicBool>,
}

impl JobRunner for Hangs {
    fn run(&self, job: &Job) -> Result<(), hetsched::exec::JobError> {
        while job.id == self.victim && !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

/// Runs the tiny plan on thread queues whose first job hangs until `release`; asserts the
/// run fails by deadline and returns the queues (not dropped yet).
fn hung_first_job(release: &Arc<AtomicBool>) -> ThreadQueues {
    let plan = plan();
    let runner = Arc::new(Hangs {
        victim: 0,
        release: release.clone(),
    });
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap(),
    );
    let mut queues = ThreadQueues::start(plan.device.processors.len(), runner, pool).unwrap();
    let err = engine::run_with(plan, stall(), &mut queues, &short_deadline()).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Fault(BackendFault::DeadlineExceeded { .. })
        ),
        "{err}"
    );
    queues
}

#[test]
fn a_hung_job_on_thread_queues_fails_by_deadline_and_the_queues_drop() {
    let release = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let queues = hung_first_job(&release);
    // Released jobs finish and every lane thread is joined.
    release.store(true, Ordering::SeqCst);
    drop(queues);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// The tiny plan on a device with two CPUs, float stages placed on either; attention on
/// both too when `attention_anywhere`, else only on the first CPU.
fn two_cpu_plan(attention_anywhere: bool) -> Arc<PrefillPlan> {
    use hetsched::systems::testing::{processor, tiny_device, tiny_model};
    use hetsched::systems::{PlacementConfig, ProcessorKind, Workload};
    let mut device = tiny_device();
    device
        .processors
        .push(processor("cpu2", ProcessorKind::Cpu, 50.0, 20.0, 5.0));
    let both = vec!["cpu".to_string(), "cpu2".to_string()];
    let placement = PlacementConfig {
        float: Some(both.clone()),
        attention: Some(if attention_anywhere {
            both
        } else {
            vec!["cpu".into()]
        }),
        ..PlacementConfig::default()
    };
    let workload = Workload {
        prompt_len: 64,
        chunk_len: 16,
        float_processor: None,
    };
    Arc::new(PrefillPlan::placed(tiny_model(2), device, workload, placement).unwrap())
}

/// Runs `plan` on a queue that swallows its first job and lets go of it when asked (if
/// `lets_go`), scheduled by `policy`.
fn run_swallowing_first(
    plan: Arc<PrefillPlan>,
    policy: &str,
    lets_go: bool,
) -> Result<engine::RunOutcome, EngineError> {
    let mut backend = Faulty::new(Fault::Slow, &plan);
    backend.lets_go = lets_go;
    let policy = PolicyRegistry::builtin().create(policy).unwrap();
    engine::run_with(plan, policy, &mut backend, &short_deadline())
}

#[test]
fn a_job_past_its_deadline_is_retried_on_another_eligible_processor() {
    let plan = two_cpu_plan(true);
    let out = run_swallowing_first(plan.clone(), "stall", true).expect("retried, not failed");
    assert_eq!(out.stats.retried, 1);
    let slices = &out.timeline.slices;
    assert_eq!(slices.len(), plan.instance_count(), "every instance once");
    let first = slices.iter().find(|s| s.id == 0).expect("the slow job ran");
    assert_eq!(first.processor, 2, "retried on the other CPU");
    assert!(
        slices.iter().all(|s| s.processor != 0),
        "nothing runs on the processor given up"
    );
    hetsched::systems::testing::check_schedule(
        &plan,
        slices,
        hetsched::systems::testing::Timing::Modeled,
        false,
    )
    .unwrap();
}

#[test]
fn a_retry_fails_when_only_the_lost_processor_can_run_what_is_left() {
    let err = run_swallowing_first(two_cpu_plan(false), "stall", true).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Fault(BackendFault::LaneLost { processor: 0, .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("only it may run"), "{err}");
}

#[test]
fn no_retry_under_fixed_placement_or_a_backend_that_keeps_the_job() {
    for (policy, lets_go) in [("inorder", true), ("stall", false)] {
        let err = run_swallowing_first(two_cpu_plan(true), policy, lets_go).unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::Fault(BackendFault::DeadlineExceeded {
                    chunk: 0,
                    stage: 0,
                    processor: 0,
                    ..
                })
            ),
            "{policy}, lets go {lets_go}: {err}"
        );
    }
}

#[test]
fn a_hung_lane_is_detached_when_the_queues_drop() {
    let release = Arc::new(AtomicBool::new(false));
    let queues = hung_first_job(&release);
    // The job is still hung: dropping must not wait for it beyond the grace period (5 s).
    let dropped = Instant::now();
    drop(queues);
    assert!(
        dropped.elapsed() < Duration::from_secs(8),
        "{:?}",
        dropped.elapsed()
    );
    release.store(true, Ordering::SeqCst);
}

/// A simulated queue whose `after`-th wait sets `cancel`, as a Ctrl-C mid-run does.
struct Cancelling {
    inner: SimBackend,
    cancel: hetsched::cancel::CancelFlag,
    waits: usize,
    after: usize,
}

impl Backend for Cancelling {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        self.inner.submit(job)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        self.waits += 1;
        if self.waits == self.after {
            self.cancel.cancel();
        }
        self.inner.wait()
    }
}

#[test]
fn a_cancelled_run_stops_at_a_subgraph_boundary_with_its_finished_slices() {
    use hetsched::systems::resources::TimelineLog;
    for after in [1, 3, 10] {
        let plan = Arc::new(tiny_plan(4, 64, 16));
        let cancel = hetsched::cancel::CancelFlag::new();
        let mut backend = Cancelling {
            inner: SimBackend::default(),
            cancel: cancel.clone(),
            waits: 0,
            after,
        };
        let options = EngineOptions {
            cancel: Some(cancel),
            ..EngineOptions::default()
        };
        let policy = PolicyRegistry::builtin().create("heft").unwrap();
        let mut world = hetsched::systems::spawn_world(plan.clone(), policy);
        let mut schedule = hetsched::systems::scheduler_schedule();
        let error = engine::run_world(&mut world, &mut schedule, &plan, &mut backend, &options)
            .unwrap_err();
        let EngineError::Cancelled { done, total } = error else {
            panic!("expected a cancellation, got {error}");
        };
        assert_eq!(total, plan.instance_count());
        assert!(
            done > 0 && done < total,
            "cancelled after {after} waits: {done} of {total}"
        );
        assert_eq!(backend.in_flight(), 0, "jobs in flight were waited for");
        let slices = world.resource::<TimelineLog>().slices.len();
        assert_eq!(slices, done, "every finished subgraph is in the timeline");
    }
}
