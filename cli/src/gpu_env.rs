//! The `HETSCHED_GPU_*` environment variables: the Vulkan kernels' A/B switches and
//! tuning knobs (docs/gpu.md), which the benchmark scripts set without a flag of their
//! own. The library reads no environment; these map the variables onto its options.

use hetsched::exec::{GpuKernelOptions, GpuWeights};

use crate::CliError;

/// The kernel variants the variables ask for: `HETSCHED_GPU_F32_ATTENTION=1`,
/// `HETSCHED_GPU_UNFUSED_O=1`, `HETSCHED_GPU_ONE_ROW_GEMV_TREE=1`,
/// `HETSCHED_GPU_FIVE_DISPATCH_DECODE=1`, `HETSCHED_GPU_DECODE_PREFETCH=1`,
/// `HETSCHED_GPU_ATTN_MIN_KEY_BLOCKS=N`,
/// `HETSCHED_GPU_DECODE_MIN_KEY_BLOCKS=N`, `HETSCHED_GPU_DECODE_GROUPS_PER_SM=N` and
/// `HETSCHED_GPU_DECODE_LAYERS_PER_DISPATCH=N` (N ≥ 1), and
/// `HETSCHED_GPU_DECODE_O_MAX_KEYS=N` (N ≥ 0).
pub fn gpu_kernels() -> Result<GpuKernelOptions, CliError> {
    Ok(GpuKernelOptions {
        f32_attention: is_one("HETSCHED_GPU_F32_ATTENTION"),
        unfused_output_projection: is_one("HETSCHED_GPU_UNFUSED_O"),
        attention_min_key_blocks: key_blocks("HETSCHED_GPU_ATTN_MIN_KEY_BLOCKS")?,
        decode_min_key_blocks: key_blocks("HETSCHED_GPU_DECODE_MIN_KEY_BLOCKS")?,
        one_row_gemv_tree: is_one("HETSCHED_GPU_ONE_ROW_GEMV_TREE"),
        five_dispatch_decode: is_one("HETSCHED_GPU_FIVE_DISPATCH_DECODE"),
        decode_layer_prefetch: is_one("HETSCHED_GPU_DECODE_PREFETCH"),
        decode_layers_per_dispatch: whole(
            "HETSCHED_GPU_DECODE_LAYERS_PER_DISPATCH",
            "a whole number of layers, at least 1",
        )?,
        decode_layer_groups_per_sm: whole(
            "HETSCHED_GPU_DECODE_GROUPS_PER_SM",
            "a whole number of workgroups, at least 1",
        )?
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        decode_attention_with_o_max_keys: at_least(
            "HETSCHED_GPU_DECODE_O_MAX_KEYS",
            0,
            "a whole number of keys",
        )?,
    })
}

/// The whole number of key blocks, at least 1, that `variable` holds (`None` unset).
fn key_blocks(variable: &'static str) -> Result<Option<usize>, CliError> {
    whole(variable, "a whole number of key blocks, at least 1")
}

/// The whole number, at least 1, that `variable` holds (`None` unset); `expected` says
/// what it counts, for the error.
fn whole(variable: &'static str, expected: &'static str) -> Result<Option<usize>, CliError> {
    at_least(variable, 1, expected)
}

/// The whole number, at least `least`, that `variable` holds (`None` unset).
fn at_least(
    variable: &'static str,
    least: usize,
    expected: &'static str,
) -> Result<Option<usize>, CliError> {
    match std::env::var(variable) {
        Err(_) => Ok(None),
        Ok(value) => match value.parse::<usize>() {
            Ok(n) if n >= least => Ok(Some(n)),
            _ => Err(CliError::GpuEnvironment {
                variable,
                value,
                expected,
            }),
        },
    }
}

/// `asked`, except that `auto` becomes f16 or f32 with `HETSCHED_GPU_F16_WEIGHTS=1` or
/// `=0`.
pub fn gpu_weights(asked: GpuWeights) -> GpuWeights {
    match (asked, std::env::var("HETSCHED_GPU_F16_WEIGHTS").as_deref()) {
        (GpuWeights::Auto, Ok("1")) => GpuWeights::F16,
        (GpuWeights::Auto, Ok("0")) => GpuWeights::F32,
        _ => asked,
    }
}

/// Whether `variable` is set to `1`.
fn is_one(variable: &str) -> bool {
    std::env::var(variable).is_ok_and(|v| v == "1")
}
