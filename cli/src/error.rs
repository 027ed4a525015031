//! Why a command failed: the library's typed errors, and the few mistakes only the
//! command line can make. `main` prints one `error: ...` line and exits non-zero.

use std::io;
use std::path::PathBuf;

use hetsched::budget::BudgetError;
use hetsched::compare::CompareError;
use hetsched::engine::EngineError;
use hetsched::exec::{CalibrationError, ExecError, LoadError};
use hetsched::import::ImportError;
use hetsched::scene::SceneError;
use thiserror::Error;

/// A command's failure.
#[derive(Debug, Error)]
pub enum CliError {
    /// A scene or its plan is invalid.
    #[error(transparent)]
    Scene(#[from] SceneError),
    /// A memory budget is not understood or cannot be met.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// A simulation stopped early.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A comparison or sweep failed.
    #[error(transparent)]
    Compare(#[from] CompareError),
    /// A model could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A real prefill, evaluation or calibration failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// Profiling or a prediction failed.
    #[error(transparent)]
    Profiling(#[from] hetsched::profiling::ProfilingError),
    /// Generation failed or was asked for with bad settings.
    #[error(transparent)]
    Generate(#[from] hetsched::exec::generate::GenerateError),
    /// A calibration file is missing, corrupt, or cannot be pruned as asked.
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    /// The text could not be tokenized.
    #[error(transparent)]
    Import(#[from] ImportError),
    /// A prompt or text input is empty: nothing to run.
    #[error("the {what} is empty: give at least one token of text")]
    EmptyInput {
        /// Which input ("prompt", "text file").
        what: &'static str,
    },
    /// `--stop ""`: an empty stop string would end generation before its first token.
    #[error(
        "--stop \"\" is an empty stop string, which would match before any text; give a non-empty one"
    )]
    EmptyStop,
    /// The Ctrl-C handler could not be installed.
    #[error("cannot install the Ctrl-C handler: {error}")]
    Signal {
        /// The OS error.
        error: io::Error,
    },
    /// The server could not start or stopped with an error.
    #[error(transparent)]
    Serve(#[from] hetsched_serve::ServeError),
    /// A request trace that cannot be used.
    #[error(transparent)]
    RequestTrace(#[from] hetsched::request_trace::TraceError),
    /// A request mix that cannot be simulated.
    #[error(transparent)]
    Requests(#[from] hetsched::requests::RequestsError),
    /// A request the real request engine refused (`run --requests`).
    #[error(transparent)]
    Submit(#[from] hetsched::exec::generate::requests::SubmitError),
    /// A request of `run --requests` failed or never finished.
    #[error("a request failed: {0}")]
    RequestFailed(String),
    /// An arrival scale that is not a factor (`run --requests --arrival-scale`).
    #[error("arrival scale {0}: give a number above 0, at most 1000")]
    ArrivalScale(f64),
    /// A number of seconds that is not a time.
    #[error("{name} {value}: give a number of seconds, 0 or more")]
    InvalidSeconds {
        /// The option.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// An input file could not be read.
    #[error("cannot read {what} {}: {error}", path.display())]
    Read {
        /// What the file is for ("prompt file", "text file", "corpus file").
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// An output path cannot be written; found before any work.
    #[error("cannot write {}: {error} (checked before the run; nothing was done)", path.display())]
    Unwritable {
        /// The output file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// An output file could not be written after the work (its results were printed).
    #[error("cannot write {}: {error}", path.display())]
    Write {
        /// The output file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The report could not be written to stdout (a closed pipe is handled apart: a
    /// quiet exit with status 141).
    #[error("cannot write to stdout: {error}")]
    Stdout {
        /// The OS error.
        error: io::Error,
    },
    /// The sweep's rows could not be formatted as CSV.
    #[error("cannot write CSV: {0}")]
    Csv(#[from] csv::Error),
    /// An option that `generate --n` above 1 cannot go with.
    #[error("--n above 1 decodes the samples together in batched steps: {0}")]
    SamplesWith(&'static str),
    /// `--backends` names something other than cpu, gpu and npu.
    #[error("unknown backend `{0}`: use cpu, gpu and npu")]
    UnknownBackend(String),
    /// `--backends` names a set of lanes no run uses.
    #[error(
        "--backends takes cpu,npu (INT8 stages on the emulated NPU lane, float work on the cpu lane), cpu,gpu,npu (float stages on a Vulkan GPU lane) or gpu (every stage on the GPU, f32, weights and KV cache resident)"
    )]
    BackendSet,
    /// `--gpu-weights f16` without the resident GPU path.
    #[error("--gpu-weights f16 applies to --backends gpu (every stage resident on the GPU)")]
    GpuWeightsNotResident,
    /// A calibration option without a w8a8-shadow run that follows a calibration.
    #[error("--calibration and --prune apply to --precision w8a8-shadow with a calibration")]
    CalibrationUnused,
    /// `--prune` or `--pruned-scale` with no calibration to re-decide.
    #[error(
        "--prune needs a calibration: none at {}; run `hetsched calibrate --model {} --corpus TEXT` or pass --calibration FILE",
        calibration.display(),
        model.display()
    )]
    NoCalibration {
        /// Where the default calibration was looked for.
        calibration: PathBuf,
        /// The model.
        model: PathBuf,
    },
    /// `sweep --chunk-lens` was given empty.
    #[error("give at least one chunk length with --chunk-lens")]
    NoChunkLens,
    /// A run history could not be read or written.
    #[error(transparent)]
    History(#[from] hetsched::history::HistoryError),
    /// A value could not be written as TOML.
    #[error("cannot write TOML: {0}")]
    Toml(String),
    /// A measured profile of another model.
    #[error(
        "the profile {} was measured on {profiled} ({profiled_shape}), not on {model} ({shape}): its stage costs do not hold; profile this model with `hetsched profile`",
        path.display()
    )]
    ProfileModel {
        /// The profile file.
        path: PathBuf,
        /// The model it was measured on.
        profiled: String,
        /// That model's shape.
        profiled_shape: String,
        /// The model of this run.
        model: String,
        /// Its shape.
        shape: String,
    },
    /// A prompt length of zero tokens.
    #[error("--prompt-len must be at least 1")]
    EmptyPromptLen,
    /// A profile could not be measured (what no other variant names).
    #[error(transparent)]
    Profile(hetsched::exec::profile::ProfileError),
    /// A `HETSCHED_GPU_*` variable the command cannot read.
    #[error("{variable}={value}: expected {expected}")]
    GpuEnvironment {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it takes.
        expected: &'static str,
    },
}

impl From<hetsched::exec::profile::ProfileError> for CliError {
    /// The profile method's errors as the command's own, so that their messages stay
    /// those of the flags they are about.
    fn from(e: hetsched::exec::profile::ProfileError) -> Self {
        use hetsched::exec::profile::ProfileError;
        match e {
            ProfileError::EmptyPrompt => Self::EmptyPromptLen,
            ProfileError::NoChunkLens => Self::NoChunkLens,
            ProfileError::Exec(e) => Self::Exec(e),
            ProfileError::Import(e) => Self::Import(e),
            ProfileError::History(e) => Self::History(e),
            other => Self::Profile(other),
        }
    }
}
