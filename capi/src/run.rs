//! Finished runs: simulation, the JSON report, the Chrome trace and the SVG timeline.

use std::ffi::c_char;
use std::path::Path;

use hetsched_runtime::engine::{self, RunOutcome};
use hetsched_runtime::fsutil::write_atomic;
use hetsched_runtime::profiling;
use hetsched_runtime::report::RunReport;
use hetsched_runtime::timeline::{Trace, chrome::to_chrome_json, svg::to_svg};
use hetsched_systems::policy::PolicyRegistry;

use crate::error::{CapiError, guarded, hs_status};
use crate::handles::{self, HandleKind};
use crate::scene::{PlanObject, hs_plan};
use crate::strings::{optional_str_arg, out_arg, str_arg, string_out};

/// A finished run (simulated, or on the host's queues). Opaque; from `hs_simulate` or
/// `hs_engine_result`, ended with `hs_run_destroy`. Immutable: usable from any thread.
pub struct hs_run {
    _opaque: [u8; 0],
}

/// A finished run and how to report it.
pub(crate) struct RunObject {
    pub(crate) scene_name: String,
    pub(crate) outcome: RunOutcome,
    /// Measured on real queues (wall clock): its bound comes from its own durations.
    pub(crate) measured: bool,
}

impl HandleKind for RunObject {
    const KIND: &'static str = "run";
    type C = hs_run;
}

impl RunObject {
    /// The report `hetsched simulate --json` prints for a simulation; for a measured run,
    /// the bound from its own measured durations ([`RunReport::measured`]).
    pub(crate) fn report(&self) -> RunReport {
        if self.measured {
            RunReport::measured(&self.scene_name, &self.outcome, &[])
        } else {
            RunReport::new(&self.scene_name, &self.outcome)
        }
    }

    fn title(&self) -> String {
        let report = self.report();
        // The title `hetsched simulate` gives its timelines.
        format!(
            "{} — {}, {} tokens, chunk {}",
            self.scene_name, report.policy, report.prompt_len, report.chunk_len
        )
    }
}

/// The policy `name` names, or the plan's scene's policy for `None`.
pub(crate) fn policy_for(
    plan: &PlanObject,
    name: Option<&str>,
) -> Result<Box<dyn hetsched_systems::Policy>, CapiError> {
    Ok(PolicyRegistry::builtin().create(name.unwrap_or(&plan.policy))?)
}

/// Simulates the plan on a virtual clock under the policy `policy` (a name from
/// `hs_policy_names`, or NULL for the scene's own), as `hetsched simulate` does (a
/// measured device profile is simulated as queues sharing one worker pool). `policy` is
/// the caller's, only read. `*out`: a new run the caller ends with `hs_run_destroy`.
///
/// # Safety
/// `policy` is NULL or NUL-terminated; `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_simulate(
    plan: *const hs_plan,
    policy: *const c_char,
    out: *mut *mut hs_run,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<PlanObject>(plan, "plan")?;
        // SAFETY: the contract above.
        let (name, out) = unsafe { (optional_str_arg(policy, "policy")?, out_arg(out, "out")?) };
        let policy = policy_for(&object, name)?;
        let plan = object.plan.clone();
        let outcome = match plan.device.measured {
            Some(_) => profiling::predict_with(plan, policy)
                .map_err(|e| CapiError::Predict(e.to_string()))?,
            None => engine::simulate(plan, policy)?,
        };
        *out = handles::register(RunObject {
            scene_name: object.scene_name.clone(),
            outcome,
            measured: false,
        });
        Ok(())
    })
}

/// The run's makespan (time of its last completion), ns, written to `*out`: a
/// prediction for a simulated run, a measurement for a run on wall-clock host queues.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_run_makespan_ns(run: *const hs_run, out: *mut u64) -> hs_status {
    guarded(|| {
        let object = handles::get::<RunObject>(run, "run")?;
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        *out = object.outcome.makespan_ns;
        Ok(())
    })
}

/// The run's report as pretty JSON: for a simulation, the text `hetsched simulate --json`
/// prints. `*out`: a new string the caller frees with `hs_string_free`.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_run_report_json(
    run: *const hs_run,
    out: *mut *mut c_char,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<RunObject>(run, "run")?;
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        let json = serde_json::to_string_pretty(&object.report())
            .map_err(|e| CapiError::Internal(format!("report: {e}")))?;
        *out = string_out(json);
        Ok(())
    })
}

fn write_timeline(
    run: *const hs_run,
    path: *const c_char,
    render: fn(&Trace) -> String,
) -> Result<(), CapiError> {
    let object = handles::get::<RunObject>(run, "run")?;
    // SAFETY: the exported callers' contract: `path` is NULL or NUL-terminated.
    let path = unsafe { str_arg(path, "path") }?;
    let text = render(&Trace::new(&object.title(), &object.outcome));
    write_atomic(Path::new(path), text.as_bytes()).map_err(|e| CapiError::Io {
        path: path.to_string(),
        message: e.to_string(),
    })
}

/// Writes the run's timeline as a Chrome trace (JSON for chrome://tracing or Perfetto) to
/// `path` (the caller's, only read), atomically: an existing file is replaced whole or
/// left as it was.
///
/// # Safety
/// `path` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_run_write_chrome_trace(
    run: *const hs_run,
    path: *const c_char,
) -> hs_status {
    guarded(|| write_timeline(run, path, to_chrome_json))
}

/// Writes the run's timeline as an SVG picture to `path` (the caller's, only read),
/// atomically.
///
/// # Safety
/// `path` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_run_write_svg(run: *const hs_run, path: *const c_char) -> hs_status {
    guarded(|| write_timeline(run, path, to_svg))
}

/// Ends a run. NULL is a no-op; a handle already destroyed is `HS_ERR_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn hs_run_destroy(run: *mut hs_run) -> hs_status {
    guarded(|| handles::destroy::<RunObject>(run, "run"))
}
