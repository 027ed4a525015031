//! Simulated queues sharing one pool of worker threads job by job, as a work-stealing
//! pool (rayon, under `hetsched-exec`'s `ThreadQueues`) runs them: each running job holds
//! a worker of its own and spreads its parallel loops over the idle ones, so a job that
//! arrives while others run does not start at once; it waits (queue wait, not busy
//! time) until a worker is free of stealable work. Each job has its own parallel
//! fraction `f`, from its measured speed-up on the pool's threads over one thread
//! (`hetsched profile`'s one-thread pass): a large GEMM (`f` near 1) keeps every worker
//! busy to its end, a small or memory-bound stage leaves one idle often.
//!
//! The model, per job (Amdahl): alone on `T` threads a job runs at its full rate; `n`
//! running jobs get `T / n` threads each and run at `speedup(T / n) / speedup(T)`, with
//! `speedup(t) = 1 / (1 - f + f / t)`. A job that finds a free worker but others running
//! joins when the running job that yields soonest ends its current parallel loop: a job's
//! loops are its stage's operators (one kernel call each, with a serial step between
//! them where a worker runs out of the job's work), each taking its share of the job's
//! work (from the roofline of its operators: an attention stage at a long context is
//! mostly its attention loop), and the job is taken to yield after the parallel share
//! `f` of what is left of the loop it is in (a job with no parallel part yields at once;
//! a single fully parallel loop only at its end); with no free worker it waits for a
//! completion. Measured on this machine
//! (docs/calibration.md): it splits the lanes' busy time as the real queues do, which the
//! symmetric rate of [`super::shared_pool`] does not, and the per-loop wait fits the
//! measured overlap better than a wait for the whole job's parallel share.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use hetsched_systems::StageCost;
use hetsched_systems::model::ChunkShape;
use hetsched_systems::resources::{Completion, Job};

use super::shared_pool::amdahl_rate;
use super::{Backend, BackendError};
use crate::weight_reuse::{ReuseTracker, WarmWeights};

/// Each job's parallel fraction, by instance id and lane: `fraction[id * lanes + lane]`.
#[derive(Clone, Debug, Default)]
pub struct ParallelFractions {
    /// Lanes (processors) per instance.
    pub lanes: usize,
    /// The fractions, in [0, 1].
    pub fraction: Vec<f64>,
    /// The fraction of a job the table has no entry for.
    pub default: f64,
    /// Each instance's parallel loops (its stage's operators, each one kernel call), by
    /// instance id, as their shares of its work, in order: between two loops a worker is
    /// free of the job, so a newcomer waits for the end of the running job's current
    /// loop, not of all its parallel work. An instance without an entry is one loop.
    pub loops: Vec<Box<[f32]>>,
    /// The weight bytes each stage's jobs stream, by stage index (none: no stage does).
    pub stage_weight_bytes: Vec<u64>,
    /// How a job whose weights are still cached is priced (none: every job as its cost
    /// says): [`crate::weight_reuse`].
    pub warm: Option<WarmWeights>,
}

impl ParallelFractions {
    /// The parallel fraction of a job on `threads` threads whose speed-up over one
    /// thread is `speedup` (clamped to [1, threads]): Amdahl's law solved for `f`.
    pub fn from_speedup(speedup: f64, threads: usize) -> f64 {
        let t = threads.max(1) as f64;
        if t <= 1.0 || !speedup.is_finite() {
            return 0.0;
        }
        let s = speedup.clamp(1.0, t);
        ((1.0 - 1.0 / s) * t / (t - 1.0)).clamp(0.0, 1.0)
    }

    /// The parallel fraction of a job of `shape` whose stage costs `one` on one thread
    /// and `all` on `threads` ([`Self::from_speedup`] of their ratio).
    pub fn from_costs(one: &StageCost, all: &StageCost, shape: ChunkShape, threads: usize) -> f64 {
        Self::from_speedup(one.ns(shape) / all.ns(shape).max(1.0), threads)
    }

    fn at(&self, id: u32, processor: usize) -> f64 {
        self.fraction
            .get(id as usize * self.lanes + processor)
            .copied()
            .unwrap_or(self.default)
    }

    fn loops_of(&self, id: u32) -> Box<[f32]> {
        self.loops.get(id as usize).cloned().unwrap_or_default()
    }
}

/// Work (ns alone) left in the current loop of a job of `work` with `left` to do, whose
/// loops take `shares` of it in order (none: one loop, all that is left).
fn left_in_loop(shares: &[f32], work: f64, left: f64) -> f64 {
    let left = left.max(0.0);
    let done = work - left;
    let mut end = 0.0;
    for &share in shares {
        end += f64::from(share) * work;
        if end > done {
            return (end - done).min(left);
        }
    }
    left
}

/// A job on the simulated pool.
#[derive(Debug)]
struct Running {
    id: u32,
    processor: usize,
    start: u64,
    fraction: f64,
    /// Its parallel loops' shares of its work, in order.
    loops: Box<[f32]>,
    /// Its work, in ns of running alone.
    work: f64,
    /// Work left, in ns of running alone.
    left: f64,
}

/// A job waiting for its hand-off gap: (ready time, processor, id, work, stage).
type Submitted = (u64, usize, u32, u64, u32);

/// A job past its hand-off gap, waiting for a worker.
#[derive(Debug)]
struct Queued {
    id: u32,
    stage: u32,
    processor: usize,
    fraction: f64,
    loops: Box<[f32]>,
    work: f64,
}

/// A virtual-clock backend with one shared pool of workers (see the module doc).
#[derive(Debug, Default)]
pub struct WorkerPoolBackend {
    threads: usize,
    gap_ns: u64,
    fractions: ParallelFractions,
    now: u64,
    /// Jobs submitted, waiting for their gap, earliest first.
    starting: BinaryHeap<Reverse<Submitted>>,
    /// Jobs past their gap, first come first served.
    queued: VecDeque<Queued>,
    /// When the queue's first job may take a worker (None: when one is free).
    admit_at: Option<u64>,
    running: Vec<Running>,
    /// Whose weights are still cached, in job start order.
    reuse: ReuseTracker,
}

impl WorkerPoolBackend {
    /// A pool of `threads` workers that waits `gap_ns` before each job.
    pub fn new(threads: usize, gap_ns: u64, fractions: ParallelFractions) -> Self {
        Self {
            threads: threads.max(1),
            gap_ns,
            fractions,
            ..Self::default()
        }
    }

    /// Rate of a job of parallel fraction `f` while `n` jobs run, relative to alone.
    fn rate(&self, f: f64, n: usize) -> f64 {
        amdahl_rate(f, self.threads, n)
    }

    fn advance(&mut self, to: u64) {
        let dt = to.saturating_sub(self.now) as f64;
        let n = self.running.len();
        for i in 0..n {
            let rate = self.rate(self.running[i].fraction, n);
            self.running[i].left -= dt * rate;
        }
        self.now = self.now.max(to);
    }

    /// Ns until the first running job finishes, and its index.
    fn next_finish(&self) -> Option<(u64, usize)> {
        let n = self.running.len();
        self.running
            .iter()
            .enumerate()
            .map(|(i, j)| {
                (
                    (j.left.max(0.0) / self.rate(j.fraction, n)).ceil() as u64,
                    i,
                )
            })
            .min_by_key(|&(dt, i)| (dt, self.running[i].processor))
    }

    /// When the queue's first job may start, from the running set now: at once on an
    /// idle pool, after the soonest-yielding job's parallel share of its current loop
    /// with a free worker, never (until a completion) with none.
    fn admission_time(&self) -> Option<u64> {
        if self.running.is_empty() {
            return Some(self.now);
        }
        if self.running.len() >= self.threads {
            return None;
        }
        let n = self.running.len();
        self.running
            .iter()
            .map(|j| {
                let left = left_in_loop(&j.loops, j.work, j.left);
                let share = j.fraction * left / self.rate(j.fraction, n);
                self.now + share.ceil() as u64
            })
            .min()
    }

    fn admit(&mut self) {
        let Some(mut job) = self.queued.pop_front() else {
            return;
        };
        if let Some(warm) = self.fractions.warm {
            let stage = job.stage as usize;
            let bytes = self
                .fractions
                .stage_weight_bytes
                .get(stage)
                .copied()
                .unwrap_or(0);
            if self.reuse.start(stage, bytes, warm.cache_bytes) {
                job.work = warm.warm_work(job.work, bytes);
            }
        }
        self.running.push(Running {
            id: job.id,
            processor: job.processor,
            start: self.now,
            fraction: job.fraction,
            loops: job.loops,
            work: job.work,
            left: job.work,
        });
        self.admit_at = None;
    }
}

impl Backend for WorkerPoolBackend {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        let ready = self.now.max(job.dispatched_ns) + self.gap_ns;
        self.starting.push(Reverse((
            ready,
            job.processor,
            job.id,
            job.estimated_ns,
            job.key.stage,
        )));
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.running.len() + self.queued.len() + self.starting.len()
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        loop {
            // The queue's first job times its wait from now (at once on an idle pool): when
            // it joins the queue, and again after a worker was taken or freed.
            if !self.queued.is_empty() && self.admit_at.is_none() {
                self.admit_at = self.admission_time();
            }
            let finish = self.next_finish().map(|(dt, i)| (self.now + dt, i));
            let ready = self.starting.peek().map(|Reverse(s)| s.0);
            let admit = self.admit_at.filter(|_| !self.queued.is_empty());
            // The earliest event; at a tie a job joining goes first (the sharing changes
            // from then on), then a worker taken, then a job finishing.
            let next = [
                ready.map(|t| (t, 0)),
                admit.map(|t| (t, 1)),
                finish.map(|(t, _)| (t, 2)),
            ]
            .into_iter()
            .flatten()
            .min();
            match next {
                None => return Ok((self.now, Vec::new())),
                Some((t, 0)) => {
                    self.advance(t);
                    let Some(Reverse((_, processor, id, work, stage))) = self.starting.pop() else {
                        unreachable!("peeked just above")
                    };
                    let fraction = self.fractions.at(id, processor);
                    let loops = self.fractions.loops_of(id);
                    self.queued.push_back(Queued {
                        id,
                        stage,
                        processor,
                        fraction,
                        loops,
                        work: work as f64,
                    });
                }
                Some((t, 1)) => {
                    self.advance(t);
                    self.admit();
                }
                Some((t, _)) => {
                    let Some((_, i)) = finish else {
                        unreachable!("a finish was the earliest event")
                    };
                    self.advance(t);
                    let done = self.running.remove(i);
                    // A freed worker: the queue's first job re-times its wait.
                    self.admit_at = None;
                    return Ok((
                        self.now,
                        vec![Completion {
                            id: done.id,
                            processor: done.processor,
                            start_ns: done.start,
                            end_ns: self.now,
                        }],
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use hetsched_systems::InstanceKey;

    use super::*;

    fn job(id: u32, processor: usize, work: u64) -> Job {
        Job {
            id,
            request: Default::default(),
            key: InstanceKey {
                chunk: id,
                stage: 0,
            },
            processor,
            estimated_ns: work,
            dispatched_ns: 0,
        }
    }

    /// Two jobs of one lane each, id 0 on lane 0 and id 1 on lane 1, both of parallel
    /// fraction `f`, submitted at once on a two-worker pool; their completions by id.
    fn pair(f: f64, work: u64) -> Vec<Completion> {
        pair_in_loops(f, work, Vec::new())
    }

    /// [`pair`] with each job's loops as shares of its work (by id).
    fn pair_in_loops(f: f64, work: u64, loops: Vec<Box<[f32]>>) -> Vec<Completion> {
        let fractions = ParallelFractions {
            lanes: 2,
            fraction: vec![f, 0.0, 0.0, f],
            default: 0.0,
            loops,
            ..ParallelFractions::default()
        };
        let mut pool = WorkerPoolBackend::new(2, 0, fractions);
        pool.submit(job(0, 0, work)).unwrap();
        pool.submit(job(1, 1, work)).unwrap();
        let mut done = Vec::new();
        while pool.in_flight() > 0 {
            done.extend(pool.wait().unwrap().1);
        }
        done.sort_by_key(|c| c.id);
        done
    }

    #[test]
    fn a_speed_up_gives_the_amdahl_fraction() {
        assert_eq!(ParallelFractions::from_speedup(1.0, 2), 0.0);
        assert_eq!(ParallelFractions::from_speedup(2.0, 2), 1.0);
        assert!((ParallelFractions::from_speedup(1.5, 2) - 2.0 / 3.0).abs() < 1e-12);
        // Out of range speed-ups are clamped; one thread has no parallel part.
        assert_eq!(ParallelFractions::from_speedup(0.7, 2), 0.0);
        assert_eq!(ParallelFractions::from_speedup(3.0, 2), 1.0);
        assert_eq!(ParallelFractions::from_speedup(1.8, 1), 0.0);
        assert_eq!(ParallelFractions::from_speedup(f64::NAN, 2), 0.0);
    }

    /// Jobs with no parallel part each use one worker: side by side, neither slows.
    #[test]
    fn serial_jobs_run_side_by_side_at_full_speed() {
        let done = pair(0.0, 1_000);
        for c in &done {
            assert_eq!((c.start_ns, c.end_ns), (0, 1_000), "{c:?}");
        }
    }

    /// A fully parallel job keeps every worker to its end: the second waits (its start,
    /// and so its busy time, begins when the first ends) and the pool does one at a time.
    #[test]
    fn a_fully_parallel_job_makes_the_next_wait_for_its_end() {
        let done = pair(1.0, 1_000);
        assert_eq!((done[0].start_ns, done[0].end_ns), (0, 1_000));
        assert_eq!((done[1].start_ns, done[1].end_ns), (1_000, 2_000));
    }

    /// In between, the second job joins once the first has done its parallel share of
    /// the work it had left, and both then run at Amdahl's rate for one thread each.
    #[test]
    fn a_partly_parallel_job_lets_the_next_join_after_its_parallel_share() {
        // f = 1/2: alone on 2 threads a job runs 4/3 as fast as on one, so two jobs on
        // one thread each run at 3/4. Job 0 runs 500 ns alone (half of its 1000), then
        // both at 3/4: job 0's last 500 take 667 ns; job 1 has done 500 by then and
        // finishes its last 500 alone.
        let done = pair(0.5, 1_000);
        assert_eq!(done[0].start_ns, 0);
        assert_eq!(done[1].start_ns, 500);
        assert!((done[0].end_ns as i64 - 1_167).abs() <= 1, "{:?}", done[0]);
        assert!((done[1].end_ns as i64 - 1_667).abs() <= 2, "{:?}", done[1]);
        // The pool did 2000 ns of alone work in under 2000 ns, more than one job at a time.
        assert!(done[1].end_ns < 2_000);
    }

    /// A job of several loops yields at the end of its current one: with two loops the
    /// newcomer joins after half the wait of a single loop of the same work.
    #[test]
    fn a_job_of_several_loops_lets_the_next_join_at_the_end_of_its_loop() {
        let loops: Vec<Box<[f32]>> = vec![Box::new([0.5, 0.5]), Box::new([1.0])];
        let done = pair_in_loops(0.5, 1_000, loops);
        // Job 0 (f = 1/2, two loops of 500) yields after f * 500 = 250 ns, not 500.
        assert_eq!(done[1].start_ns, 250, "{done:?}");
        assert!(
            done.iter().all(|c| c.end_ns - c.start_ns >= 1_000),
            "{done:?}"
        );
    }

    /// The wait is for the rest of the loop the running job is in, by its share of the
    /// job's work: a job mostly one loop (an attention stage at a long context) keeps
    /// the newcomer waiting longer than one of equal loops.
    #[test]
    fn the_wait_is_the_rest_of_the_current_loop_by_its_share() {
        // A job of 1000 ns in loops of 800 and 200 (shares are f32: to 1e-3 ns).
        let cases = [(1_000.0, 800.0), (500.0, 300.0), (150.0, 150.0)];
        for (left, want) in cases {
            let got = left_in_loop(&[0.8, 0.2], 1_000.0, left);
            assert!((got - want).abs() < 1e-3, "{left} left: {got}");
        }
        // No shares: one loop, all that is left.
        assert_eq!(left_in_loop(&[], 1_000.0, 600.0), 600.0);
        let loops: Vec<Box<[f32]>> = vec![Box::new([0.8, 0.2]), Box::new([1.0])];
        let done = pair_in_loops(0.5, 1_000, loops);
        // f * 800, rounded up to a whole ns.
        assert!((400..=401).contains(&done[1].start_ns), "{done:?}");
    }

    /// However the fractions are set, every job takes at least its alone time, no job
    /// starts before its gap, and the pool never runs more jobs than workers.
    #[test]
    fn jobs_never_beat_their_alone_time_nor_crowd_the_pool() {
        for (i, f) in [0.0, 0.3, 0.7, 1.0].into_iter().enumerate() {
            let lanes = 3;
            let fractions = ParallelFractions {
                lanes,
                fraction: (0..30)
                    .map(|k| (f + 0.1 * (k % 3) as f64).min(1.0))
                    .collect(),
                default: f,
                ..ParallelFractions::default()
            };
            let mut pool = WorkerPoolBackend::new(2, 50, fractions);
            let work = |id: u32| 300 + 170 * u64::from((id + i as u32) % 5);
            for id in 0..3 {
                pool.submit(job(id, id as usize, work(id))).unwrap();
            }
            let mut done = Vec::new();
            while pool.in_flight() > 0 {
                done.extend(pool.wait().unwrap().1);
            }
            assert_eq!(done.len(), 3);
            for c in &done {
                assert!(c.start_ns >= 50, "{c:?}");
                assert!(c.end_ns - c.start_ns + 1 >= work(c.id), "{c:?}");
            }
            for t in done.iter().map(|c| c.start_ns) {
                let running = done
                    .iter()
                    .filter(|c| c.start_ns <= t && t < c.end_ns)
                    .count();
                assert!(running <= 2, "f {f}: {running} jobs at {t}");
            }
        }
    }

    /// Jobs one after another on one lane, of stages `stages` (each streaming 4 MB),
    /// each of `work` ns, with a 16 MB cache saving 0.01 ns per byte; their durations.
    fn one_by_one(stages: &[u32], work: u64, warm: Option<WarmWeights>) -> Vec<u64> {
        let fractions = ParallelFractions {
            lanes: 1,
            stage_weight_bytes: vec![4 << 20; 8],
            warm,
            ..ParallelFractions::default()
        };
        let mut pool = WorkerPoolBackend::new(2, 0, fractions);
        let mut durations = Vec::new();
        for (id, &stage) in stages.iter().enumerate() {
            let mut next = job(id as u32, 0, work);
            next.key.stage = stage;
            next.dispatched_ns = pool.now;
            pool.submit(next).unwrap();
            let (_, done) = pool.wait().unwrap();
            durations.extend(done.iter().map(|c| c.end_ns - c.start_ns));
        }
        durations
    }

    #[test]
    fn a_job_whose_weights_are_still_cached_takes_its_cost_less_the_saving() {
        let warm = WarmWeights {
            cache_bytes: 16 << 20,
            ns_per_byte: 0.01,
        };
        let saving = (0.01 * f64::from(4u32 << 20)) as u64; // 41943 ns
        // Stage 0 first (cold), stage 1, stage 0 again: 4 MB streamed since, 8 with its
        // own, within 16: warm. Then three more stages: 12 MB since, 16 with its own:
        // warm; then four: 16 MB since, pushed out.
        let durations = one_by_one(&[0, 1, 0, 2, 3, 4, 0, 1, 2, 3, 4, 0], 100_000, Some(warm));
        assert_eq!(durations[..3], [100_000, 100_000, 100_000 - saving]);
        assert_eq!(durations[6], 100_000 - saving);
        assert_eq!(durations[11], 100_000);
        // At most half a job's work is saved.
        assert_eq!(one_by_one(&[0, 0], 50_000, Some(warm)), [50_000, 25_000]);
        // Without the rule, every job takes its cost.
        assert_eq!(one_by_one(&[0, 0], 100_000, None), [100_000, 100_000]);
    }
}
