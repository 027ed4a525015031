//! Real prefill: the scheduler's systems dispatch every subgraph instance of a loaded
//! model to thread-backed queues that run real kernels, chunk by chunk, out of order.
//!
//! Data flow: [`ExecModel`] (weights) and the prompt's tokens → a [`PrefillPlan`] built
//! from the model's shapes and a device profile → [`Step`]s compiled per stage →
//! [`engine::run`] with [`ThreadQueues`] whose lanes call a [`StageRunner`] → logits of
//! the last token.
//!
//! ```no_run
//! use std::sync::Arc;
//! use hetsched::exec::{ExecModel, LinearPrecision, PrefillOptions, prefill};
//! use hetsched::import::{GgufFile, GgufTokenizer};
//!
//! let file = GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tokens = GgufTokenizer::from_gguf(&file)?.encode("The capital of France is")?;
//! let model = Arc::new(ExecModel::load(&file, LinearPrecision::W8a8)?);
//! let result = prefill(model, &tokens, &PrefillOptions::default())?;
//! println!("{} logits in {} ms", result.logits.len(), result.outcome.makespan_ns / 1_000_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod interpret;
mod queues;
mod report;
mod state;
mod steps;
mod values;
mod weights;

use std::path::Path;
use std::sync::Arc;

use hetsched_systems::resources::Job;
use hetsched_systems::{DeviceProfile, Policy, PrefillPlan, Workload};

pub use error::ExecError;
pub use interpret::StageRunner;
pub use queues::{JobRunner, ThreadQueues};
pub use report::{PrefillReport, TopToken};
pub use state::PrefillState;
pub use steps::Step;
pub use weights::{ExecModel, LayerWeights, LinearPrecision, LinearWeights};

use crate::engine::{self, RunOutcome};
use crate::scene::Scene;

/// The shipped scene whose device profile describes this kind of host: float work on
/// the CPU lane, INT8 linears on the emulated-NPU lane.
pub const HOST_SCENE: &str = "smollm2-135m-desktop";

/// How to run a prefill.
#[derive(Debug, Clone)]
pub struct PrefillOptions {
    /// Tokens per chunk.
    pub chunk_len: u32,
    /// Scheduling policy.
    pub policy: Policy,
    /// Compute threads shared by every queue.
    pub threads: usize,
    /// Processors (one queue each) and their cost models, which the policies consult.
    pub device: DeviceProfile,
}

impl Default for PrefillOptions {
    fn default() -> Self {
        Self {
            chunk_len: 128,
            policy: Policy::default(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            device: host_device(),
        }
    }
}

/// The host's device profile (from [`HOST_SCENE`]).
pub fn host_device() -> DeviceProfile {
    Scene::load(Path::new(HOST_SCENE))
        .expect("the shipped host scene is valid")
        .device
}

/// A finished prefill.
#[derive(Debug)]
pub struct PrefillResult {
    /// Logits of the next token after the prompt, `[vocab]`.
    pub logits: Vec<f32>,
    /// The schedule that ran, with real timestamps.
    pub outcome: RunOutcome,
}

impl JobRunner for StageRunner {
    fn run(&self, job: &Job) -> Result<(), String> {
        StageRunner::run(self, job.key).map_err(|e| e.to_string())
    }
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

/// Prefills `tokens` on real queues and returns the next-token logits.
pub fn prefill(
    model: Arc<ExecModel>,
    tokens: &[u32],
    options: &PrefillOptions,
) -> Result<PrefillResult, ExecError> {
    check_prompt(&model, tokens)?;
    let workload = Workload {
        prompt_len: tokens.len() as u32,
        chunk_len: options.chunk_len,
        policy: options.policy,
        float_processor: None,
    };
    let plan = Arc::new(PrefillPlan::new(
        model.model_config(),
        options.device.clone(),
        workload,
    )?);
    let steps = Step::compile_stages(&plan.stages)?;
    let layers = plan.stages.iter().map(|s| s.layer).collect();
    let state = PrefillState::new(
        tokens.to_vec(),
        options.chunk_len as usize,
        model.layers.len(),
        model.config.kv_dim(),
    );
    let runner = Arc::new(StageRunner::new(model, steps, layers, state));
    let threads = options.threads.max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("hetsched-worker-{i}"))
        .build()
        .map_err(|e| ExecError::Threads {
            threads,
            reason: e.to_string(),
        })?;
    let mut queues =
        ThreadQueues::start(plan.device.processors.len(), runner.clone(), Arc::new(pool)).map_err(
            |e| ExecError::Threads {
                threads,
                reason: e.to_string(),
            },
        )?;
    let outcome = engine::run(plan, &mut queues)?;
    drop(queues);
    let logits = runner
        .state
        .logits
        .lock()
        .take()
        .ok_or(ExecError::MissingValue {
            op: "prefill",
            chunk: 0,
            value: "logits",
        })?;
    Ok(PrefillResult { logits, outcome })
}
