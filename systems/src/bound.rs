//! The load part of the makespan lower bound, under fixed or flexible placement.
//!
//! Fixed placement: the busiest processor's work. Flexible placement: no schedule can
//! beat the best *fractional* spread of the work, where each instance may be split over
//! its eligible processors at each one's own cost. That linear programme (minimise T with
//! every processor's share at most T) has the dual
//!
//! ```text
//! max over weights w >= 0 with sum(w) = 1 of  sum over instances j of min over eligible p of w_p * c_jp
//! ```
//!
//! and *every* weight vector gives a valid bound: any schedule's makespan T is at least
//! `sum_p w_p * load_p >= sum_j min_p w_p * c_jp`. So the search below only has to find
//! good weights, never prove it found the best: whatever it returns is a true lower bound.
//! Weights are integers out of `SCALE` and the sum is floored, so rounding never lifts
//! the bound above its exact value. The dual is concave in `w`; a nested ternary search
//! over the simplex finds its maximum up to the grid. Instances with the same eligible
//! costs are grouped first (every chunk's copy of a static stage costs the same), so the
//! search costs O(groups) per evaluation.

use std::collections::BTreeMap;

/// Weight resolution: weights are `k / SCALE`.
const SCALE: u64 = 1 << 20;

/// Lanes beyond which the search is skipped (its cost grows as 70^lanes); the forced-work
/// bound below still holds.
const MAX_SEARCH_LANES: usize = 4;

/// The load bound in ns (see the module doc) of instances on `lanes` processors, each
/// given by its options: the (lane, cost in ns) of every lane it may run on. Under fixed
/// placement (`flexible` false) the busiest processor's work.
pub(crate) fn load_bound_ns(
    lanes: usize,
    flexible: bool,
    instances: impl IntoIterator<Item = Vec<(usize, u64)>>,
) -> u64 {
    // Group instances by their (lane, cost) options.
    let mut groups: BTreeMap<Vec<(usize, u64)>, u64> = BTreeMap::new();
    for options in instances {
        *groups.entry(options).or_default() += 1;
    }
    // Work that can only go to one processor: the vertices of the simplex, and the whole
    // answer under fixed placement.
    let mut forced = vec![0u64; lanes];
    for (options, count) in &groups {
        if let [(lane, cost)] = options.as_slice() {
            forced[*lane] += cost * count;
        }
    }
    let forced_max = forced.iter().copied().max().unwrap_or(0);
    if !flexible {
        return forced_max;
    }
    let used: Vec<usize> = (0..lanes)
        .filter(|l| groups.keys().any(|o| o.iter().any(|(lane, _)| lane == l)))
        .collect();
    if used.len() > MAX_SEARCH_LANES {
        return forced_max;
    }
    let groups: Vec<(Vec<(usize, u64)>, u64)> = groups
        .into_iter()
        .map(|(options, count)| {
            let local = options
                .into_iter()
                .map(|(lane, cost)| {
                    (
                        used.iter().position(|&u| u == lane).expect("used lane"),
                        cost,
                    )
                })
                .collect();
            (local, count)
        })
        .collect();
    let dual = Dual { groups: &groups };
    let mut weights = vec![0u64; used.len()];
    forced_max.max(dual.search(&mut weights, 0, SCALE))
}

/// The dual objective over grouped instances, with lanes renumbered to the used ones.
struct Dual<'a> {
    groups: &'a [(Vec<(usize, u64)>, u64)],
}

impl Dual<'_> {
    /// `sum_j min_p w_p c_jp`, floored, for integer weights out of `SCALE`.
    fn value(&self, weights: &[u64]) -> u64 {
        let total: u128 = self
            .groups
            .iter()
            .map(|(options, count)| {
                let cheapest = options
                    .iter()
                    .map(|&(lane, cost)| u128::from(weights[lane]) * u128::from(cost))
                    .min()
                    .unwrap_or(0);
                cheapest * u128::from(*count)
            })
            .sum();
        (total / u128::from(SCALE)) as u64
    }

    /// The best value with `weights[..lane]` fixed and `left` weight to spread over
    /// `weights[lane..]`: ternary search on this lane's weight, recursing for the rest.
    fn search(&self, weights: &mut [u64], lane: usize, left: u64) -> u64 {
        if lane + 1 == weights.len() {
            weights[lane] = left;
            return self.value(weights);
        }
        let at = |k: u64, weights: &mut [u64]| {
            weights[lane] = k;
            self.search(weights, lane + 1, left - k)
        };
        let (mut lo, mut hi) = (0u64, left);
        while hi - lo > 2 {
            let m1 = lo + (hi - lo) / 3;
            let m2 = hi - (hi - lo) / 3;
            let (f1, f2) = (at(m1, weights), at(m2, weights));
            // Concave: the maximum lies on the side of the larger value.
            if f1 < f2 {
                lo = m1 + 1;
            } else if f1 > f2 {
                hi = m2 - 1;
            } else {
                lo = m1;
                hi = m2;
            }
        }
        (lo..=hi).map(|k| at(k, weights)).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use crate::placement::PlacementConfig;
    use crate::plan::{InstanceKey, PrefillPlan, Workload};
    use crate::testing::{tiny_device, tiny_model};

    /// The two-processor fractional optimum, exactly: jobs sorted by how much cheaper they
    /// are on processor 0, processor 0 takes a prefix and one job is split.
    fn two_processor_optimum(jobs: &[(u64, u64)]) -> f64 {
        let mut jobs = jobs.to_vec();
        jobs.sort_by(|x, y| (x.0 as f64 / x.1 as f64).total_cmp(&(y.0 as f64 / y.1 as f64)));
        let (mut on_0, mut on_1) = (0.0, jobs.iter().map(|j| j.1 as f64).sum::<f64>());
        for &(a, b) in &jobs {
            let (a, b) = (a as f64, b as f64);
            if on_0 + a >= on_1 - b {
                // Split: x of it on processor 0 so both loads meet.
                let x = (on_1 - on_0) / (a + b);
                return on_0 + x * a;
            }
            on_0 += a;
            on_1 -= b;
        }
        on_0.max(on_1)
    }

    #[test]
    fn the_dual_search_finds_the_two_processor_optimum() {
        let every = Some(vec!["npu".to_string(), "cpu".to_string()]);
        let placement = PlacementConfig {
            int8_linear: every.clone(),
            attention: every.clone(),
            float: every,
            shadow: None,
        };
        let workload = Workload {
            prompt_len: 512,
            chunk_len: 128,
            float_processor: None,
        };
        let plan = PrefillPlan::placed(tiny_model(2), tiny_device(), workload, placement).unwrap();
        let (cpu, npu) = (0, 1);
        let jobs: Vec<(u64, u64)> = plan
            .instances()
            .map(|k: InstanceKey| (plan.cost_on(k, npu).unwrap(), plan.cost_on(k, cpu).unwrap()))
            .collect();
        let exact = two_processor_optimum(&jobs);
        let found = plan.lower_bound().busiest_processor_ns as f64;
        assert!(found <= exact + 1.0, "{found} above the LP optimum {exact}");
        assert!(
            found >= 0.999 * exact,
            "{found} far below the LP optimum {exact}"
        );
        // Fixed placement: the busiest processor.
        let fixed = crate::testing::tiny_plan(2, 512, 128);
        let busiest = fixed.work_per_processor().into_iter().max().unwrap();
        assert_eq!(fixed.lower_bound().busiest_processor_ns, busiest);
    }
}
