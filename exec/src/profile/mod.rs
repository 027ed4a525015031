//! Measured device profiles, the method behind `hetsched profile`, for any embedder: real
//! prefills of a model (one [`ExecModel`] per precision) over a grid of chunk lengths and
//! prompt lengths with repetitions; pairs of runs that measure how two jobs share the
//! worker pool and what cached weights save; every stage on one thread; then a cost per
//! (stage kind, processor, precision) fitted from those samples
//! (`hetsched_runtime::profiling`) and the record of where it was measured
//! ([`ProfileOrigin`]). Or the same fit from a run history instead of prefills. The
//! caller parses its settings, draws the progress and writes the files
//! (docs/calibration.md, "Measured profiles").

mod grid;
mod host;
mod prompt;

pub use grid::ProfileGrid;
pub use host::{cpu_features, cpu_name, last_level_cache_bytes};
pub use prompt::prompt_tokens;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use hetsched_import::{GgufTokenizer, ImportError};
use hetsched_runtime::history::{
    HistoryError, HistoryRecord, HistoryScope, HistoryTally, check_records, require_samples,
};
use hetsched_runtime::profiling::{StageFit, fit_profile_alone};
use hetsched_runtime::progress::Progress;
use hetsched_systems::{
    DeviceProfile, OneThreadCost, PrecisionGap, PrecisionWarm, ProfileOrigin, precision_label,
};
use thiserror::Error;

use crate::{ExecError, ExecModel, GpuUse, PrefillOptions};

/// Why a profile could not be measured or fitted.
#[derive(Debug, Error)]
pub enum ProfileError {
    /// A prompt length of zero tokens, or a text that gives no token.
    #[error("a prompt must be at least 1 token long (and its text give one)")]
    EmptyPrompt,
    /// No chunk length, or one of zero tokens.
    #[error("the profile's chunk lengths must be at least one, each at least 1 token")]
    NoChunkLens,
    /// No model to profile.
    #[error("no model to profile: give at least one precision")]
    NoModels,
    /// A prefill failed, or the fitted profile is out of range.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The text could not be tokenized.
    #[error(transparent)]
    Import(#[from] ImportError),
    /// The history to refit from is invalid or too thin.
    #[error(transparent)]
    History(#[from] HistoryError),
}

/// What a profile is measured with.
pub struct ProfileSetup<'a> {
    /// The model loaded once per precision; the first names the profile.
    pub models: &'a [Arc<ExecModel>],
    /// The models' tokenizer.
    pub tokenizer: &'a GgufTokenizer,
    /// The text the prefills repeat to each prompt length.
    pub text: &'a str,
    /// The prefills' options (policy, threads, GPU use, device); the chunk length and
    /// the policy of each run are the method's.
    pub options: &'a PrefillOptions,
    /// The prefills to run.
    pub grid: &'a ProfileGrid,
    /// The host's last-level cache, if known: which jobs ran with their weights cached
    /// (nothing about cached weights is measured without it).
    pub cache_bytes: Option<u64>,
}

impl ProfileSetup<'_> {
    /// The model that names the profile.
    fn first(&self) -> Result<&Arc<ExecModel>, ProfileError> {
        self.models.first().ok_or(ProfileError::NoModels)
    }

    /// The options every measured prefill starts from: the setup's, with the resident GPU
    /// path's stages timed by the device's timestamps (the host submits them without
    /// waiting, so its clock sees only the recording).
    fn run_options(&self) -> PrefillOptions {
        PrefillOptions {
            gpu_timestamps: self.options.gpu_timestamps || self.options.gpu == GpuUse::Resident,
            ..self.options.clone()
        }
    }

    /// The device the prefills run on (the options' device, with a GPU lane if used).
    fn device(&self) -> DeviceProfile {
        match self.options.gpu {
            GpuUse::Off => self.options.device.clone(),
            _ => crate::with_gpu_lane(self.options.device.clone()),
        }
    }
}

/// One prefill's precision and its hand-off gap (its idle time per hand-off,
/// `profiling::job_gap_ns`), ns.
pub type PrefillGap = (String, f64);

/// What was measured (or read from a history), before the fit.
pub struct Measurement {
    /// The device the samples ran on.
    pub device: DeviceProfile,
    /// One record per subgraph instance of every measured prefill.
    pub samples: Vec<HistoryRecord>,
    /// Each grid prefill's precision and hand-off gap (none from a history).
    pub gaps: Vec<PrefillGap>,
    /// Every stage's cost on one compute thread (empty with one thread).
    pub one_thread: Vec<OneThreadCost>,
    /// Rate of each of two jobs sharing the pool, relative to one alone (none: nothing
    /// overlapped, or read from a history).
    pub two_job_rate: Option<f64>,
    /// Each precision's saving per cached weight byte.
    pub warm_weights: Vec<PrecisionWarm>,
}

/// A fitted, validated device profile and what it was fitted from.
pub struct MeasuredProfile {
    /// The device profile, its costs fitted and its origin recorded.
    pub device: DeviceProfile,
    /// The samples it was fitted from.
    pub samples: Vec<HistoryRecord>,
    /// One fit per (stage kind, processor, precision).
    pub fits: Vec<StageFit>,
    /// How many grid prefills ran.
    pub prefills: usize,
    /// Rate of each of two jobs sharing the pool (none: not measured).
    pub two_job_rate: Option<f64>,
}

/// Measures a profile: the sharing runs, the grid, the one-thread pass, in that order.
/// `bar` gives a progress for each pass by the unit it counts ("prefills", "one thread").
pub fn measure(
    setup: &ProfileSetup,
    bar: &mut dyn FnMut(&str) -> Box<dyn Progress>,
) -> Result<Measurement, ProfileError> {
    setup.first()?;
    let (two_job_rate, warm_weights) = grid::sharing(setup)?;
    let (samples, device, gaps) = grid::measure(setup, bar("prefills").as_mut())?;
    let one_thread = match setup.options.threads > 1 {
        true => grid::one_thread(setup, &device, bar("one thread").as_mut())?,
        false => Vec::new(),
    };
    Ok(Measurement {
        device,
        samples,
        gaps,
        one_thread,
        two_job_rate,
        warm_weights,
    })
}

/// The samples of a run history (`records`, read from `path`) instead of prefills: those
/// of the first model that ran alone, the costs from runs on the options' threads, the
/// one-thread table from runs on one thread; with what was used and left out.
pub fn from_history(
    setup: &ProfileSetup,
    path: &Path,
    records: Vec<HistoryRecord>,
) -> Result<(Measurement, HistoryTally), ProfileError> {
    let first = setup.first()?;
    let device = setup.device();
    let scope = HistoryScope::of(&first.model_config(), &device).map_err(ExecError::from)?;
    check_records(path, &records, &scope)?;
    let (samples, on_one, tally) = split_history(records, &first.name, setup.options.threads);
    require_samples(path, &samples, &tally)?;
    let one_thread = one_thread_costs(&device, &on_one);
    let measurement = Measurement {
        device,
        samples,
        gaps: Vec::new(),
        one_thread,
        two_job_rate: None,
        warm_weights: Vec::new(),
    };
    Ok((measurement, tally))
}

impl Measurement {
    /// Fits the costs, names the device after the host and records where it was measured
    /// (`backends` as given, `samples_file` the name of the samples written beside it); a
    /// fit that came out absurd (a cost past its range) is refused, by the same check
    /// every reader of the profile applies.
    pub fn fit(
        self,
        setup: &ProfileSetup,
        backends: &str,
        samples_file: &str,
    ) -> Result<MeasuredProfile, ProfileError> {
        let first = setup.first()?;
        let threads = setup.options.threads;
        let mut device = self.device;
        let fits = fit_profile_alone(&mut device, &self.samples, &self.one_thread, threads);
        device.name = format!("{} (measured by hetsched profile)", cpu_name());
        device.measured = Some(ProfileOrigin {
            model: first.name.clone(),
            model_shape: ProfileOrigin::shape_of(&first.model_config()),
            precisions: setup
                .models
                .iter()
                .map(|m| precision_label(&m.model_config()))
                .collect(),
            cpu: cpu_name(),
            cpu_features: cpu_features(),
            threads,
            backends: backends.to_string(),
            samples: samples_file.to_string(),
            job_gap_us: median(self.gaps.iter().map(|g| g.1).collect()) / 1e3,
            job_gaps: gaps_by_precision(&self.gaps),
            two_job_rate: self.two_job_rate.unwrap_or(0.0),
            one_thread: self.one_thread,
            adapted: Vec::new(),
            cache_bytes: setup.cache_bytes.unwrap_or(0),
            warm_weights: self.warm_weights,
        });
        device.validate().map_err(ExecError::from)?;
        Ok(MeasuredProfile {
            device,
            samples: self.samples,
            fits,
            prefills: self.gaps.len(),
            two_job_rate: self.two_job_rate,
        })
    }
}

/// The median gap of each precision's prefills, in microseconds.
fn gaps_by_precision(gaps: &[PrefillGap]) -> Vec<PrecisionGap> {
    let mut by_precision: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (precision, ns) in gaps {
        by_precision.entry(precision).or_default().push(*ns);
    }
    by_precision
        .into_iter()
        .map(|(precision, ns)| PrecisionGap {
            precision: precision.to_string(),
            us: median(ns) / 1e3,
        })
        .collect()
}

/// The median of `values` (the upper middle of an even count; 0 if empty).
fn median(mut values: Vec<f64>) -> f64 {
    hetsched_systems::median(&mut values)
}

/// A history's records of `model` that ran alone, split into those of runs on `threads`
/// compute threads (or of unrecorded threads, as in older files), which the profile's
/// costs are fitted from, and those of runs on one thread (when `threads` > 1), which its
/// one-thread table is; records of other thread counts are left out. The tally counts
/// what was used and left out, and why.
fn split_history(
    records: Vec<HistoryRecord>,
    model: &str,
    threads: usize,
) -> (Vec<HistoryRecord>, Vec<HistoryRecord>, HistoryTally) {
    let threads = u32::try_from(threads).ok();
    let (mut fit, mut on_one) = (Vec::new(), Vec::new());
    let mut tally = HistoryTally::default();
    for r in records {
        // A job that shared the cores with another lane's ran slower than alone; the
        // profile's costs are of jobs alone (the pool model adds the sharing), so only
        // those (and records of older files, which do not say) are fitted. Warm ones
        // are left out by the fit itself, and counted here.
        if r.model != model {
            tally.other_model += 1;
            continue;
        }
        if r.alone == Some(false) {
            tally.shared += 1;
            continue;
        }
        if r.warm == Some(true) {
            tally.warm += 1;
        }
        match r.threads {
            None => fit.push(r),
            t if t == threads => fit.push(r),
            Some(1) => on_one.push(r),
            Some(_) => tally.other_threads += 1,
        }
    }
    tally.used = (fit.len() + on_one.len()).saturating_sub(tally.warm);
    (fit, on_one, tally)
}

/// Stage costs fitted from one-thread `samples` (on a copy of `device`), as the profile's
/// one-thread table.
fn one_thread_costs(device: &DeviceProfile, samples: &[HistoryRecord]) -> Vec<OneThreadCost> {
    fit_profile_alone(&mut device.clone(), samples, &[], 1)
        .into_iter()
        .map(|f| OneThreadCost {
            processor: f.processor,
            cost: f.cost,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use hetsched_runtime::history::HistoryRecord;

    #[test]
    fn each_precision_gets_the_median_of_its_prefills_gaps() {
        let gaps: Vec<(String, f64)> = [("f32", 9e4), ("w8a8", 5e4), ("f32", 7e4), ("f32", 8e4)]
            .into_iter()
            .map(|(p, ns)| (p.to_string(), ns))
            .collect();
        let by = super::gaps_by_precision(&gaps);
        let pairs: Vec<(&str, f64)> = by.iter().map(|g| (g.precision.as_str(), g.us)).collect();
        assert_eq!(pairs, [("f32", 80.0), ("w8a8", 50.0)]);
    }

    /// A refit from a history uses only records alone, of the model, on the profile's
    /// threads (one-thread ones apart); a record that does not say counts.
    #[test]
    fn from_history_leaves_out_shared_jobs() {
        let record = |alone, warm, threads| HistoryRecord {
            model: "m".into(),
            precision: "w8a8".into(),
            stage: "q_proj".into(),
            processor: "npu-emu".into(),
            tokens: 64,
            past: 0,
            ns: 1000,
            attention: false,
            window: None,
            prompt_len: 512,
            chunk_len: 64,
            threads,
            alone,
            overlapped_ns: None,
            warm,
        };
        let records = vec![
            record(Some(true), Some(false), Some(2)),
            record(Some(true), None, None),
            record(Some(false), Some(false), Some(2)),
            record(Some(true), Some(false), Some(1)),
            record(Some(true), Some(false), Some(4)),
        ];
        let (fit, on_one, tally) = super::split_history(records.clone(), "m", 2);
        assert_eq!(fit, records[..2]);
        assert_eq!(on_one, records[3..4]);
        assert_eq!((tally.used, tally.shared, tally.other_threads), (3, 1, 1));
        assert!(super::split_history(records, "other", 2).0.is_empty());
    }
}
