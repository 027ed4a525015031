//! Simulated queues that share one pool of compute threads, as the host's real thread
//! queues do (`hetsched-exec`'s `ThreadQueues`): every lane hands its job to the same
//! rayon pool. A job alone has the whole pool and takes its modeled duration; jobs
//! running at once split the pool's threads, and each runs at the rate its share gives
//! ([`PoolSharing`]). Measured on this machine's 2-thread pool (docs/calibration.md):
//! under `inorder` two jobs never run at once, under `balance` a quarter of the time
//! does, at about 0.68 of the alone rate each (1.36x the throughput of one job). Each
//! job starts after a fixed hand-off gap (the measured time between one job's end and
//! the next one's start on the real queues). `hetsched run --predict` simulates with it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hetsched_systems::resources::{Completion, Job};

use super::{Backend, BackendError};

/// How jobs running at once share the pool: `threads` workers, and the rate of each of
/// two jobs sharing it relative to one job alone (`two_job_rate`, in [1/2, 1]: 1/2 is
/// no gain from sharing, jobs as good as one at a time; 1 is two jobs each as fast as
/// alone). From it an Amdahl parallel fraction `f = 2 (1 - rate)` of a job's work
/// prices any number of jobs: `n` jobs get `threads / n` threads each, a job on `t`
/// threads runs at `speedup(t) / speedup(threads)`, `speedup(t) = 1 / (1 - f + f / t)`
/// (and `t` times the one-thread rate below one thread).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolSharing {
    /// Worker threads.
    pub threads: usize,
    /// Rate of each of two jobs running at once, relative to one alone.
    pub two_job_rate: f64,
}

impl Default for PoolSharing {
    /// Two jobs together no faster than one after the other.
    fn default() -> Self {
        Self {
            threads: 2,
            two_job_rate: 0.5,
        }
    }
}

impl PoolSharing {
    /// The Amdahl parallel fraction that gives two jobs `two_job_rate` each.
    pub fn parallel_fraction(&self) -> f64 {
        (2.0 * (1.0 - self.two_job_rate.clamp(0.5, 1.0))).clamp(0.0, 1.0)
    }

    /// Rate of each of `n` jobs running at once, relative to one job alone (1 for n <= 1).
    pub fn rate(&self, n: usize) -> f64 {
        amdahl_rate(self.parallel_fraction(), self.threads, n)
    }
}

/// Rate of a job of Amdahl parallel fraction `f` while `n` jobs split `threads` workers,
/// relative to the job alone on all of them: `speedup(threads / n) / speedup(threads)`,
/// `speedup(t) = 1 / (1 - f + f / t)` (and `t` times the one-thread rate below one
/// thread); 1 for `n <= 1`.
pub fn amdahl_rate(f: f64, threads: usize, n: usize) -> f64 {
    if n <= 1 {
        return 1.0;
    }
    let speedup = |t: f64| if t >= 1.0 { 1.0 / (1.0 - f + f / t) } else { t };
    let threads = threads.max(1) as f64;
    speedup(threads / n as f64) / speedup(threads)
}

/// A job on the simulated pool.
#[derive(Debug)]
struct Active {
    id: u32,
    processor: usize,
    start: u64,
    /// Work left, in ns of running alone.
    left: f64,
}

/// A virtual-clock backend with one shared executor (see the module doc).
#[derive(Debug, Default)]
pub struct SharedPoolBackend {
    /// Hand-off gap before each job, ns.
    gap_ns: u64,
    sharing: PoolSharing,
    /// The simulation's time.
    now: u64,
    /// Jobs submitted, waiting for their gap: (start, processor, id, work) min-heap.
    starting: BinaryHeap<Reverse<(u64, usize, u32, u64)>>,
    /// Jobs running, in start order.
    running: Vec<Active>,
}

impl SharedPoolBackend {
    /// A shared executor that waits `gap_ns` before each job and shares its threads
    /// between jobs as `sharing` says.
    pub fn new(gap_ns: u64, sharing: PoolSharing) -> Self {
        Self {
            gap_ns,
            sharing,
            ..Self::default()
        }
    }

    /// Runs the pool forward by `dt` ns at the current sharing.
    fn advance(&mut self, dt: u64) {
        let rate = self.sharing.rate(self.running.len());
        for job in &mut self.running {
            job.left -= dt as f64 * rate;
        }
        self.now += dt;
    }

    /// Ns until the first running job finishes at the current sharing.
    fn next_finish(&self) -> Option<(u64, usize)> {
        let rate = self.sharing.rate(self.running.len());
        self.running
            .iter()
            .enumerate()
            .map(|(i, j)| ((j.left.max(0.0) / rate).ceil() as u64, i))
            .min_by_key(|&(dt, i)| (dt, self.running[i].processor))
    }
}

impl Backend for SharedPoolBackend {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        let start = self.now.max(job.dispatched_ns) + self.gap_ns;
        self.starting
            .push(Reverse((start, job.processor, job.id, job.estimated_ns)));
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.running.len() + self.starting.len()
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        loop {
            let finish = self.next_finish();
            let start = self.starting.peek().map(|Reverse(s)| s.0);
            match (finish, start) {
                (None, None) => return Ok((self.now, Vec::new())),
                // A job joins the pool first (or at the same time as one leaves it): the
                // sharing changes from then on.
                (f, Some(at)) if f.is_none_or(|(dt, _)| at <= self.now + dt) => {
                    self.advance(at.saturating_sub(self.now));
                    let Some(Reverse((start, processor, id, work))) = self.starting.pop() else {
                        unreachable!("peeked just above")
                    };
                    self.running.push(Active {
                        id,
                        processor,
                        start,
                        left: work as f64,
                    });
                }
                (Some((dt, i)), _) => {
                    self.advance(dt);
                    let done = self.running.remove(i);
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
                (None, Some(_)) => unreachable!("the first arm takes a start without a finish"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hetsched_systems::PolicyRegistry;
    use hetsched_systems::testing::tiny_plan;

    use super::*;
    use crate::engine::run;

    fn spans(rate: f64, gap: u64, policy: &str) -> (crate::engine::RunOutcome, u64) {
        let plan = Arc::new(tiny_plan(2, 256, 64));
        let policy = PolicyRegistry::builtin().create(policy).unwrap();
        let sharing = PoolSharing {
            threads: 2,
            two_job_rate: rate,
        };
        let out = run(plan, policy, &mut SharedPoolBackend::new(gap, sharing)).unwrap();
        let work = out.timeline.slices.iter().map(|s| s.estimated_ns).sum();
        (out, work)
    }

    #[test]
    fn sharing_rates_follow_amdahl() {
        let half = PoolSharing::default();
        assert_eq!(half.rate(1), 1.0);
        assert!((half.rate(2) - 0.5).abs() < 1e-12);
        let gain = PoolSharing {
            threads: 2,
            two_job_rate: 0.7,
        };
        assert!((gain.rate(2) - 0.7).abs() < 1e-12);
        // Three jobs on two threads: each a bit under two thirds of two jobs' rate.
        assert!(gain.rate(3) < gain.rate(2) && gain.rate(3) > 0.0);
        let perfect = PoolSharing {
            threads: 2,
            two_job_rate: 1.0,
        };
        assert!((perfect.rate(2) - 1.0).abs() < 1e-12);
    }

    /// With no gain from sharing the pool does one job's work at a time: the makespan is
    /// at least the work plus a gap before each job, however jobs overlap.
    #[test]
    fn without_a_sharing_gain_the_pool_does_one_jobs_work_at_a_time() {
        let (out, work) = spans(0.5, 1_000, "balance");
        let jobs = out.timeline.slices.len() as u64;
        assert!(
            out.makespan_ns + jobs >= work,
            "{} < {work}",
            out.makespan_ns
        );
        // Every job waits its gap after its dispatch.
        assert!(out.timeline.slices.iter().all(|s| s.start_ns >= 1_000));
    }

    /// Jobs that run at once finish sooner when sharing gains, never later than their
    /// work alone would need; a lone job takes exactly its modeled time.
    #[test]
    fn a_sharing_gain_shortens_the_makespan_of_overlapping_jobs() {
        let (slow, work) = spans(0.5, 0, "balance");
        let (fast, _) = spans(0.8, 0, "balance");
        assert!(fast.makespan_ns < slow.makespan_ns);
        assert!(fast.makespan_ns as f64 >= work as f64 / (2.0 * 0.8) - 1.0);
        // `inorder` on one lane at a time here: each slice is its modeled duration.
        let (one, _) = spans(0.8, 0, "inorder");
        for s in &one.timeline.slices {
            let took = s.end_ns - s.start_ns;
            assert!(took >= s.estimated_ns, "{took} < {}", s.estimated_ns);
        }
    }
}
