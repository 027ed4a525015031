//! Opening the Vulkan GPU: the float lane beside the CPU ([`GpuUse::FloatLane`]) and the
//! resident path that runs every stage on the device ([`GpuUse::Resident`]). Only the
//! GPU arm of each function depends on the `gpu` feature; a build without it answers
//! [`no_gpu_support`].

use std::sync::Arc;

use crate::{ExecError, ExecModel, FloatKernels, GpuKernelOptions};
#[cfg(feature = "gpu")]
use {
    crate::devices::resident_gpu_device,
    crate::gpu_resident::{DeviceTime, GpuModel, GpuStageRunner, ResidentWeights},
    crate::prefill_parts::{check_prompt, compile, take_logits, workload},
    crate::queues::run_on_queues,
    crate::{GpuFloat, GpuWeights, PrefillOptions, PrefillResult, ShadowUsage},
    hetsched_runtime::engine::RunOutcome,
    hetsched_systems::{InstanceKey, PrefillPlan},
};

/// What a build without the `gpu` feature says when asked for a GPU.
pub(crate) fn no_gpu_support() -> ExecError {
    ExecError::Gpu(
        "this build has no GPU support: rebuild with `cargo build --release --features gpu`".into(),
    )
}

/// Refuses a model the GPU kernels do not compute ([`ExecError::NotOnGpu`]): they run the
/// llama row with unscaled RoPE (one RoPE table from the base, no sliding window, no
/// family steps).
pub(crate) fn gpu_computes(model: &ExecModel) -> Result<(), ExecError> {
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

/// The float kernels of a GPU lane beside the CPU ([`crate::GpuUse::FloatLane`]): norms,
/// RoPE and attention on the device, tensors copied in and out per call.
pub(crate) fn open_float_lane(
    model: &ExecModel,
    #[cfg_attr(not(feature = "gpu"), expect(unused_variables))] kernels: &GpuKernelOptions,
) -> Result<Arc<dyn FloatKernels>, ExecError> {
    gpu_computes(model)?;
    #[cfg(feature = "gpu")]
    return Ok(Arc::new(GpuFloat {
        context: parking_lot::Mutex::new(gpu_context(kernels)?),
        head_dim: model.config.head_dim,
        rope_base: model.config.rope_base,
        rope_style: model.config.rope_style,
    }));
    #[cfg_attr(feature = "gpu", expect(unreachable_code))]
    Err(no_gpu_support())
}

/// The Vulkan device with the kernel variants `kernels` asks for, prepared (pipelines
/// built, first allocations and submission done) so that none of that lands in the
/// prefill.
#[cfg(feature = "gpu")]
pub(crate) fn gpu_context(
    kernels: &GpuKernelOptions,
) -> Result<hetsched_gpu::GpuContext, ExecError> {
    let failed = |e: hetsched_gpu::GpuError| ExecError::Gpu(e.to_string());
    let options = hetsched_gpu::GpuOptions {
        f32_attention: kernels.f32_attention,
        unfused_output_projection: kernels.unfused_output_projection,
        attention_min_key_blocks: kernels.attention_min_key_blocks,
        ..Default::default()
    };
    let context = hetsched_gpu::GpuContext::new(options).map_err(failed)?;
    context.prepare().map_err(failed)?;
    Ok(context)
}

/// Uploads `model` to the GPU and prefills there ([`crate::GpuUse::Resident`]), with the
/// weights [`PrefillOptions::gpu_weights`] asks for ([`ResidentWeights`]).
#[cfg(feature = "gpu")]
pub(crate) fn prefill_resident(
    model: Arc<ExecModel>,
    tokens: &[u32],
    options: &PrefillOptions,
) -> Result<PrefillResult, ExecError> {
    let context = gpu_context(&options.gpu_kernels)?;
    let f16 = match options.gpu_weights {
        GpuWeights::F16 => true,
        GpuWeights::F32 => false,
        GpuWeights::Auto => context.fused_gemm_on_tensor_cores(),
    };
    let weights = match f16 {
        true => ResidentWeights::F16,
        false => ResidentWeights::F32,
    };
    let gpu = Arc::new(GpuModel::upload_as(context, model, weights)?);
    gpu.warm_up()?;
    prefill_on_gpu(&gpu, tokens, options)
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
