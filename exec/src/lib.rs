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
//! use hetsched_exec::{ExecModel, LinearPrecision, PrefillOptions, prefill};
//! use hetsched_import::{GgufFile, GgufTokenizer};
//!
//! let file = GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tokens = GgufTokenizer::from_gguf(&file)?.encode("The capital of France is")?;
//! let model = Arc::new(ExecModel::load(&file, LinearPrecision::W8a8)?);
//! let result = prefill(model, &tokens, &PrefillOptions::default())?;
//! println!("{} logits in {} ms", result.logits.len(), result.outcome.makespan_ns / 1_000_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod blocks;
mod calibrate;
mod calibration;
mod decide;
mod error;
mod eval;
mod family;
mod float_kernels;
pub mod generate;
#[cfg(feature = "gpu")]
mod gpu_layout;
#[cfg(feature = "gpu")]
mod gpu_resident;
mod heap;
mod interpret;
mod linger;
mod load;
pub mod lock_wait;
mod passes;
mod queues;
mod report;
mod shadow;
mod shadow_quant;
mod state;
mod steps;
mod values;
mod weights;

use std::path::Path;
use std::sync::Arc;

use hetsched_runtime::decision::DecisionChoice;
#[cfg(feature = "gpu")]
use hetsched_systems::InstanceKey;
use hetsched_systems::policy::Policy;
use hetsched_systems::resources::Job;
use hetsched_systems::{
    DEFAULT_POLICY, DeviceProfile, PlacementConfig, PrefillPlan, ProcessorKind, Workload,
};

pub use calibrate::{
    ActivationRecorder, CalibrateOptions, TOP_CHANNELS, calibrate, calibrate_with_progress,
};
pub use calibration::{
    CALIBRATION_VERSION, Calibration, CalibrationError, HotChannel, Importance, ModelIdentity,
    OutlierStats, SiteCalibration, default_calibration_path,
};
pub use decide::policy_of_run;
pub use error::{ExecError, KernelError};
pub use eval::{
    EvalReport, EvalWindows, Scoring, evaluate, evaluate_windows, evaluate_with_progress,
};
#[cfg(feature = "gpu")]
pub use float_kernels::GpuFloat;
pub use float_kernels::{CpuFloat, FloatKernels};
#[cfg(feature = "gpu")]
pub use gpu_resident::{
    DecodeOutput, DecodeStages, DeviceTime, GpuDecode, GpuModel, GpuStageRunner, ResidentWeights,
};
pub use interpret::StageRunner;
pub use load::{LoadError, LoadedModels, load_models};
pub use queues::{JobError, JobRunner, QueueWait, ThreadQueues, wait_per_lane};
pub use report::{PrefillReport, TopToken, shadow_summary};
pub use shadow::{
    ColdRowCache, ColdRows, PrunedScale, QuantRule, ShadowCounters, ShadowReport, ShadowRows,
    ShadowUsage,
};
pub use state::{KvCache, PrefillState};
pub use steps::{FamilyStep, Step};
pub use values::{PRUNED_CLIP_RMS, SHADOW_CLIP_RMS};
pub use weights::{ExecModel, LayerWeights, LinearPrecision, LinearWeights, ShadowSetup};

use hetsched_runtime::engine::{self, RunOutcome};
use hetsched_runtime::scene::Scene;

/// The shipped scene whose device profile describes this kind of host: float work on
/// the CPU lane, INT8 linears on the emulated-NPU lane.
pub const HOST_SCENE: &str = "smollm2-135m-desktop";

/// How to run a prefill.
#[derive(Debug, Clone)]
pub struct PrefillOptions {
    /// Tokens per chunk.
    pub chunk_len: u32,
    /// Scheduling policy, by built-in name (see [`hetsched_systems::PolicyRegistry::builtin`]).
    pub policy: String,
    /// Compute threads shared by every queue.
    pub threads: usize,
    /// Processors (one queue each) and their cost models, which the policies consult.
    pub device: DeviceProfile,
    /// Whether and how a Vulkan GPU takes part (needs the `gpu` feature and a device).
    pub gpu: GpuUse,
    /// With [`GpuUse::Resident`]: bracket every stage with device timestamps, so that the
    /// timeline shows when the GPU ran it (it costs about 5% of the prefill).
    pub gpu_timestamps: bool,
    /// With [`GpuUse::Resident`]: the weights' type ([`GpuWeights`]; by default f16 where
    /// the device runs the fused GEMMs on tensor cores, f32 elsewhere).
    pub gpu_weights: GpuWeights,
    /// Where each kind of stage may run (a scene's `[placement]` table; empty: fixed).
    /// Under flexible placement each job runs on the lane the dispatcher chose for it.
    pub placement: PlacementConfig,
    /// Logits for every token of the last chunk (`[tokens, vocab]`), not just the last
    /// token: with a chunk as long as the prompt, every position's (for evaluation).
    pub all_logits: bool,
    /// Sees every activation before it is quantized (calibration).
    pub recorder: Option<Arc<ActivationRecorder>>,
}

impl Default for PrefillOptions {
    fn default() -> Self {
        Self {
            chunk_len: 128,
            policy: DEFAULT_POLICY.to_string(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            device: host_device(),
            gpu: GpuUse::Off,
            gpu_timestamps: false,
            gpu_weights: GpuWeights::Auto,
            placement: PlacementConfig::default(),
            all_logits: false,
            recorder: None,
        }
    }
}

impl PrefillOptions {
    /// Checks the settings a caller may get wrong: at least one compute thread, a chunk
    /// of at least one token.
    pub fn validate(&self) -> Result<(), ExecError> {
        if self.threads == 0 {
            return Err(ExecError::InvalidOption {
                option: "threads",
                message: "0 compute threads cannot run anything; give at least 1".into(),
            });
        }
        if self.chunk_len == 0 {
            return Err(ExecError::InvalidOption {
                option: "chunk length",
                message: "a chunk of 0 tokens never finishes the prompt; give at least 1".into(),
            });
        }
        Ok(())
    }
}

/// How a prefill uses a Vulkan GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuUse {
    /// CPU and emulated-NPU lanes only.
    #[default]
    Off,
    /// A GPU lane beside them takes the float stages; tensors travel between host and
    /// device for every call (`--backends cpu,gpu,npu`).
    FloatLane,
    /// The GPU is the only lane and runs every stage with weights, activations and KV
    /// cache resident on the device; f32 linears (`--backends gpu`).
    Resident,
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

/// The resident GPU path's weight type ([`PrefillOptions::gpu_weights`], `run
/// --gpu-weights`), and which one a prefill ran ([`PrefillResult::gpu_weights`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuWeights {
    /// f16 where the device runs the fused GEMMs on tensor cores (KHR cooperative
    /// matrices), f32 elsewhere; `HETSCHED_GPU_F16_WEIGHTS=1` or `=0` picks f16 or f32.
    #[default]
    Auto,
    /// f32 weights and sums: the reference.
    F32,
    /// f16 weights, activations rounded to f16 as the GEMMs stage them, f32 sums (on CUDA
    /// cores where the device has no cooperative matrices).
    F16,
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

/// `device` with a GPU lane added (costed like its CPU: the policies only need a guess),
/// which takes the float stages.
pub fn with_gpu_lane(mut device: DeviceProfile) -> DeviceProfile {
    if device.first_of(ProcessorKind::Gpu).is_none()
        && let Some(cpu) = device.first_of(ProcessorKind::Cpu)
    {
        let gpu = gpu_costed_like(&device.processors[cpu]);
        device.processors.push(gpu);
        device.name = format!("{} + Vulkan GPU", device.name);
    }
    device
}

/// A processor named `gpu` of kind GPU with `spec`'s cost model: the host's GPU lanes have
/// no calibrated profile, and the policies only need a guess.
fn gpu_costed_like(spec: &hetsched_systems::ProcessorSpec) -> hetsched_systems::ProcessorSpec {
    hetsched_systems::ProcessorSpec {
        name: "gpu".into(),
        kind: ProcessorKind::Gpu,
        ..spec.clone()
    }
}

impl JobRunner for StageRunner {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        Ok(StageRunner::run(self, job.key, job.processor)?)
    }
}

/// Float kernels for every lane of `device`.
fn lane_kernels(
    model: &Arc<ExecModel>,
    device: &DeviceProfile,
) -> Result<Vec<Arc<dyn FloatKernels>>, ExecError> {
    let cpu: Arc<dyn FloatKernels> = Arc::new(CpuFloat {
        model: model.clone(),
    });
    let mut gpu: Option<Arc<dyn FloatKernels>> = None;
    device
        .processors
        .iter()
        .map(|p| match p.kind {
            ProcessorKind::Gpu => {
                gpu_computes(model)?;
                if gpu.is_none() {
                    gpu = Some(open_gpu(model)?);
                }
                Ok(gpu.clone().expect("opened just above"))
            }
            _ => Ok(cpu.clone()),
        })
        .collect()
}

/// The Vulkan device, prepared (pipelines built, first allocations and submission done) so
/// that none of that lands in the prefill. Attention runs on tensor cores where the device
/// has them (f16 inputs, f32 accumulation) unless `HETSCHED_GPU_F32_ATTENTION=1` asks for
/// the f32 kernel, the reference (and what an A/B measurement of the two compares);
/// `HETSCHED_GPU_ATTN_MIN_KEY_BLOCKS=N` sets its key split's fewest blocks per range;
/// `HETSCHED_GPU_UNFUSED_O=1` keeps the output projection a GEMM of its own (5 dispatches a
/// layer, deterministic) where attention could add it into the stream itself.
#[cfg(feature = "gpu")]
fn gpu_context() -> Result<hetsched_gpu::GpuContext, ExecError> {
    let failed = |e: hetsched_gpu::GpuError| ExecError::Gpu(e.to_string());
    let options = hetsched_gpu::GpuOptions {
        f32_attention: std::env::var("HETSCHED_GPU_F32_ATTENTION").is_ok_and(|v| v == "1"),
        unfused_output_projection: std::env::var("HETSCHED_GPU_UNFUSED_O").is_ok_and(|v| v == "1"),
        attention_min_key_blocks: std::env::var("HETSCHED_GPU_ATTN_MIN_KEY_BLOCKS")
            .ok()
            .and_then(|v| v.parse().ok()),
        ..Default::default()
    };
    let context = hetsched_gpu::GpuContext::new(options).map_err(failed)?;
    context.prepare().map_err(failed)?;
    Ok(context)
}

#[cfg(feature = "gpu")]
fn open_gpu(model: &ExecModel) -> Result<Arc<dyn FloatKernels>, ExecError> {
    Ok(Arc::new(GpuFloat {
        context: parking_lot::Mutex::new(gpu_context()?),
        head_dim: model.config.head_dim,
        rope_base: model.config.rope_base,
        rope_style: model.config.rope_style,
    }))
}

/// What a build without the `gpu` feature says when asked for a GPU.
#[cfg(not(feature = "gpu"))]
fn no_gpu_support() -> ExecError {
    ExecError::Gpu(
        "this build has no GPU support: rebuild with `cargo build --release --features gpu`".into(),
    )
}

#[cfg(not(feature = "gpu"))]
fn open_gpu(_model: &ExecModel) -> Result<Arc<dyn FloatKernels>, ExecError> {
    Err(no_gpu_support())
}

/// Refuses a model the GPU kernels do not compute ([`ExecError::NotOnGpu`]): they run the
/// llama row with unscaled RoPE (one RoPE table from the base, no sliding window, no
/// family steps).
fn gpu_computes(model: &ExecModel) -> Result<(), ExecError> {
    let arch = model.config.family.arch.to_owned();
    if !model.config.family.is_llama_like() {
        let feature = format!("the {arch} family's steps");
        return Err(ExecError::NotOnGpu { arch, feature });
    }
    if model.rope_scaled {
        let feature = "scaled RoPE (linear, or Llama-3's rope_freqs.weight)".to_owned();
        return Err(ExecError::NotOnGpu { arch, feature });
    }
    Ok(())
}

/// Uploads `model` to the GPU and prefills there ([`GpuUse::Resident`]), with the
/// weights [`PrefillOptions::gpu_weights`] asks for ([`ResidentWeights`]).
#[cfg(feature = "gpu")]
fn prefill_resident(
    model: Arc<ExecModel>,
    tokens: &[u32],
    options: &PrefillOptions,
) -> Result<PrefillResult, ExecError> {
    let context = gpu_context()?;
    let from_env = std::env::var("HETSCHED_GPU_F16_WEIGHTS").ok();
    let f16 = match (options.gpu_weights, from_env.as_deref()) {
        (GpuWeights::F16, _) | (GpuWeights::Auto, Some("1")) => true,
        (GpuWeights::F32, _) | (GpuWeights::Auto, Some("0")) => false,
        (GpuWeights::Auto, _) => context.fused_gemm_on_tensor_cores(),
    };
    let weights = match f16 {
        true => ResidentWeights::F16,
        false => ResidentWeights::F32,
    };
    let gpu = Arc::new(GpuModel::upload_as(context, model, weights)?);
    gpu.warm_up()?;
    prefill_on_gpu(&gpu, tokens, options)
}

#[cfg(not(feature = "gpu"))]
fn prefill_resident(
    _model: Arc<ExecModel>,
    _tokens: &[u32],
    _options: &PrefillOptions,
) -> Result<PrefillResult, ExecError> {
    Err(no_gpu_support())
}

/// The device profile of [`GpuUse::Resident`]: one GPU lane, costed like the host's CPU
/// (the policies only need a guess, and with one lane they only order chunks).
pub fn resident_gpu_device() -> DeviceProfile {
    let mut device = host_device();
    let cpu = device.first_of(ProcessorKind::Cpu).unwrap_or(0);
    device.processors = vec![gpu_costed_like(&device.processors[cpu])];
    device.name = "Vulkan GPU (every stage resident)".into();
    device
}

/// Redraws `outcome`'s timeline with the device's times of each stage (from
/// [`GpuStageRunner::device_times`]): the host only queued them. The device clock is
/// anchored so that the first stage starts when the host queued it.
#[cfg(feature = "gpu")]
fn on_device_clock(outcome: &mut RunOutcome, times: &[DeviceTime]) {
    let by_key: std::collections::HashMap<InstanceKey, (u64, u64)> = times
        .iter()
        .map(|t| (t.key, (t.start_ns, t.end_ns)))
        .collect();
    let Some(device_zero) = times.iter().map(|t| t.start_ns).min() else {
        return;
    };
    let host_zero = outcome
        .timeline
        .slices
        .iter()
        .map(|s| s.start_ns)
        .min()
        .unwrap_or(0);
    for slice in &mut outcome.timeline.slices {
        if let Some(&(start, end)) = by_key.get(&slice.key) {
            slice.start_ns = host_zero + start.saturating_sub(device_zero);
            slice.end_ns = host_zero + end.saturating_sub(device_zero);
        }
    }
}

/// Prefills `tokens` with every stage on the GPU of `gpu`, whose weights are already
/// resident: upload once with [`GpuModel::upload`], prefill many times.
#[cfg(feature = "gpu")]
pub fn prefill_on_gpu(
    gpu: &Arc<GpuModel>,
    tokens: &[u32],
    options: &PrefillOptions,
) -> Result<PrefillResult, ExecError> {
    options.validate()?;
    check_prompt(&gpu.host, tokens)?;
    let plan = Arc::new(PrefillPlan::new(
        gpu.host.model_config(),
        resident_gpu_device(),
        workload(tokens, options, None),
    )?);
    let (steps, layers) = compile(&plan)?;
    let runner = Arc::new(GpuStageRunner::new(
        gpu.clone(),
        steps,
        layers,
        tokens.to_vec(),
        options.chunk_len as usize,
        options.all_logits,
        options.gpu_timestamps,
    )?);
    let policy = hetsched_systems::PolicyRegistry::builtin().create(&options.policy)?;
    let (mut outcome, queue_waits) = run_on_queues(plan, policy, runner.clone(), 1)?;
    if let Some(times) = runner.device_times()? {
        on_device_clock(&mut outcome, &times);
    }
    runner.check_finite()?;
    let logits = take_logits(&runner.logits)?;
    Ok(PrefillResult {
        logits,
        outcome,
        queue_waits,
        shadow: ShadowUsage::default(),
        gpu_activations: Some(runner.activation_bytes()),
        gpu_weights: Some(match gpu.weights {
            ResidentWeights::F16 => GpuWeights::F16,
            ResidentWeights::F32 => GpuWeights::F32,
        }),
        decision: None,
    })
}

/// The workload of prefilling `tokens` under `options`, float work on `float_processor`.
fn workload(tokens: &[u32], options: &PrefillOptions, float_processor: Option<String>) -> Workload {
    Workload {
        prompt_len: tokens.len() as u32,
        chunk_len: options.chunk_len,
        float_processor,
    }
}

/// Every stage of `plan` compiled to steps, and each stage's decoder layer.
type CompiledStages = (Vec<Vec<Step>>, Vec<Option<u32>>);

fn compile(plan: &PrefillPlan) -> Result<CompiledStages, ExecError> {
    let steps = Step::compile_stages(&plan.stages)?;
    Ok((steps, plan.stages.iter().map(|s| s.layer).collect()))
}

/// The logits the head left in `slot`; their absence means the head never ran.
/// The run's logits, which must all be finite: a NaN there (an overflow in some layer)
/// would rank no token at all, so it is an error rather than an empty answer.
fn take_logits(slot: &parking_lot::Mutex<Option<Vec<f32>>>) -> Result<Vec<f32>, ExecError> {
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

/// The [`JobRunner`] of a CPU prefill of `tokens` under `plan`: every stage compiled to
/// kernels, the lanes' float kernels, an empty state cut into the plan's chunks. Handed
/// to a queue of one's own ([`ThreadQueues`], or any `Backend` that calls it), the engine
/// runs the real prefill; the logits are in `runner.state.logits` afterwards
/// (`examples/phone_workflow.rs` profiles a device this way).
pub fn stage_runner(
    model: Arc<ExecModel>,
    plan: &PrefillPlan,
    tokens: &[u32],
) -> Result<StageRunner, ExecError> {
    check_prompt(&model, tokens)?;
    if plan.workload.prompt_len as usize != tokens.len() {
        return Err(ExecError::PlanMismatch {
            plan_tokens: plan.workload.prompt_len as usize,
            tokens: tokens.len(),
        });
    }
    let lanes = lane_kernels(&model, &plan.device)?;
    let (steps, layers) = compile(plan)?;
    let state = PrefillState::new(
        tokens.to_vec(),
        plan.workload.chunk_len as usize,
        model.layers.len(),
        model.config.kv_dim(),
    );
    Ok(StageRunner::new(model, steps, layers, lanes, state))
}

/// Runs `plan` on one thread-backed queue per processor, every job through `runner`, with
/// `threads` compute threads shared by the queues, scheduled by `policy`; with each job's
/// queue wait.
fn run_on_queues(
    plan: Arc<PrefillPlan>,
    policy: Box<dyn Policy>,
    runner: Arc<dyn JobRunner>,
    threads: usize,
) -> Result<(RunOutcome, Vec<QueueWait>), ExecError> {
    let threads = threads.max(1);
    let failed = |e: &dyn std::fmt::Display| ExecError::Threads {
        threads,
        reason: e.to_string(),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("hetsched-worker-{i}"))
        .build()
        .map_err(|e| failed(&e))?;
    let mut queues = ThreadQueues::start(plan.device.processors.len(), runner, Arc::new(pool))
        .map_err(|e| failed(&e))?;
    let outcome = engine::run_with(
        plan,
        policy,
        &mut queues,
        &engine::EngineOptions::real_queues(),
    )?;
    let waits = queues.take_queue_waits();
    drop(queues);
    Ok((outcome, waits))
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

/// The processors a CPU-host prefill under `options` runs on: the options' device, with
/// a GPU lane for [`GpuUse::FloatLane`].
fn prefill_device(options: &PrefillOptions) -> DeviceProfile {
    if options.gpu == GpuUse::FloatLane {
        with_gpu_lane(options.device.clone())
    } else {
        options.device.clone()
    }
}

/// Prefills `tokens` on real queues and returns the next-token logits.
pub fn prefill(
    model: Arc<ExecModel>,
    tokens: &[u32],
    options: &PrefillOptions,
) -> Result<PrefillResult, ExecError> {
    options.validate()?;
    check_prompt(&model, tokens)?;
    if options.gpu == GpuUse::Resident {
        gpu_computes(&model)?;
        return prefill_resident(model, tokens, options);
    }
    let device = prefill_device(options);
    let float_processor = (options.gpu == GpuUse::FloatLane).then(|| "gpu".to_string());
    let plan = Arc::new(PrefillPlan::placed(
        model.model_config(),
        device,
        workload(tokens, options, float_processor),
        options.placement.clone(),
    )?);
    let mut runner = stage_runner(model.clone(), &plan, tokens)?;
    runner.state.all_logits = options.all_logits;
    runner.state.recorder = options.recorder.clone();
    let runner = Arc::new(runner);
    let (policy, decision) = decide::policy(&plan, options)?;
    let shadow_before = model.shadow_counters.snapshot();
    let (outcome, queue_waits) = run_on_queues(plan, policy, runner.clone(), options.threads)?;
    let logits = take_logits(&runner.state.logits)?;
    Ok(PrefillResult {
        logits,
        outcome,
        queue_waits,
        shadow: model.shadow_counters.snapshot().since(shadow_before),
        gpu_activations: None,
        gpu_weights: None,
        decision,
    })
}
