//! Perplexity through decode steps: the scored positions of each window are fed one
//! token at a time, so their logits come from the decode path's own head (a 4-bit head
//! under W4A8, INT8 under W8A8), where `hetsched eval`'s prefills use the f32 head.
//!
//! Each window (cut and scored as [`EvalWindows`] says) is one fresh [`Session`]: the
//! tokens before the first scored position are prefilled, then every later token is a
//! decode step whose logits predict the next. Two paths over the same model share every
//! layer's arithmetic, so their difference is the head's alone: [`DecodeScore::agreement`]
//! is what greedy decoding keeps of one head's choices under the other.

use std::sync::Arc;

use super::{DecodePath, GenerateError, Session};
use crate::eval::{log_softmax, window_tokens};
use crate::{EvalWindows, ExecError, ExecModel, PrefillOptions};

/// What [`decode_perplexity`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeScore {
    /// exp(mean negative log-likelihood) of the scored positions.
    pub perplexity: f64,
    /// Positions scored.
    pub tokens: usize,
    /// The most likely next token at each scored position, in order.
    pub greedy: Vec<u32>,
}

impl DecodeScore {
    /// Share of positions where this score's most likely token equals `other`'s (both
    /// over the same windows; 0 when they scored different positions).
    pub fn agreement(&self, other: &DecodeScore) -> f64 {
        if self.greedy.len() != other.greedy.len() || self.greedy.is_empty() {
            return 0.0;
        }
        let same = self.greedy.iter().zip(&other.greedy);
        same.filter(|(a, b)| a == b).count() as f64 / self.greedy.len() as f64
    }
}

/// The perplexity of `tokens` cut into `windows`, the scored positions' logits taken
/// from decode steps on `path` (a direct path: its head is what is measured).
///
/// # Errors
/// [`ExecError::InvalidEval`] for a window shorter than 2 tokens, a text shorter than
/// one window, or a scoring that leaves no position to a decode step; any error of the
/// session's prefill or steps.
pub fn decode_perplexity(
    model: &Arc<ExecModel>,
    options: &PrefillOptions,
    path: DecodePath,
    tokens: &[u32],
    windows: &EvalWindows,
) -> Result<DecodeScore, GenerateError> {
    let EvalWindows {
        ctx,
        max_windows,
        scoring,
    } = *windows;
    let first = scoring.first_scored(ctx).max(1);
    if ctx < 3 || first >= ctx - 1 {
        return Err(ExecError::InvalidEval(format!(
            "--ctx {ctx} leaves no position to a decode step: use at least 3 tokens per window"
        ))
        .into());
    }
    let cut: Vec<Vec<u32>> = tokens
        .chunks_exact(ctx)
        .take(max_windows)
        .map(|w| window_tokens(w, scoring))
        .collect();
    if cut.is_empty() {
        return Err(ExecError::InvalidEval(format!(
            "the text has {} tokens, fewer than one window of {ctx}",
            tokens.len()
        ))
        .into());
    }
    let (mut nll, mut greedy) = (0f64, Vec::with_capacity(cut.len() * (ctx - first)));
    for window in &cut {
        let mut session = Session::new(model.clone(), options.clone(), path)?;
        session.reserve(ctx)?;
        session.prefill(&window[..first])?;
        for t in first..ctx - 1 {
            session.step(window[t])?;
            let logits = session
                .logits()
                .ok_or_else(|| ExecError::Kernel("a decode step left no logits".into()))?;
            let lp = log_softmax(logits);
            nll -= lp[window[t + 1] as usize];
            greedy.push(super::argmax(logits));
        }
    }
    Ok(DecodeScore {
        perplexity: (nll / greedy.len() as f64).exp(),
        tokens: greedy.len(),
        greedy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(greedy: &[u32]) -> DecodeScore {
        DecodeScore {
            perplexity: 1.0,
            tokens: greedy.len(),
            greedy: greedy.to_vec(),
        }
    }

    #[test]
    fn agreement_counts_equal_choices_and_refuses_different_positions() {
        assert_eq!(score(&[1, 2, 3, 4]).agreement(&score(&[1, 9, 3, 9])), 0.5);
        assert_eq!(score(&[1, 2]).agreement(&score(&[1, 2, 3])), 0.0);
        assert_eq!(score(&[]).agreement(&score(&[])), 0.0);
    }
}
