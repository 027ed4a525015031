//! Predicted against measured: a real run beside the simulation of the same plan (same
//! device profile, same policy), and which cost model priced each kind of stage.

use std::collections::BTreeMap;

use hetsched_systems::{CostAdaptation, CostSource, PrefillPlan, stage_kind};
use serde::Serialize;

use crate::engine::RunOutcome;

/// Which cost model the policy's plan used, stage kind by stage kind (home processors).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CostModelUse {
    /// `measured` when every stage kind had a fitted cost, `roofline` when none had,
    /// `mixed` otherwise.
    pub model: &'static str,
    /// Stage kinds priced by a fitted, measured cost.
    pub measured_stage_kinds: usize,
    /// Stage kinds the profile had no measured cost for (priced by the roofline).
    pub roofline_stage_kinds: Vec<String>,
    /// Measured costs scaled to the run history (`run --adapt`), kind by kind; empty
    /// when the profile's costs were used as fitted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub adapted: Vec<CostAdaptation>,
}

impl CostModelUse {
    /// How `plan`'s stages were priced on their home processors.
    pub fn of(plan: &PrefillPlan) -> CostModelUse {
        let mut kinds: BTreeMap<String, CostSource> = BTreeMap::new();
        for (stage, &lane) in plan.stages.iter().zip(&plan.stage_processor) {
            let source = plan.device.processors[lane]
                .cost
                .source(&plan.model, &stage.ops);
            kinds.insert(stage_kind(&stage.ops), source);
        }
        let roofline: Vec<String> = kinds
            .iter()
            .filter(|(_, s)| **s == CostSource::Roofline)
            .map(|(k, _)| k.clone())
            .collect();
        let measured = kinds.len() - roofline.len();
        CostModelUse {
            model: match (measured, roofline.len()) {
                (_, 0) => "measured",
                (0, _) => "roofline",
                _ => "mixed",
            },
            measured_stage_kinds: measured,
            roofline_stage_kinds: roofline,
            adapted: plan
                .device
                .measured
                .as_ref()
                .map(|m| m.adapted.clone())
                .unwrap_or_default(),
        }
    }
}

/// One processor's busy time, predicted and measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BusyPrediction {
    /// Processor name.
    pub name: String,
    /// Simulated busy time, in ms.
    pub predicted_ms: f64,
    /// Measured busy time (compute only), in ms.
    pub measured_ms: f64,
    /// (predicted - measured) / measured.
    pub error: f64,
}

/// One stage kind's total time over the run, predicted and measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageKindPrediction {
    /// The stage kind (its operators' names joined by `+`).
    pub stage: String,
    /// Instances of it.
    pub instances: usize,
    /// Simulated time summed over its instances, in ms.
    pub predicted_ms: f64,
    /// Measured time summed over its instances, in ms.
    pub measured_ms: f64,
    /// (predicted - measured) / measured.
    pub error: f64,
}

/// A real run against the simulation of its plan.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Prediction {
    /// The simulated makespan, in ms.
    pub predicted_makespan_ms: f64,
    /// The real makespan, in ms.
    pub measured_makespan_ms: f64,
    /// (predicted - measured) / measured makespan.
    pub prediction_error: f64,
    /// Per processor.
    pub processors: Vec<BusyPrediction>,
    /// Stage kinds, largest absolute error in time first.
    pub stage_kinds: Vec<StageKindPrediction>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn relative(predicted: u64, measured: u64) -> f64 {
    let e = (predicted as f64 - measured as f64) / measured.max(1) as f64;
    (e * 1e6).round() / 1e6
}

/// Busy time per lane and (instances, time) per stage kind of a run.
fn totals(run: &RunOutcome) -> (Vec<u64>, BTreeMap<String, (usize, u64)>) {
    let plan = &run.plan;
    let mut lanes = vec![0u64; plan.lanes()];
    let mut kinds: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for s in &run.timeline.slices {
        let ns = s.end_ns.saturating_sub(s.start_ns);
        if let Some(l) = lanes.get_mut(s.processor) {
            *l += ns;
        }
        let kind = stage_kind(&plan.stages[s.key.stage as usize].ops);
        let entry = kinds.entry(kind).or_default();
        entry.0 += 1;
        entry.1 += ns;
    }
    (lanes, kinds)
}

impl Prediction {
    /// Compares `measured` (a real run) with `predicted` (the simulation of its plan).
    pub fn compare(measured: &RunOutcome, predicted: &RunOutcome) -> Prediction {
        let (real_lanes, real_kinds) = totals(measured);
        let (sim_lanes, sim_kinds) = totals(predicted);
        let processors = measured
            .plan
            .device
            .processors
            .iter()
            .enumerate()
            .map(|(i, p)| BusyPrediction {
                name: p.name.clone(),
                predicted_ms: ms(sim_lanes.get(i).copied().unwrap_or(0)),
                measured_ms: ms(real_lanes[i]),
                error: relative(sim_lanes.get(i).copied().unwrap_or(0), real_lanes[i]),
            })
            .collect();
        let mut stage_kinds: Vec<StageKindPrediction> = real_kinds
            .into_iter()
            .map(|(stage, (instances, real))| {
                let sim = sim_kinds.get(&stage).map_or(0, |k| k.1);
                StageKindPrediction {
                    error: relative(sim, real),
                    predicted_ms: ms(sim),
                    measured_ms: ms(real),
                    instances,
                    stage,
                }
            })
            .collect();
        stage_kinds.sort_by(|a, b| {
            let gap = |k: &StageKindPrediction| (k.predicted_ms - k.measured_ms).abs();
            gap(b).total_cmp(&gap(a))
        });
        Prediction {
            predicted_makespan_ms: ms(predicted.makespan_ns),
            measured_makespan_ms: ms(measured.makespan_ns),
            prediction_error: relative(predicted.makespan_ns, measured.makespan_ns),
            processors,
            stage_kinds,
        }
    }

    /// A few readable lines: makespans, busy times, the `worst` stage kinds.
    pub fn summary(&self, worst: usize) -> String {
        let mut s = format!(
            "predicted {:.1} ms vs measured {:.1} ms ({:+.1}%)\n",
            self.predicted_makespan_ms,
            self.measured_makespan_ms,
            100.0 * self.prediction_error
        );
        for p in &self.processors {
            s.push_str(&format!(
                "  {:<8} busy predicted {:>9.1} ms, measured {:>9.1} ms ({:+.1}%)\n",
                p.name,
                p.predicted_ms,
                p.measured_ms,
                100.0 * p.error
            ));
        }
        for k in self.stage_kinds.iter().take(worst) {
            s.push_str(&format!(
                "  stage {} (x{}): predicted {:.1} ms, measured {:.1} ms ({:+.1}%)\n",
                k.stage,
                k.instances,
                k.predicted_ms,
                k.measured_ms,
                100.0 * k.error
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hetsched_systems::PolicyRegistry;
    use hetsched_systems::testing::tiny_plan;

    use super::*;
    use crate::engine::simulate;

    #[test]
    fn a_simulation_predicts_itself_exactly() {
        let plan = Arc::new(tiny_plan(2, 256, 64));
        let policy = || PolicyRegistry::builtin().create("stall").unwrap();
        let a = simulate(plan.clone(), policy()).unwrap();
        let b = simulate(plan.clone(), policy()).unwrap();
        let p = Prediction::compare(&a, &b);
        assert_eq!(p.prediction_error, 0.0);
        assert!(p.processors.iter().all(|b| b.error == 0.0));
        assert!(p.stage_kinds.iter().all(|k| k.error == 0.0));
        assert_eq!(CostModelUse::of(&plan).model, "roofline");
    }

    #[test]
    fn a_slower_real_run_shows_as_a_negative_error() {
        let plan = Arc::new(tiny_plan(1, 128, 64));
        let policy = || PolicyRegistry::builtin().create("inorder").unwrap();
        let sim = simulate(plan.clone(), policy()).unwrap();
        let mut real = sim.clone();
        for s in &mut real.timeline.slices {
            s.start_ns *= 2;
            s.end_ns *= 2;
        }
        real.makespan_ns *= 2;
        let p = Prediction::compare(&real, &sim);
        assert!((p.prediction_error + 0.5).abs() < 1e-6, "{p:?}");
        assert!(
            p.processors
                .iter()
                .all(|b| b.measured_ms == 0.0 || (b.error + 0.5).abs() < 1e-3)
        );
    }
}
