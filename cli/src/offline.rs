//! The simulated commands: `simulate`, `compare`, `sweep` and `scenes`. They run scenes
//! on a virtual clock; no model is loaded.

use std::path::PathBuf;
use std::sync::Arc;

use hetsched::budget::{BudgetSpec, apply_budget};
use hetsched::engine;
use hetsched::progress::Progress;
use hetsched::report::RunReport;
use hetsched::request_report::MixReport;
use hetsched::request_trace::load_trace;
use hetsched::requests::{KvFull, MixOptions, RideMode, simulate_requests};
use hetsched::scene::{DEFAULT_SCENE, Scene, SceneError, shipped_scenes};
use hetsched::systems::request_policy::DEFAULT_REQUEST_POLICY;
use hetsched::systems::{DecodeEstimate, estimate_decode};
use hetsched::timeline::Trace;

use crate::CliError;
use crate::choices::{MemoryPlan, byte_count, policies_or_all, policy_name};
use crate::output::{Timelines, check_outputs, print_json_or, print_text, write_file};
use crate::progress::Bar;

/// `hetsched simulate`.
#[derive(clap::Args)]
pub struct SimulateArgs {
    /// Scene file, or the name of a shipped scene [default: qwen1.5-1.8b-xiaomi14].
    scene: Option<PathBuf>,
    /// Override the prompt length (tokens).
    #[arg(long)]
    prompt_len: Option<u32>,
    /// Override the chunk length (tokens).
    #[arg(long)]
    chunk_len: Option<u32>,
    /// Scheduling policy: balance (ours, the default), stall (seed 000, Eq. 6), inorder, layerwise, peer, heft, cpf, lookahead.
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
    memory_budget: Option<BudgetSpec>,
    /// Drop the model's outlier shadow (its shadow table): per-tensor W8A8 alone, to
    /// measure what the shadow costs.
    #[arg(long)]
    no_shadow: bool,
    /// Also model N decode steps after the prefill (memory-bandwidth bound, on the CPU):
    /// the report gains prefill, decode and end-to-end latency.
    #[arg(long, value_name = "N")]
    decode_tokens: Option<u32>,
    /// How many offset strategies each region's memory plan tries [default: the scene's
    /// `[memory] plan_effort`, scaled unless it says].
    #[arg(long, value_enum)]
    memory_plan: Option<MemoryPlan>,
    /// Simulate the requests of this trace file together on the scene (TOML, format in
    /// docs/requests.md; shipped ones in scenes/traces/): prefills and batched decode
    /// steps; per request its time to first token, per output token and end to end beside
    /// alone; per priority class p50/p95/p99; prompt lengths come from the trace.
    #[arg(long, value_name = "TRACE", conflicts_with_all = ["prompt_len", "decode_tokens"])]
    requests: Option<PathBuf>,
    /// With --requests: the policy across requests: fcfs, priority or slack.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_REQUEST_POLICY, requires = "requests")]
    request_policy: String,
    /// With --requests: bytes of KV cache the live requests may hold together (BYTES, or
    /// with a KiB, MiB or GiB suffix) [default: no limit].
    #[arg(long, value_name = "BYTES", value_parser = byte_count, requires = "requests")]
    kv_budget: Option<u64>,
    /// With --requests and --kv-budget: a request whose KV cache does not fit beside the
    /// live ones waits, or is refused.
    #[arg(long, value_name = "WHAT", default_value = "wait", value_parser = ["wait", "refuse"], requires = "kv_budget")]
    kv_full: String,
    /// With --requests: cut each prefill's attention stages by query heads into parts of
    /// about MS milliseconds or less on their home processor (docs/requests.md,
    /// "Attention cut by query heads") [default: attention whole].
    #[arg(long, value_name = "MS", value_parser = part_ms, requires = "requests")]
    attention_part_ms: Option<u64>,
    /// With --requests: when a decode step rides another request's prefill chunks (its
    /// linears joining the chunk's jobs as extra rows, docs/requests.md): when the
    /// request policy lets it (`policy`: under slack, when the step is predicted to end
    /// by its deadline that way), never (`off`) or whenever a chunk can carry it
    /// (`always`).
    #[arg(long, value_name = "WHEN", default_value = "policy", value_parser = ["off", "policy", "always"], requires = "requests")]
    ride: String,
}

/// A part length in milliseconds, as ns: above 0, at most a minute.
fn part_ms(text: &str) -> Result<u64, String> {
    match text.parse::<f64>() {
        Ok(ms) if ms > 0.0 && ms <= 60_000.0 => Ok(((ms * 1e6).round() as u64).max(1)),
        _ => Err(format!(
            "`{text}`: give a part length in milliseconds, above 0 and at most 60000"
        )),
    }
}

/// `simulate --decode-tokens`: the prefill's report, the modelled decode, end to end.
#[derive(serde::Serialize)]
struct EndToEnd<'a> {
    #[serde(flatten)]
    prefill: &'a RunReport,
    decode: &'a DecodeEstimate,
    prefill_ms: f64,
    decode_ms: f64,
    decode_tokens_per_s: f64,
    end_to_end_ms: f64,
}

impl<'a> EndToEnd<'a> {
    fn new(prefill: &'a RunReport, decode: &'a DecodeEstimate) -> Self {
        let decode_ms = decode.decode_ns as f64 / 1e6;
        Self {
            prefill,
            decode,
            prefill_ms: prefill.makespan_ms,
            decode_ms,
            decode_tokens_per_s: if decode_ms > 0.0 {
                f64::from(decode.tokens) / decode_ms * 1e3
            } else {
                0.0
            },
            end_to_end_ms: prefill.makespan_ms + decode_ms,
        }
    }

    fn summary(&self) -> String {
        let d = self.decode;
        let source = if d.bandwidth_given {
            "decode_bandwidth_gbps"
        } else {
            "bandwidth_gbps"
        };
        format!(
            "decode: {} steps on {} at {:.1} GB/s ({source}), {:.1} MB of weights a step: \
             {:.1} ms ({:.1} tokens/s)\nend to end: prefill {:.1} ms + decode {:.1} ms = {:.1} ms\n",
            d.tokens,
            d.processor,
            d.bandwidth_gbps,
            d.weight_bytes_per_step as f64 / 1e6,
            self.decode_ms,
            self.decode_tokens_per_s,
            self.prefill_ms,
            self.decode_ms,
            self.end_to_end_ms
        )
    }
}

/// `hetsched compare`.
#[derive(clap::Args)]
pub struct CompareArgs {
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

/// `hetsched sweep`.
#[derive(clap::Args)]
pub struct SweepArgs {
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
    /// Print the rows as a JSON array instead of CSV (--csv still writes the file).
    #[arg(long)]
    json: bool,
}

/// `hetsched scenes`.
#[derive(clap::Args)]
pub struct ScenesArgs {
    /// Print the names as a JSON array instead of one per line.
    #[arg(long)]
    json: bool,
}

/// Simulates one scene and prints its report; then writes the timelines asked for.
pub fn simulate(args: SimulateArgs) -> Result<(), CliError> {
    let timelines = Timelines {
        trace: args.trace,
        svg: args.svg,
    };
    timelines.check()?;
    let scene_path = args.scene.unwrap_or_else(|| PathBuf::from(DEFAULT_SCENE));
    let mut scene = Scene::load(&scene_path)?;
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
    if let Some(effort) = args.memory_plan {
        scene.memory.plan_effort = effort.into();
    }
    if let Some(budget) = &args.memory_budget {
        apply_budget(&mut scene, budget)?;
    }
    if let Some(trace) = &args.requests {
        let options = MixOptions {
            request_policy: args.request_policy.clone(),
            kv_budget_bytes: args.kv_budget,
            kv_full: if args.kv_full == "refuse" {
                KvFull::Refuse
            } else {
                KvFull::Wait
            },
            attention_part_ns: args.attention_part_ms,
            ride: RideMode::from_name(&args.ride).unwrap_or_default(),
        };
        return simulate_mix(&scene, trace, &options, args.json, &timelines);
    }
    let plan = Arc::new(scene.plan()?);
    let decode = args
        .decode_tokens
        .map(|n| estimate_decode(&plan.model, &plan.device, plan.workload.prompt_len, n))
        .transpose()
        .map_err(SceneError::from)?;
    // A measured profile describes queues sharing one worker pool (its `[measured]` gap
    // and sharing rate): simulated the way `run --predict` simulates a real run.
    let run = match plan.device.measured {
        Some(_) => hetsched::profiling::predict_with(plan, scene.new_policy()?)?,
        None => engine::simulate(plan, scene.new_policy()?)?,
    };
    let report = RunReport::new(&scene.name, &run);
    match &decode {
        None => print_json_or(args.json, &report, || report.summary()),
        Some(decode) => {
            let e2e = EndToEnd::new(&report, decode);
            print_json_or(args.json, &e2e, || report.summary() + &e2e.summary());
        }
    }
    let title = format!(
        "{} — {}, {} tokens, chunk {}",
        scene.name, report.policy, report.prompt_len, report.chunk_len
    );
    timelines.write(&title, &run)
}

/// `simulate --requests`: the trace's requests together on `scene`, reported per request
/// and per class, and the timelines coloured by request.
fn simulate_mix(
    scene: &Scene,
    trace: &std::path::Path,
    options: &MixOptions,
    json: bool,
    timelines: &Timelines,
) -> Result<(), CliError> {
    let trace = load_trace(trace)?;
    let specs: Vec<_> = trace.iter().map(|t| t.spec.clone()).collect();
    let run = simulate_requests(scene, &specs, options)?;
    let request_policy = options.request_policy.as_str();
    let report = MixReport::new(scene, request_policy, &trace, &run);
    print_json_or(json, &report, || report.summary());
    if timelines.any() {
        let title = format!(
            "{}: {} requests, {} across, {} within",
            scene.name,
            trace.len(),
            request_policy,
            scene.policy
        );
        timelines.write_trace(&Trace::of_requests(&title, &run))?;
    }
    Ok(())
}

/// Every policy over scenes and prompt lengths, as a table or JSON.
pub fn compare(args: CompareArgs) -> Result<(), CliError> {
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
        .collect::<Result<Vec<_>, _>>()?;
    let policies = policies_or_all(args.policies);
    // One call per scene and prompt length, so the bar moves between them; the rows come
    // out in the order one call over everything gives.
    let mut bar = Bar::new("settings");
    let per_scene = args.prompt_lens.len().max(1);
    bar.set_len((scenes.len() * per_scene) as u64);
    let mut rows = Vec::new();
    for scene in &scenes {
        let scene = std::slice::from_ref(scene);
        if args.prompt_lens.is_empty() {
            bar.set_message(&scene[0].name);
            rows.extend(hetsched::compare::compare(scene, &[], &policies)?);
            bar.inc(1);
        }
        for &len in &args.prompt_lens {
            bar.set_message(&format!("{}, prompt {len}", scene[0].name));
            rows.extend(hetsched::compare::compare(scene, &[len], &policies)?);
            bar.inc(1);
        }
    }
    bar.finish();
    print_json_or(args.json, &rows, || hetsched::compare::table(&rows));
    Ok(())
}

/// Chunk length x policy (x prompt length) on one scene: rows as CSV or JSON, a plot.
pub fn sweep(args: SweepArgs) -> Result<(), CliError> {
    check_outputs([args.csv.as_deref(), args.svg.as_deref()])?;
    let scene_path = args.scene.unwrap_or_else(|| PathBuf::from(DEFAULT_SCENE));
    let scene = Scene::load(&scene_path)?;
    if args.chunk_lens.is_empty() {
        return Err(CliError::NoChunkLens);
    }
    let policies = policies_or_all(args.policies);
    let rows = hetsched::sweep::sweep(
        &scene,
        &args.chunk_lens,
        &args.prompt_lens,
        &policies,
        &mut Bar::new("settings"),
    )?;
    let csv = hetsched::sweep::to_csv(&rows)?;
    if args.json {
        print_json_or(true, &rows, String::new);
    } else if args.csv.is_none() {
        print_text(&csv);
    }
    if let Some(path) = &args.csv {
        write_file(path, &csv)?;
    }
    if let Some(path) = &args.svg {
        let title = format!("{}: simulated prefill speed", scene.name);
        write_file(path, &hetsched::sweep::to_svg(&title, &rows))?;
    }
    Ok(())
}

/// The shipped scenes' names.
pub fn scenes(args: ScenesArgs) -> Result<(), CliError> {
    let names = shipped_scenes();
    print_json_or(args.json, &names, || {
        names.iter().map(|name| format!("{name}\n")).collect()
    });
    Ok(())
}
