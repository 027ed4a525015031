//! Exact minimum makespan of small plans, by branch and bound over active schedules
//! (Giffler-Thompson), with the processor of each instance chosen among its eligible ones
//! under flexible placement: used by tests to measure how far each heuristic policy is
//! from optimal. Exponential: meant for a couple of dozen instances.
//!
//! Branching: of every (unscheduled job, eligible lane) pair whose predecessors are done,
//! take the one that could complete first, at `c*` on lane `m*`; branch over every pair on
//! `m*` that could start before `c*`. This keeps an optimal schedule: in any schedule in
//! which `m*`'s next job starts at or after `c*`, `m*` is idle over the first job's
//! window, so moving that job there (to end at `c*`, no later than where it was) delays
//! nothing. Under fixed placement each job has one pair: the classic rule.

use crate::plan::{InstanceKey, PrefillPlan};

/// Optimal makespan in ns of `plan` (choosing placements where the plan allows), or
/// `None` when the plan has more than `max_instances` instances.
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
            options: plan
                .eligible(k)
                .iter()
                .filter_map(|&lane| plan.cost_on(k, lane).map(|c| (lane, c)))
                .collect(),
            min_cost: plan.min_cost_ns(k),
            preds: plan.predecessors(k).into_iter().map(index_of).collect(),
            tail: plan.bottom_level_ns(k),
        })
        .collect();
    let lanes = plan.lanes();
    let mut search = Search {
        jobs: &jobs,
        lanes,
        best: u64::MAX,
    };
    let state = State {
        finish: vec![None; jobs.len()],
        lane_free: vec![0; lanes],
    };
    search.branch(&state);
    Some(search.best)
}

struct Job {
    /// (lane, cost) for every lane the job may run on.
    options: Vec<(usize, u64)>,
    /// Cheapest cost over `options`.
    min_cost: u64,
    preds: Vec<usize>,
    /// Bottom level at cheapest costs: this job plus the longest chain after it.
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
    /// When job `j`'s predecessors are all done, or `None`.
    fn ready_at(&self, state: &State, j: usize) -> Option<u64> {
        let mut at = 0;
        for &p in &self.jobs[j].preds {
            at = at.max(state.finish[p]?);
        }
        Some(at)
    }

    /// A lower bound on any completion of `state`: the latest finish so far; each
    /// unscheduled job's earliest start plus its tail; each lane's free time plus the
    /// work only it can do; and all lanes' free times plus every job's cheapest cost,
    /// spread evenly over the lanes.
    fn bound(&self, state: &State) -> u64 {
        let mut forced = vec![0u64; self.lanes];
        let mut spread = 0u64;
        let mut bound = state.finish.iter().flatten().copied().max().unwrap_or(0);
        for (j, job) in self.jobs.iter().enumerate() {
            if state.finish[j].is_some() {
                continue;
            }
            if let [(lane, cost)] = job.options.as_slice() {
                forced[*lane] += cost;
            }
            spread += job.min_cost;
            let preds_done = job
                .preds
                .iter()
                .filter_map(|&p| state.finish[p])
                .max()
                .unwrap_or(0);
            let lane_free = job
                .options
                .iter()
                .map(|&(lane, _)| state.lane_free[lane])
                .min()
                .unwrap_or(0);
            bound = bound.max(preds_done.max(lane_free) + job.tail);
        }
        for (free, work) in state.lane_free.iter().zip(&forced) {
            bound = bound.max(free + work);
        }
        let total = state.lane_free.iter().sum::<u64>() + spread;
        bound.max(total.div_ceil(self.lanes as u64))
    }

    fn branch(&mut self, state: &State) {
        // (job, lane, start, cost) for every schedulable pair.
        let mut schedulable: Vec<(usize, usize, u64, u64)> = Vec::new();
        for j in (0..self.jobs.len()).filter(|&j| state.finish[j].is_none()) {
            let Some(ready) = self.ready_at(state, j) else {
                continue;
            };
            for &(lane, cost) in &self.jobs[j].options {
                schedulable.push((j, lane, ready.max(state.lane_free[lane]), cost));
            }
        }
        if schedulable.is_empty() {
            let makespan = state.finish.iter().flatten().copied().max().unwrap_or(0);
            self.best = self.best.min(makespan);
            return;
        }
        if self.bound(state) >= self.best {
            return;
        }
        let &(_, lane, s_star, cost_star) = schedulable
            .iter()
            .min_by_key(|(j, lane, s, c)| (s + c, *j, *lane))
            .expect("non-empty");
        let c_star = s_star + cost_star;
        for &(j, l, s, cost) in &schedulable {
            if l != lane || s >= c_star {
                continue;
            }
            let mut next = state.clone();
            let end = s + cost;
            next.finish[j] = Some(end);
            next.lane_free[lane] = end;
            self.branch(&next);
        }
    }
}
