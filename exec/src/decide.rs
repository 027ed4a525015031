//! The policy object a CPU-host prefill runs: the named policy, deciding with the roofline
//! costs instead of the measured ones when the run's own model predicts that faster
//! ([`hetsched_runtime::decision`]).

use std::sync::Arc;

use hetsched_runtime::decision::{DecisionChoice, choose_decision_costs, policy_for};
use hetsched_runtime::profiling::ProfilingError;
use hetsched_systems::policy::Policy;
use hetsched_systems::{PolicyRegistry, PrefillPlan};

use crate::{ExecError, PrefillOptions, host_device, prefill_device};

/// `options.policy` for `plan`, and the decision-cost choice when `plan` is priced by a
/// measured profile (`None` otherwise: the roofline plan is the plan).
pub(crate) fn policy(
    plan: &Arc<PrefillPlan>,
    options: &PrefillOptions,
) -> Result<(Box<dyn Policy>, Option<DecisionChoice>), ExecError> {
    if plan.device.measured.is_none() {
        return Ok((PolicyRegistry::builtin().create(&options.policy)?, None));
    }
    let roofline = roofline_plan(plan, options)?;
    let choice = choose_decision_costs(plan, &roofline, &options.policy).map_err(from_profiling)?;
    let policy = policy_for(&choice, &options.policy, plan, &roofline).map_err(from_profiling)?;
    Ok((policy, Some(choice)))
}

/// The policy object a prefill of `plan` under `options` ran with, given the run's
/// [`PrefillResult::decision`](crate::PrefillResult::decision): to simulate the same
/// decisions (`run --predict`).
pub fn policy_of_run(
    plan: &Arc<PrefillPlan>,
    options: &PrefillOptions,
    decision: Option<&DecisionChoice>,
) -> Result<Box<dyn Policy>, ExecError> {
    match decision {
        None => Ok(PolicyRegistry::builtin().create(&options.policy)?),
        Some(choice) => {
            let roofline = roofline_plan(plan, options)?;
            policy_for(choice, &options.policy, plan, &roofline).map_err(from_profiling)
        }
    }
}

/// `plan` priced by the host's roofline profile instead of its measured one.
fn roofline_plan(
    plan: &PrefillPlan,
    options: &PrefillOptions,
) -> Result<Arc<PrefillPlan>, ExecError> {
    let roofline_options = PrefillOptions {
        device: host_device(),
        ..options.clone()
    };
    Ok(Arc::new(PrefillPlan::placed(
        plan.model.clone(),
        prefill_device(&roofline_options),
        plan.workload.clone(),
        plan.placement.clone(),
    )?))
}

fn from_profiling(e: ProfilingError) -> ExecError {
    match e {
        ProfilingError::Policy(e) => e.into(),
        ProfilingError::Plan(e) => e.into(),
        ProfilingError::Engine(e) => e.into(),
        ProfilingError::Costs(e) => e.into(),
    }
}
