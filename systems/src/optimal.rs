//! Exact minimum makespan of small plans, by branch and bound over active schedules
//! (Giffler-Thompson): used by tests to measure how far each heuristic policy is from
//! optimal. Exponential: meant for about a dozen instances.

use crate::plan::{InstanceKey, PrefillPlan};

/// Optimal makespan in ns of `plan` under its placement, or `None` when the plan has more
/// than `max_instances` instances.
pub fn optimal_makespan_ns(plan: &PrefillPlan, max_instances: usize) -> Option<u64> {
    let keys: Vec<InstanceKey> = plan.instances().collect();
    if keys.len() > max_instances {
        return None;
    }
    let index_of = |k: InstanceKey| {
        keys.iter()
            .position(|x| *x == k)
            .expect("predecessor exists")
    };
    let jobs: Vec<Job> = keys
        .iter()
        .map(|&k| Job {
            lane: plan.processor(k),
            cost: plan.cost_ns(k),
            preds: plan.predecessors(k).into_iter().map(index_of).collect(),
            tail: plan.bottom_level_ns(k),
        })
        .collect();
    let mut search = Search {
        jobs: &jobs,
        lanes: plan.device.processors.len(),
        best: u64::MAX,
    };
    let state = State {
        finish: vec![None; jobs.len()],
        lane_free: vec![0; plan.device.processors.len()],
    };
    search.branch(&state);
    Some(search.best)
}

struct Job {
    lane: usize,
    cost: u64,
    preds: Vec<usize>,
    /// Bottom level: this job plus the longest chain after it.
    tail: u64,
}

#[derive(Clone)]
struct State {
    finish: Vec<Option<u64>>,
    lane_free: Vec<u64>,
}

struct Search<'a> {
    jobs: &'a [Job],
    lanes: usize,
    best: u64,
}

impl Search<'_> {
    fn earliest_start(&self, state: &State, j: usize) -> Option<u64> {
        let job = &self.jobs[j];
        let mut start = state.lane_free[job.lane];
        for &p in &job.preds {
            start = start.max(state.finish[p]?);
        }
        Some(start)
    }

    fn bound(&self, state: &State) -> u64 {
        let mut remaining = vec![0u64; self.lanes];
        let mut bound = state.finish.iter().flatten().copied().max().unwrap_or(0);
        for (j, job) in self.jobs.iter().enumerate() {
            if state.finish[j].is_none() {
                remaining[job.lane] += job.cost;
                // A job cannot start before its lane is free or its scheduled preds end.
                let start = job
                    .preds
                    .iter()
                    .filter_map(|&p| state.finish[p])
                    .max()
                    .unwrap_or(0);
                bound = bound.max(start.max(state.lane_free[job.lane]) + job.tail);
            }
        }
        for (free, work) in state.lane_free.iter().zip(&remaining) {
            bound = bound.max(free + work);
        }
        bound
    }

    fn branch(&mut self, state: &State) {
        let schedulable: Vec<(usize, u64)> = (0..self.jobs.len())
            .filter(|&j| state.finish[j].is_none())
            .filter_map(|j| self.earliest_start(state, j).map(|s| (j, s)))
            .collect();
        if schedulable.is_empty() {
            let makespan = state.finish.iter().flatten().copied().max().unwrap_or(0);
            self.best = self.best.min(makespan);
            return;
        }
        if self.bound(state) >= self.best {
            return;
        }
        // Giffler-Thompson: the job with the earliest completion fixes a lane and a time;
        // branch over every job of that lane that could start before that time.
        let &(j_star, s_star) = schedulable
            .iter()
            .min_by_key(|(j, s)| (s + self.jobs[*j].cost, *j))
            .expect("non-empty");
        let lane = self.jobs[j_star].lane;
        let c_star = s_star + self.jobs[j_star].cost;
        for &(j, s) in &schedulable {
            if self.jobs[j].lane != lane || s >= c_star {
                continue;
            }
            let mut next = state.clone();
            let end = s + self.jobs[j].cost;
            next.finish[j] = Some(end);
            next.lane_free[lane] = end;
            self.branch(&next);
        }
    }
}
