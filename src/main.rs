//! The `hetsched` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use std::time::Instant;

use hetsched::engine::{self, RunOutcome};
use hetsched::exec::{
    self, Calibration, ExecModel, GpuUse, Importance, LinearPrecision, PrefillOptions,
    PrefillReport, PrunedScale,
};
use hetsched::import::{
    ColumnSource, GgufFile, GgufSource, GgufTokenizer, HfModel, ImportError, LayerTensor,
    LlamaSource,
};
use hetsched::report::RunReport;
use hetsched::scene::{DEFAULT_SCENE, Scene, shipped_scenes};
use hetsched::systems::PolicyRegistry;
use hetsched::timeline::{Trace, chrome::to_chrome_json, svg::to_svg};

#[derive(Parser)]
#[command(
    name = "hetsched",
    version,
    about = "Scheduling core for on-device LLM prefill on CPU, GPU and NPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a prefill on a device profile with a virtual clock.
    Simulate(SimulateArgs),
    /// Prefill a real model (GGUF) on this machine's queues and print the next token.
    Run(RunArgs),
    /// Perplexity of a text, and KL / top-1 agreement of a precision against f32.
    Eval(EvalArgs),
    /// Record activation ranges and outliers over a corpus; decide which layers keep the
    /// outlier shadow; write the calibration file that w8a8-shadow runs follow.
    Calibrate(CalibrateArgs),
    /// Outlier statistics of a calibration file (seed 000 Figs 10-11): table, JSON, SVG.
    Outliers(OutliersArgs),
    /// Compare every policy over scenes and prompt lengths.
    Compare(CompareArgs),
    /// Sweep chunk length x policy (x prompt length) on one scene: CSV and an SVG plot.
    Sweep(SweepArgs),
    /// List the scenes shipped inside the binary.
    Scenes,
}

#[derive(clap::Args)]
struct CompareArgs {
    /// Scene files or shipped scene names [default: every shipped phone scene].
    scenes: Vec<PathBuf>,
    /// Prompt lengths, comma-separated [default: each scene's own].
    #[arg(long, value_delimiter = ',')]
    prompt_lens: Vec<u32>,
    /// Policies, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_parser = policy_name)]
    policies: Vec<String>,
    /// Print the rows as a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct SweepArgs {
    /// Scene file, or the name of a shipped scene [default: qwen1.5-1.8b-xiaomi14].
    scene: Option<PathBuf>,
    /// Chunk lengths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "32,64,128,256,512")]
    chunk_lens: Vec<u32>,
    /// Prompt lengths, comma-separated [default: the scene's own].
    #[arg(long, value_delimiter = ',')]
    prompt_lens: Vec<u32>,
    /// Policies, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_parser = policy_name)]
    policies: Vec<String>,
    /// Write the rows as CSV here [default: print them to stdout].
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write the plot (tokens/s against chunk length, a line per policy) here.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

#[derive(clap::Args)]
struct SimulateArgs {
    /// Scene file, or the name of a shipped scene [default: qwen1.5-1.8b-xiaomi14].
    scene: Option<PathBuf>,
    /// Override the prompt length (tokens).
    #[arg(long)]
    prompt_len: Option<u32>,
    /// Override the chunk length (tokens).
    #[arg(long)]
    chunk_len: Option<u32>,
    /// Scheduling policy: balance (ours, the default), stall (seed 000, Eq. 6), inorder, peer, heft, cpf, lookahead.
    #[arg(long, value_parser = policy_name)]
    policy: Option<String>,
    /// Write a Chrome trace JSON timeline (open in ui.perfetto.dev).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write an SVG timeline picture.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
    /// Memory budget per region: BYTES (e.g. 512MiB), REGION=BYTES[,..], or FACTORx (times
    /// the in-order policy's planned peak).
    #[arg(long, value_name = "BUDGET")]
    memory_budget: Option<hetsched::budget::BudgetSpec>,
    /// Drop the model's outlier shadow (its `[shadow]` table): per-tensor W8A8 alone, to
    /// measure what the shadow costs.
    #[arg(long)]
    no_shadow: bool,
}

#[derive(clap::Args)]
struct RunArgs {
    /// GGUF model file (llama architecture), e.g. models/SmolLM2-135M-Instruct.Q4_1.gguf, or a
    /// Hugging Face directory (config.json, tokenizer.json, *.safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Prompt text.
    #[arg(
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    prompt: Option<String>,
    /// File holding the prompt text.
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 128)]
    chunk_len: u32,
    /// Scheduling policy: balance (ours, the default), stall (seed 000, Eq. 6), inorder, peer, heft, cpf, lookahead.
    #[arg(long, default_value = "balance", value_parser = policy_name)]
    policy: String,
    /// Arithmetic of the linear layers.
    #[arg(long, value_enum, default_value = "w8a8")]
    precision: LinearPrecision,
    /// Compute threads [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Processor queues: cpu,npu (the emulated NPU); cpu,gpu,npu to run the float stages on
    /// a Vulkan GPU lane; gpu alone to run every stage on the GPU with weights and KV cache
    /// resident there (needs --precision f32). GPU needs a build with `--features gpu`.
    #[arg(long, value_delimiter = ',', default_value = "cpu,npu")]
    backends: Vec<String>,
    #[command(flatten)]
    shadow: ShadowArgs,
    /// Write a Chrome trace JSON timeline with real timestamps.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write an SVG timeline picture.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

/// Which calibration a w8a8-shadow run follows.
#[derive(clap::Args)]
struct ShadowArgs {
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
    pruned_scale: Option<PrunedScale>,
    /// Cold shadow rows (read from the model file on an outlier in a channel calibration
    /// saw no outlier in) kept in memory once read, MiB shared by every linear; 0 reads
    /// every miss again.
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    cold_cache_mib: u64,
}

#[derive(clap::Args)]
struct CalibrateArgs {
    /// GGUF model file or Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    /// Text files to calibrate on (e.g. /usr/share/common-licenses/Apache-2.0).
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    corpus: Vec<PathBuf>,
    /// Where to write the calibration [default: MODEL.calibration.json beside the model].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Share of sites (layer x activation) whose outlier shadow is dropped: the least
    /// important ones under --importance.
    #[arg(long, default_value_t = 0.85)]
    prune: f64,
    /// How sites are ranked for pruning: residual (largest |x| a pruned site would
    /// quantize with, outside the channels it keeps, / clipped scale), ratio (seed 000:
    /// largest outlier / clipped scale) or kl (the KL divergence from f32 that pruning the
    /// site alone adds, measured on --sensitivity-windows; one prefill per site and window).
    #[arg(long, value_enum, default_value = "residual")]
    importance: Importance,
    /// With --pruned-scale hot-max: the float rows (KiB) each pruned site keeps resident
    /// for its channels of largest max |x| (at most 256 channels).
    #[arg(long, value_name = "KIB", default_value_t = 256)]
    pruned_shadow_kib: u64,
    /// With --pruned-scale hot-max: a pruned site's ceiling, in RMS of the activation's
    /// bulk; values beyond it in the other channels also go to the shadow, reading their
    /// rows from the model file (higher: fewer reads, less accuracy).
    #[arg(long, value_name = "RMS", default_value_t = exec::PRUNED_CLIP_RMS)]
    pruned_clip_rms: f32,
    /// Windows (the corpus's first) each site's kl importance is measured on.
    #[arg(long, default_value_t = 2)]
    sensitivity_windows: usize,
    /// Tokens per window.
    #[arg(long, default_value_t = 256)]
    ctx: usize,
    /// Windows at most over the whole corpus.
    #[arg(long, default_value_t = 16)]
    max_windows: usize,
    /// Percentile of |x| for each site's clipped scale.
    #[arg(long, default_value_t = 99.99)]
    percentile: f64,
    /// Scale of pruned sites: max (each tensor's max |x|), percentile (the calibrated
    /// percentile of |x|; values beyond saturate) or hot-max (the max |x| outside the
    /// site's --pruned-channels top channels, whose float rows shadow the values beyond).
    #[arg(long, value_enum, default_value = "hot-max")]
    pruned_scale: PrunedScale,
    /// Compute threads [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Write the outlier statistics plot (SVG) here.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print the outlier statistics as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct OutliersArgs {
    /// Calibration file written by `hetsched calibrate`.
    calibration: PathBuf,
    /// Write the plot (SVG) here.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct EvalArgs {
    /// GGUF model file or Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    /// Text to evaluate on (e.g. /usr/share/common-licenses/GPL-3).
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Arithmetic of the linear layers.
    #[arg(long, value_enum, default_value = "w8a8")]
    precision: LinearPrecision,
    /// Tokens per window.
    #[arg(long, default_value_t = 256)]
    ctx: usize,
    /// Evaluate at most this many windows.
    #[arg(long, default_value_t = usize::MAX)]
    max_windows: usize,
    /// Compute threads [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    shadow: ShadowArgs,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => simulate(args),
        Command::Run(args) => run(args),
        Command::Eval(args) => eval(args),
        Command::Calibrate(args) => calibrate(args),
        Command::Outliers(args) => outliers(args),
        Command::Compare(args) => compare(args),
        Command::Sweep(args) => sweep(args),
        Command::Scenes => {
            for name in shipped_scenes() {
                println!("{name}");
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(args: SimulateArgs) -> Result<(), String> {
    let scene_path = args.scene.unwrap_or_else(|| PathBuf::from(DEFAULT_SCENE));
    let mut scene = Scene::load(&scene_path).map_err(|e| e.to_string())?;
    if let Some(n) = args.prompt_len {
        scene.workload.prompt_len = n;
    }
    if let Some(n) = args.chunk_len {
        scene.workload.chunk_len = n;
    }
    if let Some(p) = args.policy {
        scene.policy = p;
    }
    if args.no_shadow {
        scene.model.shadow = None;
    }
    if let Some(budget) = &args.memory_budget {
        hetsched::budget::apply_budget(&mut scene, budget).map_err(|e| e.to_string())?;
    }
    let plan = Arc::new(scene.plan().map_err(|e| e.to_string())?);
    let policy = scene.new_policy().map_err(|e| e.to_string())?;
    let run = engine::simulate(plan, policy).map_err(|e| e.to_string())?;
    let report = RunReport::new(&scene.name, &run);
    let title = format!(
        "{} — {}, {} tokens, chunk {}",
        scene.name, report.policy, report.prompt_len, report.chunk_len
    );
    write_timelines(&title, &run, args.trace.as_deref(), args.svg.as_deref())?;
    print_json_or(args.json, &report, || report.summary());
    Ok(())
}

fn run(args: RunArgs) -> Result<(), String> {
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read prompt file {}: {e}", path.display()))?,
        (None, None) => return Err("give --prompt TEXT or --prompt-file FILE".into()),
    };
    let loading = Instant::now();
    let calibration = find_calibration(&args.model, args.precision, &args.shadow)?;
    let (tokenizer, model) = load_model(
        &args.model,
        &[args.precision],
        calibration.as_ref(),
        args.shadow.cold_cache_mib.saturating_mul(1 << 20),
    )?;
    let model = model.into_iter().next().expect("one precision asked for");
    let tokens = tokenizer.encode(&text).map_err(|e| e.to_string())?;
    let model = Arc::new(model);
    let load_ms = loading.elapsed().as_secs_f64() * 1e3;
    let defaults = PrefillOptions::default();
    let options = PrefillOptions {
        chunk_len: args.chunk_len,
        policy: args.policy,
        threads: args.threads.unwrap_or(defaults.threads),
        gpu: gpu_use(&args.backends)?,
        // A timeline asked for shows the device's times.
        gpu_timestamps: args.trace.is_some() || args.svg.is_some(),
        ..defaults
    };
    let name = model.name.clone();
    let result = exec::prefill(model.clone(), &tokens, &options).map_err(|e| e.to_string())?;
    let report = PrefillReport::new(&model, options.threads, load_ms, &result, &tokenizer);
    let title = format!(
        "{name} ({}) on this machine — {}, {} tokens, chunk {}",
        report.precision, report.schedule.policy, report.prompt_tokens, report.schedule.chunk_len
    );
    write_timelines(
        &title,
        &result.outcome,
        args.trace.as_deref(),
        args.svg.as_deref(),
    )?;
    print_json_or(args.json, &report, || report.summary());
    Ok(())
}

/// How `--backends` uses the GPU: `cpu,npu` (none), `cpu,gpu,npu` (a float lane), or
/// `gpu` alone (every stage resident on the GPU).
fn gpu_use(backends: &[String]) -> Result<GpuUse, String> {
    for b in backends {
        if !["cpu", "gpu", "npu"].contains(&b.as_str()) {
            return Err(format!("unknown backend `{b}`: use cpu, gpu and npu"));
        }
    }
    let has = |name: &str| backends.iter().any(|b| b == name);
    match (has("cpu"), has("gpu"), has("npu")) {
        (false, true, false) => Ok(GpuUse::Resident),
        (true, gpu, true) => Ok(if gpu { GpuUse::FloatLane } else { GpuUse::Off }),
        _ => Err(
            "--backends takes cpu,npu (INT8 stages on the emulated NPU lane, float work on the cpu lane), cpu,gpu,npu (float stages on a Vulkan GPU lane) or gpu (every stage on the GPU, f32, weights and KV cache resident)".into(),
        ),
    }
}

/// The tokenizer and the model at each of `precisions`, from a GGUF file or a Hugging
/// Face directory; a w8a8-shadow model follows `calibration` (its path and contents)
/// when given.
fn load_model(
    path: &Path,
    precisions: &[LinearPrecision],
    calibration: Option<&(PathBuf, Calibration)>,
    cold_cache_bytes: u64,
) -> Result<(GgufTokenizer, Vec<ExecModel>), String> {
    let shown = |e: ImportError| format!("{}: {e}", path.display());
    // Declared first: `source` may borrow it.
    let file;
    let (tokenizer, source, columns): (_, Box<dyn LlamaSource + '_>, Arc<dyn ColumnSource>);
    if path.is_dir() {
        let hf = Arc::new(HfModel::open(path).map_err(shown)?);
        tokenizer =
            GgufTokenizer::from_tokenizer_json(&hf.tokenizer_path(), false).map_err(shown)?;
        source = Box::new(SharedSource(hf.clone()));
        columns = hf;
    } else {
        file = Arc::new(GgufFile::open(path).map_err(shown)?);
        tokenizer = GgufTokenizer::from_gguf(&file).map_err(shown)?;
        source = Box::new(GgufSource::new(&file).map_err(shown)?);
        columns = file.clone();
    }
    let models = precisions
        .iter()
        .map(|&p| match (p, calibration) {
            (LinearPrecision::W8a8Shadow, Some((cal_path, cal))) => {
                let mut model = ExecModel::from_source_calibrated(
                    &*source,
                    cal,
                    columns.clone(),
                    cold_cache_bytes,
                )
                .map_err(|e| format!("{}: {e}", cal_path.display()))?;
                model.calibration_file = Some(cal_path.display().to_string());
                Ok(model)
            }
            _ => ExecModel::from_source(&*source, p).map_err(shown),
        })
        .collect::<Result<_, String>>()?;
    Ok((tokenizer, models))
}

/// A Hugging Face checkpoint shared between the loader and the shadow's cold-row reads.
struct SharedSource(Arc<HfModel>);

impl LlamaSource for SharedSource {
    fn config(&self) -> &hetsched::import::LlamaConfig {
        self.0.config()
    }
    fn name(&self) -> String {
        self.0.name()
    }
    fn token_embd(&self) -> Result<Vec<f32>, ImportError> {
        self.0.token_embd()
    }
    fn output_norm(&self) -> Result<Vec<f32>, ImportError> {
        self.0.output_norm()
    }
    fn output(&self) -> Result<Option<Vec<f32>>, ImportError> {
        self.0.output()
    }
    fn layer(&self, layer: usize, which: LayerTensor) -> Result<Vec<f32>, ImportError> {
        self.0.layer(layer, which)
    }
}

/// The calibration a `precision` run follows: `--calibration FILE` (which must exist),
/// else the default file beside the model if there is one; none for other precisions or
/// with `--no-calibration`. `--prune` re-decides its kept sites.
fn find_calibration(
    model: &Path,
    precision: LinearPrecision,
    args: &ShadowArgs,
) -> Result<Option<(PathBuf, Calibration)>, String> {
    if precision != LinearPrecision::W8a8Shadow || args.no_calibration {
        if args.calibration.is_some() || args.prune.is_some() || args.pruned_scale.is_some() {
            return Err(
                "--calibration and --prune apply to --precision w8a8-shadow with a calibration"
                    .into(),
            );
        }
        return Ok(None);
    }
    let path = match &args.calibration {
        Some(path) => path.clone(),
        None => {
            let path = exec::default_calibration_path(model);
            if !path.exists() {
                if args.prune.is_some() || args.pruned_scale.is_some() {
                    return Err(format!(
                        "--prune needs a calibration: none at {}; run `hetsched calibrate --model {} --corpus TEXT` or pass --calibration FILE",
                        path.display(),
                        model.display()
                    ));
                }
                return Ok(None);
            }
            path
        }
    };
    let mut calibration = Calibration::load(&path).map_err(|e| e.to_string())?;
    // The scale first: the residual importance that --prune ranks by depends on it.
    if let Some(scale) = args.pruned_scale {
        calibration.pruned_scale = scale;
    }
    if let Some(rate) = args.prune {
        calibration.prune(rate).map_err(|e| e.to_string())?;
    }
    Ok(Some((path, calibration)))
}

fn eval(args: EvalArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.text)
        .map_err(|e| format!("cannot read text file {}: {e}", args.text.display()))?;
    let precisions: &[LinearPrecision] = match args.precision {
        LinearPrecision::F32 => &[LinearPrecision::F32],
        other => &[other, LinearPrecision::F32],
    };
    let calibration = find_calibration(&args.model, args.precision, &args.shadow)?;
    let (tokenizer, models) = load_model(
        &args.model,
        precisions,
        calibration.as_ref(),
        args.shadow.cold_cache_mib.saturating_mul(1 << 20),
    )?;
    let tokens = tokenizer.encode(&text).map_err(|e| e.to_string())?;
    let mut models = models.into_iter().map(Arc::new);
    let model = models.next().expect("at least one model");
    let reference = models.next().unwrap_or_else(|| model.clone());
    let defaults = PrefillOptions::default();
    let options = PrefillOptions {
        threads: args.threads.unwrap_or(defaults.threads),
        ..defaults
    };
    let report = exec::evaluate(
        &model,
        &reference,
        &tokens,
        args.ctx,
        args.max_windows,
        &options,
    )
    .map_err(|e| e.to_string())?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report always serialises")
        );
    } else {
        println!(
            "{} ({}): perplexity {:.3} (f32 {:.3}) over {} tokens in {} windows of {}\n\
             KL(f32 || {}) {:.4} nats, top-1 agreement with f32 {:.1}%",
            model.name,
            report.precision,
            report.perplexity,
            report.perplexity_f32,
            report.tokens,
            report.windows,
            report.ctx,
            report.precision,
            report.kl_divergence,
            100.0 * report.top1_agreement
        );
        if let Some(sh) = &report.shadow {
            println!("{}", exec::shadow_summary(sh));
        }
    }
    Ok(())
}

fn calibrate(args: CalibrateArgs) -> Result<(), String> {
    let mut corpus = Vec::new();
    // The kl importance runs the model as w8a8-shadow with one site pruned at a time.
    let precisions: &[LinearPrecision] = match args.importance {
        Importance::Kl => &[LinearPrecision::F32, LinearPrecision::W8a8Shadow],
        Importance::Ratio | Importance::Residual => &[LinearPrecision::F32],
    };
    let (tokenizer, models) = load_model(&args.model, precisions, None, 0)?;
    for path in &args.corpus {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read corpus file {}: {e}", path.display()))?;
        let tokens = tokenizer.encode(&text).map_err(|e| e.to_string())?;
        corpus.push((path.display().to_string(), tokens));
    }
    let mut models = models.into_iter();
    let model = Arc::new(models.next().expect("f32 asked for"));
    let shadow = models.next();
    let defaults = PrefillOptions::default();
    let options = exec::CalibrateOptions {
        ctx: args.ctx,
        max_windows: args.max_windows,
        prune: args.prune,
        percentile: args.percentile,
        pruned_scale: args.pruned_scale,
        pruned_shadow_bytes: args.pruned_shadow_kib * 1024,
        pruned_clip_rms: args.pruned_clip_rms,
        importance: args.importance,
        sensitivity_windows: args.sensitivity_windows,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        prefill: PrefillOptions {
            threads: args.threads.unwrap_or(defaults.threads),
            ..defaults
        },
    };
    let calibration =
        exec::calibrate(&model, shadow, &corpus, &options).map_err(|e| e.to_string())?;
    let out = args
        .out
        .unwrap_or_else(|| exec::default_calibration_path(&args.model));
    calibration.save(&out).map_err(|e| e.to_string())?;
    if !args.json {
        println!(
            "calibrated {} on {} windows ({} tokens); wrote {}",
            model.name,
            calibration.windows,
            calibration.tokens,
            out.display()
        );
    }
    show_outliers(&calibration, args.svg.as_deref(), args.json)
}

fn outliers(args: OutliersArgs) -> Result<(), String> {
    let calibration = Calibration::load(&args.calibration).map_err(|e| e.to_string())?;
    show_outliers(&calibration, args.svg.as_deref(), args.json)
}

/// Prints a calibration's outlier statistics (table or JSON) and writes the plot.
fn show_outliers(calibration: &Calibration, svg: Option<&Path>, json: bool) -> Result<(), String> {
    if let Some(path) = svg {
        let title = format!(
            "{}: activation outliers beyond {} RMS ({} windows of {})",
            calibration.model.name, calibration.clip_rms, calibration.windows, calibration.ctx
        );
        write(path, &hetsched::outliers::to_svg(&title, calibration))?;
    }
    if json {
        let stats = calibration.outlier_stats();
        let (channels, top) = hetsched::outliers::means(&stats);
        let value = serde_json::json!({
            "model": calibration.model,
            "prune": calibration.prune,
            "kept_sites": calibration.kept_sites(),
            "sites": stats.len(),
            "mean_channels_with_outliers": channels,
            "mean_outliers_in_top_channels": top,
            "stats": stats,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("the statistics always serialise")
        );
    } else {
        print!("{}", hetsched::outliers::table(calibration));
    }
    Ok(())
}

fn write_timelines(
    title: &str,
    run: &RunOutcome,
    trace: Option<&Path>,
    svg: Option<&Path>,
) -> Result<(), String> {
    if trace.is_none() && svg.is_none() {
        return Ok(());
    }
    let timeline = Trace::new(title, run);
    if let Some(path) = trace {
        write(path, &to_chrome_json(&timeline))?;
    }
    if let Some(path) = svg {
        write(path, &to_svg(&timeline))?;
    }
    Ok(())
}

fn compare(args: CompareArgs) -> Result<(), String> {
    let names: Vec<PathBuf> = if args.scenes.is_empty() {
        shipped_scenes()
            .into_iter()
            .filter(|n| !n.contains("desktop"))
            .map(PathBuf::from)
            .collect()
    } else {
        args.scenes
    };
    let scenes = names
        .iter()
        .map(|p| Scene::load(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let policies = if args.policies.is_empty() {
        PolicyRegistry::builtin()
            .names()
            .map(String::from)
            .collect()
    } else {
        args.policies
    };
    let rows = hetsched::compare::compare(&scenes, &args.prompt_lens, &policies)
        .map_err(|e| e.to_string())?;
    print_json_or(args.json, &rows, || hetsched::compare::table(&rows));
    Ok(())
}

fn sweep(args: SweepArgs) -> Result<(), String> {
    let scene_path = args.scene.unwrap_or_else(|| PathBuf::from(DEFAULT_SCENE));
    let scene = Scene::load(&scene_path).map_err(|e| e.to_string())?;
    if args.chunk_lens.is_empty() {
        return Err("give at least one chunk length with --chunk-lens".into());
    }
    let policies = if args.policies.is_empty() {
        PolicyRegistry::builtin()
            .names()
            .map(String::from)
            .collect()
    } else {
        args.policies
    };
    let rows = hetsched::sweep::sweep(
        &scene,
        &args.chunk_lens,
        &args.prompt_lens,
        &policies,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
    )
    .map_err(|e| e.to_string())?;
    let csv = hetsched::sweep::to_csv(&rows).map_err(|e| format!("cannot write CSV: {e}"))?;
    match &args.csv {
        Some(path) => write(path, &csv)?,
        None => print!("{csv}"),
    }
    if let Some(path) = &args.svg {
        let title = format!("{}: simulated prefill speed", scene.name);
        write(path, &hetsched::sweep::to_svg(&title, &rows))?;
    }
    Ok(())
}

/// Prints `value` as pretty JSON with `json`, else the text `summary` gives.
fn print_json_or(json: bool, value: &impl serde::Serialize, summary: impl FnOnce() -> String) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).expect("our reports always serialise")
        );
    } else {
        print!("{}", summary());
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A built-in policy's name, or a usage error listing them.
fn policy_name(name: &str) -> Result<String, String> {
    PolicyRegistry::builtin()
        .create(name)
        .map(|_| name.to_string())
        .map_err(|e| e.to_string())
}
