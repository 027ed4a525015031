//! Real prefill: the scheduler's systems dispatch every subgraph instance of a loaded
//! model to thread-backed queues that run real kernels, chunk by chunk, out of order.
//!
//! Data flow: [`ExecModel`] (weights) and the prompt's tokens → a [`PrefillPlan`](hetsched_systems::PrefillPlan) built
//! from the model's shapes and a device profile → [`Step`]s compiled per stage →
//! [`engine::run`](hetsched_runtime::engine::run) with [`ThreadQueues`] whose lanes call a [`StageRunner`] → logits of
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

mod activation;
pub mod blocks;
mod calibrate;
mod calibration;
mod decide;
mod devices;
mod error;
mod eval;
mod family;
mod float_kernels;
pub mod generate;
#[cfg(feature = "gpu")]
mod gpu_layout;
mod gpu_open;
#[cfg(feature = "gpu")]
mod gpu_resident;
mod heap;
mod interpret;
mod linger;
mod load;
pub mod lock_wait;
mod options;
mod passes;
mod prefill;
mod prefill_parts;
pub mod profile;
mod queues;
mod recorder;
mod report;
#[cfg(feature = "gpu")]
mod resident_prefill;
mod shadow;
mod state;
mod steps;
mod unnested;
mod values;
mod walk;
mod weights;

pub use calibrate::{CalibrateOptions, calibrate, calibrate_with_progress};
pub use calibration::{
    CALIBRATION_VERSION, Calibration, HotChannel, Importance, ModelIdentity, OutlierStats,
    SiteCalibration, default_calibration_path,
};
pub use decide::policy_of_run;
pub use devices::{
    HOST_SCENE, host_device, resident_gpu_device, resident_gpu_device_of, with_gpu_lane,
};
pub use error::{CalibrationError, ExecError, KernelError};
pub use eval::{
    EvalReport, EvalWindows, Scoring, evaluate, evaluate_windows, evaluate_with_progress,
};
#[cfg(feature = "gpu")]
pub use float_kernels::GpuFloat;
pub use float_kernels::{CpuFloat, FloatKernels};
#[cfg(feature = "gpu")]
pub use gpu_resident::{
    DecodeOutput, DecodeStages, DeviceTime, GpuDecode, GpuModel, GpuStageRunner, ResidentWeights,
    StepRow,
};
pub use heap::release_free_memory;
pub use interpret::StageRunner;
pub use load::{LoadError, LoadedModels, load_models};
pub use options::{GpuKernelOptions, GpuUse, GpuWeights, PrefillOptions, run_device};
pub use prefill::{prefill, stage_runner};
pub use prefill_parts::{ActivationBytes, PrefillResult, check_prompt};
pub use queues::{JobError, JobRunner, QueueWait, ThreadQueues, wait_per_lane};
pub use recorder::{ActivationRecorder, TOP_CHANNELS};
pub use report::{PrefillReport, TopToken, shadow_summary};
#[cfg(feature = "gpu")]
pub use resident_prefill::prefill_on_gpu;
pub use shadow::{
    ColdRowCache, ColdRows, PRUNED_CLIP_RMS, PrunedScale, QuantRule, SHADOW_CLIP_RMS,
    ShadowCounters, ShadowReport, ShadowRows, ShadowUsage,
};
pub use state::{KvCache, PrefillState};
pub use steps::{FamilyStep, Step};
pub use weights::{ExecModel, LayerWeights, LinearPrecision, LinearWeights, ShadowSetup};

// Crate-root paths of the helpers the other modules share.
pub(crate) use options::prefill_device;
pub(crate) use prefill::lane_kernels;
pub(crate) use prefill_parts::take_logits;
