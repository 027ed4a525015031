//! `hetsched eval`: perplexity of a text under real prefill, and how far a precision's
//! next-token distributions are from f32's (KL divergence, top-1 agreement).
//!
//! The text is cut into windows of `ctx` tokens; each window is one prefill (one chunk,
//! through the scheduler and the queues like any run) that returns every position's
//! logits. Position t predicts token t+1 of the same window.
//!
//! Which positions count is the [`Scoring`]: [`Scoring::All`] (the default of
//! `hetsched eval`) scores every position of every window; [`Scoring::LlamaCpp`] scores
//! as llama.cpp's `llama-perplexity` does, so that the two figures compare directly:
//! only the second half of each window (positions `ctx/2 .. ctx-1`, each with at least
//! `ctx/2` tokens of context), and, for a tokenizer that adds BOS, the window's first
//! token replaced by BOS. The same model and text read higher under `All`, whose early
//! positions see little context.

use std::sync::Arc;

use serde::Serialize;

use super::shadow::{ShadowReport, ShadowUsage};
use super::{ExecError, ExecModel, PrefillOptions, prefill};
use hetsched_runtime::progress::{Progress, Silent};

/// What `hetsched eval --json` prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EvalReport {
    /// Precision evaluated.
    pub precision: &'static str,
    /// Tokens per window.
    pub ctx: usize,
    /// Windows evaluated.
    pub windows: usize,
    /// Which positions were scored: `all` or `llama-cpp`.
    pub scoring: &'static str,
    /// Predicted tokens (ctx − 1 per window, or ctx − 1 − ctx/2 scored the llama.cpp way).
    pub tokens: usize,
    /// exp(mean negative log-likelihood).
    pub perplexity: f64,
    /// The f32 model's perplexity on the same windows.
    pub perplexity_f32: f64,
    /// Mean KL(f32 || this precision) over positions, in nats (0 for f32 itself).
    pub kl_divergence: f64,
    /// Share of positions whose most likely token equals f32's.
    pub top1_agreement: f64,
    /// Prompt tokens per second of the evaluated precision's prefills.
    pub prefill_tokens_per_s: f64,
    /// The outlier shadow over every window (w8a8-shadow only).
    pub shadow: Option<ShadowReport>,
}

/// Which positions of each window [`evaluate_windows`] scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scoring {
    /// Every position `0 .. ctx-1` of each window (ctx − 1 predictions per window).
    #[default]
    All,
    /// llama.cpp's `llama-perplexity`: positions `ctx/2 .. ctx-1` only
    /// (`ctx − 1 − ctx/2` predictions per window), after replacing the window's first
    /// token with `bos` when there is one (llama.cpp does so when the vocabulary adds BOS).
    LlamaCpp {
        /// The BOS token the window starts with, or `None` to keep the text's token.
        bos: Option<u32>,
    },
}

impl Scoring {
    /// The first position scored in a window of `ctx` tokens.
    pub fn first_scored(self, ctx: usize) -> usize {
        match self {
            Self::All => 0,
            Self::LlamaCpp { .. } => ctx / 2,
        }
    }

    /// The name shown in reports: `all` or `llama-cpp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::LlamaCpp { .. } => "llama-cpp",
        }
    }
}

/// How [`evaluate_windows`] cuts the text and scores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalWindows {
    /// Tokens per window (at least 2).
    pub ctx: usize,
    /// At most this many windows, the first ones.
    pub max_windows: usize,
    /// Which positions count.
    pub scoring: Scoring,
}

/// `ln softmax(logits)`, in f64 (the KL sums of evaluation and calibration).
pub(super) fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let lse = hetsched_import::log_sum_exp(logits);
    logits.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(q || p) of two log-probability vectors, in nats.
pub(super) fn kl_divergence(lq: &[f64], lp: &[f64]) -> f64 {
    lq.iter().zip(lp).map(|(q, p)| q.exp() * (q - p)).sum()
}

fn argmax(x: &[f64]) -> usize {
    x.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 { (i, v) } else { best }
        })
        .0
}

/// Evaluates `model` against the f32 `reference` (the same weights in f32; pass the same
/// model to evaluate f32 alone) on `tokens`, in windows of `ctx` tokens, at most
/// `max_windows` of them.
pub fn evaluate(
    model: &Arc<ExecModel>,
    reference: &Arc<ExecModel>,
    tokens: &[u32],
    ctx: usize,
    max_windows: usize,
    options: &PrefillOptions,
) -> Result<EvalReport, ExecError> {
    evaluate_with_progress(
        model,
        reference,
        tokens,
        ctx,
        max_windows,
        options,
        &mut Silent,
    )
}

/// [`evaluate`], counting the windows done on `progress`.
pub fn evaluate_with_progress(
    model: &Arc<ExecModel>,
    reference: &Arc<ExecModel>,
    tokens: &[u32],
    ctx: usize,
    max_windows: usize,
    options: &PrefillOptions,
    progress: &mut dyn Progress,
) -> Result<EvalReport, ExecError> {
    let windows = EvalWindows {
        ctx,
        max_windows,
        scoring: Scoring::All,
    };
    evaluate_windows(model, reference, tokens, &windows, options, progress)
}

/// Evaluates `model` against `reference` as [`evaluate`] does, with the windows cut and
/// scored as `windows` says, counting the windows done on `progress`.
pub fn evaluate_windows(
    model: &Arc<ExecModel>,
    reference: &Arc<ExecModel>,
    tokens: &[u32],
    windows: &EvalWindows,
    options: &PrefillOptions,
    progress: &mut dyn Progress,
) -> Result<EvalReport, ExecError> {
    let EvalWindows {
        ctx,
        max_windows,
        scoring,
    } = *windows;
    if ctx < 2 {
        return Err(ExecError::InvalidEval(format!(
            "--ctx {ctx} leaves nothing to predict: use at least 2 tokens per window"
        )));
    }
    let windows: Vec<Vec<u32>> = tokens
        .chunks_exact(ctx)
        .take(max_windows)
        .map(|w| window_tokens(w, scoring))
        .collect();
    if windows.is_empty() {
        return Err(ExecError::InvalidEval(format!(
            "the text has {} tokens, fewer than one window of {ctx}: give a longer text or a smaller --ctx",
            tokens.len()
        )));
    }
    let options = PrefillOptions {
        chunk_len: ctx as u32,
        all_logits: true,
        ..options.clone()
    };
    let vocab = model.config.vocab_size;
    let same = Arc::ptr_eq(model, reference);
    let mut scores = Scores::default();
    let (mut shadow, mut prefill_ns) = (ShadowUsage::default(), 0u64);
    progress.set_len(windows.len() as u64);
    for window in &windows {
        let run = prefill(model.clone(), window, &options)?;
        prefill_ns += run.outcome.makespan_ns;
        shadow = shadow.plus(run.shadow);
        let logits = run.logits;
        let reference_logits = if same {
            None
        } else {
            Some(prefill(reference.clone(), window, &options)?.logits)
        };
        let scored = scoring.first_scored(ctx)..ctx - 1;
        scores.add_window(window, scored, &logits, reference_logits.as_deref(), vocab);
        progress.inc(1);
    }
    progress.finish();
    let n = scores.count as f64;
    Ok(EvalReport {
        precision: model.precision.as_str(),
        ctx,
        windows: windows.len(),
        scoring: scoring.as_str(),
        tokens: scores.count,
        perplexity: (scores.nll / n).exp(),
        perplexity_f32: (scores.nll_f32 / n).exp(),
        kl_divergence: scores.kl / n,
        top1_agreement: scores.agree as f64 / n,
        prefill_tokens_per_s: (windows.len() * ctx) as f64 / (prefill_ns.max(1) as f64 / 1e9),
        shadow: model.shadow_report(shadow).map(|mut s| {
            s.prefill_share = s.shadow_ms / (prefill_ns.max(1) as f64 / 1e6);
            s
        }),
    })
}

/// Sums over the scored tokens of every window so far.
#[derive(Default)]
struct Scores {
    /// Negative log-likelihood of each next token under the model.
    nll: f64,
    /// The same under the reference (the model's own when they are one).
    nll_f32: f64,
    /// KL divergence of the model's next-token distribution from the reference's.
    kl: f64,
    /// Tokens whose most likely next token the two agree on.
    agree: usize,
    /// Tokens scored.
    count: usize,
}

impl Scores {
    /// Adds `window`'s next-token predictions at the positions `scored`, from the
    /// model's `logits` and the reference's (`None`: the model is its own reference),
    /// `vocab` per position.
    fn add_window(
        &mut self,
        window: &[u32],
        scored: std::ops::Range<usize>,
        logits: &[f32],
        reference: Option<&[f32]>,
        vocab: usize,
    ) {
        for t in scored {
            let next = window[t + 1] as usize;
            let lp = log_softmax(&logits[t * vocab..(t + 1) * vocab]);
            self.nll -= lp[next];
            match reference {
                Some(r) => {
                    let lq = log_softmax(&r[t * vocab..(t + 1) * vocab]);
                    self.nll_f32 -= lq[next];
                    self.kl += kl_divergence(&lq, &lp);
                    self.agree += usize::from(argmax(&lq) == argmax(&lp));
                }
                None => {
                    self.nll_f32 -= lp[next];
                    self.agree += 1;
                }
            }
            self.count += 1;
        }
    }
}

/// One window's tokens as scored: with its first token replaced by BOS where `scoring`
/// asks for it (llama.cpp's `tokens[batch_start] = bos`).
pub(crate) fn window_tokens(window: &[u32], scoring: Scoring) -> Vec<u32> {
    let mut w = window.to_vec();
    if let (Scoring::LlamaCpp { bos: Some(bos) }, Some(first)) = (scoring, w.first_mut()) {
        *first = bos;
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_scores_the_second_half_after_bos() {
        let scoring = Scoring::LlamaCpp { bos: Some(1) };
        assert_eq!(scoring.first_scored(512), 256);
        assert_eq!(scoring.first_scored(7), 3);
        assert_eq!(Scoring::All.first_scored(512), 0);
        assert_eq!(window_tokens(&[5, 6, 7], scoring), [1, 6, 7]);
        assert_eq!(
            window_tokens(&[5, 6, 7], Scoring::LlamaCpp { bos: None }),
            [5, 6, 7]
        );
        assert_eq!(window_tokens(&[5, 6, 7], Scoring::All), [5, 6, 7]);
    }
}
