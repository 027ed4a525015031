//! `hetsched generate`'s reports: the `--json` object of one turn and of `--n` samples,
//! and the one-line summary on stderr.

use hetsched::exec::ExecModel;
use hetsched::exec::generate::bandwidth::{measure_read_bandwidth, probe_bytes};
use hetsched::exec::generate::{DecodePath, DecodeTime, Generated, SamplesGenerated, WeightBytes};
use serde::Serialize;

use crate::CliError;
use crate::output::{print_json_or, print_text};

/// The `--json` report.
#[derive(Serialize)]
pub(super) struct GenerateReport {
    pub(super) model: String,
    pub(super) precision: &'static str,
    pub(super) threads: usize,
    /// The lanes: cpu,npu, cpu,gpu,npu or gpu (`--backends`).
    pub(super) backends: String,
    pub(super) decode: &'static str,
    pub(super) prompt_tokens: usize,
    pub(super) generated_tokens: usize,
    pub(super) ttft_ms: f64,
    /// Of the time to first token: building and compiling the prefill's plan.
    pub(super) prefill_plan_ms: f64,
    pub(super) prefill_tokens_per_s: f64,
    pub(super) decode_tokens_per_s: f64,
    /// Weight bytes a decode step reads: the layers' linears and the head as it runs.
    pub(super) weight_bytes_per_token: WeightBytes,
    /// This machine's streaming-read bandwidth at the run's threads, measured after the
    /// run (median pass over a buffer 8x a 32 MiB last-level cache), GB/s.
    pub(super) bandwidth_gb_s: f64,
    /// `weight_bytes_per_token` (both parts) x `decode_tokens_per_s` / `bandwidth_gb_s`:
    /// how close decoding streams its weights to the measured limit.
    pub(super) bandwidth_fraction: f64,
    /// Share of decode steps' wall time outside their stages (scheduled steps: the
    /// scheduler and queues) or outside the kernels' parallel regions (direct steps:
    /// norms, activation quantization, RoPE, residual adds).
    pub(super) decode_overhead: Option<f64>,
    /// The same share, step by step: the median over the steps (a step the operating
    /// system preempted between two stages does not move it, as it moves the total).
    pub(super) decode_overhead_median: Option<f64>,
    /// The time a scheduled step spent outside its stages, µs: the median over the steps
    /// (what `decode_overhead_median` is a share of the step's time of).
    pub(super) decode_overhead_us_median: Option<f64>,
    /// Subgraph instances of one scheduled decode step.
    pub(super) decode_instances_per_step: Option<usize>,
    /// The time from one decode step's end to the next one's start, µs, the median over
    /// the steps: choosing the token from the logits (greedy or sampled), streaming its
    /// text and checking the stop conditions. `decode_tokens_per_s` times the steps
    /// alone, as `llama-bench`'s tg rows time no sampling.
    pub(super) between_steps_us_median: Option<f64>,
    pub(super) text: String,
    pub(super) finish_reason: hetsched::exec::generate::FinishReason,
}

/// Prints the `n` samples of `--n`: the JSON object, or each sample's text and the
/// figures on stderr.
pub(super) fn print_samples(
    report: &SamplesReport,
    samples: &SamplesGenerated,
    n: usize,
    json: bool,
) {
    if json {
        print_json_or(true, report, String::new);
        return;
    }
    for (i, sample) in samples.samples.iter().enumerate() {
        print_text(&format!(
            "--- sample {i} ({:?}) ---\n{}\n",
            sample.finish_reason, sample.text
        ));
    }
    eprintln!(
        "[{} ({}), {} threads: {} prompt tokens, first tokens after {:.1} ms; {} \
         samples, {} tokens at {:.1} tokens/s summed over the samples ({} batched \
         steps)]",
        report.model,
        report.precision,
        report.threads,
        report.prompt_tokens,
        report.ttft_ms,
        n,
        report.generated_tokens,
        report.decode_tokens_per_s,
        report.decode_steps
    );
}

/// Adds the memory bandwidth probed on `threads` threads to `report`, and the share of it
/// the decode's weight streaming used.
pub(super) fn add_bandwidth(report: &mut GenerateReport, threads: usize) -> Result<(), CliError> {
    let probe = measure_read_bandwidth(threads, probe_bytes(), 5)?;
    let streamed = report.weight_bytes_per_token.total() as f64 * report.decode_tokens_per_s;
    report.bandwidth_gb_s = probe.median_gb_s;
    report.bandwidth_fraction = streamed / 1e9 / probe.median_gb_s;
    Ok(())
}

/// The `--json` report of `--n` above 1.
#[derive(Serialize)]
pub(super) struct SamplesReport {
    pub(super) model: String,
    pub(super) precision: &'static str,
    pub(super) threads: usize,
    pub(super) backends: String,
    pub(super) decode: &'static str,
    pub(super) n: usize,
    pub(super) prompt_tokens: usize,
    /// Summed over the samples.
    pub(super) generated_tokens: usize,
    pub(super) ttft_ms: f64,
    pub(super) prefill_plan_ms: f64,
    pub(super) prefill_tokens_per_s: f64,
    /// Tokens fed by the batched decode steps, summed over the samples, per second of
    /// the steps' wall time.
    pub(super) decode_tokens_per_s: f64,
    /// Batched decode steps (each feeds every live sample one token).
    pub(super) decode_steps: u64,
    pub(super) samples: Vec<SampleReport>,
}

/// One sample of a [`SamplesReport`].
#[derive(Serialize)]
pub(super) struct SampleReport {
    pub(super) generated_tokens: usize,
    pub(super) text: String,
    pub(super) finish_reason: hetsched::exec::generate::FinishReason,
}

pub(super) fn samples_report(
    model: &ExecModel,
    threads: usize,
    backends: String,
    s: &SamplesGenerated,
) -> SamplesReport {
    SamplesReport {
        model: model.name.clone(),
        precision: model.precision.as_str(),
        threads,
        decode: match backends.as_str() {
            "gpu" => "gpu-batched",
            _ => "direct-batched",
        },
        backends,
        n: s.samples.len(),
        prompt_tokens: s.prompt_tokens,
        generated_tokens: s.samples.iter().map(|x| x.tokens.len()).sum(),
        ttft_ms: s.ttft_ns as f64 / 1e6,
        prefill_plan_ms: s.prefill_plan_ns as f64 / 1e6,
        prefill_tokens_per_s: per_second(s.prompt_tokens as u64, s.prefill_ns),
        decode_tokens_per_s: per_second(s.decode_tokens, s.decode_ns),
        decode_steps: s.decode_steps,
        samples: s
            .samples
            .iter()
            .map(|x| SampleReport {
                generated_tokens: x.tokens.len(),
                text: x.text.clone(),
                finish_reason: x.finish_reason,
            })
            .collect(),
    }
}

/// The `--json` object of a finished turn.
pub(super) fn report(
    model: &ExecModel,
    threads: usize,
    path: DecodePath,
    generated: &Generated,
    time: DecodeTime,
) -> GenerateReport {
    GenerateReport {
        model: model.name.clone(),
        precision: model.precision.as_str(),
        threads,
        backends: String::new(),
        decode: match path {
            DecodePath::Direct => "direct",
            DecodePath::DirectF32Head => "direct-f32-head",
            DecodePath::DirectInt8Head => "direct-int8-head",
            DecodePath::Scheduled => "scheduled",
        },
        prompt_tokens: generated.prompt_tokens,
        generated_tokens: generated.tokens.len(),
        ttft_ms: generated.ttft_ns as f64 / 1e6,
        prefill_plan_ms: generated.prefill_plan_ns as f64 / 1e6,
        prefill_tokens_per_s: per_second(generated.prompt_tokens as u64, generated.prefill_ns),
        decode_tokens_per_s: per_second(generated.decode_steps, generated.decode_ns),
        weight_bytes_per_token: WeightBytes::default(),
        bandwidth_gb_s: 0.0,
        bandwidth_fraction: 0.0,
        decode_overhead: (time.wall_ns > 0).then(|| time.overhead()),
        decode_overhead_median: (!generated.decode_step_times.is_empty()).then(|| {
            let shares = generated.decode_step_times.iter().map(|t| t.overhead());
            crate::profile::median(shares.collect())
        }),
        decode_overhead_us_median: (!generated.decode_step_times.is_empty()).then(|| {
            let outside = generated
                .decode_step_times
                .iter()
                .map(|t| t.wall_ns.saturating_sub(t.busy_ns) as f64 / 1e3);
            crate::profile::median(outside.collect())
        }),
        decode_instances_per_step: None,
        between_steps_us_median: (generated.decode_spans_ns.len() > 1).then(|| {
            let gaps = generated
                .decode_spans_ns
                .windows(2)
                .map(|pair| pair[1].0.saturating_sub(pair[0].1) as f64 / 1e3);
            crate::profile::median(gaps.collect())
        }),
        finish_reason: generated.finish_reason,
        text: generated.text.clone(),
    }
}

pub(super) fn per_second(count: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        count as f64 / (ns as f64 / 1e9)
    }
}

/// The figures after the streamed text.
pub(super) fn summary(r: &GenerateReport, g: &Generated) -> String {
    let overhead = r.decode_overhead.map_or(String::new(), |o| {
        format!(
            ", {:.1}% of the steps outside their kernels or stages",
            100.0 * o
        )
    });
    format!(
        "[{} ({}), {} threads: {} prompt tokens, first token after {:.1} ms ({:.0} tokens/s \
         prefill); {} tokens at {:.1} tokens/s ({} decode{overhead}); finish: {:?}]",
        r.model,
        r.precision,
        r.threads,
        r.prompt_tokens,
        r.ttft_ms,
        r.prefill_tokens_per_s,
        g.tokens.len(),
        r.decode_tokens_per_s,
        r.decode,
        g.finish_reason
    )
}
