//! The float kernels of a stage (RMSNorm, query RoPE, attention) on the processor its lane
//! stands for: the host CPU, or (with the `gpu` feature) a Vulkan device.

use std::ops::Range;

use hetsched_kernels::{
    AttentionKv, AttentionShape, FlashKeys, attention_causal_gqa_flash, attention_causal_gqa_gemm,
    flash_supported, rms_norm_fast,
};
use rayon::prelude::*;

use super::error::KernelError;

/// Query tokens per attention task: small blocks let work stealing balance the causal
/// triangle (late tokens see more keys) across threads.
const ATTENTION_BLOCK: usize = 16;

/// Float kernels one lane runs. A device's failure is [`KernelError::Device`], in its own
/// words.
pub trait FloatKernels: Send + Sync {
    /// Where they run, for messages.
    fn device(&self) -> String;
    /// RMSNorm of `rows` rows of width `cols`.
    fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<f32>, KernelError>;
    /// RoPE on `x` (`[positions, heads, head_dim]`) at absolute `positions`.
    fn rope(&self, x: &mut [f32], positions: Range<usize>, heads: usize)
    -> Result<(), KernelError>;
    /// Causal GQA attention of `q` over the first `shape.kv_len` cache rows.
    fn attention(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        shape: &AttentionShape,
    ) -> Result<Vec<f32>, KernelError>;
}

/// The host CPU: the `hetsched-kernels` fast paths, attention split over the pool.
#[derive(Debug)]
pub struct CpuFloat {
    /// The model (its RoPE table).
    pub model: std::sync::Arc<super::ExecModel>,
}

impl FloatKernels for CpuFloat {
    fn device(&self) -> String {
        "cpu".into()
    }

    fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<f32>, KernelError> {
        let mut out = vec![0f32; rows * cols];
        rms_norm_fast(x, weight, eps, &mut out, rows, cols);
        Ok(out)
    }

    fn rope(
        &self,
        x: &mut [f32],
        positions: Range<usize>,
        heads: usize,
    ) -> Result<(), KernelError> {
        self.model.rope.apply(x, positions, heads);
        Ok(())
    }

    fn attention(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        shape: &AttentionShape,
    ) -> Result<Vec<f32>, KernelError> {
        if flash_supported(shape.head_dim) {
            let keys = FlashKeys::gather(k_cache, shape.kv_len, shape.n_kv_heads, shape.head_dim);
            return Ok(by_token_blocks(q, shape, |q, out, block| {
                attention_causal_gqa_flash(q, &keys, v_cache, out, block);
            }));
        }
        let gathered = AttentionKv::gather(
            k_cache,
            v_cache,
            shape.kv_len,
            shape.n_kv_heads,
            shape.head_dim,
        );
        Ok(by_token_blocks(q, shape, |q, out, block| {
            attention_causal_gqa_gemm(q, &gathered, out, block);
        }))
    }
}

/// Attention of the queries `q` split into blocks of [`ATTENTION_BLOCK`] tokens across the
/// pool: `kernel(q_block, out_block, block_shape)` per block. The flash kernel (AVX-512,
/// one pass over the keys, values read in place) or the GEMM one, each with its keys
/// prepared once per call.
fn by_token_blocks(
    q: &[f32],
    shape: &AttentionShape,
    kernel: impl Fn(&[f32], &mut [f32], &AttentionShape) + Sync,
) -> Vec<f32> {
    let row = shape.n_heads * shape.head_dim;
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(ATTENTION_BLOCK * row)
        .zip(q.par_chunks(ATTENTION_BLOCK * row))
        .enumerate()
        .for_each(|(b, (out, q))| {
            let block = AttentionShape {
                n_tokens: q.len() / row,
                pos0: shape.pos0 + b * ATTENTION_BLOCK,
                ..*shape
            };
            kernel(q, out, &block);
        });
    out
}

/// A Vulkan device through `hetsched-gpu` (host slices in and out per call).
#[cfg(feature = "gpu")]
pub struct GpuFloat {
    /// The device; one call at a time.
    pub context: parking_lot::Mutex<hetsched_gpu::GpuContext>,
    /// RoPE parameters.
    pub head_dim: usize,
    /// RoPE base.
    pub rope_base: f32,
    /// RoPE pairing.
    pub rope_style: hetsched_kernels::RopeStyle,
}

#[cfg(feature = "gpu")]
impl FloatKernels for GpuFloat {
    fn device(&self) -> String {
        format!("gpu ({})", self.context.lock().info().name)
    }

    fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<f32>, KernelError> {
        let gpu = self.context.lock();
        gpu.rms_norm(x, weight, eps, rows, cols)
            .map_err(|e| KernelError::Device(Box::new(e)))
    }

    fn rope(
        &self,
        x: &mut [f32],
        positions: Range<usize>,
        heads: usize,
    ) -> Result<(), KernelError> {
        let positions: Vec<usize> = positions.collect();
        let gpu = self.context.lock();
        gpu.rope(
            x,
            &positions,
            heads,
            self.head_dim,
            self.rope_base,
            self.rope_style,
        )
        .map_err(|e| KernelError::Device(Box::new(e)))
    }

    fn attention(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        shape: &AttentionShape,
    ) -> Result<Vec<f32>, KernelError> {
        let rows = shape.kv_len * shape.n_kv_heads * shape.head_dim;
        let gpu = self.context.lock();
        gpu.attention_causal_gqa(q, &k_cache[..rows], &v_cache[..rows], shape)
            .map_err(|e| KernelError::Device(Box::new(e)))
    }
}
