//! Causal grouped-query attention over a KV cache with a past offset, matching
//! `hetsched_kernels::reference::attention_causal_gqa`.

use hetsched_kernels::reference::AttentionShape;

use vulkano::buffer::Subbuffer;

use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::job::Job;
use crate::pipelines::{PUSH_WORDS, Shader};

/// Largest head dimension of the kernels (their per-thread accumulators are sized for it).
pub const MAX_HEAD_DIM: usize = 256;

/// Largest head dimension of the tiled kernel (its shared-memory tiles are sized for it);
/// larger heads use one workgroup per query.
const TILED_MAX_HEAD_DIM: usize = 128;

/// Query tokens per workgroup of the tiled kernel.
const TILED_QUERIES: usize = 8;

/// Largest head dimension of the flash kernel (`attention_flash.comp`: its shared tiles
/// and per-thread dims are sized for it); larger heads use the tiled kernel.
pub(crate) const FLASH_MAX_HEAD_DIM: usize = 64;

/// Query tokens per workgroup of the flash kernel.
const FLASH_QUERIES: usize = 32;

/// Query rows per workgroup of the tensor-core kernel (`attention_flash_khr.comp`).
const KHR_QUERIES: usize = 64;

/// Keys per block of the tensor-core kernel.
const KHR_KEYS: usize = 64;

/// Workgroups the key split aims for: about four per SM of a 132-SM H100, so that a
/// 512-token chunk of 9 heads (72 query blocks) still fills the device.
const KHR_TARGET_WORKGROUPS: usize = 512;

/// Fewest key blocks per range: a range's fixed cost (Q's fragments, its partials, its
/// share of the merge) against more workgroups for a chunk's 72 query blocks. With the
/// line-wise partials, 8 beat 16 on an H100 (layer_bench: the 8 attention dispatches of a
/// 4096-token prompt 501 us against 559; 4 gave 512; end to end +5% at 4096 tokens, +7% at
/// 2048, docs/gpu.md). [`crate::GpuOptions::attention_min_key_blocks`] overrides it.
const KHR_MIN_BLOCKS_PER_RANGE: usize = 8;

/// Most key ranges one query block is split into.
const KHR_MAX_SPLITS: usize = 32;

/// The plain kernel for `s`, its push constants and its grid.
fn plain_dispatch(s: &AttentionShape) -> (Shader, [u32; PUSH_WORDS], [u32; 3]) {
    let push = base_push(s);
    let (shader, query_groups) = if s.head_dim <= FLASH_MAX_HEAD_DIM {
        (Shader::AttentionFlash, s.n_tokens.div_ceil(FLASH_QUERIES))
    } else if s.head_dim <= TILED_MAX_HEAD_DIM {
        (Shader::AttentionTiled, s.n_tokens.div_ceil(TILED_QUERIES))
    } else {
        (Shader::Attention, s.n_tokens)
    };
    (
        shader,
        push,
        [s.n_heads as u32, query_groups.clamp(1, 65_535) as u32, 1],
    )
}

fn base_push(s: &AttentionShape) -> [u32; PUSH_WORDS] {
    let mut push = [0u32; PUSH_WORDS];
    push[0] = s.n_tokens as u32;
    push[1] = s.pos0 as u32;
    push[2] = s.kv_len as u32;
    push[3] = s.n_heads as u32;
    push[4] = s.n_kv_heads as u32;
    push[5] = s.head_dim as u32;
    push[6] = s.scale().to_bits();
    push
}

/// How the tensor-core kernel splits `s`: key ranges per query block, and the scratch
/// layout in words (counters, then 256 words of (max, sum) and 4096 of partial output per
/// range of one head and query block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KhrSplit {
    splits: usize,
    ml_base: usize,
    o_base: usize,
    words: usize,
}

fn khr_split(s: &AttentionShape, max_words: usize, min_blocks: usize) -> KhrSplit {
    let q_blocks = s.n_tokens.div_ceil(KHR_QUERIES);
    let base = s.n_heads * q_blocks;
    let key_blocks = (s.pos0 + s.n_tokens).div_ceil(KHR_KEYS);
    let mut splits = KHR_TARGET_WORKGROUPS
        .div_ceil(base)
        .min(key_blocks / min_blocks.max(1))
        .clamp(1, KHR_MAX_SPLITS);
    let layout = |splits: usize| {
        let counters = base.next_multiple_of(4);
        let ranges = splits * base;
        KhrSplit {
            splits,
            ml_base: counters,
            o_base: counters + 256 * ranges,
            words: counters + (256 + 4096) * ranges,
        }
    };
    while splits > 1 && layout(splits).words > max_words {
        splits /= 2;
    }
    layout(splits)
}

impl GpuContext {
    /// Whether this device and build can run the tensor-core attention kernel
    /// (`VK_KHR_cooperative_matrix` with 16x16x16 f16 matrices, 32-wide subgroups, subgroup
    /// shuffles, the kernel compiled by glslang 13).
    pub(crate) fn tensor_core_attention_available(&self) -> bool {
        Shader::AttentionFlashKhr.compiled()
            && self.check_coop(crate::CoopKernel::Khr).is_ok()
            && self.info.subgroup_shuffle
    }

    /// Whether attention of shape `s` runs on tensor cores here (f16 Q, K, V and
    /// probabilities, f32 accumulation and softmax): head_dim <= 64 and a multiple of 4, a
    /// device with the KHR cooperative matrices, and [`crate::GpuOptions::f32_attention`]
    /// off. Otherwise the f32 kernels run.
    pub fn attention_on_tensor_cores(&self, s: &AttentionShape) -> bool {
        !self.f32_attention
            && s.head_dim <= FLASH_MAX_HEAD_DIM
            && s.head_dim.is_multiple_of(4)
            && self.tensor_core_attention_available()
    }

    /// The attention scratch buffer, at least `words` long, its counters zero.
    fn attention_scratch(&self, words: usize) -> Result<Subbuffer<[u32]>> {
        let mut scratch = self
            .attention_scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(buf) = &*scratch
            && buf.len() >= words as u64
        {
            return Ok(buf.clone());
        }
        // Grown in powers of two and zeroed once: every dispatch leaves its counters at zero.
        // A replaced buffer lives on in the command buffers that still use it.
        let limit = self.info.max_storage_buffer_range / 4;
        let len = (words as u64)
            .next_power_of_two()
            .min(limit)
            .max(words as u64);
        let buf = self.alloc_words(len, "attention scratch")?;
        let mut job = Job::new(self)?;
        job.fill_zero(&buf)?;
        job.finish()?;
        *scratch = Some(buf.clone());
        Ok(buf)
    }
}

/// The output projection a fused attention dispatch adds into the residual stream
/// (already validated, see `attention_o.rs`): the buffers of W_o, x and the flags, and the
/// push constants both kernels take.
pub(crate) struct FusedOutput<'a> {
    pub(crate) bufs: [&'a Subbuffer<[u32]>; 3],
    /// Columns of x (rows of W_o).
    pub(crate) o_cols: usize,
    /// W_o's row stride in 32-bit words.
    pub(crate) w_ld_words: usize,
    /// Whether W_o is f16 (else f32).
    pub(crate) w_f16: bool,
    /// x's row stride in floats.
    pub(crate) x_ld: usize,
    /// The flag a non-finite product raises.
    pub(crate) slot: usize,
}

/// Push-constant word of the sliding window (keys a query sees at most, 0: all) in the
/// kernels that take one (`attention.comp`, `attention_decode.comp`).
const WINDOW_WORD: usize = 14;

/// Records attention of shape `s` (already validated) over `[q, k_cache, v_cache, out]`:
/// the decode kernel for a few tokens (`attention_decode.comp`, unfused only), else the
/// tensor-core kernel where [`GpuContext::attention_on_tensor_cores`], else the plain one;
/// with `fused`, their variants that also add the output projection into the stream.
/// With a sliding `window` (> 0; 0: none) the kernels that take one run: the decode kernel
/// for a few tokens, else `attention.comp` (unfused only; the caller refuses `fused`).
pub(crate) fn record_attention<C: AsRef<GpuContext>>(
    job: &mut Job<C>,
    bufs: [&Subbuffer<[u32]>; 4],
    s: &AttentionShape,
    fused: Option<&FusedOutput<'_>>,
    window: usize,
) -> Result<()> {
    let ctx = job.ctx();
    if fused.is_none() && decode_attention_fits(s) {
        return record_decode_attention(job, bufs, None, s, window);
    }
    if window > 0 {
        let mut push = base_push(s);
        push[WINDOW_WORD] = window_word(window);
        let groups = [s.n_heads as u32, s.n_tokens.clamp(1, 65_535) as u32, 1];
        return job.dispatch(Shader::Attention, &bufs, push, groups);
    }
    if !ctx.attention_on_tensor_cores(s) {
        let (shader, mut push, groups) = plain_dispatch(s);
        let Some(f) = fused else {
            return job.dispatch(shader, &bufs, push, groups);
        };
        push[7] = u32::from(f.w_f16);
        push[8] = f.o_cols as u32;
        push[9] = f.w_ld_words as u32;
        push[10] = f.x_ld as u32;
        push[11] = f.slot as u32;
        let [q, k, v, out] = bufs;
        let [w, x, flags] = f.bufs;
        return job.dispatch(
            Shader::AttentionFlashO,
            &[q, k, v, out, w, x, flags],
            push,
            groups,
        );
    }
    let max_words = (ctx.info.max_storage_buffer_range / 4) as usize;
    let min_blocks = ctx
        .attention_min_key_blocks
        .unwrap_or(KHR_MIN_BLOCKS_PER_RANGE)
        .max(1);
    let split = khr_split(s, max_words, min_blocks);
    let scratch = if split.splits > 1 {
        ctx.attention_scratch(split.words)?
    } else {
        ctx.unused_bindings()?[0].clone()
    };
    let mut push = base_push(s);
    push[7] = split.splits as u32;
    push[8] = split.ml_base as u32;
    push[9] = split.o_base as u32;
    let q_blocks = s.n_tokens.div_ceil(KHR_QUERIES).clamp(1, 65_535) as u32;
    let groups = [s.n_heads as u32, q_blocks, split.splits as u32];
    let [q, k, v, out] = bufs;
    let Some(f) = fused else {
        return job.dispatch(
            Shader::AttentionFlashKhr,
            &[q, k, v, out, &scratch],
            push,
            groups,
        );
    };
    push[10] = f.o_cols as u32;
    push[11] = (f.w_ld_words / 4) as u32;
    push[12] = f.x_ld as u32;
    push[13] = f.slot as u32;
    let [w, x, flags] = f.bufs;
    job.dispatch(
        Shader::AttentionFlashKhrO,
        &[q, k, v, out, &scratch, w, x, flags],
        push,
        groups,
    )
}

pub(crate) fn validate_shape(s: &AttentionShape, q: usize, k: usize, v: usize) -> Result<()> {
    let op = "attention_causal_gqa";
    if s.n_kv_heads == 0 || !s.n_heads.is_multiple_of(s.n_kv_heads) {
        return Err(shape(
            op,
            format!(
                "n_kv_heads {} must divide n_heads {}",
                s.n_kv_heads, s.n_heads
            ),
        ));
    }
    if s.kv_len < s.pos0 + s.n_tokens {
        return Err(shape(
            op,
            format!(
                "kv_len {} must be >= pos0 {} + n_tokens {}",
                s.kv_len, s.pos0, s.n_tokens
            ),
        ));
    }
    if s.head_dim == 0 || s.head_dim > MAX_HEAD_DIM {
        return Err(shape(
            op,
            format!("head_dim {} must be in 1..={MAX_HEAD_DIM}", s.head_dim),
        ));
    }
    let q_len = s.n_tokens * s.n_heads * s.head_dim;
    let kv = s.kv_len * s.n_kv_heads * s.head_dim;
    if q != q_len {
        return Err(shape(
            op,
            format!("q has {q} elements, [n_tokens, n_heads, head_dim] needs {q_len}"),
        ));
    }
    if k != kv || v != kv {
        return Err(shape(
            op,
            format!("k/v caches have {k}/{v} elements, [kv_len, n_kv_heads, head_dim] needs {kv}"),
        ));
    }
    Ok(())
}

fn words(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

impl GpuContext {
    /// Causal GQA attention of a chunk: `q` `[n_tokens, n_heads, head_dim]` (RoPE applied),
    /// caches `[kv_len, n_kv_heads, head_dim]` holding the chunk's own keys at
    /// `pos0..pos0 + n_tokens`; query `t` attends to keys `0..=pos0 + t`. Returns
    /// `[n_tokens, n_heads, head_dim]`. Caches larger than one storage buffer are refused
    /// ([`crate::GpuError::BufferTooLarge`]).
    pub fn attention_causal_gqa(
        &self,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        s: &AttentionShape,
    ) -> Result<Vec<f32>> {
        self.attention_causal_gqa_windowed(q, (k_cache, v_cache), s, 0)
    }

    /// [`GpuContext::attention_causal_gqa`] where each query sees at most its last `window`
    /// keys (itself included; a sliding-window layer), 0 meaning all of them.
    pub fn attention_causal_gqa_windowed(
        &self,
        q: &[f32],
        (k_cache, v_cache): (&[f32], &[f32]),
        s: &AttentionShape,
        window: usize,
    ) -> Result<Vec<f32>> {
        validate_shape(s, q.len(), k_cache.len(), v_cache.len())?;
        if q.is_empty() {
            return Ok(Vec::new());
        }
        let mut job = Job::new(self)?;
        let q_buf = job.upload(&words(q), "attention q")?;
        let k_buf = job.upload(&words(k_cache), "attention k cache")?;
        let v_buf = job.upload(&words(v_cache), "attention v cache")?;
        let out = self.alloc_words(q.len() as u64, "attention output")?;
        record_attention(&mut job, [&q_buf, &k_buf, &v_buf, &out], s, None, window)?;
        job.download(&out);
        let got = job.finish()?.downloads;
        Ok(got[0].iter().map(|&b| f32::from_bits(b)).collect())
    }
}

/// Most query tokens the decode attention kernel (`attention_decode.comp`) takes: one
/// workgroup per (head, token) pays off while the prefill kernels' 32-row tiles would be
/// mostly empty.
pub(crate) const DECODE_ATTENTION_MAX_TOKENS: usize = 8;

/// Whether [`crate::GpuBatch::attention`] runs `s` on the decode kernel.
pub(crate) fn decode_attention_fits(s: &AttentionShape) -> bool {
    s.n_tokens <= DECODE_ATTENTION_MAX_TOKENS
        && s.head_dim.is_multiple_of(4)
        && s.head_dim <= crate::MAX_HEAD_DIM
}

/// Keys a workgroup of the decode attention kernel takes at a time (its threads, one key
/// each: `T` in `attention_decode.comp`).
const DECODE_KEY_BLOCK: usize = 64;

/// Most workgroups one (head, token) of the decode kernel is split into along its keys;
/// past `DECODE_KEY_BLOCK · DECODE_MAX_SPLITS` keys each walks several blocks.
const DECODE_MAX_SPLITS: usize = 128;

/// Fewest key blocks a workgroup of a split decode attention walks, unless
/// [`crate::GpuOptions::decode_min_key_blocks`] says otherwise. A split costs each
/// workgroup a write of its partials and an atomic, and the last one the merge.
pub const DECODE_MIN_KEY_BLOCKS: usize = 1;

/// How many workgroups one (head, token) of decode attention over `kv_len` keys is split
/// into: one per `min_blocks` key blocks, up to [`DECODE_MAX_SPLITS`]. A single sequence's
/// step has only `n_heads` (head, token) pairs, a few workgroups on a GPU of a hundred
/// cores, so each takes a run of the keys and a second kernel merges their softmax states.
fn decode_splits(kv_len: usize, min_blocks: usize) -> usize {
    kv_len
        .div_ceil(DECODE_KEY_BLOCK * min_blocks.max(1))
        .clamp(1, DECODE_MAX_SPLITS)
}

/// A window as its push-constant word: keys past `u32::MAX` are all of them.
fn window_word(window: usize) -> u32 {
    u32::try_from(window).unwrap_or(0)
}

/// The decode attention kernel's push constants for `s` split `splits` ways, positions
/// from a buffer when `positions_from_buffer`, else from pos0, over a sliding `window`
/// (0: none).
fn decode_push(
    s: &AttentionShape,
    splits: usize,
    positions_from_buffer: bool,
    window: usize,
) -> [u32; PUSH_WORDS] {
    let mut p = [0u32; PUSH_WORDS];
    p[..9].copy_from_slice(&[
        s.n_tokens as u32,
        s.pos0 as u32,
        s.kv_len as u32,
        s.n_heads as u32,
        s.n_kv_heads as u32,
        s.head_dim as u32,
        s.scale().to_bits(),
        u32::from(positions_from_buffer),
        splits as u32,
    ]);
    p[WINDOW_WORD] = window_word(window);
    p
}

/// Records the decode attention kernel over `[q, k_cache, v_cache, out]` for `s` (already
/// validated), token positions from `positions` when given (else `s.pos0 + t`), over a
/// sliding `window` (0: none), split along the keys ([`decode_splits`]); the last
/// workgroup of a (head, token) to finish merges its splits, in the same dispatch.
pub(crate) fn record_decode_attention<C: AsRef<GpuContext>>(
    job: &mut Job<C>,
    [q, k, v, out]: [&Subbuffer<[u32]>; 4],
    positions: Option<&Subbuffer<[u32]>>,
    s: &AttentionShape,
    window: usize,
) -> Result<()> {
    let min_blocks = job
        .ctx()
        .decode_min_key_blocks
        .unwrap_or(DECODE_MIN_KEY_BLOCKS);
    let splits = decode_splits(s.kv_len, min_blocks);
    let push = decode_push(s, splits, positions.is_some(), window);
    let unused = job.ctx().unused_bindings()?;
    let positions = positions.unwrap_or(&unused[0]);
    let (n_heads, n_tokens) = (s.n_heads as u32, s.n_tokens as u32);
    if splits == 1 {
        return job.dispatch(
            Shader::AttentionDecode,
            &[q, k, v, out, positions, &unused[1]],
            push,
            [n_heads, n_tokens, 1],
        );
    }
    // Every (token, head, split) record is written before the merge reads it, so the
    // records need no zeroing; the counters do, once: the merging workgroup leaves its
    // counter at zero for the next replay. A buffer of their own per recording, so that
    // replays of different steps never share one.
    let counters = (s.n_tokens * s.n_heads).next_multiple_of(4);
    let record_words = s.head_dim + 4;
    let words = counters + s.n_tokens * s.n_heads * splits * record_words;
    let part = job
        .ctx()
        .alloc_words(words as u64, "decode attention partials")?;
    job.zero_once(&part)?;
    job.dispatch(
        Shader::AttentionDecode,
        &[q, k, v, out, positions, &part],
        push,
        [n_heads, n_tokens, splits as u32],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n_tokens: usize, pos0: usize) -> AttentionShape {
        AttentionShape {
            n_tokens,
            pos0,
            kv_len: pos0 + n_tokens,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
        }
    }

    #[test]
    fn decode_split_takes_at_least_its_blocks_and_at_most_its_cap() {
        assert_eq!(decode_splits(133, 1), 3);
        assert_eq!(decode_splits(133, 4), 1);
        assert_eq!(decode_splits(257, 4), 2);
        assert_eq!(decode_splits(4096, 4), 16);
        assert_eq!(decode_splits(1 << 20, 1), DECODE_MAX_SPLITS);
        // No blocks asked for reads as one.
        assert_eq!(decode_splits(133, 0), 3);
    }

    #[test]
    fn key_split_fills_the_device_and_fits_the_buffer() {
        // The last 512-token chunk of 4096: 72 query blocks, 64 key blocks -> 8 ranges.
        let s = khr_split(&shape(512, 3584), usize::MAX, KHR_MIN_BLOCKS_PER_RANGE);
        assert_eq!(s.splits, 8);
        let ranges = 8 * 72;
        assert_eq!((s.ml_base, s.o_base), (72, 72 + 256 * ranges));
        assert_eq!(s.words, 72 + 4352 * ranges);
        // 2048 queries at 6144: 288 query blocks, 128 key blocks -> 2 ranges.
        assert_eq!(
            khr_split(&shape(2048, 6144), usize::MAX, KHR_MIN_BLOCKS_PER_RANGE).splits,
            2
        );
        // A first 512-token chunk (16 key blocks) or a 45-token one after 512: no split.
        assert_eq!(
            khr_split(&shape(512, 0), usize::MAX, KHR_MIN_BLOCKS_PER_RANGE).splits,
            1
        );
        assert_eq!(
            khr_split(&shape(45, 512), usize::MAX, KHR_MIN_BLOCKS_PER_RANGE).splits,
            1
        );
        // Few query blocks over a long past: up to 32 ranges of 8 blocks or more.
        assert_eq!(
            khr_split(&shape(45, 40_000), usize::MAX, KHR_MIN_BLOCKS_PER_RANGE).splits,
            32
        );
        // A scratch limit halves the ranges until the layout fits.
        let small = khr_split(&shape(512, 3584), s.words / 2, KHR_MIN_BLOCKS_PER_RANGE);
        // Fewer blocks per range: the middle chunks of 4096 split too (24 blocks: 3 of 8).
        assert_eq!(khr_split(&shape(512, 1024), usize::MAX, 8).splits, 3);
        assert_eq!(khr_split(&shape(512, 1024), usize::MAX, 16).splits, 1);
        assert_eq!(small.splits, 2);
        assert!(small.words <= s.words / 2);
    }
}
