//! Which cost model a run's policy decides with, when it has a measured profile.
//!
//! A measured profile predicts the run's durations (docs/calibration.md); whether a
//! heuristic decides *better* with those costs than with the roofline model's is another
//! question (the heuristics were tuned on roofline-priced scenes, and measured costs were
//! seen losing by up to 10% at prompt 512, chunk 256). So the run asks its own model:
//! it simulates the policy deciding with each cost table, both times with the measured
//! durations and the measured pool sharing ([`predict_with`]), and keeps the decisions
//! predicted to finish first. Ties keep the measured costs. The report names the choice
//! and both predictions.

use std::sync::Arc;

use hetsched_systems::policy::{CostsFrom, Policy};
use hetsched_systems::{PolicyRegistry, PrefillPlan};
use serde::Serialize;

use crate::profiling::{ProfilingError, predict_with};

/// The cost table a policy decides with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DecisionCosts {
    /// The run's own (measured) costs.
    Measured,
    /// The roofline model's costs.
    Roofline,
}

/// The choice and what it rests on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecisionChoice {
    /// The cost table the policy decided with.
    pub costs: DecisionCosts,
    /// Predicted makespan (ms) deciding with the measured costs.
    pub predicted_measured_ms: f64,
    /// Predicted makespan (ms) deciding with the roofline costs; `None` when the roofline
    /// plan cannot stand in (another placement), named in `note`.
    pub predicted_roofline_ms: Option<f64>,
    /// Why the roofline decisions were not considered, if they were not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl DecisionChoice {
    /// A line for the human report.
    pub fn summary(&self) -> String {
        let costs = match self.costs {
            DecisionCosts::Measured => "measured",
            DecisionCosts::Roofline => "roofline",
        };
        match (self.predicted_roofline_ms, &self.note) {
            (Some(r), _) => format!(
                "decided with {costs} costs (predicted {:.1} ms with measured, {r:.1} ms with roofline)",
                self.predicted_measured_ms
            ),
            (None, Some(note)) => format!("decided with measured costs ({note})"),
            (None, None) => "decided with measured costs".into(),
        }
    }
}

/// Simulates `policy` on `run` (measured costs) deciding with `run`'s costs and with
/// `roofline`'s, both timed by `run`'s, and picks the faster (ties: measured).
pub fn choose_decision_costs(
    run: &Arc<PrefillPlan>,
    roofline: &Arc<PrefillPlan>,
    policy: &str,
) -> Result<DecisionChoice, ProfilingError> {
    let registry = PolicyRegistry::builtin();
    let measured_ms = ms(predict_with(run.clone(), registry.create(policy)?)?.makespan_ns);
    let Some(roofline_policy) = deciding_with(registry.create(policy)?, run, roofline)? else {
        return Ok(DecisionChoice {
            costs: DecisionCosts::Measured,
            predicted_measured_ms: measured_ms,
            predicted_roofline_ms: None,
            note: Some("the roofline plan places stages differently".into()),
        });
    };
    let roofline_ms = ms(predict_with(run.clone(), roofline_policy)?.makespan_ns);
    let costs = match roofline_ms < measured_ms {
        true => DecisionCosts::Roofline,
        false => DecisionCosts::Measured,
    };
    Ok(DecisionChoice {
        costs,
        predicted_measured_ms: measured_ms,
        predicted_roofline_ms: Some(roofline_ms),
        note: None,
    })
}

/// `policy` deciding with `decisions`' costs on a run of `run`, or `None` when the two
/// plans place stages differently. The simulator may run a plan as a shorter one (a
/// prompt under a chunk): the decision plan is made the same way.
fn deciding_with(
    policy: Box<dyn Policy>,
    run: &Arc<PrefillPlan>,
    decisions: &Arc<PrefillPlan>,
) -> Result<Option<Box<dyn Policy>>, ProfilingError> {
    let run = crate::profiling::as_executed(run)?;
    let decisions = crate::profiling::as_executed(decisions)?;
    let deciding = CostsFrom::new(policy, &run, decisions).ok();
    Ok(deciding.map(|p| Box::new(p) as Box<dyn Policy>))
}

/// The policy a real run of `run` uses under `choice`: `policy` itself, or `policy`
/// deciding with `roofline`'s costs (an error if `roofline` cannot decide for `run`,
/// rather than a run that silently decides otherwise than its report says).
pub fn policy_for(
    choice: &DecisionChoice,
    policy: &str,
    run: &PrefillPlan,
    roofline: &Arc<PrefillPlan>,
) -> Result<Box<dyn Policy>, ProfilingError> {
    let inner = PolicyRegistry::builtin().create(policy)?;
    Ok(match choice.costs {
        DecisionCosts::Measured => inner,
        DecisionCosts::Roofline => Box::new(CostsFrom::new(inner, run, roofline.clone())?),
    })
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use hetsched_systems::policy::{CostsMismatch, PickContext};
    use hetsched_systems::{DeviceProfile, Workload};

    use super::*;
    use crate::backends::sim::SimBackend;
    use crate::engine;
    use crate::scene::Scene;

    /// The shipped desktop scene's model (SmolLM2-135M) on `device`.
    fn plan_on(device: DeviceProfile, prompt_len: u32, chunk_len: u32) -> Arc<PrefillPlan> {
        let workload = Workload {
            prompt_len,
            chunk_len,
            float_processor: None,
        };
        Arc::new(PrefillPlan::new(desktop().model, device, workload).unwrap())
    }

    fn desktop() -> Scene {
        Scene::load(std::path::Path::new("smollm2-135m-desktop")).unwrap()
    }

    /// The desktop device with its CPU's float rate scaled by `f` and the NPU lane's launch
    /// cost by `f`: the same instances and placement, other costs.
    fn distorted(f: f64) -> DeviceProfile {
        let mut d = desktop().device;
        d.processors[0].cost.peak_gops.fp32 *= f;
        d.processors[0].cost.peak_gops.fp16 *= f;
        d.processors[1].cost.launch_us *= f;
        d
    }

    /// Remembers the cost the plan it is shown gives every candidate it picks.
    struct SeesCosts(Arc<std::sync::Mutex<Vec<(u32, u64)>>>);

    impl Policy for SeesCosts {
        fn name(&self) -> &str {
            "sees-costs"
        }
        fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
            let id = *candidates.first()?;
            let cost = ctx.plan.cost_ns(ctx.plan.key(id as usize));
            self.0.lock().unwrap().push((id, cost));
            Some(id)
        }
    }

    #[test]
    fn the_inner_policy_decides_with_the_other_plans_costs() {
        let run = plan_on(desktop().device, 512, 128);
        let other = plan_on(distorted(0.25), 512, 128);
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let wrapped = CostsFrom::new(Box::new(SeesCosts(seen.clone())), &run, other.clone());
        let outcome = engine::run(
            run.clone(),
            Box::new(wrapped.unwrap()),
            &mut SimBackend::default(),
        )
        .unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), run.instance_count());
        let mut differ = 0;
        for &(id, cost) in seen.iter() {
            let key = run.key(id as usize);
            assert_eq!(cost, other.cost_ns(key));
            differ += usize::from(cost != run.cost_ns(key));
        }
        assert!(differ > 0, "the two plans price some instance differently");
        // The durations are still the run's own.
        for s in &outcome.timeline.slices {
            assert_eq!(s.end_ns - s.start_ns, run.cost_ns(s.key));
        }
        // A plan of another prompt length is refused.
        let longer = plan_on(desktop().device, 1024, 128);
        assert!(matches!(
            CostsFrom::new(Box::new(SeesCosts(Default::default())), &run, longer),
            Err(CostsMismatch::Shape { .. })
        ));
    }

    /// A profile `hetsched profile` measured on a Zen 5 (SmolLM2-135M, w8a8 and f32, 2
    /// threads; docs/calibration.md).
    fn measured_zen5() -> DeviceProfile {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/zen5-smollm2-profile.toml"
        );
        Scene::load_device(std::path::Path::new(path)).unwrap()
    }

    #[test]
    fn a_measured_profile_can_prefer_the_roofline_decisions() {
        // At prompt 2048, chunk 256, the measured model predicts balance faster deciding
        // with the roofline costs (862 against 879 ms when this was written).
        let model = desktop().model;
        let workload = Workload {
            prompt_len: 2048,
            chunk_len: 256,
            float_processor: None,
        };
        let run =
            Arc::new(PrefillPlan::new(model.clone(), measured_zen5(), workload.clone()).unwrap());
        let roofline = Arc::new(PrefillPlan::new(model, desktop().device, workload).unwrap());
        let c = choose_decision_costs(&run, &roofline, "balance").unwrap();
        assert_eq!(c.costs, DecisionCosts::Roofline, "{c:?}");
        assert!(c.predicted_roofline_ms.unwrap() < c.predicted_measured_ms);
    }

    #[test]
    fn the_same_costs_tie_and_keep_the_measured_decisions() {
        let run = plan_on(desktop().device, 512, 128);
        let choice = choose_decision_costs(&run, &run, "stall").unwrap();
        assert_eq!(choice.costs, DecisionCosts::Measured);
        assert_eq!(
            choice.predicted_roofline_ms,
            Some(choice.predicted_measured_ms)
        );
    }

    #[test]
    fn the_choice_is_never_predicted_slower_than_the_measured_decisions() {
        for policy in ["balance", "stall", "lookahead", "inorder"] {
            for f in [0.2, 0.5, 2.0, 5.0] {
                for (prompt, chunk) in [(512, 64), (512, 256), (2048, 256), (200, 256)] {
                    let run = plan_on(desktop().device, prompt, chunk);
                    let roofline = plan_on(distorted(f), prompt, chunk);
                    let c = choose_decision_costs(&run, &roofline, policy).unwrap();
                    let r = c.predicted_roofline_ms.expect("same placement");
                    let chosen = match c.costs {
                        DecisionCosts::Measured => c.predicted_measured_ms,
                        DecisionCosts::Roofline => r,
                    };
                    assert!(chosen <= c.predicted_measured_ms, "{policy} {f}: {c:?}");
                    assert_eq!(
                        chosen,
                        c.predicted_measured_ms.min(r),
                        "{policy} {f}: {c:?}"
                    );
                    // The policy a real run gets schedules what was predicted.
                    let p = policy_for(&c, policy, &run, &roofline).unwrap();
                    let again = predict_with(run.clone(), p).unwrap();
                    assert_eq!(ms(again.makespan_ns), chosen, "{policy} {f}");
                }
            }
        }
    }
}
