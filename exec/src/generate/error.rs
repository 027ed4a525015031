//! What can go wrong in a generation session.

use hetsched_import::ImportError;
use thiserror::Error;

use crate::ExecError;

/// A generation session's error.
#[derive(Debug, Error)]
pub enum GenerateError {
    /// A sampling setting out of range.
    #[error("invalid {option}: {message}")]
    InvalidSampling {
        /// `temperature`, `top-k` or `top-p`.
        option: &'static str,
        /// What was wrong and what to give instead.
        message: String,
    },
    /// The prompt and the tokens asked for do not fit in the model's context.
    #[error(
        "{prompt} prompt tokens (after {history} of history) plus {max_tokens} new tokens exceed \
         the model's context of {context}: shorten the prompt or lower --max-tokens"
    )]
    BeyondContext {
        /// Tokens already in the session.
        history: usize,
        /// Tokens of the new prompt.
        prompt: usize,
        /// Tokens asked for.
        max_tokens: usize,
        /// The model's context length.
        context: usize,
    },
    /// Generation needs an end-of-sequence token and the model names none.
    #[error(
        "the model names no end-of-sequence token (tokenizer.ggml.eos_token_id): generation \
         could only stop at --max-tokens or a stop string; this tool refuses such a model"
    )]
    NoEos,
    /// `max_tokens` 0.
    #[error("max tokens 0 generates nothing: give at least 1")]
    NoTokens,
    /// A number of parallel samples out of range.
    #[error("{n} samples: give between 1 and {max} samples of one prompt")]
    Samples {
        /// Samples asked for.
        n: usize,
        /// The most decoded together.
        max: usize,
    },
    /// A turn without prompt tokens.
    #[error("the turn's prompt is empty: give at least one token of text")]
    EmptyTurn,
    /// The model's chat template is not one this tool can render.
    #[error(
        "cannot render the model's chat template (tokenizer.chat_template): {reason}; \
         supported: the ChatML form (<|im_start|>role\\ncontent<|im_end|>) and Gemma's turns \
         (<start_of_turn>role\\ncontent<end_of_turn>)"
    )]
    ChatTemplate {
        /// Why.
        reason: String,
    },
    /// The session was asked to feed tokens while a prefill of it is paused, or to resume
    /// a prefill it never started.
    #[error("{0}")]
    PrefillOrder(&'static str),
    /// The executor failed (a kernel, the scheduler, a bad token).
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The tokenizer failed.
    #[error(transparent)]
    Import(#[from] ImportError),
}
