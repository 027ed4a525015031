//! Embedding the scheduler with a queue of your own.
//!
//! An embedder implements [`Backend`] for its processors (a QNN queue on a phone, say):
//! `submit` starts a job on the processor the scheduler chose, `wait` reports what
//! finished. The scheduler systems, the policies and the timeline stay untouched.
//!
//! This queue runs every job as real work on a shared worker pool (rayon): an f32 GEMM
//! from `hetsched-kernels` for a float processor, a W8A8 GEMM for an NPU, repeated in
//! proportion to the job's modeled time (one 64 x 256 x 256 product per modeled
//! millisecond, at least one). Completions come back over a crossbeam channel; `wait_for`
//! bounds the wait so that the engine's deadlines work. The run then prints what each
//! processor did, with measured against modeled time.
//!
//! Run it: `cargo run --release --example custom_queue`

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use hetsched::prelude::*;
use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{PackedI8Weights, matmul_f32, matmul_w8a8};

/// The GEMM every job repeats: `[M, K] x [K, N]`.
const M: usize = 64;
const K: usize = 256;
const N: usize = 256;

/// Weights and activations shared by every job (read-only).
struct Operands {
    x: Vec<f32>,
    w: Vec<f32>,
    w_i8: PackedI8Weights,
    w_scales: Vec<f32>,
}

impl Operands {
    fn new() -> Self {
        let mut rng = SeededRng::new(7);
        Self {
            x: rng.f32s(M * K),
            w: rng.f32s(K * N),
            w_i8: PackedI8Weights::pack(&rng.i8s(N * K), N, K),
            w_scales: vec![0.01; N],
        }
    }

    /// One job's work on a processor of `kind`: `reps` products.
    fn run(&self, kind: ProcessorKind, reps: u64) -> f32 {
        let mut out = vec![0f32; M * N];
        for _ in 0..reps {
            match kind {
                ProcessorKind::Npu => matmul_w8a8(&self.x, M, &self.w_i8, &self.w_scales, &mut out),
                _ => matmul_f32(&self.x, &self.w, &mut out, M, K, N),
            }
        }
        out[0]
    }
}

/// Jobs run on a worker pool; completions come back over a channel.
struct KernelQueue {
    kinds: Vec<ProcessorKind>,
    pool: rayon::ThreadPool,
    operands: Arc<Operands>,
    done_tx: Sender<Completion>,
    done: Receiver<Completion>,
    in_flight: usize,
    started: Instant,
}

impl KernelQueue {
    fn new(kinds: Vec<ProcessorKind>, threads: usize) -> Result<Self, rayon::ThreadPoolBuildError> {
        let (done_tx, done) = unbounded();
        Ok(Self {
            kinds,
            pool: rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()?,
            operands: Arc::new(Operands::new()),
            done_tx,
            done,
            in_flight: 0,
            started: Instant::now(),
        })
    }

    fn drain(&mut self, first: Completion) -> (u64, Vec<Completion>) {
        let done: Vec<Completion> = std::iter::once(first).chain(self.done.try_iter()).collect();
        self.in_flight -= done.len();
        (self.started.elapsed().as_nanos() as u64, done)
    }
}

impl Backend for KernelQueue {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        let Some(&kind) = self.kinds.get(job.processor) else {
            return Err(BackendError {
                processor: job.processor,
                job: job.id,
                reason: "no such processor".into(),
            });
        };
        let (operands, done, started) = (self.operands.clone(), self.done_tx.clone(), self.started);
        let reps = (job.estimated_ns / 1_000_000).max(1);
        self.pool.spawn(move || {
            let start_ns = started.elapsed().as_nanos() as u64;
            std::hint::black_box(operands.run(kind, reps));
            let end_ns = started.elapsed().as_nanos() as u64;
            // The receiver only goes away with the queue, after the run.
            let _ = done.send(Completion {
                id: job.id,
                processor: job.processor,
                start_ns,
                end_ns,
            });
        });
        self.in_flight += 1;
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        // The queue holds a sender itself, so the channel never disconnects.
        let first = self.done.recv().expect("the queue keeps the channel open");
        Ok(self.drain(first))
    }

    fn wait_for(&mut self, timeout: Duration) -> Result<(u64, Vec<Completion>), BackendError> {
        match self.done.recv_timeout(timeout) {
            Ok(first) => Ok(self.drain(first)),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                Ok((self.started.elapsed().as_nanos() as u64, Vec::new()))
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut scene = Scene::load(Path::new("qwen1.5-1.8b-xiaomi14"))?;
    scene.workload.prompt_len = 512;
    let plan = Arc::new(scene.plan()?);
    let kinds = plan.device.processors.iter().map(|p| p.kind).collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut queue = KernelQueue::new(kinds, threads)?;
    let run = run(plan.clone(), scene.new_policy()?, &mut queue)?;
    println!(
        "{}: {} subgraphs in {:.1} ms of wall time on {threads} worker threads \
         (one 64x256x256 GEMM per modeled ms)",
        scene.name,
        run.timeline.slices.len(),
        run.makespan_ns as f64 / 1e6,
    );
    for (lane, spec) in plan.device.processors.iter().enumerate() {
        let slices = run.timeline.slices.iter().filter(|s| s.processor == lane);
        let (jobs, busy, modeled) = slices.fold((0, 0, 0), |(n, b, m), s| {
            (n + 1, b + s.end_ns - s.start_ns, m + s.estimated_ns)
        });
        println!(
            "  {:>8}: {jobs} jobs, busy {:.1} ms (modeled on the phone: {:.1} ms)",
            spec.name,
            busy as f64 / 1e6,
            modeled as f64 / 1e6
        );
    }
    // A real run's bound comes from its own measured durations, not the phone's model.
    println!("{}", RunReport::measured(&scene.name, &run, &[]).summary());
    Ok(())
}
