//! Admission of requests against the engine's limits: what a request's KV caches take,
//! the bytes and requests in use, and the typed errors a server answers 503 (or 400) with.

use thiserror::Error;

use super::{Admission, EngineLimits, RequestId, RequestSpec};
use crate::generate::MAX_SAMPLES;
use crate::generate::error::GenerateError;

/// Why a request was refused at [`super::RequestEngine::submit`]; nothing of it ran.
#[derive(Debug, Error)]
pub enum SubmitError {
    /// The request's own settings are wrong (empty prompt, a token outside the
    /// vocabulary, beyond the context, a bad sampling setting, `n` or `max_tokens` out of
    /// range): a client error.
    #[error(transparent)]
    Invalid(#[from] GenerateError),
    /// A prompt token outside the model's vocabulary.
    #[error("prompt token {id} is outside the model's vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The token.
        id: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// The KV caches in use leave no room for this request now (admission mode
    /// [`Admission::Refuse`]); it may fit later: retry (HTTP 503).
    #[error(
        "the KV budget is full: the request needs {needed} bytes, {in_use} of {budget} are in \
         use; retry later"
    )]
    KvBudgetFull {
        /// Bytes of the request's caches.
        needed: usize,
        /// Bytes in use by live requests.
        in_use: usize,
        /// The engine's budget.
        budget: usize,
    },
    /// The request's caches alone exceed the whole KV budget: it can never run.
    #[error(
        "the request's KV caches need {needed} bytes, more than the engine's whole budget of \
         {budget}: lower max_tokens, n or the prompt, or raise the budget"
    )]
    KvNeverFits {
        /// Bytes of the request's caches.
        needed: usize,
        /// The engine's budget.
        budget: usize,
    },
    /// As many requests as the engine holds are live or waiting (HTTP 503).
    #[error("{limit} requests are already live or waiting, the engine's limit; retry later")]
    TooManyRequests {
        /// The limit.
        limit: usize,
    },
    /// The engine has stopped (shut down, or its thread failed).
    #[error("the request engine has stopped")]
    Stopped,
}

/// Why [`super::RequestEngine::cancel`] did nothing.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum CancelError {
    /// The request has finished (or was cancelled before), or was never submitted.
    #[error("request {0} is not live (finished, cancelled before, or unknown)")]
    NotLive(RequestId),
}

/// Bytes of one request's KV caches: the prompt's cache (shared by its samples) and each
/// sample's own positions after it (every generated token but the last is fed).
pub fn kv_bytes(spec: &RequestSpec, layers: usize, kv_dim: usize) -> usize {
    let per_position = layers * kv_dim * 2 * std::mem::size_of::<f32>();
    let own = spec.max_tokens.saturating_sub(1).max(1);
    per_position.saturating_mul(spec.prompt.len().saturating_add(spec.n.saturating_mul(own)))
}

/// Checks what can be checked of `spec` without the engine's state.
pub fn validate(spec: &RequestSpec, vocab: usize, context: usize) -> Result<(), SubmitError> {
    if spec.prompt.is_empty() {
        return Err(GenerateError::EmptyTurn.into());
    }
    if spec.max_tokens == 0 {
        return Err(GenerateError::NoTokens.into());
    }
    if spec.n == 0 || spec.n > MAX_SAMPLES {
        return Err(GenerateError::Samples {
            n: spec.n,
            max: MAX_SAMPLES,
        }
        .into());
    }
    spec.sampling.validate()?;
    if let Some(&id) = spec.prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(SubmitError::TokenOutOfRange { id, vocab });
    }
    if spec.prompt.len().saturating_add(spec.max_tokens) > context {
        return Err(GenerateError::BeyondContext {
            history: 0,
            prompt: spec.prompt.len(),
            max_tokens: spec.max_tokens,
            context,
        }
        .into());
    }
    Ok(())
}

/// The engine's bookkeeping that `submit` and the engine thread share (under one lock).
#[derive(Debug, Default)]
pub struct Ledger {
    /// KV bytes of admitted (live) requests.
    pub kv_in_use: usize,
    /// Requests live or waiting for memory.
    pub requests: usize,
}

impl Ledger {
    /// Admits a request of `needed` KV bytes: `Ok(true)` when its memory is reserved
    /// now, `Ok(false)` when it waits for memory (mode [`Admission::Wait`]), else the
    /// typed refusal. Counts it among the requests either way it is accepted.
    pub fn admit(&mut self, needed: usize, limits: &EngineLimits) -> Result<bool, SubmitError> {
        if needed > limits.kv_budget_bytes {
            return Err(SubmitError::KvNeverFits {
                needed,
                budget: limits.kv_budget_bytes,
            });
        }
        if self.requests >= limits.max_requests {
            return Err(SubmitError::TooManyRequests {
                limit: limits.max_requests,
            });
        }
        let fits = self.kv_in_use + needed <= limits.kv_budget_bytes;
        if !fits && limits.admission == Admission::Refuse {
            return Err(SubmitError::KvBudgetFull {
                needed,
                in_use: self.kv_in_use,
                budget: limits.kv_budget_bytes,
            });
        }
        self.requests += 1;
        if fits {
            self.kv_in_use += needed;
        }
        Ok(fits)
    }

    /// Reserves a waiting request's bytes if they fit now.
    pub fn reserve(&mut self, needed: usize, budget: usize) -> bool {
        let fits = self.kv_in_use + needed <= budget;
        if fits {
            self.kv_in_use += needed;
        }
        fits
    }

    /// A request left: its bytes (if it held them) and its place are free.
    pub fn release(&mut self, held: usize) {
        self.kv_in_use = self.kv_in_use.saturating_sub(held);
        self.requests = self.requests.saturating_sub(1);
    }
}
