//! `hetsched generate`: a scheduled prefill of the prompt, then decode steps, the text
//! streamed to stdout as tokens come (statistics on stderr, or one JSON object with
//! `--json`). Ctrl-C stops after the current token and keeps what was generated.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hetsched::cancel::CancelFlag;
use hetsched::exec::generate::{
    ChatTemplate, DecodePath, GPU_MAX_SAMPLES, GenerateError, GenerateOptions, Generated,
    MAX_SAMPLES, Sampling, Session,
};
use hetsched::exec::{GpuUse, LinearPrecision, PrefillOptions};
use hetsched::import::GgufFile;

use crate::CliError;
use crate::choices::Precision;
use crate::model::{PromptArgs, ShadowArgs, load_one};
mod report;

use report::{GenerateReport, add_bandwidth, print_samples, report, samples_report, summary};

use crate::output::{check_outputs, print_json_or, print_text, write_file};
use hetsched::timeline::Trace;
use hetsched::timeline::chrome::to_chrome_json;
use hetsched::timeline::decode::with_decode_steps;
use hetsched::timeline::svg::to_svg;

/// `hetsched generate`.
#[derive(clap::Args)]
pub struct GenerateArgs {
    /// GGUF model file (llama architecture), or a Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    prompt: PromptArgs,
    /// New tokens at most.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Sample among the K most probable tokens only [default: all].
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample among the most probable tokens whose probabilities reach P, in (0, 1].
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Seed of the sampler's random generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop before this string (repeat for several).
    #[arg(long, value_name = "STR")]
    stop: Vec<String>,
    /// Samples of the prompt, decoded together in batched steps over the prompt's shared
    /// KV cache (sample i seeded --seed + i); each is printed when it ends. Direct
    /// decode on the CPU only.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// Go on past the end-of-sequence token (for benchmarks: always --max-tokens tokens).
    #[arg(long)]
    ignore_eos: bool,
    /// Wrap the prompt as a user message in the model's chat template (ChatML).
    #[arg(long)]
    chat: bool,
    /// Arithmetic of the linear layers.
    #[arg(long, value_enum, default_value = "w8a8")]
    precision: Precision,
    /// Compute threads [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Tokens per prefill chunk.
    #[arg(long, default_value_t = 128)]
    chunk_len: u32,
    /// Scheduling policy of the prefill (and of scheduled decode steps).
    #[arg(long, default_value = "balance", value_parser = crate::choices::policy_name)]
    policy: String,
    /// How decode steps run: direct (one chain of kernels per token; a quantized model's
    /// head at its width too: INT8 for W8A8, 4-bit with its best candidates rescored for
    /// W4A8), direct-f32-head (the same with the f32 head the prefill uses),
    /// direct-int8-head (with an INT8 head whatever the layers' width) or scheduled (each token a one-token plan through the engine and queues) [default:
    /// direct; scheduled with --backends gpu].
    #[arg(long, value_enum)]
    decode: Option<DecodeChoice>,
    /// Decoder layers per subgraph instance of a scheduled decode step on the CPU lane
    /// (1: one instance per layer) [default: 5]. The tokens are the same either way.
    #[arg(long, value_name = "N")]
    decode_layers: Option<u32>,
    /// Processor queues, as for `run`: cpu,npu; cpu,gpu,npu (float stages of the prefill
    /// on a Vulkan GPU lane; decode on the CPU); gpu alone (prefill and decode steps on the
    /// GPU, weights and KV cache resident there; needs --precision f32). GPU needs a build
    /// with `--features gpu`.
    #[arg(long, value_delimiter = ',', default_value = "cpu,npu")]
    backends: Vec<String>,
    /// With --backends gpu: the resident weights' type. f16 streams half the bytes a
    /// decode step reads (the products round their inputs to f16 and sum in f32); f32 is
    /// the reference, whose greedy tokens are the CPU f32 path's; auto is f32 here
    /// (`HETSCHED_GPU_F16_WEIGHTS=1` makes it f16).
    #[arg(long, value_enum, default_value = "auto")]
    gpu_weights: crate::real::GpuWeights,
    #[command(flatten)]
    shadow: ShadowArgs,
    /// Print one JSON object at the end instead of streaming the text.
    #[arg(long)]
    json: bool,
    /// Write a Chrome trace JSON timeline: the prefill's subgraphs, then one slice per
    /// decode step.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write an SVG timeline picture (decode steps as one slice each).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// `--decode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum DecodeChoice {
    Direct,
    DirectF32Head,
    DirectInt8Head,
    Scheduled,
}

/// Generates after the prompt; streams the text, then the figures to stderr.
pub fn generate(args: GenerateArgs) -> Result<(), CliError> {
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    // Bad settings are refused before the model loads.
    sampling.validate()?;
    check_settings(&args)?;
    let batched = args.n > 1;
    let gpu = crate::real::gpu_use(&args.backends)?;
    if args.gpu_weights == crate::real::GpuWeights::F16 && gpu != GpuUse::Resident {
        return Err(CliError::GpuWeightsNotResident);
    }
    let (text, stop) = prompt_and_stops(&args)?;
    let precision = LinearPrecision::from(args.precision);
    let loaded = load_one(&args.model, precision, &args.shadow)?;
    let model = Arc::new(loaded.models.into_iter().next().expect("one precision"));
    // A rendered template's control tokens (`<start_of_turn>`) are its ids.
    let tokens = match args.chat {
        true => loaded.tokenizer.encode_special(&text)?,
        false => loaded.tokenizer.encode(&text)?,
    };
    // Ctrl-C stops the prefill at a subgraph boundary, or generation after the token in
    // progress; what was generated is kept.
    let cancel = crate::interrupt::on_ctrl_c()?;
    let options = prefill_options(&args, gpu, &cancel)?;
    let threads = options.threads;
    let path = decode_path(args.decode, gpu);
    let mut session = Session::new(model.clone(), options, path)?;
    if let Some(layers) = args.decode_layers {
        session.set_decode_layers(layers)?;
    }
    let generate_options = GenerateOptions {
        max_tokens: clamped_max_tokens(args.max_tokens, tokens.len(), model.config.context_length),
        sampling,
        stop,
        ignore_eos: args.ignore_eos,
    };
    if batched {
        let samples = session.generate_samples(
            &tokens,
            &loaded.tokenizer,
            &generate_options,
            args.n,
            cancel.shared(),
            |_, _| {},
        )?;
        let report = samples_report(&model, threads, args.backends.join(","), &samples);
        print_samples(&report, &samples, args.n, args.json);
        return Ok(());
    }
    let stream = !args.json;
    let generated = session.generate(
        &tokens,
        &loaded.tokenizer,
        &generate_options,
        cancel.shared(),
        |t| {
            if stream {
                // A closed stdout (a pipe to `head`) ends nothing: generation finishes
                // and its files are written; the exit status tells.
                print_text(t);
            }
        },
    )?;
    let mut report = report(&model, threads, path, &generated, session.decode_time());
    report.decode_instances_per_step = session.decode_instances();
    report.weight_bytes_per_token = session.weight_bytes_per_token();
    if args.json && path != DecodePath::Scheduled {
        add_bandwidth(&mut report, threads)?;
    }
    report.backends = args.backends.join(",");
    write_timelines(&args.trace, &args.svg, &report, &generated)?;
    if args.json {
        print_json_or(true, &report, String::new);
    } else {
        print_text("\n");
        eprintln!("{}", summary(&report, &generated));
    }
    Ok(())
}

/// Refuses settings that can never run, before the model loads: no new tokens, bad
/// prefill settings, an empty stop string, a sample count out of range, or several
/// samples with what draws or decodes one sequence; and outputs that cannot be written.
fn check_settings(args: &GenerateArgs) -> Result<(), CliError> {
    if args.max_tokens == 0 {
        return Err(GenerateError::NoTokens.into());
    }
    crate::model::check_prefill_settings(args.threads, args.chunk_len)?;
    if args.stop.iter().any(String::is_empty) {
        return Err(CliError::EmptyStop);
    }
    let resident_gpu = args.backends == ["gpu"];
    let max = match resident_gpu {
        true => GPU_MAX_SAMPLES,
        false => MAX_SAMPLES,
    };
    if args.n == 0 || args.n > max {
        return Err(GenerateError::Samples { n: args.n, max }.into());
    }
    let batched = args.n > 1;
    if batched && args.decode == Some(DecodeChoice::Scheduled) && !resident_gpu {
        return Err(CliError::SamplesWith(
            "drop --decode scheduled (on the CPU, samples decode on the direct path)",
        ));
    }
    if batched && (args.trace.is_some() || args.svg.is_some()) {
        return Err(CliError::SamplesWith(
            "--trace and --svg draw one sequence's decode steps; drop them",
        ));
    }
    check_outputs([args.trace.as_deref(), args.svg.as_deref()])?;
    Ok(())
}

/// The prompt's text and the stop strings: with `--chat`, the prompt wrapped as a user
/// message in the model's template, whose end of turn also stops.
fn prompt_and_stops(args: &GenerateArgs) -> Result<(String, Vec<String>), CliError> {
    let mut text = args.prompt.text(|path| {
        crate::model::read_text("prompt file", path, hetsched::limits::MAX_PROMPT_BYTES)
    })?;
    crate::model::check_prompt_text("prompt", &text)?;
    let mut stop = args.stop.clone();
    if args.chat {
        let template = chat_template(&args.model)?;
        text = template.render_user(&text);
        stop.extend(template.end_of_turn().map(str::to_owned));
    }
    Ok((text, stop))
}

/// The prefill's settings from `args`, on `gpu`, stopped by `cancel`.
fn prefill_options(
    args: &GenerateArgs,
    gpu: GpuUse,
    cancel: &CancelFlag,
) -> Result<PrefillOptions, CliError> {
    let defaults = PrefillOptions::default();
    Ok(PrefillOptions {
        chunk_len: args.chunk_len,
        policy: args.policy.clone(),
        threads: args.threads.unwrap_or(defaults.threads),
        gpu,
        cancel: Some(cancel.clone()),
        gpu_kernels: crate::gpu_env::gpu_kernels()?,
        gpu_weights: crate::gpu_env::gpu_weights(args.gpu_weights.into()),
        ..defaults
    })
}

/// The decode path `--decode` names; by default scheduled when the GPU holds the
/// weights, else direct.
fn decode_path(choice: Option<DecodeChoice>, gpu: GpuUse) -> DecodePath {
    match choice {
        None if gpu == GpuUse::Resident => DecodePath::Scheduled,
        None | Some(DecodeChoice::Direct) => DecodePath::Direct,
        Some(DecodeChoice::DirectF32Head) => DecodePath::DirectF32Head,
        Some(DecodeChoice::DirectInt8Head) => DecodePath::DirectInt8Head,
        Some(DecodeChoice::Scheduled) => DecodePath::Scheduled,
    }
}

/// `--max-tokens` clamped to what the context leaves after a prompt of `prompt` tokens,
/// with a note when it is (as llama.cpp does), for chat and plain prompts alike; a prompt
/// that fills the context leaves it as is, for the session to refuse with the figures.
fn clamped_max_tokens(max_tokens: usize, prompt: usize, context: usize) -> usize {
    let room = context.saturating_sub(prompt);
    if room == 0 || max_tokens <= room {
        return max_tokens;
    }
    eprintln!(
        "note: --max-tokens {max_tokens} clamped to {room}: the prompt's {prompt} tokens leave that much of the model's context of {context}"
    );
    room
}

/// Writes the timelines asked for: the prefill's trace with the decode steps after it on
/// the CPU lane.
fn write_timelines(
    trace: &Option<PathBuf>,
    svg: &Option<PathBuf>,
    report: &GenerateReport,
    generated: &Generated,
) -> Result<(), CliError> {
    if trace.is_none() && svg.is_none() {
        return Ok(());
    }
    let run = &generated.prefill_run;
    let title = format!(
        "{} ({}) — prefill of {} tokens, then {} decode steps ({})",
        report.model, report.precision, report.prompt_tokens, generated.decode_steps, report.decode
    );
    let prefill = Trace::new(&title, run);
    let lane = prefill
        .lanes
        .iter()
        .position(|l| l.kind == "cpu")
        .unwrap_or(0);
    let timeline = with_decode_steps(prefill, lane, run.makespan_ns, &generated.decode_spans_ns);
    if let Some(path) = trace {
        write_file(path, &to_chrome_json(&timeline))?;
    }
    if let Some(path) = svg {
        write_file(path, &to_svg(&timeline))?;
    }
    Ok(())
}

/// The chat template of the GGUF model at `path`.
fn chat_template(path: &Path) -> Result<ChatTemplate, CliError> {
    let no_template = |reason: &str| GenerateError::ChatTemplate {
        reason: reason.to_string(),
    };
    if path.is_dir() {
        return Err(no_template(
            "--chat reads the template from a GGUF file's metadata; this is a directory",
        )
        .into());
    }
    let file = GgufFile::open(path)?;
    let template = file
        .metadata()
        .get_str("tokenizer.chat_template")?
        .ok_or_else(|| {
            no_template(
                "the model file has no tokenizer.chat_template (a base model rather than an \
                 instruction-tuned one?); generate without --chat",
            )
        })?;
    Ok(ChatTemplate::parse(template)?)
}
