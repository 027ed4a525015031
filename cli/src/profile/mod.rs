//! `hetsched profile`: measures every stage kind of a real model on this machine's queues
//! over a grid of chunk lengths and prompt lengths (so attention sees a range of
//! contexts), with repetitions; fits a cost model per (stage kind, processor, precision)
//! and writes a device profile that `simulate` and `run --profile` load, with the raw
//! samples beside it (docs/calibration.md, "Measured profiles").

pub(crate) mod host;
mod samples;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use hetsched::exec::{self, ExecModel, GpuUse, LinearPrecision, PrefillOptions};
use hetsched::progress::Progress;
use hetsched::scene::toml_text;
use hetsched::systems::{DeviceProfile, ProfileOrigin, precision_label};
use serde::Serialize;

use crate::CliError;
use crate::choices::Precision;
use crate::model::{ShadowArgs, find_calibration, load, read_text};
use crate::output::{check_outputs, print_json_or, write_file};
use crate::progress::Bar;
use crate::real::{gpu_use, prompt_tokens};
use hetsched::history::{
    HistoryRecord, HistoryScope, HistoryTally, check_records, read_history, records_on,
    require_samples,
};
use hetsched::profiling::{StageFit, fit_profile_alone, job_gap_ns, two_job_rate};
use hetsched::systems::{OneThreadCost, PrecisionGap, PrecisionWarm};
use hetsched::weight_reuse::warm_saving_per_byte;
use samples::to_csv;

/// The host's SIMD features, as a measured profile records them.
pub fn host_features() -> Vec<String> {
    host::cpu_features()
}

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

/// Measures, fits, writes; prints the summary.
pub fn profile(args: ProfileArgs) -> Result<(), CliError> {
    let started = Instant::now();
    let files = ProfileFiles::beside(&args.out);
    check_outputs([
        Some(files.device.as_path()),
        Some(files.samples.as_path()),
        Some(files.model.as_path()),
        Some(files.scene.as_path()),
    ])?;
    if args.chunk_lens.is_empty() || args.chunk_lens.contains(&0) {
        return Err(CliError::NoChunkLens);
    }
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
    let cache_bytes = host::last_level_cache_bytes();
    let grid = Grid {
        chunk_lens: &args.chunk_lens,
        prompt_lens: &args.prompt_lens,
        reps: args.reps.max(1),
        cache_bytes,
    };
    let text = text.as_str();
    let (two_job_rate, warm_weights) = match &args.from_history {
        Some(_) => (None, Vec::new()),
        None => grid.sharing(&models, &loaded.tokenizer, text, &options)?,
    };
    let (samples, device, gaps, one_thread) = match history {
        Some((path, records)) => {
            let device = match gpu {
                GpuUse::Off => options.device.clone(),
                _ => exec::with_gpu_lane(options.device.clone()),
            };
            let scope = HistoryScope::of(&models[0].model_config(), &device)
                .map_err(hetsched::exec::ExecError::from)?;
            check_records(path, &records, &scope)?;
            let (samples, on_one, tally) = split_history(records, &models[0].name, options.threads);
            require_samples(path, &samples, &tally)?;
            eprintln!("{}: {tally}", path.display());
            let one_thread = one_thread_costs(&device, &on_one);
            (samples, device, Vec::new(), one_thread)
        }
        None => {
            let (samples, device, gaps) =
                grid.measure(&models, &loaded.tokenizer, text, &options)?;
            let one_thread =
                grid.one_thread(&models, &loaded.tokenizer, text, &options, &device)?;
            (samples, device, gaps, one_thread)
        }
    };
    let prefills = gaps.len();
    let mut device = device;
    let fits = fit_profile_alone(&mut device, &samples, &one_thread, options.threads);
    let first = &models[0];
    device.name = format!("{} (measured by hetsched profile)", host::cpu_name());
    device.measured = Some(ProfileOrigin {
        model: first.name.clone(),
        model_shape: ProfileOrigin::shape_of(&first.model_config()),
        precisions: models
            .iter()
            .map(|m| precision_label(&m.model_config()))
            .collect(),
        cpu: host::cpu_name(),
        cpu_features: host::cpu_features(),
        threads: options.threads,
        backends: args.backends.join(","),
        samples: file_name(&files.samples),
        job_gap_us: median(gaps.iter().map(|g| g.1).collect()) / 1e3,
        job_gaps: gaps_by_precision(&gaps),
        two_job_rate: two_job_rate.unwrap_or(0.0),
        one_thread,
        adapted: Vec::new(),
        cache_bytes: cache_bytes.unwrap_or(0),
        warm_weights,
    });
    // A fit that came out absurd (a cost past its range) is refused, not written: the
    // same check every reader of the profile applies.
    device.validate().map_err(hetsched::exec::ExecError::from)?;
    let summary = ProfileSummary {
        model: first.name.clone(),
        device: files.device.display().to_string(),
        samples_file: files.samples.display().to_string(),
        scene_file: files.scene.display().to_string(),
        prefills,
        samples: samples.len(),
        seconds: started.elapsed().as_secs_f64(),
        worst_fit_error: fits.iter().map(|f| f.cost.fit_error).fold(0.0, f64::max),
        two_job_rate,
        fits,
    };
    print_json_or(args.json, &summary, || summary_text(&summary));
    write_profile(&files, &device, first, &samples, &args.prompt_lens)
}

/// The prefills a profile runs: every chunk length x prompt length, `reps` times.
struct Grid<'a> {
    chunk_lens: &'a [u32],
    prompt_lens: &'a [u32],
    reps: u32,
    /// The host's last-level cache, if known: which jobs ran with their weights cached.
    cache_bytes: Option<u64>,
}

impl Grid<'_> {
    /// Runs the grid for every model (one per precision) after one warm-up prefill each;
    /// returns the samples, the device the prefills ran on and each prefill's precision
    /// and hand-off gap (its idle time per hand-off, `profiling::job_gap_ns`), ns.
    ///
    /// The models take turns at each setting (rep, prompt length, chunk length): a slow
    /// spell of the machine (another process, a noisy neighbour) then spreads over every
    /// precision instead of skewing the one measured during it (a profile that
    /// ran each precision's grid in one block priced w8a8's stages 15-60% above an
    /// earlier one on the same build).
    fn measure(
        &self,
        models: &[Arc<ExecModel>],
        tokenizer: &hetsched::import::GgufTokenizer,
        text: &str,
        options: &PrefillOptions,
    ) -> Result<(Vec<HistoryRecord>, DeviceProfile, Vec<PrefillGap>), CliError> {
        let settings = self.chunk_lens.len() * self.prompt_lens.len() * self.reps as usize;
        let mut bar = Bar::new("prefills");
        bar.set_len((models.len() * (settings + 1)) as u64);
        let (mut samples, mut device, mut gaps) = (Vec::new(), None, Vec::new());
        let context = |model: &ExecModel| model.config.context_length;
        for model in models {
            bar.set_message(model.precision.as_str());
            let warm = prompt_tokens(
                tokenizer,
                text,
                self.prompt_lens.first().map_or(256, |&p| p.min(256)) as usize,
                context(model),
            )?;
            exec::prefill(model.clone(), &warm, options)?;
            bar.inc(1);
        }
        for _ in 0..self.reps {
            for &prompt in self.prompt_lens {
                // Tokenized once per prompt length and model, not per chunk length.
                let prompts = models
                    .iter()
                    .map(|model| prompt_tokens(tokenizer, text, prompt as usize, context(model)))
                    .collect::<Result<Vec<_>, _>>()?;
                for &chunk_len in self.chunk_lens {
                    let options = PrefillOptions {
                        chunk_len,
                        ..options.clone()
                    };
                    for (model, tokens) in models.iter().zip(&prompts) {
                        bar.set_message(model.precision.as_str());
                        let result = exec::prefill(model.clone(), tokens, &options)?;
                        device.get_or_insert_with(|| result.outcome.plan.device.clone());
                        samples.extend(records_on(
                            &result.outcome,
                            options.threads,
                            self.cache_bytes,
                        ));
                        gaps.push((
                            precision_label(&model.model_config()),
                            job_gap_ns(&result.outcome),
                        ));
                        bar.inc(1);
                    }
                }
            }
        }
        bar.finish();
        let device = device.unwrap_or_else(|| match options.gpu {
            GpuUse::Off => options.device.clone(),
            _ => exec::with_gpu_lane(options.device.clone()),
        });
        Ok((samples, device, gaps))
    }
}

/// One prefill's precision and its hand-off gap, ns.
type PrefillGap = (String, f64);

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
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    hetsched::systems::median(&mut values)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl Grid<'_> {
    /// `text`'s tokens cut to the first prompt length (512 without one): the prompt of the
    /// sharing runs.
    fn first_prompt(
        &self,
        model: &ExecModel,
        tokenizer: &hetsched::import::GgufTokenizer,
        text: &str,
    ) -> Result<Vec<u32>, CliError> {
        let prompt = self.prompt_lens.first().copied().unwrap_or(512);
        prompt_tokens(
            tokenizer,
            text,
            prompt as usize,
            model.config.context_length,
        )
    }

    /// How two jobs share the pool, and what cached weights save: at the first prompt
    /// length, each chunk length `reps` times. The first model runs once with `inorder`
    /// (jobs alone, every weight read from memory) and once with `balance` (jobs
    /// overlapping): the two-job rate is the median of `profiling::two_job_rate` over
    /// those pairs (one pair is noisy: a few hundred overlaps of a few milliseconds).
    /// Every model (precision) runs once with `layerwise` (jobs alone, each stage's
    /// first chunk cold and the rest warm): its saving per cached weight byte is
    /// `weight_reuse::warm_saving_per_byte` over those runs, with the host's cache (none
    /// measured without a known one).
    fn sharing(
        &self,
        models: &[Arc<ExecModel>],
        tokenizer: &hetsched::import::GgufTokenizer,
        text: &str,
        options: &PrefillOptions,
    ) -> Result<(Option<f64>, Vec<PrecisionWarm>), CliError> {
        let cache_bytes = self.cache_bytes;
        let mut rates = Vec::new();
        let mut warm = Vec::new();
        for (k, model) in models.iter().enumerate() {
            let tokens = self.first_prompt(model, tokenizer, text)?;
            let mut layerwise = Vec::new();
            for _ in 0..self.reps {
                for &chunk_len in self.chunk_lens {
                    let run = |policy: &str| {
                        let options = PrefillOptions {
                            chunk_len,
                            policy: policy.into(),
                            ..options.clone()
                        };
                        exec::prefill(model.clone(), &tokens, &options)
                    };
                    if k == 0 {
                        let alone = run("inorder")?;
                        let shared = run("balance")?;
                        rates.extend(two_job_rate(&alone.outcome, &shared.outcome));
                    }
                    if cache_bytes.is_some() {
                        layerwise.push(run("layerwise")?.outcome);
                    }
                }
            }
            if let Some(ns_per_byte) = cache_bytes.and_then(|c| warm_saving_per_byte(&layerwise, c))
            {
                warm.push(PrecisionWarm {
                    precision: precision_label(&model.model_config()),
                    ns_per_byte,
                });
            }
        }
        Ok(((!rates.is_empty()).then(|| median(rates)), warm))
    }
}

impl Grid<'_> {
    /// Every stage's cost on one compute thread: each model's prefill of the first prompt
    /// length at every chunk length, and of the longest prompt length at the middle chunk
    /// length (the attention contexts the grid covers: a windowed layer's cost changes
    /// slope past its window), once each, on a one-worker pool (where jobs never overlap),
    /// fitted like the grid. With the costs on the profile's threads it gives each stage's
    /// speed-up, which says how two jobs share the pool (`run --predict`).
    fn one_thread(
        &self,
        models: &[Arc<ExecModel>],
        tokenizer: &hetsched::import::GgufTokenizer,
        text: &str,
        options: &PrefillOptions,
        device: &DeviceProfile,
    ) -> Result<Vec<OneThreadCost>, CliError> {
        if options.threads <= 1 {
            return Ok(Vec::new());
        }
        let settings = self.one_thread_settings();
        let mut bar = Bar::new("one thread");
        bar.set_len((models.len() * settings.len()) as u64);
        let mut samples = Vec::new();
        // The models take turns at each setting, as in `measure`.
        for &(prompt, chunk_len) in &settings {
            for model in models {
                let tokens = prompt_tokens(
                    tokenizer,
                    text,
                    prompt as usize,
                    model.config.context_length,
                )?;
                let options = PrefillOptions {
                    chunk_len,
                    threads: 1,
                    ..options.clone()
                };
                let result = exec::prefill(model.clone(), &tokens, &options)?;
                samples.extend(records_on(&result.outcome, 1, self.cache_bytes));
                bar.inc(1);
            }
        }
        bar.finish();
        Ok(one_thread_costs(device, &samples))
    }

    /// The one-thread pass's (prompt, chunk) prefills: the first prompt length at every
    /// chunk length, then the longest prompt length (when longer) at the middle chunk
    /// length.
    fn one_thread_settings(&self) -> Vec<(u32, u32)> {
        let first = self.prompt_lens.first().copied().unwrap_or(512);
        let mut settings: Vec<(u32, u32)> = self.chunk_lens.iter().map(|&c| (first, c)).collect();
        let longest = self.prompt_lens.iter().copied().max().unwrap_or(first);
        if longest > first {
            let mut chunks = self.chunk_lens.to_vec();
            chunks.sort_unstable();
            if let Some(&middle) = chunks.get(chunks.len() / 2) {
                settings.push((longest, middle));
            }
        }
        settings
    }
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

/// Writes the device profile, the samples, the model file and a scene naming both.
fn write_profile(
    files: &ProfileFiles,
    device: &DeviceProfile,
    model: &ExecModel,
    samples: &[HistoryRecord],
    prompt_lens: &[u32],
) -> Result<(), CliError> {
    write_file(&files.device, &toml(device)?)?;
    write_file(&files.samples, &to_csv(samples)?)?;
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

#[cfg(test)]
mod tests {
    use super::Grid;

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

    #[test]
    fn the_one_thread_pass_covers_the_longest_prompt_at_the_middle_chunk() {
        let grid = Grid {
            chunk_lens: &[256, 64, 128],
            prompt_lens: &[512, 2048],
            reps: 2,
            cache_bytes: None,
        };
        assert_eq!(
            grid.one_thread_settings(),
            [(512, 256), (512, 64), (512, 128), (2048, 128)]
        );
        let one_prompt = Grid {
            prompt_lens: &[512],
            ..grid
        };
        assert_eq!(one_prompt.one_thread_settings().len(), 3);
    }

    /// `--from-history` fits only records alone, of the model, on the profile's threads
    /// (one-thread ones apart); a record that does not say counts.
    #[test]
    fn from_history_leaves_out_shared_jobs() {
        use hetsched::history::HistoryRecord;
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
