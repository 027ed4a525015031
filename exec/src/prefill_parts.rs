//! What every prefill path shares (the host's queues and the resident GPU): checking
//! the prompt, the workload, the stages compiled to steps, the result and its logits.

use hetsched_runtime::decision::DecisionChoice;
use hetsched_runtime::engine::RunOutcome;
use hetsched_systems::{PrefillPlan, Workload};

use crate::{ExecError, ExecModel, GpuWeights, PrefillOptions, QueueWait, ShadowUsage, Step};

/// A finished prefill.
#[derive(Debug)]
pub struct PrefillResult {
    /// Logits of the next token after the prompt, `[vocab]`.
    pub logits: Vec<f32>,
    /// The schedule that ran, with real timestamps (each slice the job's compute time).
    pub outcome: RunOutcome,
    /// Each job's wait between submission and the start of its work, kept apart.
    pub queue_waits: Vec<QueueWait>,
    /// The outlier shadow's work in this prefill (zero without a shadow).
    pub shadow: ShadowUsage,
    /// Device bytes of the chunks' activations (every stage resident on a GPU only).
    pub gpu_activations: Option<ActivationBytes>,
    /// The weights the resident GPU path ran with (f32 or f16; `None` off that path).
    pub gpu_weights: Option<GpuWeights>,
    /// With a measured device profile: which cost table the policy decided with, and the
    /// predictions the choice rests on ([`hetsched_runtime::decision`]).
    pub decision: Option<DecisionChoice>,
}

/// Device bytes of a resident GPU prefill's chunk activations (`--backends gpu`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ActivationBytes {
    /// What the chunks hold: their arenas (values at the memory planner's offsets), and the
    /// buffers of chunks without one.
    pub allocated: u64,
    /// What one buffer per value would take.
    pub separate: u64,
    /// Chunks whose values sit in one arena at planned offsets.
    pub chunks_in_arena: usize,
    /// Chunks.
    pub chunks: usize,
}

/// Checks `tokens` against the model: not empty, within the context, inside the
/// vocabulary.
pub fn check_prompt(model: &ExecModel, tokens: &[u32]) -> Result<(), ExecError> {
    let c = &model.config;
    if tokens.is_empty() {
        return Err(ExecError::EmptyPrompt);
    }
    if tokens.len() > c.context_length {
        return Err(ExecError::PromptTooLong {
            tokens: tokens.len(),
            context: c.context_length,
        });
    }
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= c.vocab_size) {
        return Err(ExecError::TokenOutOfRange {
            id,
            vocab: c.vocab_size,
        });
    }
    Ok(())
}

/// The workload of prefilling `tokens` under `options`, float work on `float_processor`.
pub(crate) fn workload(
    tokens: &[u32],
    options: &PrefillOptions,
    float_processor: Option<String>,
) -> Workload {
    Workload {
        prompt_len: tokens.len() as u32,
        chunk_len: options.chunk_len,
        float_processor,
    }
}

/// Every stage of `plan` compiled to steps, and each stage's decoder layer.
pub(crate) type CompiledStages = (Vec<Vec<Step>>, Vec<Option<u32>>);

/// Compiles every stage of `plan` ([`CompiledStages`]).
pub(crate) fn compile(plan: &PrefillPlan) -> Result<CompiledStages, ExecError> {
    let steps = Step::compile_stages(&plan.stages)?;
    Ok((steps, plan.stages.iter().map(|s| s.layer).collect()))
}

/// The logits the head left in `slot`; their absence means the head never ran.
/// The run's logits, which must all be finite: a NaN there (an overflow in some layer)
/// would rank no token at all, so it is an error rather than an empty answer.
pub(crate) fn take_logits(
    slot: &parking_lot::Mutex<Option<Vec<f32>>>,
) -> Result<Vec<f32>, ExecError> {
    let logits = slot.lock().take().ok_or(ExecError::MissingValue {
        op: "prefill".into(),
        chunk: 0,
        value: "logits",
    })?;
    // One pass without an early exit (it vectorises), then the search only on failure:
    // a decode step checks a vocabulary of logits every token.
    if !logits.iter().fold(false, |bad, v| bad | !v.is_finite()) {
        return Ok(logits);
    }
    match logits.iter().position(|v| !v.is_finite()) {
        None => Ok(logits),
        Some(index) => Err(ExecError::NonFiniteLogits {
            index,
            value: logits[index],
            count: logits.iter().filter(|v| !v.is_finite()).count(),
        }),
    }
}
