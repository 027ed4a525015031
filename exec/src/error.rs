//! Why a real prefill could not run.

use hetsched_systems::PlanError;
use hetsched_systems::policy::UnknownPolicy;
use thiserror::Error;

use hetsched_import::{ImportError, LayerTensor};
use hetsched_runtime::engine::EngineError;
use std::path::PathBuf;

/// A real prefill's failure: bad input, a plan the executor cannot run, or a queue that
/// failed a job.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The options name a policy that is not built in.
    #[error(transparent)]
    Policy(#[from] UnknownPolicy),
    /// A [`super::PrefillOptions`] setting that cannot work.
    #[error("invalid {option}: {message}")]
    InvalidOption {
        /// The setting.
        option: &'static str,
        /// What is wrong and what to give instead.
        message: String,
    },
    /// A block's output held a NaN or an infinity: named by layer and block, so that the
    /// run stops where the numbers broke, not with an answer computed from garbage.
    #[error(
        "layer {layer}'s {block} block produced a non-finite value ({value} at index {index}, chunk {chunk}): an activation overflowed; check that layer's weights"
    )]
    NonFiniteActivation {
        /// Decoder layer.
        layer: usize,
        /// `attention` or `feed-forward`.
        block: &'static str,
        /// Chunk.
        chunk: usize,
        /// Index of the first non-finite value in the block's output (row-major).
        index: usize,
        /// Its value.
        value: f32,
    },
    /// The input of a layer's INT8 linears held a NaN or an infinity (an overflowing norm
    /// weight, say): refused before it is quantized, since a per-tensor quantizer turns
    /// infinities into a scale that makes every value a plausible integer.
    #[error(
        "the input of {linears} holds a non-finite value ({value} at index {index}, chunk {chunk}) before it is quantized: an activation overflowed; check the norm weights before it and the layers before those"
    )]
    NonFiniteQuantizeInput {
        /// Which linears: `layer 3's qkv linears`, `the LM head`.
        linears: String,
        /// Chunk (a decode step: the sequence's position).
        chunk: usize,
        /// Index of the first non-finite value (row-major).
        index: usize,
        /// Its value.
        value: f32,
    },
    /// On the resident GPU path, a block's output made the residual stream NaN or
    /// infinite (the device raises a flag per block; the values stay on it).
    #[error(
        "layer {layer}'s {block} block produced a non-finite value on the GPU (chunk {chunk}): an activation overflowed; check that layer's weights, or compare with `--backends cpu`"
    )]
    NonFiniteOnDevice {
        /// Decoder layer.
        layer: usize,
        /// `attention` or `feed-forward`.
        block: &'static str,
        /// Chunk.
        chunk: usize,
    },
    /// A model the GPU kernels do not compute, asked to run on a GPU lane: they run every
    /// family row with unscaled RoPE only (tables from each layer's base); the CPU lanes
    /// also run RoPE scaling.
    #[error(
        "{arch} model: the GPU lanes do not run {feature} (their kernels compute unscaled RoPE only); run it on the CPU lanes instead (`--backends cpu,npu`)"
    )]
    NotOnGpu {
        /// `general.architecture` (`gemma3`, `qwen2`, `llama`).
        arch: String,
        /// What the GPU kernels lack (`scaled RoPE`).
        feature: String,
    },
    /// The run produced NaN or infinite logits.
    #[error(
        "the prefill produced {count} non-finite logits (first: {value} at index {index}): an activation overflowed; check the model's weights"
    )]
    NonFiniteLogits {
        /// Index of the first (row-major over the returned rows).
        index: usize,
        /// Its value.
        value: f32,
        /// How many.
        count: usize,
    },
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
    /// A plan built for another prompt length than the tokens given.
    #[error("the plan is for {plan_tokens} prompt tokens but {tokens} were given")]
    PlanMismatch {
        /// The plan's prompt length.
        plan_tokens: usize,
        /// Tokens given.
        tokens: usize,
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
    /// A stage found the executor's own state inconsistent (a stage or buffer that is not
    /// there): a bug, never bad input.
    #[error("kernel failed: {0}")]
    Kernel(String),
    /// A kernel refused its input or its device failed.
    #[error("kernel failed: {0}")]
    Compute(#[from] KernelError),
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
    /// The roofline plan a measured run decides with does not match the run's plan.
    #[error(transparent)]
    Costs(#[from] hetsched_systems::policy::CostsMismatch),
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

/// Why a kernel did not compute: shapes or precisions that do not match (an executor bug),
/// shadow rows that cannot be had, or the device's own failure.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KernelError {
    /// An operand's length does not match its shape.
    #[error("activation has {found} elements where {expected} were expected")]
    Length {
        /// Elements found.
        found: usize,
        /// Elements the shape needs.
        expected: usize,
    },
    /// Operands of different precisions (e.g. an f32 activation and INT8 weights).
    #[error("{0} precisions differ")]
    Precisions(&'static str),
    /// An INT8 activation still holds outliers at its linear.
    #[error("outliers left in the activation: no shadow stage took them")]
    OutliersLeft,
    /// Outliers reached a linear that keeps no float rows.
    #[error("outliers without float weights to shadow them")]
    NoShadowWeights,
    /// An outlier's index lies outside the activation.
    #[error("outlier {index} outside a [{rows}, {k}] activation")]
    OutlierOutside {
        /// Flat index.
        index: u32,
        /// Activation rows.
        rows: usize,
        /// Activation columns.
        k: usize,
    },
    /// Outliers out of index order.
    #[error("shadow outliers must come in ascending index order")]
    OutliersUnordered,
    /// A cold channel's outlier with no model file to read its row from.
    #[error("channel {channel} has an outlier but no float row and no model file to read it from")]
    NoColdSource {
        /// Input channel.
        channel: usize,
    },
    /// A cold row could not be read from the model file.
    #[error("reading a cold shadow row: {0}")]
    ColdRead(ImportError),
    /// A cold row read from the model file has the wrong length.
    #[error("cold shadow row of layer {layer} {which:?} has {found} values, expected {expected}")]
    ColdRowLength {
        /// Decoder layer.
        layer: usize,
        /// Which tensor.
        which: LayerTensor,
        /// Values read.
        found: usize,
        /// Output features.
        expected: usize,
    },
    /// The device running the kernel failed, in its own words (e.g. a Vulkan error).
    #[error("{0}")]
    Device(Box<dyn std::error::Error + Send + Sync>),
}

/// Why a calibration could not be made, read or used.
#[derive(Debug, Error)]
pub enum CalibrationError {
    /// The file cannot be read.
    #[error(
        "cannot read calibration file {path}: {source}; make one with `hetsched calibrate --model MODEL --corpus TEXT`"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's reason.
        source: std::io::Error,
    },
    /// The file cannot be written.
    #[error("cannot write calibration file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The system's reason.
        source: std::io::Error,
    },
    /// The file is not a calibration this build understands.
    #[error(
        "calibration file {path} is corrupt ({reason}): delete it and run `hetsched calibrate` again"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What did not parse.
        reason: String,
    },
    /// The file has another format version.
    #[error(
        "calibration file {path} has format version {found}, this build reads version {expected}: run `hetsched calibrate` again"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u64,
        /// Ours.
        expected: u32,
    },
    /// The file was made for another model.
    #[error(
        "the calibration was made for model {expected}, not for {found}: run `hetsched calibrate` on this model, or pass the right --calibration FILE"
    )]
    ModelMismatch {
        /// The model the calibration describes.
        expected: String,
        /// The model being loaded.
        found: String,
    },
    /// A site's shapes are not the loaded model's.
    #[error(
        "the calibration's {at} has {found}, the model's has {expected}: run `hetsched calibrate` on this model again"
    )]
    Shape {
        /// The site and layer.
        at: String,
        /// The file's channels and row bytes.
        found: String,
        /// The model's.
        expected: String,
    },
    /// A pruning rate outside 0..=1.
    #[error(
        "prune rate {0} is outside 0..=1: give the share of sites whose shadow is dropped, e.g. 0.85"
    )]
    InvalidPrune(f64),
    /// The calibration has nothing to measure.
    #[error("{0}")]
    NoData(String),
    /// The model could not be read.
    #[error(transparent)]
    Import(#[from] ImportError),
}
