//! `hetsched eval`: the perplexity of a text under a precision, beside f32, and
//! (`--decode-heads`) the decode heads' perplexities through decode steps.

use std::path::PathBuf;
use std::sync::Arc;

use hetsched::exec::{self, ExecModel, LinearPrecision, PrefillOptions};

use crate::CliError;
use crate::choices::{Precision, ScoringChoice};
use crate::model::{ShadowArgs, find_calibration, load, read_text};
use crate::output::print_json_or;
use crate::progress::Bar;

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
    /// Score the positions through direct decode steps instead of prefills, three times:
    /// with the head at the precision's own width (4-bit with rescored candidates for
    /// W4A8), with an INT8 head and with the f32 head; print the perplexities and how often
    /// greedy decoding picks the same token under the own head as under the others.
    #[arg(long)]
    decode_heads: bool,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

/// `eval --decode-heads --json`.
#[derive(serde::Serialize)]
struct DecodeHeadsReport {
    precision: &'static str,
    ctx: usize,
    scoring: &'static str,
    tokens: usize,
    /// Through decode steps, the head at the precision's own width.
    perplexity_own_head: f64,
    /// Through decode steps, an INT8 head.
    perplexity_int8_head: f64,
    /// Through decode steps, the model's f32 head.
    perplexity_f32_head: f64,
    /// `perplexity_own_head / perplexity_int8_head - 1`.
    relative_difference: f64,
    /// Share of positions where the own head's and the INT8 head's most likely token is
    /// the same.
    greedy_agreement: f64,
    /// The same against the f32 head.
    greedy_agreement_f32: f64,
    /// The INT8 head's against the f32 head's.
    greedy_agreement_int8_f32: f64,
}

/// `eval --decode-heads`: the head's own-width perplexity against an INT8 head's and the
/// f32 head's, each through decode steps over the same windows.
fn eval_decode_heads(
    model: &Arc<ExecModel>,
    tokens: &[u32],
    windows: &exec::EvalWindows,
    options: &PrefillOptions,
    json: bool,
) -> Result<(), CliError> {
    use hetsched::exec::generate::DecodePath;
    use hetsched::exec::generate::decode_eval::decode_perplexity;
    let score = |path| decode_perplexity(model, options, path, tokens, windows);
    let own = score(DecodePath::Direct)?;
    let int8 = score(DecodePath::DirectInt8Head)?;
    let f32 = score(DecodePath::DirectF32Head)?;
    let report = DecodeHeadsReport {
        precision: model.precision.as_str(),
        ctx: windows.ctx,
        scoring: windows.scoring.as_str(),
        tokens: own.tokens,
        perplexity_own_head: own.perplexity,
        perplexity_int8_head: int8.perplexity,
        perplexity_f32_head: f32.perplexity,
        relative_difference: own.perplexity / int8.perplexity - 1.0,
        greedy_agreement: own.agreement(&int8),
        greedy_agreement_f32: own.agreement(&f32),
        greedy_agreement_int8_f32: int8.agreement(&f32),
    };
    print_json_or(json, &report, || {
        format!(
            "{} ({}), decode steps over {} positions: perplexity {:.4} with its own head, \
             {:.4} with an INT8 head ({:+.2}%), {:.4} with the f32 head; the own head's \
             greedy picks agree with the INT8 head's at {:.2}%, with the f32 head's at {:.2}% \
             (the INT8 head's with the f32 head's: {:.2}%)\n",
            model.name,
            report.precision,
            report.tokens,
            report.perplexity_own_head,
            report.perplexity_int8_head,
            100.0 * report.relative_difference,
            report.perplexity_f32_head,
            100.0 * report.greedy_agreement,
            100.0 * report.greedy_agreement_f32,
            100.0 * report.greedy_agreement_int8_f32
        )
    });
    Ok(())
}

/// Perplexity of a text, and the precision's KL and top-1 agreement against f32.
pub fn eval(args: EvalArgs) -> Result<(), CliError> {
    crate::model::check_prefill_settings(args.threads, 1)?;
    let text = read_text(
        "text file",
        &args.text,
        hetsched::limits::MAX_EVAL_TEXT_BYTES,
    )?;
    crate::model::check_prompt_text("text file", &text)?;
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
    if args.decode_heads {
        return eval_decode_heads(&model, &tokens, &windows, &options, args.json);
    }
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
