//! Why a real prefill could not run.

use hetsched_systems::PlanError;
use hetsched_systems::policy::UnknownPolicy;
use thiserror::Error;

use super::calibration::CalibrationError;
use super::steps::Step;
use crate::engine::EngineError;
use crate::import::ImportError;

/// A real prefill's failure: bad input, a plan the executor cannot run, or a queue that
/// failed a job.
#[derive(Debug, Error)]
pub enum ExecError {
    /// The options name a policy that is not built in.
    #[error(transparent)]
    Policy(#[from] UnknownPolicy),
    /// The prompt has no tokens.
    #[error("the prompt is empty: give at least one token of text")]
    EmptyPrompt,
    /// The prompt does not fit the model's context.
    #[error(
        "prompt of {tokens} tokens is longer than the model's context of {context} tokens; shorten the prompt"
    )]
    PromptTooLong {
        /// Prompt tokens.
        tokens: usize,
        /// Context length.
        context: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The plan holds an operator the executor has no kernel for.
    #[error(
        "operator `{op}` of stage {stage} has no real kernel (no `role`, or one the executor cannot bind): real execution runs the built-in llama layer only (drop `layer_ops` from the model)"
    )]
    UnsupportedOp {
        /// Operator name.
        op: String,
        /// Stage name.
        stage: String,
    },
    /// A value an operator reads was never produced: a scheduler or plan bug.
    #[error("`{op}` of chunk {chunk} found no `{value}` to read: a dependency was not respected")]
    MissingValue {
        /// Reading step (or `prefill` for the run's result).
        op: String,
        /// Chunk.
        chunk: u32,
        /// Missing value.
        value: &'static str,
    },
    /// An evaluation setting that cannot work.
    #[error("{0}")]
    InvalidEval(String),
    /// A kernel refused its input (shapes or precisions that do not match).
    #[error("kernel failed: {0}")]
    Kernel(String),
    /// A calibration file is missing, corrupt or made for another model.
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    /// The model could not be loaded.
    #[error(transparent)]
    Import(#[from] ImportError),
    /// The plan could not be built.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The run stopped early.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The GPU lane was asked for and cannot run.
    #[error("GPU unavailable: {0}")]
    Gpu(String),
    /// The thread pool could not start.
    #[error("could not start {threads} worker threads: {reason}")]
    Threads {
        /// Requested threads.
        threads: usize,
        /// The system's reason.
        reason: String,
    },
}

impl ExecError {
    /// `step` of chunk `chunk` found no `value` to read.
    pub fn missing(step: Step, chunk: usize, value: &'static str) -> Self {
        ExecError::MissingValue {
            op: format!("{step:?}"),
            chunk: chunk as u32,
            value,
        }
    }
}
