//! Opening the Vulkan GPU: the float lane beside the CPU ([`crate::GpuUse::FloatLane`])
//! and the device of the resident path ([`crate::GpuUse::Resident`]). Only the GPU arm of
//! each function depends on the `gpu` feature; a build without it answers
//! [`no_gpu_support`].

use std::sync::Arc;

#[cfg(feature = "gpu")]
use crate::GpuFloat;
use crate::{ExecError, ExecModel, FloatKernels, GpuKernelOptions};

/// What a build without the `gpu` feature says when asked for a GPU.
pub(crate) fn no_gpu_support() -> ExecError {
    ExecError::Gpu(
        "this build has no GPU support: rebuild with `cargo build --release --features gpu`".into(),
    )
}

/// Refuses a model the GPU kernels do not compute ([`ExecError::NotOnGpu`]): they run
/// every family row (llama, Qwen2, Gemma 3: their steps, sliding windows and per-layer
/// RoPE bases) with unscaled RoPE only (the tables come from each layer's base).
pub(crate) fn gpu_computes(model: &ExecModel) -> Result<(), ExecError> {
    let arch = model.config.family.arch.to_owned();
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
        rope_bases: (0..model.config.n_layers)
            .map(|l| model.config.rope_base_of(l))
            .collect(),
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
        decode_min_key_blocks: kernels.decode_min_key_blocks,
        one_row_gemv_tree: kernels.one_row_gemv_tree,
        five_dispatch_decode: kernels.five_dispatch_decode,
        decode_layer_groups_per_sm: kernels.decode_layer_groups_per_sm,
        decode_attention_with_o_max_keys: kernels.decode_attention_with_o_max_keys,
        decode_layer_prefetch: kernels.decode_layer_prefetch,
        decode_layers_per_dispatch: kernels.decode_layers_per_dispatch,
        ..Default::default()
    };
    let context = hetsched_gpu::GpuContext::new(options).map_err(failed)?;
    context.prepare().map_err(failed)?;
    Ok(context)
}
