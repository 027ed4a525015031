//! Device profiles measured on the host's own queues: the phone workflow of
//! docs/calibration.md from C, over `hetsched_runtime::profiling`.
//!
//! The host runs plans on its queues with `HS_CLOCK_WALL` (`hs_engine_*`), hands each
//! finished run to an `hs_profile` (`hs_profile_add_run`), and writes the profile
//! (`hs_profile_write`): one cost per (processor, precision, stage kind) fitted from the
//! jobs' measured durations, into the runs' device profile, written as three small TOML
//! files (device, model, and a scene naming both) that `hs_scene_load` reads anywhere,
//! and `hs_simulate` then predicts from (as queues that share what the runs measured).

use std::collections::HashSet;
use std::ffi::c_char;
use std::path::Path;
use std::sync::Arc;

use hetsched_runtime::engine::RunOutcome;
use hetsched_runtime::fsutil::write_atomic;
use hetsched_runtime::history::{HistoryRecord, records_of};
use hetsched_runtime::profiling::{fit_profile, job_gap_ns, two_job_rate};
use hetsched_runtime::scene::toml_text;
use hetsched_systems::{DeviceProfile, ModelConfig, ProfileOrigin, precision_label};
use parking_lot::Mutex;
use serde_json::json;

use crate::error::{CapiError, guarded, hs_status};
use crate::handles::{self, HandleKind};
use crate::run::{RunObject, hs_run};
use crate::strings::{optional_str_arg, out_arg, str_arg, string_out};

/// Measured runs gathered into a device profile. Opaque; from `hs_profile_create`, ended
/// with `hs_profile_destroy`. Usable from any thread.
pub struct hs_profile {
    _opaque: [u8; 0],
}

/// Runs a profile holds at most (each keeps its timeline until the handle is destroyed).
pub const HS_MAX_PROFILE_RUNS: usize = 256;

/// The runs added so far.
#[derive(Default)]
pub(crate) struct ProfileObject {
    runs: Mutex<Vec<Arc<RunOutcome>>>,
}

impl HandleKind for ProfileObject {
    const KIND: &'static str = "profile";
    type C = hs_profile;
}

/// What [`ProfileObject::fit`] made of the runs.
struct Fitted {
    /// The runs' device with the fitted costs and where they were measured.
    device: DeviceProfile,
    /// The first run: its model, workload and policy go into the scene.
    first: Arc<RunOutcome>,
    summary: serde_json::Value,
}

impl ProfileObject {
    fn add(&self, run: &RunObject) -> Result<(), CapiError> {
        if !run.measured {
            return Err(CapiError::InvalidArgument(
                "the run was not measured: its times are predictions (hs_simulate, or host \
                 queues on HS_CLOCK_VIRTUAL); profile runs on HS_CLOCK_WALL"
                    .into(),
            ));
        }
        let mut runs = self.runs.lock();
        if runs.len() >= HS_MAX_PROFILE_RUNS {
            return Err(CapiError::InvalidArgument(format!(
                "the profile holds {HS_MAX_PROFILE_RUNS} runs already, its limit"
            )));
        }
        let plan = &run.outcome.plan;
        if let Some(first) = runs.first().map(|r| &r.plan) {
            let processors = |p: &hetsched_systems::PrefillPlan| {
                p.device
                    .processors
                    .iter()
                    .map(|p| p.name.clone())
                    .collect::<Vec<_>>()
            };
            if first.model != plan.model || processors(first) != processors(plan) {
                return Err(CapiError::InvalidArgument(format!(
                    "the run is of `{}` on processors {:?}; the profile's runs are of `{}` on \
                     {:?}: one profile describes one model on one device",
                    plan.model.name,
                    processors(plan),
                    first.model.name,
                    processors(first)
                )));
            }
        }
        runs.push(Arc::new(run.outcome.clone()));
        Ok(())
    }

    /// Fits the device profile from the runs (the phone workflow's step 1).
    fn fit(&self, name: Option<&str>) -> Result<Fitted, CapiError> {
        let runs = self.runs.lock().clone();
        let first = runs.first().ok_or_else(|| {
            CapiError::State("the profile has no run: add measured runs first".into())
        })?;
        // The jobs that ran alone: one that shared the processors with another lane's
        // job may have run slower by that sharing, which the prediction adds on its own.
        // A stage none of whose jobs ran alone (w8a8-shadow's pairs run side by side even
        // under `inorder`) is fitted from its overlapped jobs, its only samples.
        let records: Vec<HistoryRecord> = runs.iter().flat_map(|r| records_of(r)).collect();
        let total = records.len();
        let kind = |r: &HistoryRecord| (r.processor.clone(), r.stage.clone());
        let ran_alone = |r: &HistoryRecord| r.alone != Some(false);
        let mut kinds: Vec<(String, String)> = records.iter().map(kind).collect();
        kinds.sort();
        kinds.dedup();
        let alone_kinds: HashSet<(String, String)> =
            records.iter().filter(|r| ran_alone(r)).map(kind).collect();
        let jobs_alone = records.iter().filter(|r| ran_alone(r)).count();
        let samples: Vec<HistoryRecord> = records
            .into_iter()
            .filter(|r| ran_alone(r) || !alone_kinds.contains(&kind(r)))
            .collect();
        let mut device = first.plan.device.clone();
        let fits = fit_profile(&mut device, &samples);
        if fits.is_empty() {
            return Err(CapiError::InvalidArgument(format!(
                "no stage cost could be fitted from the {total} jobs of {} runs: every \
                 duration must be positive, on a processor of the runs' device",
                runs.len()
            )));
        }
        let named = |(p, stage): &(String, String)| json!({"processor": p, "stage": stage});
        let mut gaps: Vec<f64> = runs.iter().map(|r| job_gap_ns(r)).collect();
        gaps.sort_by(f64::total_cmp);
        let rate = sharing_rate(&runs);
        let model = &first.plan.model;
        if let Some(name) = name {
            device.name = name.to_string();
        }
        device.measured = Some(host_origin(
            model,
            &device,
            gaps[gaps.len() / 2] / 1e3,
            rate.unwrap_or(0.0),
        ));
        let summary = json!({
            "runs": runs.len(),
            "jobs": total,
            "jobs_alone": jobs_alone,
            "job_gap_us": gaps[gaps.len() / 2] / 1e3,
            "two_job_rate": rate,
            "fitted_from_overlapped": kinds
                .iter()
                .filter(|k| !alone_kinds.contains(*k))
                .map(named)
                .collect::<Vec<_>>(),
            // Stages with no fitted cost keep the device's modeled cost.
            "not_fitted": kinds
                .iter()
                .filter(|(p, stage)| {
                    !fits
                        .iter()
                        .any(|f| &f.processor == p && &f.cost.stage == stage)
                })
                .map(named)
                .collect::<Vec<_>>(),
            "fits": fits,
        });
        Ok(Fitted {
            device,
            first: first.clone(),
            summary,
        })
    }
}

/// Where a profile fitted from the host's queues was measured: `model` on `device`'s
/// processors, one host queue each, with the median job gap and the two-job rate.
fn host_origin(
    model: &ModelConfig,
    device: &DeviceProfile,
    job_gap_us: f64,
    two_job_rate: f64,
) -> ProfileOrigin {
    ProfileOrigin {
        model: model.name.clone(),
        model_shape: ProfileOrigin::shape_of(model),
        precisions: vec![precision_label(model)],
        cpu: "the host's queues".into(),
        cpu_features: Vec::new(),
        // One host queue per processor, each running one job at a time: as many
        // jobs at once as lanes (the prediction's pool shares this many workers).
        threads: device.processors.len(),
        backends: device
            .processors
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(","),
        samples: String::new(),
        job_gap_us,
        job_gaps: Vec::new(),
        two_job_rate,
        one_thread: Vec::new(),
        adapted: Vec::new(),
        cache_bytes: 0,
        warm_weights: Vec::new(),
    }
}

/// How two jobs share the host's processors (`profiling::two_job_rate`), from the
/// `inorder` runs of a workload against its runs under a policy that overlaps jobs: the
/// median over such pairs; `None` without one.
fn sharing_rate(runs: &[Arc<RunOutcome>]) -> Option<f64> {
    let (alone, shared): (Vec<_>, Vec<_>) = runs.iter().partition(|r| r.policy == "inorder");
    let mut rates: Vec<f64> = alone
        .iter()
        .flat_map(|a| {
            shared
                .iter()
                .filter(|s| s.plan.workload == a.plan.workload)
                .filter_map(|s| two_job_rate(a, s))
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied()
}

fn write(dir: &Path, file: &str, text: &str) -> Result<(), CapiError> {
    let path = dir.join(file);
    write_atomic(&path, text.as_bytes()).map_err(|e| CapiError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// A new, empty profile. `*out`: a new handle the caller ends with `hs_profile_destroy`.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_profile_create(out: *mut *mut hs_profile) -> hs_status {
    guarded(|| {
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        *out = handles::register(ProfileObject::default());
        Ok(())
    })
}

/// Adds a run measured on the host's queues (from `hs_engine_result` of an engine on
/// `HS_CLOCK_WALL`): each job's measured duration becomes a sample. The run stays the
/// caller's (copied here; destroy it as usual). Errors: a run that was not measured
/// (`hs_simulate`, `HS_CLOCK_VIRTUAL`), one of another model or device than the runs
/// before, or more than `HS_MAX_PROFILE_RUNS` runs: `HS_ERR_INVALID_ARGUMENT`.
///
/// Profile with `inorder` (jobs never overlap): a stage is fitted from its jobs that ran
/// alone (from its overlapped ones where none did). A
/// run of the same workload under a policy that overlaps jobs (`balance`) beside an
/// `inorder` one also measures how two jobs share the processors (`two_job_rate`: 1
/// when they do not slow each other, 1/2 when they share one pool with no gain).
#[unsafe(no_mangle)]
pub extern "C" fn hs_profile_add_run(profile: *const hs_profile, run: *const hs_run) -> hs_status {
    guarded(|| {
        let object = handles::get::<ProfileObject>(profile, "profile")?;
        let run = handles::get::<RunObject>(run, "run")?;
        object.add(&run)
    })
}

/// Fits the profile and writes it into the folder `dir` (UTF-8, the caller's, only read;
/// it must exist): `device.toml` (the runs' device profile with a cost per (processor,
/// precision, stage kind) fitted from the measured jobs, and where they were measured),
/// `model.toml` (the runs' model) and `scene.toml` (names both, with the first run's
/// workload and policy), each replaced whole or left as it was. `name` (UTF-8, or NULL
/// for the runs' device's name) names the device. `hs_scene_load("DIR/scene.toml")`
/// loads them anywhere, the model's weights not needed; `hs_simulate` then predicts from
/// the measured costs. `*summary_json` (NULL: not wanted): a new string the caller frees
/// with `hs_string_free`: `{"runs", "jobs", "jobs_alone", "job_gap_us", "two_job_rate",
/// "fitted_from_overlapped": [{"processor", "stage"}], "not_fitted": [...], "fits":
/// [{"processor", "stage", "precision", "fit_error", ...}]}` (`fitted_from_overlapped`:
/// stages none of whose jobs ran alone, fitted from jobs that ran beside another;
/// `not_fitted`: stages that keep the device's modeled cost). Errors: no run
/// added (`HS_ERR_STATE`), nothing to fit (`HS_ERR_INVALID_ARGUMENT`), a file that could
/// not be written (`HS_ERR_IO`).
///
/// # Safety
/// `dir` and `name` are NULL or NUL-terminated; `summary_json` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_profile_write(
    profile: *const hs_profile,
    dir: *const c_char,
    name: *const c_char,
    summary_json: *mut *mut c_char,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<ProfileObject>(profile, "profile")?;
        // SAFETY: the contract above.
        let (dir, name) = unsafe { (str_arg(dir, "dir")?, optional_str_arg(name, "name")?) };
        let dir = Path::new(dir);
        if !dir.is_dir() {
            return Err(CapiError::Io {
                path: dir.display().to_string(),
                message: "not a folder".into(),
            });
        }
        let fitted = object.fit(name)?;
        let first = &fitted.first;
        write(
            dir,
            "device.toml",
            &toml_text(&fitted.device).map_err(toml_error)?,
        )?;
        write(
            dir,
            "model.toml",
            &toml_text(&first.plan.model).map_err(toml_error)?,
        )?;
        let workload = &first.plan.workload;
        let mut scene = format!(
            "name = {}\ndevice = \"device.toml\"\nmodel = \"model.toml\"\n\n[workload]\n\
             prompt_len = {}\nchunk_len = {}\npolicy = {}\n",
            toml_string(&format!("{} (measured)", fitted.device.name)),
            workload.prompt_len,
            workload.chunk_len,
            toml_string(&first.policy),
        );
        if let Some(float) = &workload.float_processor {
            scene += &format!("float_processor = {}\n", toml_string(float));
        }
        write(dir, "scene.toml", &scene)?;
        if !summary_json.is_null() {
            // SAFETY: non-null, and valid for writes by the contract above.
            let out = unsafe { out_arg(summary_json, "summary_json") }?;
            *out = string_out(fitted.summary.to_string());
        }
        Ok(())
    })
}

/// A TOML basic string of `text` (JSON's string escapes are valid TOML ones).
fn toml_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// A profile or model that TOML cannot write: a bug, not the host's.
fn toml_error(message: String) -> CapiError {
    CapiError::Internal(format!("TOML: {message}"))
}

/// Ends the profile. NULL is a no-op.
#[unsafe(no_mangle)]
pub extern "C" fn hs_profile_destroy(profile: *mut hs_profile) -> hs_status {
    guarded(|| handles::destroy::<ProfileObject>(profile, "profile"))
}

#[cfg(test)]
mod tests {
    use hetsched_runtime::backends::shared_pool::{PoolSharing, SharedPoolBackend};
    use hetsched_runtime::engine;
    use hetsched_runtime::scene::Scene;
    use hetsched_systems::policy::PolicyRegistry;

    use super::*;

    /// The default scene's plan run under `policy` on queues sharing one pool at `rate`.
    fn run_on_pool(policy: &str, rate: f64) -> Arc<RunOutcome> {
        let plan = Arc::new(Scene::default_scene().plan().unwrap());
        let policy = PolicyRegistry::builtin().create(policy).unwrap();
        let sharing = PoolSharing {
            threads: 2,
            two_job_rate: rate,
        };
        let mut pool = SharedPoolBackend::new(0, sharing);
        Arc::new(engine::run(plan, policy, &mut pool).unwrap())
    }

    #[test]
    fn the_sharing_rate_is_measured_from_an_inorder_and_an_overlapping_run() {
        for rate in [0.6, 0.8, 1.0] {
            let runs = [run_on_pool("inorder", rate), run_on_pool("balance", rate)];
            let measured = sharing_rate(&runs).expect("a pair of runs of one workload");
            assert!((measured - rate).abs() < 0.02, "{measured} for {rate}");
        }
        // Without an overlapping run of the same workload there is nothing to measure.
        assert_eq!(sharing_rate(&[run_on_pool("inorder", 0.7)]), None);
    }
}
