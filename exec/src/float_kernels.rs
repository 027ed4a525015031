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
    /// RoPE on `x` (`[positions, heads, head_dim]`) at absolute `positions`, with layer
    /// `layer`'s rotations (a sliding-window layer may use another base).
    fn rope(
        &self,
        x: &mut [f32],
        positions: Range<usize>,
        heads: usize,
        layer: usize,
    ) -> Result<(), KernelError>;
    /// Causal GQA attention of `q` over the first `shape.kv_len` cache rows, each query
    /// seeing at most its last `window` keys (itself included; `usize::MAX`: all).
    fn attention(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        shape: &AttentionShape,
        window: usize,
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
        layer: usize,
    ) -> Result<(), KernelError> {
        self.model.rope_of(layer).apply(x, positions, heads);
        Ok(())
    }

    fn attention(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        shape: &AttentionShape,
        window: usize,
    ) -> Result<Vec<f32>, KernelError> {
        // The last query sees `kv_len` keys: a wider window cuts none. A window that cuts
        // keys goes before the flash kernel, which knows only the causal mask.
        if window < shape.kv_len {
            return Ok(windowed_attention(q, k_cache, v_cache, shape, window));
        }
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

/// Causal GQA attention in which the query at position `p` sees keys
/// `max(0, p + 1 − window) ..= p` (llama.cpp's sliding window), one query per task: each
/// gathers its own window of the cache (the GEMM kernel masks causally, not from below).
fn windowed_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: &AttentionShape,
    window: usize,
) -> Vec<f32> {
    let row = shape.n_heads * shape.head_dim;
    let kv_row = shape.n_kv_heads * shape.head_dim;
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(row)
        .zip(q.par_chunks(row))
        .enumerate()
        .for_each(|(t, (out, q))| {
            let pos = shape.pos0 + t;
            let first = (pos + 1).saturating_sub(window);
            let keys = pos + 1 - first;
            let span = first * kv_row..(pos + 1) * kv_row;
            let gathered = AttentionKv::gather(
                &k_cache[span.clone()],
                &v_cache[span],
                keys,
                shape.n_kv_heads,
                shape.head_dim,
            );
            let one = AttentionShape {
                n_tokens: 1,
                pos0: keys - 1,
                kv_len: keys,
                ..*shape
            };
            attention_causal_gqa_gemm(q, &gathered, out, &one);
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
        // One table for every layer: GPU lanes run the llama family only.
        _layer: usize,
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
        // No sliding window: GPU lanes run the llama family only.
        _window: usize,
    ) -> Result<Vec<f32>, KernelError> {
        let rows = shape.kv_len * shape.n_kv_heads * shape.head_dim;
        let gpu = self.context.lock();
        gpu.attention_causal_gqa(q, &k_cache[..rows], &v_cache[..rows], shape)
            .map_err(|e| KernelError::Device(Box::new(e)))
    }
}
