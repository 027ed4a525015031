//! A prefill with every stage resident on the GPU ([`crate::GpuUse::Resident`], feature
//! `gpu`): the weights uploaded once ([`GpuModel`]), the plan on the one GPU lane, the
//! timeline on the device's clock.

use std::sync::Arc;

use hetsched_runtime::engine::RunOutcome;
use hetsched_systems::{InstanceKey, PrefillPlan};

use crate::devices::resident_gpu_device_of;
use crate::gpu_open::gpu_context;
use crate::gpu_resident::{DeviceTime, GpuModel, GpuStageRunner, ResidentWeights};
use crate::prefill_parts::{check_prompt, compile, take_logits, workload};
use crate::queues::run_on_queues;
use crate::{ExecError, ExecModel, GpuWeights, PrefillOptions, PrefillResult, ShadowUsage};

/// Uploads `model` to the GPU and prefills there ([`crate::GpuUse::Resident`]), with the
/// weights [`PrefillOptions::gpu_weights`] asks for ([`ResidentWeights`]).
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
pub fn prefill_on_gpu(
    gpu: &Arc<GpuModel>,
    tokens: &[u32],
    options: &PrefillOptions,
) -> Result<PrefillResult, ExecError> {
    options.validate()?;
    check_prompt(&gpu.host, tokens)?;
    let plan = Arc::new(PrefillPlan::new(
        gpu.host.model_config(),
        resident_gpu_device_of(&options.device),
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
    let (mut outcome, queue_waits) = run_on_queues(plan, policy, runner.clone(), 1, options)?;
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

impl GpuModel {
    /// Runs a one-token prefill, so that what a first prefill pays for beyond
    /// [`hetsched_gpu::GpuContext::prepare`] (descriptor pools, memory blocks of activation-sized buffers,
    /// the first open command buffer) stays out of a measured run.
    pub fn warm_up(self: &Arc<Self>) -> Result<(), ExecError> {
        let options = PrefillOptions {
            chunk_len: 1,
            ..PrefillOptions::default()
        };
        prefill_on_gpu(self, &[0], &options).map(drop)
    }
}
