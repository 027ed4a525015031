//! The `hetsched` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use std::time::Instant;

use hetsched::engine::{self, RunOutcome};
use hetsched::exec::{self, ExecModel, GpuUse, LinearPrecision, PrefillOptions, PrefillReport};
use hetsched::import::{GgufFile, GgufTokenizer, HfModel, ImportError};
use hetsched::report::RunReport;
use hetsched::scene::{DEFAULT_SCENE, Scene, shipped_scenes};
use hetsched::systems::Policy;
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
    #[arg(long, value_delimiter = ',')]
    policies: Vec<Policy>,
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
    #[arg(long, value_delimiter = ',')]
    policies: Vec<Policy>,
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
    #[arg(long)]
    policy: Option<Policy>,
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
    #[arg(long, default_value = "balance")]
    policy: Policy,
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
        scene.workload.policy = p;
    }
    if let Some(budget) = &args.memory_budget {
        hetsched::budget::apply_budget(&mut scene, budget).map_err(|e| e.to_string())?;
    }
    let plan = Arc::new(scene.plan().map_err(|e| e.to_string())?);
    let run = engine::simulate(plan).map_err(|e| e.to_string())?;
    let report = RunReport::new(&scene.name, &run);
    let title = format!(
        "{} — {}, {} tokens, chunk {}",
        scene.name, report.policy, report.prompt_len, report.chunk_len
    );
    write_timelines(&title, &run, args.trace.as_deref(), args.svg.as_deref())?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report always serialises")
        );
    } else {
        print!("{}", report.summary());
    }
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
    let (tokenizer, model) = load_model(&args.model, &[args.precision])?;
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
    let result = exec::prefill(model, &tokens, &options).map_err(|e| e.to_string())?;
    let report = PrefillReport::new(
        &name,
        args.precision.as_str(),
        options.threads,
        load_ms,
        &result,
        &tokenizer,
    );
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
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report always serialises")
        );
    } else {
        print!("{}", report.summary());
    }
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
/// Face directory.
fn load_model(
    path: &Path,
    precisions: &[LinearPrecision],
) -> Result<(GgufTokenizer, Vec<ExecModel>), String> {
    let shown = |e: ImportError| format!("{}: {e}", path.display());
    if path.is_dir() {
        let hf = HfModel::open(path).map_err(shown)?;
        let tokenizer =
            GgufTokenizer::from_tokenizer_json(&hf.tokenizer_path(), false).map_err(shown)?;
        let models = precisions
            .iter()
            .map(|&p| ExecModel::from_source(&hf, p).map_err(shown))
            .collect::<Result<_, _>>()?;
        Ok((tokenizer, models))
    } else {
        let file = GgufFile::open(path).map_err(shown)?;
        let tokenizer = GgufTokenizer::from_gguf(&file).map_err(shown)?;
        let models = precisions
            .iter()
            .map(|&p| ExecModel::load(&file, p).map_err(shown))
            .collect::<Result<_, _>>()?;
        Ok((tokenizer, models))
    }
}

fn eval(args: EvalArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.text)
        .map_err(|e| format!("cannot read text file {}: {e}", args.text.display()))?;
    let precisions: &[LinearPrecision] = match args.precision {
        LinearPrecision::F32 => &[LinearPrecision::F32],
        other => &[other, LinearPrecision::F32],
    };
    let (tokenizer, models) = load_model(&args.model, precisions)?;
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
        Policy::ALL.to_vec()
    } else {
        args.policies
    };
    let rows = hetsched::compare::compare(&scenes, &args.prompt_lens, &policies)
        .map_err(|e| e.to_string())?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("rows always serialise")
        );
    } else {
        print!("{}", hetsched::compare::table(&rows));
    }
    Ok(())
}

fn sweep(args: SweepArgs) -> Result<(), String> {
    let scene_path = args.scene.unwrap_or_else(|| PathBuf::from(DEFAULT_SCENE));
    let scene = Scene::load(&scene_path).map_err(|e| e.to_string())?;
    if args.chunk_lens.is_empty() {
        return Err("give at least one chunk length with --chunk-lens".into());
    }
    let policies = if args.policies.is_empty() {
        Policy::ALL.to_vec()
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

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
