//! Embedding the scheduler with a queue of your own.
//!
//! An embedder implements [`Backend`] for its processors (a QNN queue on a phone, say):
//! `submit` starts a job on the processor the scheduler chose, `wait` reports what
//! finished. The scheduler systems, the policies and the timeline stay untouched.
//!
//! This queue runs each processor on its own thread and "executes" a job by sleeping a
//! thousandth of its modeled duration, then the run prints what each processor did.
//!
//! Run it: `cargo run --release --example custom_queue`

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hetsched::backends::{Backend, BackendError};
use hetsched::engine;
use hetsched::scene::Scene;
use hetsched::systems::resources::{Completion, Job};

/// One thread per processor; jobs in over a channel, completions out over another.
struct SleepQueue {
    lanes: Vec<Sender<Job>>,
    done: Receiver<Completion>,
    workers: Vec<JoinHandle<()>>,
    in_flight: usize,
    started: Instant,
}

impl SleepQueue {
    fn new(processors: usize) -> Self {
        let (done_tx, done) = channel();
        let started = Instant::now();
        let (lanes, workers) = (0..processors)
            .map(|_| {
                let (tx, rx) = channel::<Job>();
                let done_tx = done_tx.clone();
                let worker = std::thread::spawn(move || {
                    for job in rx {
                        let start_ns = started.elapsed().as_nanos() as u64;
                        std::thread::sleep(Duration::from_nanos(job.estimated_ns / 1000));
                        let end_ns = started.elapsed().as_nanos() as u64;
                        let report = Completion {
                            id: job.id,
                            processor: job.processor,
                            start_ns,
                            end_ns,
                        };
                        if done_tx.send(report).is_err() {
                            return;
                        }
                    }
                });
                (tx, worker)
            })
            .unzip();
        Self {
            lanes,
            done,
            workers,
            in_flight: 0,
            started,
        }
    }
}

impl Backend for SleepQueue {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        let failed = |reason: &str| BackendError {
            processor: job.processor,
            job: job.id,
            reason: reason.to_string(),
        };
        let lane = self
            .lanes
            .get(job.processor)
            .ok_or_else(|| failed("no such processor"))?;
        lane.send(job).map_err(|_| failed("the worker stopped"))?;
        self.in_flight += 1;
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        let first = self.done.recv().map_err(|_| BackendError {
            processor: 0,
            job: 0,
            reason: "every worker stopped".into(),
        })?;
        let done: Vec<Completion> = std::iter::once(first).chain(self.done.try_iter()).collect();
        self.in_flight -= done.len();
        Ok((self.started.elapsed().as_nanos() as u64, done))
    }
}

impl Drop for SleepQueue {
    fn drop(&mut self) {
        self.lanes.clear();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let scene = Scene::load(Path::new("qwen1.5-1.8b-xiaomi14"))?;
    let plan = Arc::new(scene.plan()?);
    let mut queue = SleepQueue::new(plan.device.processors.len());
    let run = engine::run(plan.clone(), scene.new_policy()?, &mut queue)?;
    println!(
        "{}: {} subgraphs in {:.1} ms of wall time (jobs sleep 1/1000 of their modeled time; \
         the modeled lower bound is {:.0} ms)",
        scene.name,
        run.timeline.slices.len(),
        run.makespan_ns as f64 / 1e6,
        plan.lower_bound().ns() as f64 / 1e6
    );
    for (lane, spec) in plan.device.processors.iter().enumerate() {
        let jobs = run
            .timeline
            .slices
            .iter()
            .filter(|s| s.processor == lane)
            .count();
        println!("  {:>6}: {jobs} jobs", spec.name);
    }
    Ok(())
}
