//! Errors of plan building: each says what was wrong and what to do.

use thiserror::Error;

/// Why a prefill plan could not be built.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum PlanError {
    /// The model configuration is inconsistent.
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// The workload (prompt length, chunk length) is unusable.
    #[error("invalid workload: {0}")]
    InvalidWorkload(String),
    /// The device profile is unusable.
    #[error("invalid device profile: {0}")]
    InvalidDevice(String),
    /// A layer operator names an input that does not exist.
    #[error("layer operator `{op}` reads `{input}`, which no operator in the layer produces")]
    UnknownInput {
        /// The reading operator.
        op: String,
        /// The missing input name.
        input: String,
    },
    /// Two layer operators share a name.
    #[error("layer operator name `{0}` is used twice; operator names must be unique")]
    DuplicateOp(String),
    /// The layer graph has a dependency cycle.
    #[error(
        "the layer graph has a dependency cycle through operator `{0}`; remove one of its inputs"
    )]
    Cycle(String),
    /// The scene's memory settings are unusable.
    #[error("invalid memory settings: {0}")]
    InvalidMemory(String),
    /// A memory budget can never be met.
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    /// A stage needs a processor the device does not have.
    #[error("the device has no processor for {0} work; add one to the device profile")]
    NoProcessor(String),
}
