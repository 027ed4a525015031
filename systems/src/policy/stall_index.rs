//! Eq. 6 kept, not recomputed: every ready home instance's stall-contribution total (the
//! modeled time of its set S, [`newly_enabled`](super::newly_enabled)), updated as
//! instances complete and arrive, and per lane ordered by `balance`'s home score.
//!
//! `balance` ranks a lane's own ready instances by (contribution C, bottom level, earliest
//! id) at every decision. Scoring them all each time cost a pass over S of every ready
//! instance per decision, which grows with the ready queues and so with the prompt. Here
//! a total changes only when an input of it does. For an instance `K = (c, s)`, S reads,
//! per successor stage `n` of `s`:
//! - `n` intra-chunk: whether `(c, t)` is done, for each stage `t` that `n` waits for;
//! - `n` cross-chunk: the done prefix of `s` and which chunks of `s` past it are done
//!   (only the instance at the prefix, `(prefix(s), s)`, has a cross-chunk S at all), and
//!   the done prefix of each stage `t` that `n` waits for.
//!
//! So the completion of `(c, t)` can change the totals of `(c, s)` for every stage `s`
//! with an intra-chunk successor that waits for `t`, and of `(prefix(s), s)` for every
//! stage `s` with a cross-chunk successor that waits for `t` (`s = t` included). Only
//! those are recomputed; marking more is harmless, fewer would be a wrong score (the
//! property test compares every kept total with a fresh one over random runs).
//!
//! The index follows the scheduler through two append-only logs, the completions
//! ([`StageProgress::completed`]) and the arrivals in the ready queues
//! ([`PickContext::arrivals`]); launches are told ([`StallIndex::launched`]). A context it
//! cannot follow (queues built by hand, a log shorter than seen) is read afresh.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::PickContext;
use super::eq6::{contribution_on, stall_total};
use crate::device::ProcessorKind;
use crate::graph::StageDependency;
use crate::plan::{InstanceKey, PrefillPlan};
use crate::progress::StageProgress;

/// A home instance's rank in `balance`: contribution C on its home lane, bottom level,
/// then the earliest id (the largest `Reverse`); the lane's best is the set's last.
pub type HomeScore = (i64, i64, Reverse<u32>);

/// The kept totals and per-lane orders; see the module doc.
#[derive(Clone, Debug, Default)]
pub struct StallIndex {
    /// Per stage, the stages whose instances of the same chunk read its done flags.
    intra_readers: Vec<Vec<u32>>,
    /// Per stage, the stages whose instance at their done prefix reads its done state.
    cross_readers: Vec<Vec<u32>>,
    /// Per lane, its processor's kind, which says whether C is negated there
    /// ([`contribution_on`]).
    kinds: Vec<ProcessorKind>,
    /// Per id, the total of S (valid where `tracked`).
    totals: Vec<u64>,
    /// Per id, whether it is a ready instance kept in its home lane's order.
    tracked: Vec<bool>,
    /// Per home lane, its ready instances by [`HomeScore`].
    by_lane: Vec<BTreeSet<HomeScore>>,
    /// How much of each log has been read.
    completions_seen: usize,
    arrivals_seen: usize,
    /// Scratch: ids whose total may have changed.
    dirty: Vec<u32>,
}

impl StallIndex {
    /// An empty index for `plan`: nothing ready, nothing read.
    pub fn new(plan: &PrefillPlan) -> Self {
        let mut index = StallIndex::default();
        index.reset(plan);
        index
    }

    /// Empties the index for `plan`, keeping its allocations (a decode step re-runs one
    /// small plan many times, and `start` is called for each run).
    pub fn reset(&mut self, plan: &PrefillPlan) {
        let stages = plan.stages.len();
        for readers in [&mut self.intra_readers, &mut self.cross_readers] {
            readers.resize_with(stages, Vec::new);
            readers.iter_mut().for_each(Vec::clear);
        }
        for reader in 0..stages as u32 {
            for &next in plan.successor_stages(reader) {
                let template = &plan.stages[next as usize];
                let readers = match template.dependency {
                    StageDependency::None => continue,
                    StageDependency::IntraChunk => &mut self.intra_readers,
                    StageDependency::CrossChunk => &mut self.cross_readers,
                };
                for &waited in template.after.iter().chain([&reader]) {
                    let list = &mut readers[waited as usize];
                    if !list.contains(&reader) {
                        list.push(reader);
                    }
                }
            }
        }
        self.kinds.clear();
        self.kinds
            .extend(plan.device.processors.iter().map(|p| p.kind));
        self.totals.clear();
        self.totals.resize(plan.id_space(), 0);
        self.tracked.clear();
        self.tracked.resize(plan.id_space(), false);
        self.by_lane
            .resize_with(plan.device.processors.len(), BTreeSet::new);
        self.by_lane.truncate(plan.device.processors.len());
        self.by_lane.iter_mut().for_each(BTreeSet::clear);
        self.completions_seen = 0;
        self.arrivals_seen = 0;
        self.dirty.clear();
    }

    /// Brings the index up to `ctx`: the completions and arrivals since the last look,
    /// then the totals they may have changed.
    pub fn sync(&mut self, ctx: &PickContext<'_>) {
        let (plan, progress) = (ctx.plan, ctx.progress);
        let completed = progress.completed();
        if self.totals.len() != plan.id_space()
            || self.by_lane.len() != ctx.ready.len()
            || completed.len() < self.completions_seen
            || ctx.arrivals.len() < self.arrivals_seen
        {
            return self.rebuild(ctx);
        }
        for &id in &completed[self.completions_seen..] {
            let done = plan.key(id as usize);
            for &stage in &self.intra_readers[done.stage as usize] {
                let key = InstanceKey {
                    chunk: done.chunk,
                    stage,
                };
                push_tracked(&mut self.dirty, &self.tracked, plan, key);
            }
            for &stage in &self.cross_readers[done.stage as usize] {
                let chunk = progress.done_prefix(stage);
                if chunk < plan.chunks {
                    let key = InstanceKey { chunk, stage };
                    push_tracked(&mut self.dirty, &self.tracked, plan, key);
                }
            }
        }
        self.completions_seen = completed.len();
        for &id in &ctx.arrivals[self.arrivals_seen..] {
            let home = plan.processor(plan.key(id as usize));
            if !self.tracked[id as usize] && ctx.ready[home].contains(&id) {
                self.track(plan, progress, id);
            }
        }
        self.arrivals_seen = ctx.arrivals.len();
        let mut dirty = std::mem::take(&mut self.dirty);
        for &id in &dirty {
            if self.tracked[id as usize] {
                self.untrack(plan, id);
                self.track(plan, progress, id);
            }
        }
        dirty.clear();
        self.dirty = dirty;
        let in_step = ctx
            .backlog
            .iter()
            .zip(&self.by_lane)
            .all(|(b, set)| b.count == set.len());
        if !in_step {
            self.rebuild(ctx);
        }
    }

    /// The lane's best ready home instance by [`HomeScore`], if it has one.
    pub fn best_home(&self, lane: usize) -> Option<u32> {
        self.by_lane[lane].last().map(|&(_, _, Reverse(id))| id)
    }

    /// The kept total of S of ready home instance `id` (`None` if it is not one).
    pub fn total(&self, id: u32) -> Option<u64> {
        self.tracked
            .get(id as usize)
            .copied()
            .unwrap_or(false)
            .then(|| self.totals[id as usize])
    }

    /// Instance `id` was launched: it leaves its home lane's order.
    pub fn launched(&mut self, plan: &PrefillPlan, id: u32) {
        if self.tracked.get(id as usize).copied().unwrap_or(false) {
            self.untrack(plan, id);
        }
    }

    /// Reads every ready home instance of `ctx` afresh.
    fn rebuild(&mut self, ctx: &PickContext<'_>) {
        self.reset(ctx.plan);
        for (lane, queue) in ctx.ready.iter().enumerate() {
            for &id in queue {
                if ctx.plan.processor(ctx.plan.key(id as usize)) == lane {
                    self.track(ctx.plan, ctx.progress, id);
                }
            }
        }
        self.completions_seen = ctx.progress.completed().len();
        self.arrivals_seen = ctx.arrivals.len();
    }

    fn score(&self, plan: &PrefillPlan, id: u32) -> (usize, HomeScore) {
        let key = plan.key(id as usize);
        let home = plan.processor(key);
        let c = contribution_on(self.kinds[home], self.totals[id as usize]);
        let rank = plan.bottom_level_ns(key) as i64;
        (home, (c, rank, Reverse(id)))
    }

    fn track(&mut self, plan: &PrefillPlan, progress: &StageProgress, id: u32) {
        let key = plan.key(id as usize);
        self.totals[id as usize] = stall_total(plan, progress, key);
        self.tracked[id as usize] = true;
        let (home, score) = self.score(plan, id);
        self.by_lane[home].insert(score);
    }

    fn untrack(&mut self, plan: &PrefillPlan, id: u32) {
        let (home, score) = self.score(plan, id);
        self.by_lane[home].remove(&score);
        self.tracked[id as usize] = false;
    }
}

/// Adds `key`'s id to `dirty` if it exists and is tracked.
fn push_tracked(dirty: &mut Vec<u32>, tracked: &[bool], plan: &PrefillPlan, key: InstanceKey) {
    if plan.exists(key) {
        let id = plan.id(key);
        if tracked[id] {
            dirty.push(id as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;

    use proptest::prelude::*;

    use super::StallIndex;
    use crate::device::ProcessorKind;
    use crate::placement::PlacementConfig;
    use crate::plan::{InstanceKey, PrefillPlan, Workload};
    use crate::policy::{LaneTimes, PickContext, stall_contribution, stall_total};
    use crate::progress::StageProgress;
    use crate::resources::ReadyQueues;
    use crate::shadow::{KeptSite, ShadowConfig, ShadowSite};
    use crate::testing::{processor, tiny_device, tiny_model};

    /// A random tiny plan: 1 to 3 layers, shadows at random sites (stages that wait for
    /// two, with the partner rule), fixed or flexible float placement over a CPU, an NPU
    /// and sometimes a GPU, 2 to 9 chunks.
    fn random_plan(layers: u32, sites: u8, gpu: bool, flexible: bool, chunks: u32) -> PrefillPlan {
        let kept: Vec<KeptSite> = (0..layers)
            .flat_map(|layer| {
                ShadowSite::ALL
                    .into_iter()
                    .enumerate()
                    .filter(move |(k, _)| sites >> ((layer as usize * 4 + k) % 8) & 1 == 1)
                    .map(move |(_, site)| KeptSite { layer, site })
            })
            .collect();
        let model = crate::model::ModelConfig {
            shadow: (!kept.is_empty()).then(|| ShadowConfig::with_sites(kept)),
            ..tiny_model(layers)
        };
        let mut device = tiny_device();
        if gpu {
            device
                .processors
                .push(processor("gpu", ProcessorKind::Gpu, 30.0, 30.0, 5.0));
        }
        let float: Vec<String> = if gpu && flexible {
            vec!["cpu".into(), "gpu".into()]
        } else {
            vec!["cpu".into()]
        };
        let placement = PlacementConfig {
            float: Some(float.clone()),
            attention: Some(float),
            ..PlacementConfig::default()
        };
        let workload = Workload {
            prompt_len: 16 * chunks,
            chunk_len: 16,
            float_processor: None,
        };
        PrefillPlan::placed(model, device, workload, placement).expect("a valid random plan")
    }

    /// The plain recomputation: every ready home instance's total, fresh.
    fn check_against_fresh(
        index: &StallIndex,
        plan: &PrefillPlan,
        progress: &StageProgress,
        ready: &ReadyQueues,
    ) -> Result<(), TestCaseError> {
        for (lane, queue) in ready.lanes.iter().enumerate() {
            let mut best = None;
            for &id in queue {
                let key = plan.key(id as usize);
                if plan.processor(key) != lane {
                    continue;
                }
                let fresh = stall_total(plan, progress, key);
                prop_assert_eq!(index.total(id), Some(fresh), "total of {:?}", key);
                let kind = plan.device.processors[lane].kind;
                let c = stall_contribution(plan, progress, key, kind);
                let score = (c, plan.bottom_level_ns(key) as i64, Reverse(id));
                if best.is_none_or(|b| score > b) {
                    best = Some(score);
                }
            }
            prop_assert_eq!(index.best_home(lane), best.map(|(_, _, Reverse(id))| id));
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

        /// Over random runs of random plans (jobs launched and completed in random order,
        /// several in flight), every total the index keeps equals Eq. 6 recomputed, and
        /// each lane's best home job is the plain scan's.
        #[test]
        fn kept_totals_equal_a_fresh_recomputation(
            layers in 1u32..4,
            sites in any::<u8>(),
            gpu in any::<bool>(),
            flexible in any::<bool>(),
            chunks in 2u32..10,
            steps in prop::collection::vec((any::<bool>(), any::<u16>(), any::<bool>()), 1..400),
        ) {
            let plan = random_plan(layers, sites, gpu, flexible, chunks);
            let mut progress = StageProgress::new(&plan);
            let mut ready = ReadyQueues::new(plan.lanes(), !flexible);
            let mut entered = vec![false; plan.id_space()];
            let enter_ready = |progress: &StageProgress, ready: &mut ReadyQueues, entered: &mut Vec<bool>| {
                for key in plan.instances() {
                    let id = plan.id(key);
                    if !entered[id] && plan.predecessors(key).iter().all(|&p| progress.is_done(&plan, p)) {
                        entered[id] = true;
                        ready.insert(&plan, id as u32);
                    }
                }
            };
            enter_ready(&progress, &mut ready, &mut entered);
            // Reset from another plan's index, as a policy started again is.
            let mut index = StallIndex::new(&random_plan(3, !sites, !gpu, !flexible, 11 - chunks));
            index.reset(&plan);
            let mut running: Vec<u32> = Vec::new();
            let times = LaneTimes { now_ns: 0, free_at_ns: vec![0; plan.lanes()] };
            for (launch, pick, look) in steps {
                let queued: Vec<u32> = ready.lanes.iter().flatten().copied().collect();
                if launch && !queued.is_empty() {
                    let id = queued[pick as usize % queued.len()];
                    ready.remove(&plan, id);
                    index.launched(&plan, id);
                    running.push(id);
                } else if !running.is_empty() {
                    let id = running.swap_remove(pick as usize % running.len());
                    progress.mark_done(&plan, plan.key(id as usize));
                    enter_ready(&progress, &mut ready, &mut entered);
                } else if queued.is_empty() {
                    break;
                }
                if look {
                    let ctx = PickContext {
                        plan: &plan,
                        progress: &progress,
                        ready: &ready.lanes,
                        backlog: ready.backlog(),
                        arrivals: ready.arrivals(),
                        times: &times,
                        lane: 0,
                        kind: plan.device.processors[0].kind,
                        request: None,
                    };
                    index.sync(&ctx);
                    check_against_fresh(&index, &plan, &progress, &ready)?;
                }
            }
        }
    }

    /// A context the index cannot follow (queues built by hand, no arrival log) is read
    /// afresh rather than trusted.
    #[test]
    fn a_context_without_logs_is_read_afresh() {
        let plan = random_plan(2, 0b1010, true, true, 4);
        let progress = StageProgress::new(&plan);
        let mut ready = ReadyQueues::new(plan.lanes(), false);
        for key in plan
            .instances()
            .filter(|k| plan.predecessors(*k).is_empty())
        {
            ready.insert(&plan, plan.id(key) as u32);
        }
        let times = LaneTimes {
            now_ns: 0,
            free_at_ns: vec![0; plan.lanes()],
        };
        let ctx = PickContext {
            plan: &plan,
            progress: &progress,
            ready: &ready.lanes,
            backlog: ready.backlog(),
            arrivals: &[],
            times: &times,
            lane: 0,
            kind: ProcessorKind::Cpu,
            request: None,
        };
        let mut index = StallIndex::new(&plan);
        index.sync(&ctx);
        let first = InstanceKey { chunk: 0, stage: 0 };
        assert!(index.total(plan.id(first) as u32).is_some());
        check_against_fresh(&index, &plan, &progress, &ready).unwrap();
    }
}
