//! Causal grouped-query attention over a KV cache with a past offset, matching
//! `hetsched_kernels::reference::attention_causal_gqa`.

use hetsched_kernels::reference::AttentionShape;

use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::job::Bind;
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
const FLASH_MAX_HEAD_DIM: usize = 64;

/// Query tokens per workgroup of the flash kernel.
const FLASH_QUERIES: usize = 32;

/// The kernel for `s`, its push constants and its grid.
pub(crate) fn attention_dispatch(s: &AttentionShape) -> (Shader, [u32; PUSH_WORDS], [u32; 3]) {
    let mut push = [0u32; PUSH_WORDS];
    push[0] = s.n_tokens as u32;
    push[1] = s.pos0 as u32;
    push[2] = s.kv_len as u32;
    push[3] = s.n_heads as u32;
    push[4] = s.n_kv_heads as u32;
    push[5] = s.head_dim as u32;
    push[6] = s.scale().to_bits();
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
        validate_shape(s, q.len(), k_cache.len(), v_cache.len())?;
        if q.is_empty() {
            return Ok(Vec::new());
        }
        let (shader, push, groups) = attention_dispatch(s);
        let got = self.run_simple(
            shader,
            &[
                Bind::Upload(&words(q)),
                Bind::Upload(&words(k_cache)),
                Bind::Upload(&words(v_cache)),
                Bind::Output(q.len() as u64),
            ],
            &[3],
            push,
            groups,
        )?;
        Ok(got[0].iter().map(|&b| f32::from_bits(b)).collect())
    }
}
