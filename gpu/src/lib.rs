//! Vulkan compute kernels for hetsched (vulkano 0.35, GLSL compiled by `glslc` in
//! `build.rs`, the `GL_KHR_cooperative_matrix` kernels by glslang 13 where installed): tiled
//! GEMM in f32, f16 (also on tensor cores through cooperative matrices) and INT8, RMSNorm,
//! RoPE, causal GQA attention (with a sliding window), SiLU x up, the q/k/v finish of
//! families with QKV biases or QK-norm, quantize and dequantize. Each kernel matches its scalar twin in
//! `hetsched_kernels::reference` within the tolerance its test states.
//!
//! # Entry points
//! * [`GpuContext::new`]: picks a device (discrete GPU first, Mesa's lavapipe last) and
//!   reports what it offers in [`DeviceInfo`].
//! * Host-slice kernels (`ctx.matmul_f32(&a, m, k, &w, n)`, ...): upload, run, read back.
//! * Resident matrices ([`GpuMatrix`], `ctx.upload_f32`, `ctx.matmul_f32_device`): upload
//!   weights once and reuse them for every chunk.
//! * [`GpuBatch`] (`ctx.batch()`): several kernels on resident matrices in one
//!   submission, for subgraphs whose tensors stay on the device.
//! * [`GpuContext::last_gpu_time_ns`]: GPU time of the last call from timestamp queries.
//!
//! # Layouts
//! The conventions of `hetsched_kernels`: row-major; weights `[n, k]`, `out = a · wᵀ`;
//! attention activations `[tokens, heads, head_dim]`, KV caches
//! `[kv_len, n_kv_heads, head_dim]`; symmetric INT8 in `[-127, 127]`, round to nearest even.

mod attention;
mod attention_o;
mod batch;
mod buffers;
mod context;
mod coopmat;
mod decode;
mod decode_layer;
mod elementwise;
mod error;
mod family;
mod fused;
mod gemm;
mod job;
mod norm;
mod pipelines;
mod quant;
mod rope;
mod timer;

pub use attention::{DECODE_MIN_KEY_BLOCKS, MAX_HEAD_DIM};
pub use attention_o::AttentionOutput;

pub use batch::{BatchOutput, GpuBatch};
pub use buffers::{Elem, GpuArena, GpuMatrix};
pub use context::{DeviceInfo, DeviceKind, GpuContext, GpuOptions};
pub use decode::{GEMV_MAX_ROWS, HostMatrix, RecordedBatch};
pub use decode_layer::{
    ATTENTION_WITH_O_MAX_KEYS, DECODE_LAYER_GAVE_UP, DECODE_LAYER_GROUPS_PER_SM,
    DECODE_LAYER_MAX_ROWS, DECODE_LAYERS_PER_DISPATCH, DecodeLayerCounters, DecodeLayerWeights,
    DecodeLayers,
};
pub use error::{GpuError, Result};
pub use family::QkvFinish;
pub use fused::{
    FusedGemm, GemmEpilogue, QkvRows, fold_norm, interleave_rows, reorder_rope_rows, rope_pair_rows,
};
pub use gemm::{CoopKernel, GemmTile};
pub use hetsched_kernels::reference::{AttentionShape, RopeStyle};
pub use timer::GpuTimer;
