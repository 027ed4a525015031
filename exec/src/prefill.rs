//! A prefill on the host's queues: the plan placed on the options' device, every stage
//! compiled to steps, a [`StageRunner`] over the lanes' float kernels, the engine run on
//! thread-backed queues, the logits checked.

use std::sync::Arc;

use hetsched_systems::{DeviceProfile, PrefillPlan, ProcessorKind};

use crate::gpu_open::{gpu_computes, open_float_lane};
use crate::options::prefill_device;
use crate::prefill_parts::{PrefillResult, check_prompt, compile, take_logits, workload};
use crate::queues::run_on_queues;
use crate::{
    CpuFloat, ExecError, ExecModel, FloatKernels, GpuKernelOptions, GpuUse, PrefillOptions,
    PrefillState, StageRunner, decide,
};

/// Float kernels for every lane of `device`; GPU lanes share one device opened with
/// `gpu_kernels`.
pub(crate) fn lane_kernels(
    model: &Arc<ExecModel>,
    device: &DeviceProfile,
    gpu_kernels: &GpuKernelOptions,
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
                if gpu.is_none() {
                    gpu = Some(open_float_lane(model, gpu_kernels)?);
                }
                Ok(gpu.clone().expect("opened just above"))
            }
            _ => Ok(cpu.clone()),
        })
        .collect()
}

/// The [`crate::JobRunner`] of a CPU prefill of `tokens` under `plan`: every stage
/// compiled to kernels, the lanes' float kernels (a GPU lane's with `gpu_kernels`), an
/// empty state cut into the plan's chunks. Handed to a queue of one's own
/// ([`crate::ThreadQueues`], or any `Backend` that calls it), the engine runs the real
/// prefill; the logits are in `runner.state.logits` afterwards
/// (`examples/phone_workflow.rs` profiles a device this way).
pub fn stage_runner(
    model: Arc<ExecModel>,
    plan: &PrefillPlan,
    tokens: &[u32],
    gpu_kernels: &GpuKernelOptions,
) -> Result<StageRunner, ExecError> {
    check_prompt(&model, tokens)?;
    if plan.workload.prompt_len as usize != tokens.len() {
        return Err(ExecError::PlanMismatch {
            plan_tokens: plan.workload.prompt_len as usize,
            tokens: tokens.len(),
        });
    }
    let lanes = lane_kernels(&model, &plan.device, gpu_kernels)?;
    let (steps, layers) = compile(plan)?;
    let state = PrefillState::new(
        tokens.to_vec(),
        plan.workload.chunk_len as usize,
        model.layers.len(),
        model.config.kv_dim(),
    );
    Ok(StageRunner::new(model, steps, layers, lanes, state))
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
        #[cfg(feature = "gpu")]
        return crate::resident_prefill::prefill_resident(model, tokens, options);
        #[cfg_attr(feature = "gpu", expect(unreachable_code))]
        return Err(crate::gpu_open::no_gpu_support());
    }
    let device = prefill_device(options);
    let float_processor = (options.gpu == GpuUse::FloatLane).then(|| "gpu".to_string());
    let plan = Arc::new(PrefillPlan::placed(
        model.model_config(),
        device,
        workload(tokens, options, float_processor),
        options.placement.clone(),
    )?);
    let mut runner = stage_runner(model.clone(), &plan, tokens, &options.gpu_kernels)?;
    runner.state.all_logits = options.all_logits;
    runner.state.recorder = options.recorder.clone();
    let runner = Arc::new(runner);
    let (policy, decision) = decide::policy(&plan, options)?;
    let shadow_before = model.shadow_counters.snapshot();
    let (outcome, queue_waits) =
        run_on_queues(plan, policy, runner.clone(), options.threads, options)?;
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
