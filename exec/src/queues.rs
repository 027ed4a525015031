//! Real processor queues: one host thread per processor lane, fed over a crossbeam
//! channel, all computing on one shared pool of worker threads.
//!
//! On a desktop the lanes stand for the device's processors: the CPU lane runs float
//! subgraphs, the NPU lane emulates the Hexagon NPU's INT8 semantics on the host. The
//! pool is shared because the host's cores are: whichever lane has work gets every
//! idle core, and `--threads N` bounds the compute threads of the whole run.
//!
//! A job's reported start is when a pool worker began it, not when its lane handed it to
//! the pool: the time between submission and that start is the job's queue wait (a lane
//! waiting for a worker busy with another lane's job), recorded apart as a [`QueueWait`]
//! so that the timeline's slices hold compute time only. A job that waited for a lock
//! another job held (the executor's locks go through [`crate::lock_wait`]) has that wait
//! moved out of its slice too: the slice starts that much later.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use hetsched_systems::resources::{Completion, Job};

use thiserror::Error;

use super::error::ExecError;
use super::{linger, lock_wait, unnested};
use crate::StageRunner;
use hetsched_runtime::backends::{Backend, BackendError};
use hetsched_runtime::engine::{self, RunOutcome, panic_message};
use hetsched_systems::PrefillPlan;
use hetsched_systems::policy::Policy;

/// Why a job's work failed. The queue reports it as the job's [`BackendError`] reason.
#[derive(Debug, Error)]
pub enum JobError {
    /// The executor's stage failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// An embedder's runner failed, in its own words.
    #[error(transparent)]
    Runner(Box<dyn std::error::Error + Send + Sync>),
    /// The job panicked (a broken invariant); the process goes on.
    #[error("the job panicked: {0}")]
    Panicked(String),
}

impl From<&str> for JobError {
    fn from(reason: &str) -> Self {
        JobError::Runner(reason.into())
    }
}

impl From<String> for JobError {
    fn from(reason: String) -> Self {
        JobError::Runner(reason.into())
    }
}

/// Runs one job's work. Implemented by the real executor; an embedder may plug in its
/// own (a test double, or a bridge to a vendor runtime).
pub trait JobRunner: Send + Sync + 'static {
    /// Does the work of `job`, on the calling thread (which may fan out onto the
    /// current rayon pool). An `Err` fails the job with that reason.
    fn run(&self, job: &Job) -> Result<(), JobError>;

    /// Whether `run` computes on the shared rayon pool (so the lane hands each job to a
    /// pool thread). A runner that only queues device work says no and runs on the lane's
    /// own thread, saving two thread hand-offs per job.
    fn uses_pool(&self) -> bool {
        true
    }
}

/// How often a waiting engine checks that every lane thread is alive.
const LANE_CHECK: Duration = Duration::from_millis(100);

/// How long dropping the queues waits for running jobs before detaching their threads.
const JOIN_GRACE: Duration = Duration::from_secs(5);

enum Report {
    Done(Completion, QueueWait),
    Failed(BackendError),
}

/// How long one job waited between its submission and the start of its work (for a
/// pool worker, for its lane, or for a lock another job held: [`crate::lock_wait`]), kept
/// apart from its compute time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueWait {
    /// Instance id.
    pub id: u32,
    /// Processor lane.
    pub processor: usize,
    /// When the engine submitted the job, in ns since the queues started.
    pub submitted_ns: u64,
    /// When its work began (the completion's `start_ns`).
    pub start_ns: u64,
}

impl QueueWait {
    /// The wait, in ns.
    pub fn wait_ns(&self) -> u64 {
        self.start_ns.saturating_sub(self.submitted_ns)
    }
}

/// Total queue wait per lane of `waits`, over `lanes` lanes, in ns.
pub fn wait_per_lane(waits: &[QueueWait], lanes: usize) -> Vec<u64> {
    let mut total = vec![0u64; lanes];
    for w in waits {
        if let Some(t) = total.get_mut(w.processor) {
            *t += w.wait_ns();
        }
    }
    total
}

/// Thread-backed queues implementing [`Backend`].
pub struct ThreadQueues {
    lanes: Vec<Sender<(Job, u64)>>,
    reports: Receiver<Report>,
    handles: Vec<JoinHandle<()>>,
    in_flight: usize,
    started: Instant,
    waits: Vec<QueueWait>,
}

impl std::fmt::Debug for ThreadQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadQueues")
            .field("lanes", &self.lanes.len())
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl ThreadQueues {
    /// Starts `lanes` queue threads that run jobs with `runner` inside `pool`. Times are
    /// reported from now.
    pub fn start(
        lanes: usize,
        runner: Arc<dyn JobRunner>,
        pool: Arc<rayon::ThreadPool>,
    ) -> std::io::Result<Self> {
        // The jobs' fresh buffers come from memory kept since the last job, not from the
        // kernel (see the module).
        super::heap::retain_freed_memory();
        let (report_tx, reports) = unbounded();
        let started = Instant::now();
        let mut senders = Vec::with_capacity(lanes);
        let mut handles = Vec::with_capacity(lanes);
        for lane in 0..lanes {
            let (tx, rx) = unbounded::<(Job, u64)>();
            let (runner, pool, report_tx) = (runner.clone(), pool.clone(), report_tx.clone());
            let handle = std::thread::Builder::new()
                .name(format!("hetsched-lane-{lane}"))
                .spawn(move || serve(rx, &*runner, &pool, &report_tx, started))?;
            senders.push(tx);
            handles.push(handle);
        }
        Ok(Self {
            lanes: senders,
            reports,
            handles,
            in_flight: 0,
            started,
            waits: Vec::new(),
        })
    }

    fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// The queue wait of every job completed so far, in completion order.
    pub fn queue_waits(&self) -> &[QueueWait] {
        &self.waits
    }

    /// Takes the queue waits recorded so far.
    pub fn take_queue_waits(&mut self) -> Vec<QueueWait> {
        std::mem::take(&mut self.waits)
    }
}

fn serve(
    jobs: Receiver<(Job, u64)>,
    runner: &dyn JobRunner,
    pool: &rayon::ThreadPool,
    reports: &Sender<Report>,
    started: Instant,
) {
    let now_ns = || started.elapsed().as_nanos() as u64;
    for (job, submitted_ns) in jobs {
        // Start and end are taken where the work runs: on the pool worker, after any wait
        // for one (another lane's job may hold every worker).
        let dequeued_ns = now_ns();
        // A kernel that panics (a broken invariant) fails the job instead of the process.
        let run = || {
            let timed = || {
                lock_wait::take();
                let start = now_ns();
                let result = runner.run(&job);
                let end = now_ns();
                // Keep this worker polling for the next job or a helper's call.
                linger::after_job();
                // Time spent waiting for another job's lock is not this job's work: the
                // slice starts that much later, as if the job had waited first.
                let start = start.saturating_add(lock_wait::take()).min(end);
                // Reported from the worker: the engine hears of the completion (and can
                // send the next job) without waiting for this lane's thread to wake up,
                // one thread wake-up less on every hand-off between jobs.
                reports
                    .send(report(&job, submitted_ns, (start, end.max(start)), result))
                    .is_ok()
            };
            if runner.uses_pool() {
                unnested::install(pool, timed)
            } else {
                timed()
            }
        };
        // A job that panicked sent no report: it fails here, exactly once.
        let sent = catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|panic| {
            let error = Err(JobError::Panicked(panic_message(&*panic)));
            let span = (dequeued_ns, now_ns());
            reports
                .send(report(&job, submitted_ns, span, error))
                .is_ok()
        });
        if !sent {
            return;
        }
    }
}

/// The engine's report of `job`, run over `start_ns..end_ns` with `outcome`.
fn report(
    job: &Job,
    submitted_ns: u64,
    (start_ns, end_ns): (u64, u64),
    outcome: Result<(), JobError>,
) -> Report {
    match outcome {
        Ok(()) => Report::Done(
            Completion {
                id: job.id,
                processor: job.processor,
                start_ns,
                end_ns,
            },
            QueueWait {
                id: job.id,
                processor: job.processor,
                submitted_ns,
                start_ns,
            },
        ),
        Err(error) => Report::Failed(BackendError {
            processor: job.processor,
            job: job.id,
            reason: error.to_string(),
        }),
    }
}

impl Backend for ThreadQueues {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        let lane = self.lanes.get(job.processor).ok_or_else(|| BackendError {
            processor: job.processor,
            job: job.id,
            reason: format!(
                "no queue for processor {} ({} lanes)",
                job.processor,
                self.lanes.len()
            ),
        })?;
        let submitted_ns = self.now_ns();
        lane.send((job, submitted_ns)).map_err(|_| BackendError {
            processor: job.processor,
            job: job.id,
            reason: "the queue thread has stopped".into(),
        })?;
        self.in_flight += 1;
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        loop {
            let (now, done) = self.wait_for(LANE_CHECK)?;
            if !done.is_empty() {
                return Ok((now, done));
            }
        }
    }

    fn wait_for(&mut self, timeout: Duration) -> Result<(u64, Vec<Completion>), BackendError> {
        let until = Instant::now() + timeout;
        // Wait in slices so that a lane thread that died (a panic outside the job's
        // `catch_unwind`) is noticed instead of waited on forever.
        let first = loop {
            let slice = until
                .saturating_duration_since(Instant::now())
                .min(LANE_CHECK);
            match self.reports.recv_timeout(slice) {
                Ok(report) => break report,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(BackendError {
                        processor: 0,
                        job: 0,
                        reason: "every queue thread has stopped".into(),
                    });
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(lane) = self.handles.iter().position(|h| h.is_finished()) {
                        return Err(BackendError {
                            processor: lane,
                            job: 0,
                            reason: format!("the queue thread of lane {lane} stopped"),
                        });
                    }
                    if Instant::now() >= until {
                        return Ok((self.now_ns(), Vec::new()));
                    }
                }
            }
        };
        let mut done = Vec::new();
        for report in std::iter::once(first).chain(self.reports.try_iter()) {
            self.in_flight = self.in_flight.saturating_sub(1);
            match report {
                Report::Done(c, wait) => {
                    done.push(c);
                    self.waits.push(wait);
                }
                Report::Failed(e) => return Err(e),
            }
        }
        Ok((self.now_ns(), done))
    }
}

impl Drop for ThreadQueues {
    fn drop(&mut self) {
        // Closing the channels ends the lane threads once their current job is done.
        self.lanes.clear();
        // A lane still running a hung job (the engine gave up on it past its deadline)
        // cannot be joined: after a grace period it is detached, so that dropping the
        // queues never hangs. It holds only `Arc`s, so detaching it is safe.
        let until = Instant::now() + JOIN_GRACE;
        while Instant::now() < until && !self.handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(1));
        }
        for handle in self.handles.drain(..) {
            if handle.is_finished() {
                let _ = handle.join();
            }
        }
    }
}

impl JobRunner for StageRunner {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        Ok(StageRunner::run(self, job.key, job.processor)?)
    }
}

/// Runs `plan` on one thread-backed queue per processor, every job through `runner`, with
/// `threads` compute threads shared by the queues, scheduled by `policy`, stopped by
/// `options.cancel`; with each job's queue wait.
pub(crate) fn run_on_queues(
    plan: Arc<PrefillPlan>,
    policy: Box<dyn Policy>,
    runner: Arc<dyn JobRunner>,
    threads: usize,
    options: &crate::PrefillOptions,
) -> Result<(RunOutcome, Vec<QueueWait>), ExecError> {
    let threads = threads.max(1);
    let failed = |e: &dyn std::fmt::Display| ExecError::Threads {
        threads,
        reason: e.to_string(),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("hetsched-worker-{i}"))
        .build()
        .map_err(|e| failed(&e))?;
    let mut queues = ThreadQueues::start(plan.device.processors.len(), runner, Arc::new(pool))
        .map_err(|e| failed(&e))?;
    let outcome = engine::run_with(
        plan,
        policy,
        &mut queues,
        &engine::EngineOptions {
            cancel: options.cancel.clone(),
            ..engine::EngineOptions::real_queues()
        },
    )?;
    let waits = queues.take_queue_waits();
    drop(queues);
    Ok((outcome, waits))
}
