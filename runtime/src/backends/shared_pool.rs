//! Simulated queues that share one pool of compute threads, as the host's real thread
//! queues do (`hetsched-exec`'s `ThreadQueues`): every lane hands its job to the same
//! rayon pool, whose workers finish one job's parallel work before they take the next
//! lane's, so jobs run one at a time in submission order. Each job takes its modeled
//! duration after a fixed hand-off gap (the measured time between one job's end and the
//! next one's start on the real queues). `hetsched run --predict` simulates with it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hetsched_systems::resources::{Completion, Job};

use super::{Backend, BackendError};

/// A virtual-clock backend with one shared executor (see the module doc).
#[derive(Debug, Default)]
pub struct SharedPoolBackend {
    /// Hand-off gap before each job, ns.
    gap_ns: u64,
    /// When the executor is free.
    free_at: u64,
    /// (end, processor, id, start); min-heap through `Reverse`.
    running: BinaryHeap<Reverse<(u64, usize, u32, u64)>>,
}

impl SharedPoolBackend {
    /// A shared executor that waits `gap_ns` before each job.
    pub fn new(gap_ns: u64) -> Self {
        Self {
            gap_ns,
            ..Self::default()
        }
    }
}

impl Backend for SharedPoolBackend {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        // FIFO on one executor: a later submission never overtakes, so the job's whole
        // span is known now.
        let start = self.free_at.max(job.dispatched_ns) + self.gap_ns;
        let end = start + job.estimated_ns;
        self.free_at = end;
        self.running
            .push(Reverse((end, job.processor, job.id, start)));
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.running.len()
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        let Some(Reverse((now, processor, id, start))) = self.running.pop() else {
            return Ok((0, Vec::new()));
        };
        Ok((
            now,
            vec![Completion {
                id,
                processor,
                start_ns: start,
                end_ns: now,
            }],
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hetsched_systems::PolicyRegistry;
    use hetsched_systems::testing::tiny_plan;

    use super::*;
    use crate::engine::run;

    #[test]
    fn jobs_run_one_at_a_time_with_the_gap_between() {
        let plan = Arc::new(tiny_plan(2, 256, 64));
        let policy = PolicyRegistry::builtin().create("balance").unwrap();
        let out = run(plan.clone(), policy, &mut SharedPoolBackend::new(1_000)).unwrap();
        let mut spans: Vec<(u64, u64)> = out
            .timeline
            .slices
            .iter()
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(pair[1].0 >= pair[0].1 + 1_000, "{pair:?} overlap");
        }
        let work: u64 = out.timeline.slices.iter().map(|s| s.estimated_ns).sum();
        let jobs = out.timeline.slices.len() as u64;
        assert!(out.makespan_ns >= work + 1_000 * jobs);
    }
}
