//! `hetsched run --requests TRACE`: a request trace on a real model, on this machine's
//! queues (the request engine: prefill chunks through the scheduler on the CPU and
//! emulated-NPU lanes, decode steps batched across requests).
//!
//! Each request is first run alone on the same engine (after one short warm-up request),
//! which measures its `alone` figures; then the trace's requests are submitted together
//! at their arrivals, scaled to the machine, and each one's text is streamed with its id
//! (or, with `--json`, reported). Every figure is a measurement.
//!
//! **Arrivals scaled to the machine.** A trace's arrivals are written for the phone
//! scenes (agent-burst's interactive request comes 100 ms into a background prefill of
//! about 10 s). By default (`--arrival-scale auto`) every arrival is multiplied by the
//! first request's time to first token alone measured here over the same request's
//! simulated alone on the default scene, so that a request arrives as far into the
//! first one's prefill, proportionally, as on the phone. `--arrival-scale X` gives the
//! factor. Targets (`ttft_ms`, `tpot_ms`) are kept as written.

use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use hetsched::exec::generate::requests::{
    EngineLimits, RequestEngine, RequestEvent, RequestMetrics, RequestSpec as EngineSpec, kv_bytes,
};
use hetsched::exec::{ExecModel, PrefillOptions, profile};
use hetsched::import::GgufTokenizer;
use hetsched::request_report::{ClassRow, RequestRow, RequestRows, request_tables};
use hetsched::request_trace::{TraceRequest, load_trace};
use hetsched::requests::{RequestOutcome, RequestsError, Served, simulate_prefills};
use hetsched::scene::Scene;
use hetsched::systems::request_policy::create_request_policy;
use serde::Serialize;

use crate::CliError;
use crate::output::{print_json_or, print_text};

/// The prompt text a trace's prompts are cut from (repeated to each request's length)
/// when none is given.
const DEFAULT_TEXT: &str = "An on-device runtime rarely serves one request at a time: an \
    agent summarizes a long page in the background while the user asks a short question, \
    a chat app streams one answer while the next turn arrives, and a reasoning model \
    samples several candidate answers to one prompt. Each request has its own prompt, \
    its own cache of keys and values, and its own deadline. ";

/// Most a trace may ask arrivals to be stretched or shrunk by.
const MAX_ARRIVAL_SCALE: f64 = 1e3;

/// What `run --requests` was asked for, checked before the weights load.
pub struct Asked {
    /// The trace's requests.
    pub trace: Vec<TraceRequest>,
    /// The trace's name or path, as given.
    pub trace_name: String,
    /// The policy across requests.
    pub request_policy: String,
    /// The arrival scale given (`None`: auto).
    pub arrival_scale: Option<f64>,
}

/// Reads and checks the trace, the request policy and the arrival scale: what can be
/// checked before the weights load.
///
/// # Errors
/// A trace that cannot be read or is malformed, an unknown request policy, a scale that
/// is not a positive number up to [`MAX_ARRIVAL_SCALE`].
pub fn check(
    trace: &Path,
    request_policy: &str,
    arrival_scale: Option<f64>,
) -> Result<Asked, CliError> {
    let requests = load_trace(trace)?;
    create_request_policy(request_policy).map_err(RequestsError::from)?;
    if let Some(scale) = arrival_scale
        && !(scale.is_finite() && scale > 0.0 && scale <= MAX_ARRIVAL_SCALE)
    {
        return Err(CliError::ArrivalScale(scale));
    }
    Ok(Asked {
        trace: requests,
        trace_name: trace.display().to_string(),
        request_policy: request_policy.to_string(),
        arrival_scale,
    })
}

/// One request's figures measured by the engine, ns.
#[derive(Clone, Copy, Debug)]
struct Measured {
    ttft_ns: u64,
    e2e_ns: u64,
    tpot_ns: Option<u64>,
}

impl Measured {
    fn of(metrics: &RequestMetrics) -> Self {
        let ns = |ms: f64| (ms.max(0.0) * 1e6).round() as u64;
        Measured {
            ttft_ns: ns(metrics.ttft_ms),
            e2e_ns: ns(metrics.e2e_ms),
            tpot_ns: (metrics.generated_tokens > 1).then(|| ns(metrics.tpot_ms)),
        }
    }
}

/// The report of `run --requests` (measurements).
#[derive(Serialize)]
struct RealMixReport {
    model: String,
    threads: usize,
    chunk_len: u32,
    policy: String,
    request_policy: String,
    trace: String,
    /// The factor the trace's arrivals were multiplied by.
    arrival_scale: f64,
    /// `auto` or `given`.
    arrival_scale_source: &'static str,
    /// From the first request's submission to the last request's last token, ms.
    wall_ms: f64,
    requests: Vec<RequestRow>,
    classes: Vec<ClassRow>,
    all: ClassRow,
}

/// Runs the trace in `asked` on `model`: each request alone, then all together; prints
/// the report (or streams each request's text with its id).
///
/// # Errors
/// The engine cannot start, a request is refused or fails, or the arrival scale cannot
/// be derived.
pub fn run(
    asked: Asked,
    model: Arc<ExecModel>,
    tokenizer: GgufTokenizer,
    text: &str,
    options: PrefillOptions,
    json: bool,
) -> Result<(), CliError> {
    let text = if text.trim().is_empty() {
        DEFAULT_TEXT
    } else {
        text
    };
    let context = model.config.context_length;
    let (layers, kv_dim) = (model.layers.len(), model.config.kv_dim());
    let tokenizer = Arc::new(tokenizer);
    let specs = engine_specs(&asked.trace, &tokenizer, text, context)?;
    // Every request fits beside the others: admission is not what is measured.
    let all_kv: usize = specs.iter().map(|s| kv_bytes(s, layers, kv_dim)).sum();
    let limits = EngineLimits {
        kv_budget_bytes: all_kv.max(EngineLimits::default().kv_budget_bytes),
        max_requests: specs.len().max(EngineLimits::default().max_requests),
        ..EngineLimits::default()
    };
    let (threads, chunk_len, policy) = (options.threads, options.chunk_len, options.policy.clone());
    let engine = RequestEngine::start_with_policy(
        model.clone(),
        tokenizer.clone(),
        options,
        limits,
        &asked.request_policy,
    )?;
    run_alone(&engine, warm_up(&specs[0]))?;
    let mut alone = Vec::with_capacity(specs.len());
    for spec in &specs {
        alone.push(run_alone(&engine, spec.clone())?);
    }
    let (scale, source) = match asked.arrival_scale {
        Some(scale) => (scale, "given"),
        None => (auto_scale(&asked.trace, alone[0])?, "auto"),
    };
    let arrivals = scaled_arrivals(&asked.trace, scale);
    let (mix, wall) = run_mix(&engine, &specs, &arrivals, json)?;
    let outcomes: Vec<RequestOutcome> = asked
        .trace
        .iter()
        .zip(&specs)
        .enumerate()
        .map(|(i, (t, spec))| RequestOutcome {
            id: t.spec.id,
            priority: t.spec.priority,
            arrival_ns: arrivals[i].as_nanos() as u64,
            kv_bytes: kv_bytes(spec, layers, kv_dim) as u64,
            served: Some(served(arrivals[i], &mix[i], &alone[i])),
        })
        .collect();
    let rows = RequestRows::new(&outcomes, &asked.trace);
    let report = RealMixReport {
        model: model.name.clone(),
        threads,
        chunk_len,
        policy,
        request_policy: asked.request_policy.clone(),
        trace: asked.trace_name.clone(),
        arrival_scale: scale,
        arrival_scale_source: source,
        wall_ms: wall.as_secs_f64() * 1e3,
        requests: rows.requests,
        classes: rows.classes,
        all: rows.all,
    };
    print_json_or(json, &report, || summary(&report));
    Ok(())
}

/// The engine's request for each of the trace's: its prompt cut from `text` at its
/// length (within `context`), its token and sample counts, its priority.
fn engine_specs(
    trace: &[TraceRequest],
    tokenizer: &GgufTokenizer,
    text: &str,
    context: usize,
) -> Result<Vec<EngineSpec>, CliError> {
    trace
        .iter()
        .map(|t| {
            let s = &t.spec;
            let prompt = profile::prompt_tokens(tokenizer, text, s.prompt_len as usize, context)?;
            Ok(EngineSpec {
                prompt,
                max_tokens: s.max_tokens as usize,
                n: s.samples as usize,
                priority: s.priority,
                // Every request generates its full count, so runs compare.
                ignore_eos: true,
                ..EngineSpec::default()
            })
        })
        .collect()
}

/// One short request from the start of `first`'s prompt, run first so that threads,
/// caches and page faults are warm.
fn warm_up(first: &EngineSpec) -> EngineSpec {
    EngineSpec {
        prompt: first.prompt.iter().copied().take(16).collect(),
        max_tokens: 2,
        ignore_eos: true,
        ..EngineSpec::default()
    }
}

/// The trace's arrival times scaled by `scale`.
fn scaled_arrivals(trace: &[TraceRequest], scale: f64) -> Vec<Duration> {
    trace
        .iter()
        .map(|t| Duration::from_nanos((t.spec.arrival_ns as f64 * scale).round() as u64))
        .collect()
}

/// How a request that arrived at `arrival` was served in the mix, beside alone.
fn served(arrival: Duration, mix: &Measured, alone: &Measured) -> Served {
    Served {
        admitted_ns: arrival.as_nanos() as u64,
        ttft_ns: mix.ttft_ns,
        e2e_ns: mix.e2e_ns,
        tpot_ns: mix.tpot_ns,
        alone_ttft_ns: alone.ttft_ns,
        alone_e2e_ns: alone.e2e_ns,
    }
}

/// Submits `spec` alone and waits for its end: its measured figures.
fn run_alone(engine: &RequestEngine, spec: EngineSpec) -> Result<Measured, CliError> {
    let handle = engine.submit(spec)?;
    for event in handle.events() {
        match event {
            RequestEvent::Finished(metrics) => return Ok(Measured::of(&metrics)),
            RequestEvent::Failed(why) => return Err(CliError::RequestFailed(why)),
            _ => {}
        }
    }
    Err(CliError::RequestFailed(
        "the engine stopped before the request finished".into(),
    ))
}

/// The factor that puts the trace's arrivals as far into the first request's prefill,
/// proportionally, as on the default scene: its time to first token alone measured
/// here over its simulated time alone there.
fn auto_scale(trace: &[TraceRequest], first_alone: Measured) -> Result<f64, CliError> {
    let scene = Scene::default_scene();
    let mut first = trace[0].spec.clone();
    first.arrival_ns = 0;
    first.max_tokens = 1;
    first.samples = 1;
    let simulated = simulate_prefills(&scene, std::slice::from_ref(&first), "fcfs")?;
    let simulated_ttft = simulated[0].served.map_or(0, |s| s.ttft_ns);
    if simulated_ttft == 0 {
        return Err(CliError::ArrivalScale(0.0));
    }
    Ok(first_alone.ttft_ns as f64 / simulated_ttft as f64)
}

/// Submits every request at its arrival from one start and collects each one's
/// figures, streaming its text with its id unless `json`; the wall time from the first
/// submission to the last request's end.
fn run_mix(
    engine: &RequestEngine,
    specs: &[EngineSpec],
    arrivals: &[Duration],
    json: bool,
) -> Result<(Vec<Measured>, Duration), CliError> {
    let (events, merged) = mpsc::channel::<(usize, RequestEvent)>();
    let mut figures: Vec<Option<Measured>> = vec![None; specs.len()];
    let mut forwarders = Vec::with_capacity(specs.len());
    let mut next = 0;
    let mut last_printed = None;
    let start = Instant::now();
    while figures.iter().any(Option::is_none) {
        if next < specs.len() {
            let due = start + arrivals[next];
            let now = Instant::now();
            if now >= due {
                let handle = engine.submit(specs[next].clone())?;
                let events = events.clone();
                let i = next;
                forwarders.push(std::thread::spawn(move || {
                    for event in handle.events() {
                        if events.send((i, event)).is_err() {
                            break;
                        }
                    }
                }));
                next += 1;
                continue;
            }
            match merged.recv_timeout(due - now) {
                Ok(event) => on_event(event, &mut figures, &mut last_printed, json)?,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match merged.recv() {
                Ok(event) => on_event(event, &mut figures, &mut last_printed, json)?,
                Err(_) => break,
            }
        }
    }
    let wall = start.elapsed();
    drop(events);
    for forwarder in forwarders {
        // A forwarder ends when its request's channel closes after its last event.
        let _ = forwarder.join();
    }
    if !json && last_printed.is_some() {
        print_text("\n");
    }
    let figures = figures
        .into_iter()
        .map(|f| f.ok_or_else(|| CliError::RequestFailed("a request never finished".into())))
        .collect::<Result<_, _>>()?;
    Ok((figures, wall))
}

/// One event of request `i`: a token streamed (unless `json`), its figures at its end.
fn on_event(
    (i, event): (usize, RequestEvent),
    figures: &mut [Option<Measured>],
    last_printed: &mut Option<usize>,
    json: bool,
) -> Result<(), CliError> {
    match event {
        RequestEvent::Token { text, .. } if !json => {
            if *last_printed != Some(i) {
                let gap = if last_printed.is_some() { "\n" } else { "" };
                print_text(&format!("{gap}[r{i}] "));
                *last_printed = Some(i);
            }
            print_text(&text);
        }
        RequestEvent::Finished(metrics) => figures[i] = Some(Measured::of(&metrics)),
        RequestEvent::Failed(why) => return Err(CliError::RequestFailed(why)),
        _ => {}
    }
    Ok(())
}

/// The report as text: a row per request, then per class and all.
fn summary(r: &RealMixReport) -> String {
    let mut out = format!(
        "{}: {} requests of {}, request policy {}, policy {} within each, {} threads, chunk \
         {}; arrivals x{:.3} ({}); measured\n\n",
        r.model,
        r.requests.len(),
        r.trace,
        r.request_policy,
        r.policy,
        r.threads,
        r.chunk_len,
        r.arrival_scale,
        r.arrival_scale_source
    );
    out.push_str(&request_tables(&r.requests, &r.classes, &r.all));
    out.push_str(&format!(
        "\nwall {:.1} ms (times in ms; ttft = time to first token, tpot = per output token \
         after it, e2e = its last token; alone = the same request run by itself first)\n",
        r.wall_ms
    ));
    out
}
