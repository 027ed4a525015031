//! `hetsched profile`: measures every stage kind of a real model on this machine's queues
//! over a grid of chunk lengths and prompt lengths (so attention sees a range of
//! contexts), with repetitions; fits a cost model per (stage kind, processor, precision)
//! and writes a device profile that `simulate` and `run --profile` load, with the raw
//! samples beside it (docs/calibration.md, "Measured profiles").

mod samples;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use hetsched::exec::profile::{self as method, MeasuredProfile, ProfileGrid, ProfileSetup};
use hetsched::exec::{ExecModel, LinearPrecision, PrefillOptions};
use hetsched::history::read_history;
use hetsched::profiling::StageFit;
use hetsched::progress::Progress;
use hetsched::scene::toml_text;
use serde::Serialize;

use crate::CliError;
use crate::choices::Precision;
use crate::model::{ShadowArgs, find_calibration, load, read_text};
use crate::output::{check_outputs, print_json_or, write_file};
use crate::progress::Bar;
use crate::real::gpu_use;
use samples::to_csv;

/// `hetsched profile`.
#[derive(clap::Args)]
pub struct ProfileArgs {
    /// GGUF model file or Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    /// Processor queues: cpu,npu (the emulated NPU) or cpu,gpu,npu.
    #[arg(long, value_delimiter = ',', default_value = "cpu,npu")]
    backends: Vec<String>,
    /// Compute threads [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Precisions to profile, comma-separated (w8a8-shadow follows the calibration file).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "w8a8")]
    precision: Vec<Precision>,
    /// Chunk lengths (tokens per stage instance), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256")]
    chunk_lens: Vec<u32>,
    /// Prompt lengths, comma-separated: the longest sets the attention contexts covered.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    prompt_lens: Vec<u32>,
    /// Repetitions of each (precision, chunk, prompt) prefill.
    #[arg(long, default_value_t = 2)]
    reps: u32,
    /// Refit from a run history (written by `hetsched run` with a history file) instead of
    /// measuring: its records of this model, the costs from runs on `--threads` threads,
    /// the one-thread table from runs on one thread.
    #[arg(long, value_name = "FILE")]
    from_history: Option<PathBuf>,
    /// The policy scheduling the profiled prefills (`inorder`: on the host's queues its
    /// jobs never overlap, so each sample is a job's time alone on the pool; how jobs
    /// share the pool is measured apart, by one `balance` run).
    #[arg(long, default_value = "inorder", value_parser = crate::choices::policy_name)]
    policy: String,
    #[command(flatten)]
    shadow: ShadowArgs,
    /// Text the profiled prefills repeat to each prompt length (UTF-8) [default: a
    /// built-in sentence]. w8a8-shadow's costs follow the outliers the text's activations
    /// produce (up to 30% apart between two texts at the same length): profile on text
    /// like what the runs will serve.
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// The device profile to write (TOML); the samples (SAMPLES.csv), a model file and a
    /// scene that `simulate` runs are written beside it.
    #[arg(long, value_name = "DEVICE.toml")]
    out: PathBuf,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

/// The text the profiled prefills repeat without `--prompt-file`.
const DEFAULT_TEXT: &str = "The committee reviewed the proposal in detail, weighing its costs \
    against the benefits it promised to the city and to the people who live there. ";

/// The files a profile writes, beside each other.
struct ProfileFiles {
    device: PathBuf,
    samples: PathBuf,
    model: PathBuf,
    scene: PathBuf,
}

impl ProfileFiles {
    fn beside(device: &Path) -> Self {
        let stem = device
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "device".into());
        let sibling = |suffix: &str| device.with_file_name(format!("{stem}{suffix}"));
        Self {
            device: device.to_path_buf(),
            samples: sibling(".samples.csv"),
            model: sibling(".model.toml"),
            scene: sibling(".scene.toml"),
        }
    }
}

/// What `profile --json` prints.
#[derive(Serialize)]
struct ProfileSummary {
    model: String,
    device: String,
    samples_file: String,
    scene_file: String,
    prefills: usize,
    samples: usize,
    seconds: f64,
    worst_fit_error: f64,
    /// Rate of each of two jobs sharing the pool, relative to one alone (null: none
    /// overlapped, or refitted from a history).
    two_job_rate: Option<f64>,
    fits: Vec<StageFit>,
}

/// Measures (or refits from a history), fits, writes; prints the summary. The method is
/// the library's (`hetsched::exec::profile`); this parses, draws progress and writes files.
pub fn profile(args: ProfileArgs) -> Result<(), CliError> {
    let started = Instant::now();
    let files = ProfileFiles::beside(&args.out);
    check_outputs([
        Some(files.device.as_path()),
        Some(files.samples.as_path()),
        Some(files.model.as_path()),
        Some(files.scene.as_path()),
    ])?;
    let grid = ProfileGrid {
        chunk_lens: args.chunk_lens.clone(),
        prompt_lens: args.prompt_lens.clone(),
        reps: args.reps,
    };
    grid.check()?;
    let gpu = gpu_use(&args.backends)?;
    crate::model::check_prefill_settings(args.threads, 1)?;
    // Read before the model loads: a missing or corrupt history fails at once.
    let history = match &args.from_history {
        Some(path) => Some((path, read_history(path)?)),
        None => None,
    };
    // Read before the model loads: a missing file fails at once.
    let text = match &args.prompt_file {
        Some(path) => read_text("prompt file", path, hetsched::limits::MAX_PROMPT_BYTES)?,
        None => DEFAULT_TEXT.to_string(),
    };
    let precisions: Vec<LinearPrecision> = args.precision.iter().map(|&p| p.into()).collect();
    let calibration = match precisions.contains(&LinearPrecision::W8a8Shadow) {
        true => find_calibration(&args.model, LinearPrecision::W8a8Shadow, &args.shadow)?,
        false => None,
    };
    let loaded = load(
        &args.model,
        &precisions,
        calibration.as_ref(),
        args.shadow.cold_cache_bytes(),
    )?;
    let models: Vec<Arc<ExecModel>> = loaded.models.into_iter().map(Arc::new).collect();
    let defaults = PrefillOptions::default();
    let options = PrefillOptions {
        policy: args.policy.clone(),
        threads: args.threads.unwrap_or(defaults.threads),
        gpu,
        gpu_kernels: crate::gpu_env::gpu_kernels()?,
        ..defaults
    };
    let setup = ProfileSetup {
        models: &models,
        tokenizer: &loaded.tokenizer,
        text: &text,
        options: &options,
        grid: &grid,
        cache_bytes: method::last_level_cache_bytes(),
    };
    let measurement = match history {
        Some((path, records)) => {
            let (measurement, tally) = method::from_history(&setup, path, records)?;
            eprintln!("{}: {tally}", path.display());
            measurement
        }
        None => method::measure(&setup, &mut |unit| -> Box<dyn Progress> {
            Box::new(Bar::new(unit))
        })?,
    };
    let measured = measurement.fit(&setup, &args.backends.join(","), &file_name(&files.samples))?;
    let first = &models[0];
    let summary = ProfileSummary::of(&measured, first, &files, started);
    print_json_or(args.json, &summary, || summary_text(&summary));
    write_profile(&files, &measured, first, &args.prompt_lens)
}

impl ProfileSummary {
    fn of(
        measured: &MeasuredProfile,
        model: &ExecModel,
        files: &ProfileFiles,
        started: Instant,
    ) -> Self {
        Self {
            model: model.name.clone(),
            device: files.device.display().to_string(),
            samples_file: files.samples.display().to_string(),
            scene_file: files.scene.display().to_string(),
            prefills: measured.prefills,
            samples: measured.samples.len(),
            seconds: started.elapsed().as_secs_f64(),
            worst_fit_error: measured
                .fits
                .iter()
                .map(|f| f.cost.fit_error)
                .fold(0.0, f64::max),
            two_job_rate: measured.two_job_rate,
            fits: measured.fits.clone(),
        }
    }
}

/// The median of `values` (the upper middle of an even count; 0 if empty).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    hetsched::systems::median(&mut values)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Writes the device profile, the samples, the model file and a scene naming both.
fn write_profile(
    files: &ProfileFiles,
    measured: &MeasuredProfile,
    model: &ExecModel,
    prompt_lens: &[u32],
) -> Result<(), CliError> {
    write_file(&files.device, &toml(&measured.device)?)?;
    write_file(&files.samples, &to_csv(&measured.samples)?)?;
    write_file(&files.model, &toml(&model.model_config())?)?;
    let scene = format!(
        "# Written by `hetsched profile`: the measured device profile with the model it was\n\
         # measured on; `hetsched simulate {scene}` predicts this machine.\n\
         name = \"{name} on this machine (measured profile)\"\n\
         device = \"{device}\"\n\
         model = \"{model_file}\"\n\n\
         [workload]\n\
         prompt_len = {prompt}\n\
         chunk_len = 128\n\
         policy = \"balance\"\n",
        scene = files.scene.display(),
        name = model.name,
        device = file_name(&files.device),
        model_file = file_name(&files.model),
        prompt = prompt_lens.iter().copied().max().unwrap_or(512),
    );
    write_file(&files.scene, &scene)
}

/// `value` as TOML text the scene loader reads back.
fn toml<T: Serialize>(value: &T) -> Result<String, CliError> {
    toml_text(value).map_err(CliError::Toml)
}

fn summary_text(s: &ProfileSummary) -> String {
    let mut text = format!(
        "{}: {} prefills, {} samples in {:.1} s; worst fit error {:.1}%; two jobs sharing the pool run at {} of their alone rate\n",
        s.model,
        s.prefills,
        s.samples,
        s.seconds,
        100.0 * s.worst_fit_error,
        s.two_job_rate
            .map_or("(not measured)".to_string(), |r| format!("{r:.2}"))
    );
    for f in &s.fits {
        let c = &f.cost;
        // A local layer's attention: the pairs of chunks its window cuts cost apart.
        let cut = c.window.map_or(String::new(), |w| {
            format!(
                " ({:.6} us/pair once the window of {w} cuts keys)",
                c.per_window_pair_us
            )
        });
        text.push_str(&format!(
            "  {:<8} {:<11} {:<60} {:>8.1} us + {:>7.3} us/token + {:>9.6} us/pair{cut}  ({} samples, fit error {:.1}%, noise {:.1}%)\n",
            f.processor,
            c.precision,
            c.stage,
            c.launch_us,
            c.per_token_us,
            c.per_pair_us,
            c.samples,
            100.0 * c.fit_error,
            100.0 * c.noise
        ));
    }
    text.push_str(&format!(
        "wrote {} (samples {}); simulate it with `hetsched simulate {}`\n",
        s.device, s.samples_file, s.scene_file
    ));
    text
}
