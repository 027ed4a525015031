//! The float kernels of a stage (RMSNorm, query RoPE, attention) on the processor its lane
//! stands for: the host CPU, or (with the `gpu` feature) a Vulkan device.

use std::ops::Range;

use hetsched_kernels::{
    AttentionKv, AttentionShape, FlashKeys, RopeTable, attention_causal_gqa_gemm,
    attention_windowed_gqa_flash, flash_supported, rms_norm_fast,
};

use super::blocks::{ELEMENTS_PER_BLOCK, for_each_block};
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

impl std::fmt::Debug for dyn FloatKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.device())
    }
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
        Ok(rms_norm_blocks(x, weight, eps, rows, cols))
    }

    fn rope(
        &self,
        x: &mut [f32],
        positions: Range<usize>,
        heads: usize,
        layer: usize,
    ) -> Result<(), KernelError> {
        rope_blocks(self.model.rope_of(layer), x, positions, heads);
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
        // The flash kernel walks each block's window (the causal mask when the window is
        // wider than the context), from the first key the first query sees: keys gathered
        // from there. Without AVX-512: the scalar kernel when the window cuts keys (the
        // last query sees `kv_len`), the GEMM one otherwise.
        if flash_supported(shape.head_dim) {
            let from = (shape.pos0 + 1).saturating_sub(window);
            let keys = FlashKeys::gather_from(
                k_cache,
                from,
                shape.kv_len,
                shape.n_kv_heads,
                shape.head_dim,
            );
            return Ok(by_token_blocks(q, shape, |q, out, block| {
                attention_windowed_gqa_flash(q, &keys, v_cache, out, block, window);
            }));
        }
        if window < shape.kv_len {
            return Ok(windowed_attention(q, k_cache, v_cache, shape, window));
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

/// [`rms_norm_fast`] of `x[rows, cols]` in blocks of rows over the pool: row by row, the
/// same values as one call.
fn rms_norm_blocks(x: &[f32], weight: &[f32], eps: f32, rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    if cols == 0 || x.len() != rows * cols {
        // The kernel names what is wrong with the shapes.
        rms_norm_fast(x, weight, eps, &mut out, rows, cols);
        return out;
    }
    let block = (ELEMENTS_PER_BLOCK / cols).max(1) * cols;
    let blocks = x.chunks(block).zip(out.chunks_mut(block)).collect();
    for_each_block(blocks, |(x, out)| {
        rms_norm_fast(x, weight, eps, out, x.len() / cols, cols);
    });
    out
}

/// `table.apply(x, positions, heads)` in blocks of tokens over the pool: token by token,
/// the same values as one call.
fn rope_blocks(table: &RopeTable, x: &mut [f32], positions: Range<usize>, heads: usize) {
    let row = x.len() / positions.len().max(1);
    if row == 0 || row * positions.len() != x.len() {
        // The table names what is wrong with the shapes.
        table.apply(x, positions, heads);
        return;
    }
    let tokens = (ELEMENTS_PER_BLOCK / row).max(1);
    let blocks = x.chunks_mut(tokens * row).enumerate().collect();
    for_each_block(blocks, |(b, x)| {
        let first = positions.start + b * tokens;
        table.apply(x, first..first + x.len() / row, heads);
    });
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
    // Later tokens see more keys: the heaviest blocks go first, so that the last ones
    // claimed are short and the workers finish together.
    let mut blocks: Vec<_> = out
        .chunks_mut(ATTENTION_BLOCK * row)
        .zip(q.chunks(ATTENTION_BLOCK * row))
        .enumerate()
        .collect();
    blocks.reverse();
    for_each_block(blocks, |(b, (out, q))| {
        let block = AttentionShape {
            n_tokens: q.len() / row,
            pos0: shape.pos0 + b * ATTENTION_BLOCK,
            ..*shape
        };
        kernel(q, out, &block);
    });
    out
}

/// Queries in one block of [`windowed_attention`]: a chunk of 16 queries is 4 blocks,
/// enough to share among the pool's workers, each block with one scores buffer.
const QUERIES_PER_BLOCK: usize = 4;

/// Causal GQA attention in which the query at position `p` sees keys
/// `max(0, p + 1 − window) ..= p` (llama.cpp's sliding window), a few queries a block,
/// read from the cache in place: scores, softmax and the weighted values of each head over
/// its window. (Gathering the window into the GEMM kernel's packed layout for every query, as
/// this did before, cost 100 times the attention once the window was full: Gemma 3's
/// local layers at 512 keys.)
fn windowed_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: &AttentionShape,
    window: usize,
) -> Vec<f32> {
    let d = shape.head_dim;
    let (row, kv_row) = (shape.n_heads * d, shape.n_kv_heads * d);
    let scale = shape.scale();
    let mut out = vec![0f32; q.len()];
    let per_block = row * QUERIES_PER_BLOCK;
    let blocks = out.chunks_mut(per_block).zip(q.chunks(per_block));
    for_each_block(blocks.enumerate().collect(), |(b, (out, q))| {
        let mut scores = Vec::new();
        let queries = out.chunks_mut(row).zip(q.chunks(row));
        for (t, (out, q)) in (b * QUERIES_PER_BLOCK..).zip(queries) {
            let pos = shape.pos0 + t;
            let first = (pos + 1).saturating_sub(window);
            for (h, (out, q)) in out.chunks_exact_mut(d).zip(q.chunks_exact(d)).enumerate() {
                let g = shape.kv_head_of(h) * d;
                let key = |p: usize| &k_cache[p * kv_row + g..][..d];
                scores.clear();
                scores.extend((first..=pos).map(|p| dot(q, key(p)) * scale));
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                out.fill(0.0);
                for (p, &w) in (first..=pos).zip(scores.iter()) {
                    let value = &v_cache[p * kv_row + g..][..d];
                    for (o, v) in out.iter_mut().zip(value) {
                        *o += w * v;
                    }
                }
                out.iter_mut().for_each(|o| *o /= sum);
            }
        }
    });
    out
}

/// `a · b` in eight f32 lanes (so that the compiler vectorizes it).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// A Vulkan device through `hetsched-gpu` (host slices in and out per call).
#[cfg(feature = "gpu")]
pub struct GpuFloat {
    /// The device; one call at a time.
    pub context: parking_lot::Mutex<hetsched_gpu::GpuContext>,
    /// RoPE parameters.
    pub head_dim: usize,
    /// Each layer's RoPE base (a sliding-window layer may use another).
    pub rope_bases: Vec<f32>,
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
        layer: usize,
    ) -> Result<(), KernelError> {
        let positions: Vec<usize> = positions.collect();
        let base = self.rope_bases.get(layer).copied().ok_or_else(|| {
            KernelError::Device(format!("RoPE of layer {layer}, past the model's layers").into())
        })?;
        let gpu = self.context.lock();
        gpu.rope(x, &positions, heads, self.head_dim, base, self.rope_style)
            .map_err(|e| KernelError::Device(Box::new(e)))
    }

    fn attention(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        shape: &AttentionShape,
        window: usize,
    ) -> Result<Vec<f32>, KernelError> {
        let rows = shape.kv_len * shape.n_kv_heads * shape.head_dim;
        // `usize::MAX` (all keys) is the kernel's 0.
        let window = if window == usize::MAX { 0 } else { window };
        let gpu = self.context.lock();
        gpu.attention_causal_gqa_windowed(q, (&k_cache[..rows], &v_cache[..rows]), shape, window)
            .map_err(|e| KernelError::Device(Box::new(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetsched_kernels::attention_causal_gqa;
    use hetsched_kernels::seeded::SeededRng;

    #[test]
    fn windowed_attention_is_the_reference_on_each_querys_window() {
        // 6 queries at positions 4..10 of a cache of 10 (a later chunk), 4 query heads on
        // 2 KV heads of 12 (a dot product with a remainder), windows that cut and not.
        let (n, pos0, heads, kv_heads, d) = (6, 4, 4, 2, 12);
        let kv_len = pos0 + n;
        let mut rng = SeededRng::new(11);
        let q = rng.f32s(n * heads * d);
        let (k, v) = (
            rng.f32s(kv_len * kv_heads * d),
            rng.f32s(kv_len * kv_heads * d),
        );
        let shape = AttentionShape {
            n_tokens: n,
            pos0,
            kv_len,
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: d,
        };
        let (row, kv_row) = (heads * d, kv_heads * d);
        for window in [1, 3, 7, kv_len] {
            let got = windowed_attention(&q, &k, &v, &shape, window);
            for t in 0..n {
                let pos = pos0 + t;
                let first = (pos + 1).saturating_sub(window);
                let keys = pos + 1 - first;
                let mut want = vec![0f32; row];
                let one = AttentionShape {
                    n_tokens: 1,
                    pos0: keys - 1,
                    kv_len: keys,
                    ..shape
                };
                let span = first * kv_row..(pos + 1) * kv_row;
                let query = &q[t * row..(t + 1) * row];
                attention_causal_gqa(query, &k[span.clone()], &v[span], &mut want, &one);
                for (a, b) in got[t * row..(t + 1) * row].iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "window {window}, query {t}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn norm_and_rope_in_blocks_equal_one_call_bit_for_bit() {
        use hetsched_kernels::RopeStyle;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        // 128 tokens of 9 heads × 64: several blocks of either kind.
        let (rows, heads, d) = (128, 9, 64);
        let cols = heads * d;
        let x = SeededRng::new(5).f32s(rows * cols);
        let weight = SeededRng::new(6).f32s(cols);
        let mut want = vec![0f32; rows * cols];
        rms_norm_fast(&x, &weight, 1e-5, &mut want, rows, cols);
        let got = pool.install(|| rms_norm_blocks(&x, &weight, 1e-5, rows, cols));
        assert_eq!(got, want);
        let table = RopeTable::new(d, 10000.0, RopeStyle::Adjacent, 512);
        let mut want = x.clone();
        table.apply(&mut want, 300..300 + rows, heads);
        let mut got = x.clone();
        pool.install(|| rope_blocks(&table, &mut got, 300..300 + rows, heads));
        assert_eq!(got, want);
    }
}
