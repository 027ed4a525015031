//! How to run a prefill: [`PrefillOptions`] and the GPU choices it carries. The library
//! reads no environment variable: a caller (the CLI) maps its own settings onto these
//! fields.

use std::sync::Arc;

use hetsched_systems::{DEFAULT_POLICY, DeviceProfile, PlacementConfig};

use crate::ExecError;
use crate::devices::{host_device, with_gpu_lane};
use crate::recorder::ActivationRecorder;

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
    /// The Vulkan kernels' variants, wherever a GPU takes part.
    pub gpu_kernels: GpuKernelOptions,
    /// Where each kind of stage may run (a scene's `[placement]` table; empty: fixed).
    /// Under flexible placement each job runs on the lane the dispatcher chose for it.
    pub placement: PlacementConfig,
    /// Logits for every token of the last chunk (`[tokens, vocab]`), not just the last
    /// token: with a chunk as long as the prompt, every position's (for evaluation).
    pub all_logits: bool,
    /// Sees every activation before it is quantized (calibration).
    pub recorder: Option<Arc<ActivationRecorder>>,
    /// When set (Ctrl-C), the prefill stops at the next subgraph boundary with
    /// [`hetsched_runtime::engine::EngineError::Cancelled`].
    pub cancel: Option<hetsched_runtime::cancel::CancelFlag>,
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
            gpu_kernels: GpuKernelOptions::default(),
            placement: PlacementConfig::default(),
            all_logits: false,
            recorder: None,
            cancel: None,
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

/// The resident GPU path's weight type ([`PrefillOptions::gpu_weights`], `run
/// --gpu-weights`), and which one a prefill ran ([`crate::PrefillResult::gpu_weights`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuWeights {
    /// f16 where the device runs the fused GEMMs on tensor cores (KHR cooperative
    /// matrices), f32 elsewhere (the CLI's `HETSCHED_GPU_F16_WEIGHTS=1` or `=0` picks f16
    /// or f32 in its place).
    #[default]
    Auto,
    /// f32 weights and sums: the reference.
    F32,
    /// f16 weights, activations rounded to f16 as the GEMMs stage them, f32 sums (on CUDA
    /// cores where the device has no cooperative matrices).
    F16,
}

/// Which variants the Vulkan kernels run ([`PrefillOptions::gpu_kernels`]). The defaults
/// are the fastest measured; each other choice is a reference or a tuning knob (the CLI
/// sets them from `HETSCHED_GPU_*` environment variables, docs/gpu.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuKernelOptions {
    /// Attention in f32 even where the device has tensor cores (which run it with f16
    /// inputs and f32 accumulation): the reference, and what an A/B measurement of the
    /// two compares (`HETSCHED_GPU_F32_ATTENTION=1`).
    pub f32_attention: bool,
    /// Fewest key blocks per range of the tensor-core attention's key split (`None`: the
    /// kernel's default; `HETSCHED_GPU_ATTN_MIN_KEY_BLOCKS=N`).
    pub attention_min_key_blocks: Option<usize>,
    /// The output projection a GEMM of its own (5 dispatches a layer in prefill, a stage of
    /// its own in the one-dispatch decode layers; deterministic) where attention could add
    /// it into the stream itself (`HETSCHED_GPU_UNFUSED_O=1`).
    pub unfused_output_projection: bool,
    /// Fewest key blocks each workgroup of the split decode attention walks (`None`: the
    /// kernel's default; `HETSCHED_GPU_DECODE_MIN_KEY_BLOCKS=N`).
    pub decode_min_key_blocks: Option<usize>,
    /// The one-row GEMV's 64-thread shared-memory tree even where the device's subgroup
    /// arithmetic allows the 128-thread kernel (`HETSCHED_GPU_ONE_ROW_GEMV_TREE=1`).
    pub one_row_gemv_tree: bool,
    /// A decode step's llama layers as five dispatches each even where the device runs
    /// each as one dispatch with grid barriers (`HETSCHED_GPU_FIVE_DISPATCH_DECODE=1`).
    pub five_dispatch_decode: bool,
    /// Workgroups per multiprocessor of the one-dispatch decode layer (`None`: the
    /// kernel's default; `HETSCHED_GPU_DECODE_GROUPS_PER_SM=N`).
    pub decode_layer_groups_per_sm: Option<u32>,
    /// Most keys at which a decode step of one sequence runs attention and o as one stage
    /// in the one-dispatch layers (`None`: the kernel's default, 0 never;
    /// `HETSCHED_GPU_DECODE_O_MAX_KEYS=N`).
    pub decode_attention_with_o_max_keys: Option<usize>,
    /// The one-dispatch decode layers prefetch a later stage's weights
    /// (`HETSCHED_GPU_DECODE_PREFETCH=1`).
    pub decode_layer_prefetch: bool,
    /// At most this many layers in one dispatch of the one-dispatch decode layers
    /// (`None`: the kernel's default; `HETSCHED_GPU_DECODE_LAYERS_PER_DISPATCH=N`).
    pub decode_layers_per_dispatch: Option<usize>,
}

/// The processors a run under `options` uses, in the order its timeline's lanes number
/// them (what a caller attributing a run's slices to processors needs): the resident GPU
/// alone for [`GpuUse::Resident`], else the options' device, with a GPU lane for
/// [`GpuUse::FloatLane`].
pub fn run_device(options: &PrefillOptions) -> DeviceProfile {
    match options.gpu {
        GpuUse::Resident => crate::resident_gpu_device_of(&options.device),
        GpuUse::Off | GpuUse::FloatLane => prefill_device(options),
    }
}

/// The processors a CPU-host prefill under `options` runs on: the options' device, with
/// a GPU lane for [`GpuUse::FloatLane`].
pub(crate) fn prefill_device(options: &PrefillOptions) -> DeviceProfile {
    if options.gpu == GpuUse::FloatLane {
        with_gpu_lane(options.device.clone())
    } else {
        options.device.clone()
    }
}
