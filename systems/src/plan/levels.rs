//! From the plan's lane costs to what the policies and the report read: each instance's
//! home, cheapest and mean cost, its top and bottom levels, HEFT's upward rank, and the
//! lower bound on any schedule's makespan. A plan priced again by another model (every
//! lane scaled to one total, or every stage priced anew) derives them again here.

use std::num::NonZeroU64;

use super::{InstanceKey, LowerBound, PrefillPlan};
use crate::bound::load_bound_ns;
use crate::device::ProcessorSpec;
use crate::error::PlanError;
use crate::graph::StageDependency;
use crate::model::OpDecl;

impl PrefillPlan {
    /// This plan with every lane cost scaled by one factor, so that its instances' home
    /// costs sum to `total_ns` (each at least 1 ns): the same stages and their shares of
    /// the work, priced by another model of the whole (a batched decode step's cost,
    /// [`crate::batched_decode_step_ns`]). Levels, ranks and the lower bound follow.
    pub fn with_home_total_ns(mut self, total_ns: u64) -> Self {
        let home: u64 = self.instances().map(|k| self.cost_ns(k)).sum();
        if home == 0 {
            return self;
        }
        let scale = total_ns as f64 / home as f64;
        for cost in self.lane_cost_ns.iter_mut().flatten() {
            let scaled = (cost.get() as f64 * scale).round() as u64;
            *cost = NonZeroU64::new(scaled.max(1)).expect("at least 1");
        }
        self.derive_from_lane_costs();
        self
    }

    /// This plan with every instance priced again on each lane it may run on by
    /// `price(stage operators, processor)`, ns (at least 1): the same stages, priced for
    /// another shape than the workload's (a decode batch of several sequences on the NPU,
    /// [`crate::decode_placement`]). Levels, ranks and the lower bound follow.
    ///
    /// # Errors
    /// [`PlanError::InvalidDevice`] where `price` gives `None` (the processor cannot run
    /// the stage's precision).
    pub(crate) fn with_stage_prices(
        mut self,
        mut price: impl FnMut(&[OpDecl], &ProcessorSpec) -> Option<u64>,
    ) -> Result<Self, PlanError> {
        let lanes = self.lanes();
        let keys: Vec<InstanceKey> = self.instances().collect();
        for key in keys {
            let id = self.id(key);
            for &lane in &self.stage_lanes[key.stage as usize] {
                let stage = &self.stages[key.stage as usize];
                let processor = &self.device.processors[lane];
                let ns = price(&stage.ops, processor).ok_or_else(|| {
                    PlanError::InvalidDevice(format!(
                        "processor `{}` cannot price stage {}",
                        processor.name, stage.name
                    ))
                })?;
                self.lane_cost_ns[id * lanes + lane] = NonZeroU64::new(ns.max(1));
            }
        }
        self.derive_from_lane_costs();
        Ok(self)
    }

    /// The home, cheapest and mean costs, levels, ranks and lower bound from
    /// `lane_cost_ns`.
    pub(super) fn derive_from_lane_costs(&mut self) {
        let lanes = self.lanes();
        let mut mean_cost_ns = vec![0; self.id_space()];
        let mut cost_ns = vec![0; self.id_space()];
        let mut min_cost_ns = vec![0; self.id_space()];
        for key in self.instances() {
            let id = self.id(key);
            let costs: Vec<u64> = self
                .eligible(key)
                .iter()
                .map(|&l| self.lane_cost_ns[id * lanes + l].map_or(0, NonZeroU64::get))
                .collect();
            cost_ns[id] = costs[0];
            min_cost_ns[id] = costs.iter().copied().min().unwrap_or(0);
            mean_cost_ns[id] = costs.iter().sum::<u64>() / costs.len() as u64;
        }
        self.cost_ns = cost_ns;
        self.min_cost_ns = min_cost_ns;
        self.top_level_ns = self.top_levels();
        self.bottom_level_ns = self.bottom_levels(&self.min_cost_ns);
        self.upward_rank_ns = self.bottom_levels(&mean_cost_ns);
        let options = self.instances().map(|key| {
            self.eligible(key)
                .iter()
                .filter_map(|&lane| self.cost_on(key, lane).map(|c| (lane, c)))
                .collect()
        });
        let busiest_processor_ns = load_bound_ns(self.lanes(), self.is_flexible(), options);
        self.lower_bound = LowerBound {
            busiest_processor_ns,
            critical_path_ns: self
                .instances()
                .map(|k| self.bottom_level_ns(k))
                .max()
                .unwrap_or(0),
        };
    }

    /// Lower bound: the load bound and the critical path (cheapest costs).
    pub fn lower_bound(&self) -> LowerBound {
        self.lower_bound
    }

    /// Longest dependency path from any entry to the start of `key`, in ns.
    pub fn top_level_ns(&self, key: InstanceKey) -> u64 {
        self.top_level_ns[self.id(key)]
    }

    /// Longest dependency path from the start of `key` to any exit, its own cost
    /// included, each instance at its cheapest processor, in ns.
    pub fn bottom_level_ns(&self, key: InstanceKey) -> u64 {
        self.bottom_level_ns[self.id(key)]
    }

    /// HEFT's upward rank: the bottom level with each instance at its mean cost over its
    /// eligible processors (equal to the bottom level under fixed placement), in ns.
    pub fn upward_rank_ns(&self, key: InstanceKey) -> u64 {
        self.upward_rank_ns[self.id(key)]
    }

    /// Top levels stage by stage: a stage starts when the last stage it waits for ends;
    /// for a cross-chunk stage, the running maximum of those ends over earlier chunks.
    fn top_levels(&self) -> Vec<u64> {
        let mut top = vec![0u64; self.id_space()];
        for stage in 1..self.stage_count() {
            let template = &self.stages[stage as usize];
            let mut prefix_max = 0u64;
            for chunk in 0..self.chunks {
                let finish = template
                    .after
                    .iter()
                    .map(|&s| InstanceKey { chunk, stage: s })
                    .filter(|k| self.exists(*k))
                    .map(|k| top[self.id(k)] + self.min_cost_ns(k))
                    .max()
                    .unwrap_or(0);
                prefix_max = prefix_max.max(finish);
                let key = InstanceKey { chunk, stage };
                if !self.exists(key) {
                    continue;
                }
                top[self.id(key)] = match template.dependency {
                    StageDependency::None => 0,
                    StageDependency::IntraChunk => finish,
                    StageDependency::CrossChunk => prefix_max,
                };
            }
        }
        top
    }

    /// Bottom levels under `cost` (by id) from the last stage back: the successors of
    /// G(i, j) are G(i, k) for each stage k waiting for j, and for a cross-chunk stage k
    /// every G(i', k) with i' >= i (a suffix maximum).
    fn bottom_levels(&self, cost: &[u64]) -> Vec<u64> {
        let mut bottom = vec![0u64; self.id_space()];
        for stage in (0..self.stage_count()).rev() {
            let mut tail = vec![0u64; self.chunks as usize];
            for &next in self.successor_stages(stage) {
                let cross = self.stages[next as usize].dependency == StageDependency::CrossChunk;
                let mut suffix_max = 0u64;
                for chunk in (0..self.chunks).rev() {
                    let after = InstanceKey { chunk, stage: next };
                    let level = if self.exists(after) {
                        bottom[self.id(after)]
                    } else {
                        0
                    };
                    suffix_max = suffix_max.max(level);
                    let t = &mut tail[chunk as usize];
                    *t = (*t).max(if cross { suffix_max } else { level });
                }
            }
            for chunk in 0..self.chunks {
                let key = InstanceKey { chunk, stage };
                if self.exists(key) {
                    bottom[self.id(key)] = cost[self.id(key)] + tail[chunk as usize];
                }
            }
        }
        bottom
    }
}
