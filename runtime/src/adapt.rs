//! Costs that follow the machine: a measured profile's stage costs scaled to what a run
//! history says the machine does now (`hetsched run --profile P --history H --adapt`).
//!
//! A profile is measured once; the machine it describes drifts (a phone throttles when it
//! warms; a virtual machine's host gets busier). On this machine the drift was measured:
//! three rounds of the fidelity grid right after a profile ran 1-18% slower per round
//! than the first (docs/calibration.md), and the prediction error grew with them (median
//! 6% in the first round, 18% in the third). StarPU's history-based models answer this by
//! refitting from every execution; here each stage kind's cost is multiplied by the
//! median ratio of its recent measured durations to what the profile predicts for their
//! shapes, so the fitted shape (launch, per token, per pair) is kept and only the level
//! follows the machine.
//!
//! Only records of instances that ran alone ([`HistoryRecord::alone`]) and cold
//! ([`HistoryRecord::warm`]) count: a profile's costs are of jobs alone on the pool
//! (`inorder`) reading their weights from memory; a job sharing the cores with another
//! lane's is slower by the sharing, and one whose weights were still cached faster by
//! the saving, both of which the pool model adds on its own.

use hetsched_systems::model::ChunkShape;
use hetsched_systems::{CostAdaptation, DeviceProfile, StageCost, median};

use crate::history::HistoryRecord;

/// Recent records per stage kind a factor is the median of: about one 2048-token prefill
/// at chunk 64 of one kind (32 chunks x 30 layers), several shorter ones.
pub const RECENT_RECORDS: usize = 256;

/// Bytes at the end of a history read for the recent records (a 2048-token prefill at
/// chunk 64 writes about 2 MB of records; older ones are not read).
pub const RECENT_BYTES: u64 = 32 << 20;

/// Fewer matching records than this and a stage kind's cost is left as profiled (one
/// short prefill gives 30: every layer of one chunk).
pub const MIN_RECORDS: usize = 16;

/// Factors outside this range are not drift but another machine, model or build: the
/// cost is left as profiled and the adaptation says so by its absence.
pub const FACTOR_RANGE: (f64, f64) = (0.25, 4.0);

/// `device`'s measured stage costs (and their one-thread costs) scaled to `records` of
/// `model` on `threads` compute threads: per (stage kind, processor, precision) the median
/// of `ns / predicted` over its last [`RECENT_RECORDS`] records that ran alone. Returns
/// the adapted device (its `measured.adapted` lists every factor applied) — `device`
/// unchanged when it is not a measured profile.
pub fn adapt_to_history(
    device: &DeviceProfile,
    records: &[HistoryRecord],
    model: &str,
    threads: usize,
) -> DeviceProfile {
    let mut adapted = device.clone();
    let Some(origin) = adapted.measured.as_mut() else {
        return adapted;
    };
    let threads = u32::try_from(threads).ok();
    let mut applied = Vec::new();
    for processor in &mut adapted.processors {
        for cost in &mut processor.cost.stages {
            let recent = recent_records(records, model, threads, &processor.name, cost);
            let Some(factor) = median_ratio(cost, &recent) else {
                continue;
            };
            *cost = cost.scaled(factor);
            if let Some(one) = origin.one_thread.iter_mut().find(|c| {
                c.processor == processor.name
                    && c.cost.stage == cost.stage
                    && c.cost.precision == cost.precision
            }) {
                one.cost = one.cost.scaled(factor);
            }
            applied.push(CostAdaptation {
                stage: cost.stage.clone(),
                processor: processor.name.clone(),
                precision: cost.precision.clone(),
                factor,
                records: recent.len(),
            });
        }
    }
    origin.adapted = applied;
    adapted
}

/// The last [`RECENT_RECORDS`] records of `cost`'s stage kind and precision on
/// `processor`, of `model` on `threads`, that ran alone.
fn recent_records<'a>(
    records: &'a [HistoryRecord],
    model: &str,
    threads: Option<u32>,
    processor: &str,
    cost: &StageCost,
) -> Vec<&'a HistoryRecord> {
    records
        .iter()
        .rev()
        .filter(|r| {
            r.alone == Some(true)
                && r.warm != Some(true)
                && r.threads == threads
                && r.model == model
                && r.processor == processor
                && r.stage == cost.stage
                && r.precision == cost.precision
        })
        .take(RECENT_RECORDS)
        .collect()
}

/// The median of measured over predicted time, if there are enough records and it is
/// within [`FACTOR_RANGE`].
fn median_ratio(cost: &StageCost, records: &[&HistoryRecord]) -> Option<f64> {
    let mut ratios: Vec<f64> = records
        .iter()
        .filter_map(|r| {
            let predicted = cost.ns(ChunkShape {
                tokens: r.tokens,
                past: r.past,
            });
            (predicted > 0.0).then(|| r.ns as f64 / predicted)
        })
        .collect();
    if ratios.len() < MIN_RECORDS {
        return None;
    }
    let factor = median(&mut ratios);
    (FACTOR_RANGE.0..=FACTOR_RANGE.1)
        .contains(&factor)
        .then_some(factor)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hetsched_systems::PolicyRegistry;
    use hetsched_systems::testing::{bare_profile_origin, tiny_plan};

    use super::*;
    use crate::engine::simulate;
    use crate::history::records_on;
    use crate::profiling::fit_profile;

    /// A measured profile fitted from a simulated run's records, and those records (the
    /// simulated lanes overlap: some records did not run alone).
    fn profiled() -> (DeviceProfile, Vec<HistoryRecord>, String) {
        let plan = Arc::new(tiny_plan(4, 512, 32));
        let run = simulate(
            plan.clone(),
            PolicyRegistry::builtin().create("inorder").unwrap(),
        )
        .unwrap();
        let records = records_on(&run, 2, None);
        let mut device = plan.device.clone();
        fit_profile(&mut device, &records);
        device.measured = Some(bare_profile_origin(&plan.model.name, 2));
        (device, records, plan.model.name.clone())
    }

    fn slowed(records: &[HistoryRecord], factor: f64) -> Vec<HistoryRecord> {
        records
            .iter()
            .map(|r| HistoryRecord {
                ns: (r.ns as f64 * factor) as u64,
                ..r.clone()
            })
            .collect()
    }

    #[test]
    fn a_uniformly_slower_machine_scales_every_cost_by_its_factor() {
        let (device, records, model) = profiled();
        let factors = |records: &[HistoryRecord]| {
            let adapted = adapt_to_history(&device, records, &model, 2);
            (adapted.measured.clone().unwrap().adapted, adapted)
        };
        // The fit's own residuals give factors near 1 on the records it was fitted on.
        let (as_fitted, _) = factors(&records);
        let (slower, adapted) = factors(&slowed(&records, 1.3));
        let kinds: usize = device
            .processors
            .iter()
            .flat_map(|p| p.cost.stages.iter().map(|c| (&p.name, &c.stage)))
            .filter(|&(processor, stage)| {
                let of_kind = |r: &&HistoryRecord| {
                    r.processor == *processor && r.stage == *stage && r.alone == Some(true)
                };
                records.iter().filter(of_kind).count() >= MIN_RECORDS
            })
            .count();
        assert!(kinds >= 4);
        assert_eq!(slower.len(), kinds, "every kind with enough records");
        for (base, slow) in as_fitted.iter().zip(&slower) {
            assert_eq!(
                (&base.stage, &base.processor),
                (&slow.stage, &slow.processor)
            );
            let ratio = slow.factor / base.factor;
            assert!((ratio - 1.3).abs() < 0.01, "{}: x{ratio}", base.stage);
        }
        let shape = ChunkShape {
            tokens: 64,
            past: 128,
        };
        let scaled = device.processors.iter().zip(&adapted.processors);
        let costs = scaled.flat_map(|(b, a)| {
            let pairs = b.cost.stages.iter().zip(&a.cost.stages);
            pairs.map(move |(before, after)| (&b.name, before, after))
        });
        for (processor, before, after) in costs {
            let factor = slower
                .iter()
                .find(|a| &a.processor == processor && a.stage == before.stage)
                .map_or(1.0, |a| a.factor);
            let ratio = after.ns(shape) / before.ns(shape);
            assert!((ratio - factor).abs() < 1e-9, "{}", before.stage);
        }
    }

    #[test]
    fn records_of_other_threads_overlapped_or_warm_jobs_or_absurd_factors_change_nothing() {
        let (device, records, model) = profiled();
        let alone = adapt_to_history(&device, &slowed(&records, 1.3), &model, 2);
        assert!(!alone.measured.unwrap().adapted.is_empty());
        let on_one = adapt_to_history(&device, &slowed(&records, 1.3), &model, 1);
        assert_eq!(on_one.processors, device.processors);
        // Jobs that shared the cores ran slower, and jobs whose weights were still cached
        // faster, than the cold cost alone: neither is read.
        let unchanged = |factor: f64, mark: fn(&mut HistoryRecord)| {
            let mut marked = slowed(&records, factor);
            marked.iter_mut().for_each(mark);
            adapt_to_history(&device, &marked, &model, 2).processors == device.processors
        };
        assert!(unchanged(1.3, |r| r.alone = Some(false)));
        assert!(unchanged(0.7, |r| r.warm = Some(true)));
        let absurd = adapt_to_history(&device, &slowed(&records, 10.0), &model, 2);
        assert_eq!(absurd.processors, device.processors);
        assert!(absurd.measured.unwrap().adapted.is_empty());
    }

    #[test]
    fn an_estimated_profile_is_left_as_it_is() {
        let (mut device, records, model) = profiled();
        device.measured = None;
        assert_eq!(adapt_to_history(&device, &records, &model, 2), device);
    }
}
