//! Loading a model for `run`, `eval` and `calibrate`: which calibration a w8a8-shadow run
//! follows, and the library's loader with a spinner while it reads the weights.

use std::path::{Path, PathBuf};

use hetsched::exec::{self, Calibration, LinearPrecision, LoadedModels};

use crate::CliError;
use crate::choices::Scale;
use crate::progress::Bar;

/// Which calibration a w8a8-shadow run follows.
#[derive(clap::Args)]
pub struct ShadowArgs {
    /// Calibration file for w8a8-shadow [default: MODEL.calibration.json beside the model
    /// when it exists; without one every site is shadowed with every float row resident].
    #[arg(long, value_name = "FILE", conflicts_with = "no_calibration")]
    calibration: Option<PathBuf>,
    /// Ignore the calibration file beside the model (shadow every site, every row).
    #[arg(long)]
    no_calibration: bool,
    /// Re-decide the calibration's pruning: the share of sites whose shadow is dropped.
    #[arg(long, value_name = "RATE")]
    prune: Option<f64>,
    /// Override the calibration's scale for pruned sites: max (each tensor's max |x|),
    /// percentile (the calibrated percentile of |x|; values beyond saturate) or hot-max
    /// (the max |x| outside the site's top channels, whose rows shadow the rest).
    #[arg(long, value_enum)]
    pruned_scale: Option<Scale>,
    /// Cold shadow rows (read from the model file on an outlier in a channel calibration
    /// saw no outlier in) kept in memory once read, MiB shared by every linear; 0 reads
    /// every miss again.
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    cold_cache_mib: u64,
}

impl ShadowArgs {
    /// The cold-row cache in bytes.
    pub fn cold_cache_bytes(&self) -> u64 {
        self.cold_cache_mib.saturating_mul(1 << 20)
    }
}

/// A calibration file and its contents.
pub type FoundCalibration = (PathBuf, Calibration);

/// The calibration a `precision` run follows: `--calibration FILE` (which must exist),
/// else the default file beside the model if there is one; none for other precisions or
/// with `--no-calibration`. `--prune` re-decides its kept sites.
pub fn find_calibration(
    model: &Path,
    precision: LinearPrecision,
    args: &ShadowArgs,
) -> Result<Option<FoundCalibration>, CliError> {
    let overrides = args.prune.is_some() || args.pruned_scale.is_some();
    if precision != LinearPrecision::W8a8Shadow || args.no_calibration {
        if args.calibration.is_some() || overrides {
            return Err(CliError::CalibrationUnused);
        }
        return Ok(None);
    }
    let path = match &args.calibration {
        Some(path) => path.clone(),
        None => {
            let path = exec::default_calibration_path(model);
            if !path.exists() {
                if overrides {
                    return Err(CliError::NoCalibration {
                        calibration: path,
                        model: model.to_owned(),
                    });
                }
                return Ok(None);
            }
            path
        }
    };
    let mut calibration = Calibration::load(&path)?;
    // The scale first: the residual importance that --prune ranks by depends on it.
    if let Some(scale) = args.pruned_scale {
        calibration.pruned_scale = scale.into();
    }
    if let Some(rate) = args.prune {
        calibration.prune(rate)?;
    }
    Ok(Some((path, calibration)))
}

/// Loads the tokenizer and `path` at one `precision`, with the calibration a w8a8-shadow
/// run follows (`find_calibration`).
pub fn load_one(
    path: &Path,
    precision: LinearPrecision,
    shadow: &ShadowArgs,
) -> Result<LoadedModels, CliError> {
    let calibration = find_calibration(path, precision, shadow)?;
    load(
        path,
        &[precision],
        calibration.as_ref(),
        shadow.cold_cache_bytes(),
    )
}

/// Loads the tokenizer and the model at each of `precisions`, a spinner on stderr while
/// it reads.
pub fn load(
    path: &Path,
    precisions: &[LinearPrecision],
    calibration: Option<&FoundCalibration>,
    cold_cache_bytes: u64,
) -> Result<LoadedModels, CliError> {
    let mut bar = Bar::spinner(&format!("loading {}", path.display()));
    Ok(exec::load_models(
        path,
        precisions,
        calibration.map(|(path, c)| (path.as_path(), c)),
        cold_cache_bytes,
        &mut bar,
    )?)
}

/// The prompt of `run` and `generate`: text on the command line, or a file.
#[derive(clap::Args)]
pub struct PromptArgs {
    /// Prompt text.
    #[arg(
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    prompt: Option<String>,
    /// File holding the prompt text (UTF-8).
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
}

impl PromptArgs {
    /// The prompt: the text given, or the file's, read by `read`.
    pub fn text(
        &self,
        read: impl FnOnce(&Path) -> Result<String, CliError>,
    ) -> Result<String, CliError> {
        match (&self.prompt, &self.prompt_file) {
            (Some(text), _) => Ok(text.clone()),
            (None, Some(path)) => read(path),
            // clap requires one of the two.
            (None, None) => Ok(String::new()),
        }
    }
}

/// Reads a UTF-8 text input file of at most `max` bytes (one of the text limits in
/// `hetsched::limits`), checked before it is read; `what` names it in the error.
pub fn read_text(what: &'static str, path: &Path, max: u64) -> Result<String, CliError> {
    hetsched::limits::read_text(path, max).map_err(|error| CliError::Read {
        what,
        path: path.to_owned(),
        error,
    })
}

/// Refuses, before the model loads, prefill settings no model makes valid: 0 compute
/// threads, a chunk of 0 tokens (as `PrefillOptions::validate` would after loading).
pub fn check_prefill_settings(threads: Option<usize>, chunk_len: u32) -> Result<(), CliError> {
    let options = hetsched::exec::PrefillOptions {
        threads: threads.unwrap_or(1),
        chunk_len,
        ..hetsched::exec::PrefillOptions::default()
    };
    Ok(options.validate()?)
}

/// Refuses an empty text input (`what`: "prompt", "text file") before the model loads:
/// it has no token to run.
pub fn check_prompt_text(what: &'static str, text: &str) -> Result<(), CliError> {
    match text.is_empty() {
        true => Err(CliError::EmptyInput { what }),
        false => Ok(()),
    }
}
