//! Whether a job's weights are still in the last-level cache when it starts.
//!
//! A profile's samples run `inorder`: each chunk walks every layer before the next chunk
//! starts, so by the time a stage runs again its weights were pushed out by the rest of
//! the model (SmolLM2-135M at w8a8: 107 MB of linears against a 32 MiB cache). Under
//! `balance` and `stall` a few chunks follow each other a few stages apart, so a stage's
//! weights were read a few megabytes ago. Traced on a 2-core AMD EPYC (w8a8, prompt
//! 512, chunk 64, jobs that ran alone): the INT8 stages took 0.73-0.75 of their `inorder`
//! time (FFN 506 against 693 us, QKV 106 against 143, O 63 against 87), about 70 us
//! saved per megabyte of weights for all three. Without it the model priced every
//! `balance` job cold: its NPU lane 20-49% long at chunks 64 and 128.
//!
//! The rule: a job starts warm when the weights of the jobs that started since its
//! stage's last job (of any chunk) add up, with its own, to at most the cache. Its work
//! is then its measured (cold) cost less `ns_per_byte` per weight byte, at most half of
//! it. [`ReuseTracker`] applies the rule in start order; [`warm_saving_per_byte`]
//! measures `ns_per_byte` from `layerwise` runs, whose jobs run alone, each stage's
//! first chunk cold and the rest warm (measuring it from pairs of an `inorder` and a
//! `balance` run failed: the two sides minutes apart, and few of `balance`'s warm jobs
//! alone; its figure moved 4x between profiles).

use std::collections::BTreeMap;

use hetsched_systems::PrefillPlan;
use hetsched_systems::stage_kind;

use crate::engine::RunOutcome;
use crate::overlap::overlaps;

/// The most of a job's work its cached weights may save: the rule sees bytes, not how
/// much of the job reading them is.
pub const MAX_WARM_SAVING: f64 = 0.5;

/// At most this share of a job's time overlapped another lane's job: it ran alone.
const ALONE: f64 = 0.05;

/// Jobs of a (stage kind, tokens, lane) needed on each side, cold and warm, to count it.
const MIN_JOBS: usize = 3;

/// How cached weights price a job: the cache's size and the saving per byte.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmWeights {
    /// The last-level cache, bytes.
    pub cache_bytes: u64,
    /// Nanoseconds saved per weight byte still cached.
    pub ns_per_byte: f64,
}

impl WarmWeights {
    /// The work of a job of `work` ns whose stage streams `bytes` of weights, when warm.
    ///
    /// # Examples
    /// ```
    /// use hetsched_runtime::weight_reuse::WarmWeights;
    /// let warm = WarmWeights { cache_bytes: 32 << 20, ns_per_byte: 0.07 };
    /// assert_eq!(warm.warm_work(500_000.0, 1_000_000), 430_000.0);
    /// assert_eq!(warm.warm_work(100_000.0, 1_000_000), 50_000.0); // at most half saved
    /// ```
    pub fn warm_work(&self, work: f64, bytes: u64) -> f64 {
        let saving = (bytes as f64 * self.ns_per_byte).min(work * MAX_WARM_SAVING);
        work - saving
    }
}

/// The weight bytes each stage of `plan` streams per job, by stage index.
pub fn stage_weight_bytes(plan: &PrefillPlan) -> Vec<u64> {
    plan.stages
        .iter()
        .map(|stage| {
            stage
                .ops
                .iter()
                .filter(|op| op.streams_weights())
                .map(|op| op.weight_bytes(&plan.model))
                .fold(0, u64::saturating_add)
        })
        .collect()
}

/// The weights streamed so far, in job start order, and where each stage last started.
#[derive(Clone, Debug, Default)]
pub struct ReuseTracker {
    streamed: u64,
    last: Vec<Option<u64>>,
}

impl ReuseTracker {
    /// A job of `stage` that streams `bytes` starts: whether its weights are still in a
    /// cache of `cache_bytes` (the other stages' weights streamed since its stage last
    /// started, and its own, fit). A stage's first job is cold.
    ///
    /// # Examples
    /// ```
    /// use hetsched_runtime::weight_reuse::ReuseTracker;
    /// let mut t = ReuseTracker::default();
    /// let mb = 1 << 20;
    /// assert!(!t.start(0, 4 * mb, 16 * mb)); // first: cold
    /// assert!(!t.start(1, 4 * mb, 16 * mb));
    /// assert!(t.start(0, 4 * mb, 16 * mb)); // 4 MB since, 8 with its own
    /// for s in 2..5 {
    ///     t.start(s, 4 * mb, 16 * mb);
    /// }
    /// assert!(t.start(0, 4 * mb, 16 * mb)); // 12 MB since, 16 with its own: fits
    /// for s in 2..6 {
    ///     t.start(s, 4 * mb, 16 * mb);
    /// }
    /// assert!(!t.start(0, 4 * mb, 16 * mb)); // 16 MB since: pushed out
    /// ```
    pub fn start(&mut self, stage: usize, bytes: u64, cache_bytes: u64) -> bool {
        if self.last.len() <= stage {
            self.last.resize(stage + 1, None);
        }
        // `last` is where the stage's previous job finished streaming: what came after
        // is the other stages' weights only (counting its own again would count it twice).
        let since = self.last[stage].map(|end| self.streamed - end);
        self.streamed = self.streamed.saturating_add(bytes);
        self.last[stage] = Some(self.streamed);
        since.is_some_and(|since| bytes > 0 && since.saturating_add(bytes) <= cache_bytes)
    }
}

/// Each slice of `run`'s timeline (in its order): whether its weights were warm at its
/// start, by [`ReuseTracker`] over the slices in start order.
pub fn warm_slices(run: &RunOutcome, cache_bytes: u64) -> Vec<bool> {
    warm_in_start_order(run, &stage_weight_bytes(&run.plan), cache_bytes)
}

/// [`warm_slices`] with each stage's weight bytes given.
fn warm_in_start_order(run: &RunOutcome, bytes: &[u64], cache_bytes: u64) -> Vec<bool> {
    let slices = &run.timeline.slices;
    let mut order: Vec<usize> = (0..slices.len()).collect();
    order.sort_by_key(|&i| (slices[i].start_ns, slices[i].id));
    let mut tracker = ReuseTracker::default();
    let mut warm = vec![false; slices.len()];
    for i in order {
        let stage = slices[i].key.stage as usize;
        warm[i] = tracker.start(stage, bytes[stage], cache_bytes);
    }
    warm
}

/// Nanoseconds a warm job saves per weight byte, from `runs` whose jobs each ran alone
/// (`layerwise`: each stage's first chunk cold, the rest warm, in one run, so a slow
/// spell of the machine weighs on both sides alike): per (stage kind, chunk size, lane),
/// the median of its cold jobs less the median of its warm ones (warm by
/// [`ReuseTracker`] in a cache of `cache_bytes`), over the stage's weight bytes; the
/// median over the groups with at least 3 jobs on each side. Jobs that overlapped
/// another lane's, and stages that stream no weights, are left out. `None` when no
/// group has enough jobs (nothing ran warm and alone); at least 0.
pub fn warm_saving_per_byte(runs: &[RunOutcome], cache_bytes: u64) -> Option<f64> {
    type Key = (String, u64, usize);
    // Per group: cold spans, warm spans, the stage's weight bytes.
    let mut groups: BTreeMap<Key, (Vec<f64>, Vec<f64>, u64)> = BTreeMap::new();
    for run in runs {
        let bytes = stage_weight_bytes(&run.plan);
        let is_warm = warm_in_start_order(run, &bytes, cache_bytes);
        let overlapped = overlaps(&run.timeline.slices);
        for ((s, &warm), &c) in run.timeline.slices.iter().zip(&is_warm).zip(&overlapped) {
            let stage = s.key.stage as usize;
            let span = s.end_ns.saturating_sub(s.start_ns);
            let alone = c as f64 <= ALONE * span as f64;
            if bytes[stage] == 0 || !alone {
                continue;
            }
            let tokens = run.plan.executed_shape(s.key).tokens;
            let kind = stage_kind(&run.plan.stages[stage].ops);
            let group = groups.entry((kind, tokens, s.processor)).or_default();
            let side = if warm { &mut group.1 } else { &mut group.0 };
            side.push(span as f64);
            group.2 = bytes[stage];
        }
    }
    let savings: Vec<f64> = groups
        .into_values()
        .filter(|(c, w, _)| c.len() >= MIN_JOBS && w.len() >= MIN_JOBS)
        .map(|(c, w, b)| (median(c) - median(w)) / b as f64)
        .collect();
    (!savings.is_empty()).then(|| median(savings).max(0.0))
}

fn median(mut values: Vec<f64>) -> f64 {
    hetsched_systems::median(&mut values)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hetsched_systems::resources::{RunStats, SliceRecord, TimelineLog};
    use hetsched_systems::testing::tiny_plan;
    use hetsched_systems::{InstanceKey, PrefillPlan};

    use super::*;

    /// A run of `plan` on one lane, its jobs one after another in `order`, each taking
    /// `cost(stage)` less `saving` per weight byte when warm in a cache of `cache`.
    fn sequential(
        plan: &Arc<PrefillPlan>,
        order: &[InstanceKey],
        cache: u64,
        saving: f64,
    ) -> RunOutcome {
        let bytes = stage_weight_bytes(plan);
        let mut tracker = ReuseTracker::default();
        let mut now = 0;
        let slices = order
            .iter()
            .map(|&key| {
                let stage = key.stage as usize;
                let cold = 20_000 + bytes[stage] / 64;
                let warm = tracker.start(stage, bytes[stage], cache);
                let span = if warm {
                    cold - (bytes[stage] as f64 * saving) as u64
                } else {
                    cold
                };
                let slice = SliceRecord {
                    id: plan.id(key) as u32,
                    request: Default::default(),
                    key,
                    processor: 0,
                    start_ns: now,
                    end_ns: now + span,
                    estimated_ns: cold,
                };
                now += span + 1_000;
                slice
            })
            .collect();
        RunOutcome {
            plan: plan.clone(),
            policy: "test".into(),
            timeline: TimelineLog {
                slices,
                counters: Vec::new(),
            },
            makespan_ns: now,
            stats: RunStats::default(),
            tick_wall_ns: Vec::new(),
        }
    }

    #[test]
    fn the_saving_per_byte_of_warm_jobs_is_recovered() {
        let plan = Arc::new(tiny_plan(4, 64, 16));
        let bytes = stage_weight_bytes(&plan);
        let by_chunk: Vec<InstanceKey> = plan.instances().collect();
        // Chunk by chunk, a stage's weights come back after every other stage of a
        // chunk: cold in a cache one byte short of a chunk's. Stage by stage, at once:
        // warm.
        let first_chunk = by_chunk.iter().filter(|k| k.chunk == 0);
        let chunk_bytes: u64 = first_chunk.map(|k| bytes[k.stage as usize]).sum();
        let cache = chunk_bytes - 1;
        assert!(bytes.iter().all(|&b| b < chunk_bytes), "{bytes:?}");
        let mut by_stage = by_chunk.clone();
        by_stage.sort_by_key(|k| (k.stage, k.chunk));
        let cold = sequential(&plan, &by_chunk, cache, 0.02);
        assert!(!warm_slices(&cold, cache).contains(&true));
        let warm = sequential(&plan, &by_stage, cache, 0.02);
        // Both sides from the same runs: chunk by chunk gives the cold jobs, stage by
        // stage each stage's first job cold too (too few alone) and the rest warm.
        let found = warm_saving_per_byte(&[cold.clone(), warm.clone()], cache).unwrap();
        assert!((found - 0.02).abs() < 1e-3, "{found}");
        // Nothing warm: nothing to measure.
        assert_eq!(warm_saving_per_byte(&[cold], cache), None);
    }

    /// A simulated `layerwise` run: its jobs never overlap, and in a cache that holds a
    /// layer's weights every stage's first chunk is cold and the rest warm.
    #[test]
    fn layerwise_runs_each_stage_cold_once_then_warm() {
        let plan = Arc::new(tiny_plan(3, 64, 16));
        let policy = hetsched_systems::PolicyRegistry::builtin()
            .create("layerwise")
            .unwrap();
        let run = crate::engine::simulate(plan.clone(), policy).unwrap();
        let mut slices = run.timeline.slices.clone();
        slices.sort_by_key(|s| s.start_ns);
        assert!(slices.windows(2).all(|w| w[0].end_ns <= w[1].start_ns));
        let bytes = stage_weight_bytes(&plan);
        let layer_bytes: u64 = plan
            .stages
            .iter()
            .zip(&bytes)
            .filter(|(s, _)| s.layer == Some(0))
            .map(|(_, b)| b)
            .sum();
        let warm = warm_slices(&run, layer_bytes);
        for (slice, warm) in run.timeline.slices.iter().zip(warm) {
            let streams = bytes[slice.key.stage as usize] > 0;
            let last_chunk_only = plan.stages[slice.key.stage as usize].last_chunk_only;
            let expected = streams && slice.key.chunk > 0 && !last_chunk_only;
            assert_eq!(warm, expected, "{:?}", slice.key);
        }
    }
}
