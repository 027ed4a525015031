//! The commands that run a real model on this machine: `run` (one prefill, the next
//! token) and `eval` (perplexity, and KL / top-1 against f32).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use hetsched::exec::{self, GpuUse, LinearPrecision, PrefillOptions, PrefillReport};

use crate::CliError;
use crate::choices::{Precision, ScoringChoice};
use crate::model::{ShadowArgs, find_calibration, load, read_text};
use crate::output::{Timelines, print_json_or};
use crate::progress::Bar;

/// `hetsched run`.
#[derive(clap::Args)]
pub struct RunArgs {
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
    #[arg(long, default_value = "balance", value_parser = crate::choices::policy_name)]
    policy: String,
    /// Arithmetic of the linear layers.
    #[arg(long, value_enum, default_value = "w8a8")]
    precision: Precision,
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

/// `hetsched eval`.
#[derive(clap::Args)]
pub struct EvalArgs {
    /// GGUF model file or Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    /// Text to evaluate on (e.g. /usr/share/common-licenses/GPL-3).
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Arithmetic of the linear layers.
    #[arg(long, value_enum, default_value = "w8a8")]
    precision: Precision,
    /// Tokens per window.
    #[arg(long, default_value_t = 256)]
    ctx: usize,
    /// Evaluate at most this many windows [default: every window of the text].
    #[arg(long)]
    max_windows: Option<usize>,
    /// Which positions count: `all`, or `llama-cpp` to compare with llama-perplexity.
    #[arg(long, value_enum, default_value = "all")]
    scoring: ScoringChoice,
    /// Compute threads [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    shadow: ShadowArgs,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

/// One real prefill: prints the report, then writes the timelines asked for.
pub fn run(args: RunArgs) -> Result<(), CliError> {
    let timelines = Timelines {
        trace: args.trace,
        svg: args.svg,
    };
    timelines.check()?;
    let gpu = gpu_use(&args.backends)?;
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => read_text("prompt file", path)?,
        // clap requires one of the two.
        (None, None) => String::new(),
    };
    let precision = LinearPrecision::from(args.precision);
    let loading = Instant::now();
    let calibration = find_calibration(&args.model, precision, &args.shadow)?;
    let loaded = load(
        &args.model,
        &[precision],
        calibration.as_ref(),
        args.shadow.cold_cache_bytes(),
    )?;
    let tokens = loaded.tokenizer.encode(&text)?;
    let model = Arc::new(
        loaded
            .models
            .into_iter()
            .next()
            .expect("one precision asked for"),
    );
    let load_ms = loading.elapsed().as_secs_f64() * 1e3;
    let defaults = PrefillOptions::default();
    let options = PrefillOptions {
        chunk_len: args.chunk_len,
        policy: args.policy,
        threads: args.threads.unwrap_or(defaults.threads),
        gpu,
        // A timeline asked for shows the device's times.
        gpu_timestamps: timelines.any(),
        ..defaults
    };
    let result = exec::prefill(model.clone(), &tokens, &options)?;
    let report = PrefillReport::new(&model, options.threads, load_ms, &result, &loaded.tokenizer);
    print_json_or(args.json, &report, || report.summary());
    let title = format!(
        "{} ({}) on this machine — {}, {} tokens, chunk {}",
        model.name,
        report.precision,
        report.schedule.policy,
        report.prompt_tokens,
        report.schedule.chunk_len
    );
    timelines.write(&title, &result.outcome)
}

/// How `--backends` uses the GPU: `cpu,npu` (none), `cpu,gpu,npu` (a float lane), or
/// `gpu` alone (every stage resident on the GPU).
fn gpu_use(backends: &[String]) -> Result<GpuUse, CliError> {
    if let Some(b) = backends
        .iter()
        .find(|b| !["cpu", "gpu", "npu"].contains(&b.as_str()))
    {
        return Err(CliError::UnknownBackend(b.clone()));
    }
    let has = |name: &str| backends.iter().any(|b| b == name);
    match (has("cpu"), has("gpu"), has("npu")) {
        (false, true, false) => Ok(GpuUse::Resident),
        (true, gpu, true) => Ok(if gpu { GpuUse::FloatLane } else { GpuUse::Off }),
        _ => Err(CliError::BackendSet),
    }
}

/// Perplexity of a text, and the precision's KL and top-1 agreement against f32.
pub fn eval(args: EvalArgs) -> Result<(), CliError> {
    let text = read_text("text file", &args.text)?;
    let precision = LinearPrecision::from(args.precision);
    let precisions: &[LinearPrecision] = match precision {
        LinearPrecision::F32 => &[LinearPrecision::F32],
        other => &[other, LinearPrecision::F32],
    };
    let calibration = find_calibration(&args.model, precision, &args.shadow)?;
    let loaded = load(
        &args.model,
        precisions,
        calibration.as_ref(),
        args.shadow.cold_cache_bytes(),
    )?;
    let tokens = loaded.tokenizer.encode(&text)?;
    let mut models = loaded.models.into_iter().map(Arc::new);
    let model = models.next().expect("at least one model");
    let reference = models.next().unwrap_or_else(|| model.clone());
    let defaults = PrefillOptions::default();
    let options = PrefillOptions {
        threads: args.threads.unwrap_or(defaults.threads),
        ..defaults
    };
    let scoring = match args.scoring {
        ScoringChoice::All => exec::Scoring::All,
        ScoringChoice::LlamaCpp => exec::Scoring::LlamaCpp {
            bos: loaded
                .tokenizer
                .bos_id()
                .filter(|_| loaded.tokenizer.add_bos()),
        },
    };
    let windows = exec::EvalWindows {
        ctx: args.ctx,
        max_windows: args.max_windows.unwrap_or(usize::MAX),
        scoring,
    };
    let report = exec::evaluate_windows(
        &model,
        &reference,
        &tokens,
        &windows,
        &options,
        &mut Bar::new("windows"),
    )?;
    print_json_or(args.json, &report, || {
        let mut text = format!(
            "{} ({}): perplexity {:.3} (f32 {:.3}) over {} tokens in {} windows of {}, scoring {}\n\
             KL(f32 || {}) {:.4} nats, top-1 agreement with f32 {:.1}%\n",
            model.name,
            report.precision,
            report.perplexity,
            report.perplexity_f32,
            report.tokens,
            report.windows,
            report.ctx,
            report.scoring,
            report.precision,
            report.kl_divergence,
            100.0 * report.top1_agreement
        );
        if let Some(sh) = &report.shadow {
            text += &exec::shadow_summary(sh);
            text.push('\n');
        }
        text
    });
    Ok(())
}
