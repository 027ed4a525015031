//! The commands that run a real model on this machine: `run` (one prefill, the next
//! token) and `eval` (perplexity, and KL / top-1 against f32).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use hetsched::adapt::{self, adapt_to_history};
use hetsched::exec::{
    self, GpuUse, LinearPrecision, PrefillOptions, PrefillReport, PrefillResult, profile,
};
use hetsched::history::{
    HistoryScope, append_history, check_records, read_recent_history, records_on,
};
use hetsched::prediction::Prediction;
use hetsched::profiling;
use hetsched::scene::Scene;
use hetsched::systems::{DeviceProfile, ProfileOrigin};

use crate::CliError;
use crate::choices::Precision;
use crate::model::{PromptArgs, ShadowArgs, load_one, read_text};
use crate::output::{Timelines, print_json_or, write_file};
use hetsched::engine::RunOutcome;
use hetsched::timeline::Trace;
use hetsched::timeline::chrome::to_chrome_json_with_prediction;
use hetsched::timeline::svg::to_svg;

/// The resident GPU weights' type (`run --gpu-weights`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuWeights {
    /// The command's default: for `run`, f16 where the device has tensor-core
    /// (cooperative-matrix) GEMMs, f32 elsewhere; for `generate`, f32.
    /// `HETSCHED_GPU_F16_WEIGHTS=1` or `=0` picks f16 or f32 in its place.
    Auto,
    /// f32 weights: the reference.
    F32,
    /// f16 weights in the fused GEMMs.
    F16,
}

impl From<GpuWeights> for hetsched::exec::GpuWeights {
    fn from(choice: GpuWeights) -> Self {
        match choice {
            GpuWeights::Auto => hetsched::exec::GpuWeights::Auto,
            GpuWeights::F32 => hetsched::exec::GpuWeights::F32,
            GpuWeights::F16 => hetsched::exec::GpuWeights::F16,
        }
    }
}

/// `hetsched run`.
#[derive(clap::Args)]
#[command(mut_arg("prompt", |a| a.required_unless_present_any(["prompt_file", "requests"])))]
pub struct RunArgs {
    /// GGUF model file (llama architecture), e.g. models/SmolLM2-135M-Instruct.Q4_1.gguf, or a
    /// Hugging Face directory (config.json, tokenizer.json, *.safetensors).
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Cut or repeat the prompt's tokens to exactly this many.
    #[arg(long, value_name = "TOKENS")]
    prompt_len: Option<usize>,
    /// Schedule with this measured device profile (`hetsched profile`) instead of the
    /// host's roofline profile; the report says which stage kinds it priced.
    #[arg(long, value_name = "DEVICE.toml")]
    profile: Option<PathBuf>,
    /// Also simulate the same plan and print predicted against measured makespan,
    /// per-processor busy time and the stage kinds with the largest error.
    #[arg(long)]
    predict: bool,
    /// Prefills to run and discard before the measured one (caches, page faults and the
    /// pool's threads warm, as in `hetsched profile`).
    #[arg(long, default_value_t = 0)]
    warmup: u32,
    /// Append this run's per-instance durations to a history file (JSON Lines,
    /// docs/calibration.md) that `hetsched profile` can refit from.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
    /// Scale the profile's stage costs to the machine's recent runs in the history file
    /// (each kind by the median ratio of its recent measured durations to the profile's;
    /// docs/calibration.md, "Costs that follow the machine"); needs --profile and
    /// --history. The report lists the factors.
    #[arg(long, requires_all = ["profile", "history"])]
    adapt: bool,
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
    /// With --backends gpu: the resident weights' type. f16 runs the fused GEMMs on f16
    /// weights (tensor cores where the device has cooperative matrices; f32 sums); f32 is
    /// the reference; auto is f16 where the GEMMs run on tensor cores, f32 elsewhere
    /// (docs/gpu.md, "f16 weights on tensor cores").
    #[arg(long, value_enum, default_value = "auto")]
    gpu_weights: GpuWeights,
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
    /// Run the requests of this trace file (or a shipped trace's name: agent-burst, chat,
    /// best-of-8; format in docs/requests.md) together on the model instead of one
    /// prefill: each request alone first, then all at their arrivals scaled to the
    /// machine; each request's text streamed with its id, or with --json per request its
    /// time to first token, per output token and end to end beside alone (measured).
    /// Prompts are cut from --prompt (or a built-in text) to the trace's lengths.
    #[arg(long, value_name = "TRACE", conflicts_with_all = ["prompt_len", "predict", "warmup", "history", "trace", "svg"])]
    requests: Option<PathBuf>,
    /// With --requests: the policy across requests: fcfs, priority or slack.
    #[arg(long, value_name = "NAME", default_value = hetsched::systems::request_policy::DEFAULT_REQUEST_POLICY, requires = "requests")]
    request_policy: String,
    /// With --requests: multiply the trace's arrivals by this factor [default: the first
    /// request's time to first token alone measured here over its simulated time alone
    /// on the default scene].
    #[arg(long, value_name = "FACTOR", requires = "requests")]
    arrival_scale: Option<f64>,
}

/// One real prefill: prints the report, then writes the timelines asked for.
pub fn run(args: RunArgs) -> Result<(), CliError> {
    let timelines = Timelines {
        trace: args.trace.clone(),
        svg: args.svg.clone(),
    };
    timelines.check()?;
    let gpu = gpu_use(&args.backends)?;
    if args.gpu_weights == GpuWeights::F16 && gpu != GpuUse::Resident {
        return Err(CliError::GpuWeightsNotResident);
    }
    // What can be checked without the weights is checked before they load.
    crate::model::check_prefill_settings(args.threads, args.chunk_len)?;
    let requests = args
        .requests
        .as_ref()
        .map(|trace| crate::real_requests::check(trace, &args.request_policy, args.arrival_scale))
        .transpose()?;
    let text = args
        .prompt
        .text(|path| read_text("prompt file", path, hetsched::limits::MAX_PROMPT_BYTES))?;
    if args.prompt_len.is_none() && requests.is_none() {
        crate::model::check_prompt_text("prompt", &text)?;
    }
    // A profile's ranges are checked before the weights load (its model after).
    let profile = match &args.profile {
        Some(path) => Some((path, Scene::load_device(path)?)),
        None => None,
    };
    let precision = LinearPrecision::from(args.precision);
    let loading = Instant::now();
    let loaded = load_one(&args.model, precision, &args.shadow)?;
    let context = loaded.models[0].config.context_length;
    let tokens = match args.prompt_len {
        Some(n) => profile::prompt_tokens(&loaded.tokenizer, &text, n, context)?,
        None => loaded.tokenizer.encode(&text)?,
    };
    let model = Arc::new(
        loaded
            .models
            .into_iter()
            .next()
            .expect("one precision asked for"),
    );
    let load_ms = loading.elapsed().as_secs_f64() * 1e3;
    let defaults = PrefillOptions::default();
    let threads = args.threads.unwrap_or(defaults.threads);
    let device = run_device(&args, profile, &model, threads, &defaults.device)?;
    // A timeline asked for shows the device's times, and so does a prediction: it prices
    // each stage by what the device spent on it.
    let device_times = timelines.any() || args.predict;
    let options = run_options(&args, gpu, device, threads, device_times, defaults)?;
    if let Some(asked) = requests {
        let tokenizer = loaded.tokenizer;
        return crate::real_requests::run(asked, model, tokenizer, &text, options, args.json);
    }
    for _ in 0..args.warmup {
        exec::prefill(model.clone(), &tokens, &options)?;
    }
    let result = exec::prefill(model.clone(), &tokens, &options)?;
    let mut report =
        PrefillReport::new(&model, options.threads, load_ms, &result, &loaded.tokenizer);
    let predicted = match args.predict {
        true => Some(predict(&mut report, &result, &options)?),
        false => None,
    };
    print_json_or(args.json, &report, || report.summary());
    if let Some(path) = &args.history {
        record_history(path, &result.outcome, options.threads);
    }
    let title = format!(
        "{} ({}) on this machine — {}, {} tokens, chunk {}",
        model.name,
        report.precision,
        report.schedule.policy,
        report.prompt_tokens,
        report.schedule.chunk_len
    );
    write_timelines(&timelines, &title, &result.outcome, predicted.as_ref())
}

/// The prefill's settings from `args`: `threads` on `device` and `gpu`, the device's own
/// times kept where `gpu_timestamps`, the rest `defaults`.
fn run_options(
    args: &RunArgs,
    gpu: GpuUse,
    device: DeviceProfile,
    threads: usize,
    gpu_timestamps: bool,
    defaults: PrefillOptions,
) -> Result<PrefillOptions, CliError> {
    Ok(PrefillOptions {
        chunk_len: args.chunk_len,
        policy: args.policy.clone(),
        threads,
        // Ctrl-C stops the prefill at the next subgraph boundary.
        cancel: Some(crate::interrupt::on_ctrl_c()?),
        gpu,
        device,
        gpu_timestamps,
        gpu_weights: crate::gpu_env::gpu_weights(args.gpu_weights.into()),
        gpu_kernels: crate::gpu_env::gpu_kernels()?,
        ..defaults
    })
}

/// The device a run schedules for: with `--profile`, the measured `profile` (adapted to
/// the recent `--history` with `--adapt`), else `default`.
fn run_device(
    args: &RunArgs,
    profile: Option<(&PathBuf, DeviceProfile)>,
    model: &exec::ExecModel,
    threads: usize,
    default: &DeviceProfile,
) -> Result<DeviceProfile, CliError> {
    let Some((profile, device)) = profile else {
        return Ok(default.clone());
    };
    let measured = measured_device(profile, device, model)?;
    match &args.history {
        Some(history) if args.adapt => {
            let recent = read_recent_history(history, adapt::RECENT_BYTES)?;
            // The same checks as `profile --from-history`: junk is refused, not skipped.
            let scope = HistoryScope::of(&model.model_config(), &measured)
                .map_err(exec::ExecError::from)?;
            check_records(history, &recent, &scope)?;
            Ok(adapt_to_history(&measured, &recent, &model.name, threads))
        }
        _ => Ok(measured),
    }
}

/// Appends the run's records to the history at `path`. The results are printed already:
/// a history that cannot be written is reported without losing them.
fn record_history(path: &std::path::Path, run: &RunOutcome, threads: usize) {
    let cache = profile::last_level_cache_bytes();
    let records = records_on(run, threads, cache);
    if let Err(e) = append_history(path, &records) {
        eprintln!("warning: {e}");
    }
}

/// Simulates the plan of a real run (`run --predict`) the way the real queues run it (one
/// shared pool), deciding with the cost table the run decided with, and adds the
/// comparison to `report`; returns the simulated run.
fn predict(
    report: &mut PrefillReport,
    result: &PrefillResult,
    options: &PrefillOptions,
) -> Result<RunOutcome, CliError> {
    let plan = &result.outcome.plan;
    let policy = exec::policy_of_run(plan, options, result.decision.as_ref())?;
    let simulated = profiling::predict_with(plan.clone(), policy)?;
    report.set_prediction(Prediction::compare(&result.outcome, &simulated));
    Ok(simulated)
}

/// Writes the timelines asked for; with a prediction, the Chrome trace gets a "predicted"
/// process beside the measured one and the SVG each lane's prediction under it.
fn write_timelines(
    timelines: &Timelines,
    title: &str,
    outcome: &RunOutcome,
    predicted: Option<&RunOutcome>,
) -> Result<(), CliError> {
    let Some(simulated) = predicted else {
        return timelines.write(title, outcome);
    };
    let measured = Trace::new(title, outcome);
    let predicted = Trace::new(title, simulated);
    if let Some(path) = &timelines.trace {
        write_file(path, &to_chrome_json_with_prediction(&measured, &predicted))?;
    }
    if let Some(path) = &timelines.svg {
        write_file(path, &to_svg(&measured.with_prediction(&predicted)))?;
    }
    Ok(())
}

/// The device profile `device`, read from `path` (its ranges checked then, before the
/// weights load), checked against `model`: a profile of another model is refused; one
/// measured on another CPU is used with a warning.
fn measured_device(
    path: &std::path::Path,
    device: DeviceProfile,
    model: &exec::ExecModel,
) -> Result<DeviceProfile, CliError> {
    if let Some(origin) = &device.measured {
        let shape = ProfileOrigin::shape_of(&model.model_config());
        if origin.model_shape != shape {
            return Err(CliError::ProfileModel {
                path: path.to_owned(),
                profiled: origin.model.clone(),
                profiled_shape: origin.model_shape.clone(),
                model: model.name.clone(),
                shape,
            });
        }
        let features = profile::cpu_features();
        if origin.cpu_features != features {
            eprintln!(
                "warning: {} was measured on {} ({}); this machine has {}: its costs may not hold here",
                path.display(),
                origin.cpu,
                origin.cpu_features.join(","),
                features.join(",")
            );
        }
    }
    Ok(device)
}

/// How `--backends` uses the GPU: `cpu,npu` (none), `cpu,gpu,npu` (a float lane), or
/// `gpu` alone (every stage resident on the GPU).
pub(crate) fn gpu_use(backends: &[String]) -> Result<GpuUse, CliError> {
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
