//! Causal grouped-query attention built on the f32 GEMM.
//!
//! The scalar reference ([`crate::reference::attention_causal_gqa`]) walks one query,
//! one head and one key at a time in f64. Here the keys and values of each KV head are
//! gathered once per call into packed GEMM operands ([`AttentionKv`]); a block of query
//! tokens then costs two GEMMs per KV head (`S = Q Kᵀ`, `O = P V`) and a softmax over
//! the causally visible columns only. Blocks of tokens are independent, so a caller
//! splits the queries into token blocks across threads and shares one [`AttentionKv`].

use crate::gemm_f32::{PackedF32Weights, matmul_f32_packed, matmul_f32_packed_cols};
use crate::reference::AttentionShape;
use crate::vector::{exp_approx, max_f32, normalize_lanes};
use crate::widest::widest;

/// Keys and values of every KV head, packed for the GEMM.
#[derive(Clone, Debug)]
pub struct AttentionKv {
    kv_len: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Per KV head: keys as `[kv_len, head_dim]` weights (scores = q · kᵀ).
    keys: Vec<PackedF32Weights>,
    /// Per KV head: values transposed, `[head_dim, kv_len]` weights (out = p · v).
    values_t: Vec<PackedF32Weights>,
}

impl AttentionKv {
    /// Gathers the first `kv_len` positions of `k_cache` and `v_cache`, both row-major
    /// `[≥ kv_len, n_kv_heads, head_dim]`.
    ///
    /// # Panics
    /// If a cache holds fewer than `kv_len` positions.
    pub fn gather(
        k_cache: &[f32],
        v_cache: &[f32],
        kv_len: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let row = n_kv_heads * head_dim;
        assert!(k_cache.len() >= kv_len * row, "k_cache shorter than kv_len");
        assert!(v_cache.len() >= kv_len * row, "v_cache shorter than kv_len");
        let mut keys = Vec::with_capacity(n_kv_heads);
        let mut values_t = Vec::with_capacity(n_kv_heads);
        let mut k_head = vec![0f32; kv_len * head_dim];
        let mut v_head_t = vec![0f32; head_dim * kv_len];
        for g in 0..n_kv_heads {
            for j in 0..kv_len {
                let src = j * row + g * head_dim;
                k_head[j * head_dim..(j + 1) * head_dim]
                    .copy_from_slice(&k_cache[src..src + head_dim]);
                for (e, &v) in v_cache[src..src + head_dim].iter().enumerate() {
                    v_head_t[e * kv_len + j] = v;
                }
            }
            keys.push(PackedF32Weights::pack(&k_head, kv_len, head_dim));
            values_t.push(PackedF32Weights::pack(&v_head_t, head_dim, kv_len));
        }
        Self {
            kv_len,
            n_kv_heads,
            head_dim,
            keys,
            values_t,
        }
    }

    /// Positions gathered.
    pub fn kv_len(&self) -> usize {
        self.kv_len
    }
}

/// Same contract as [`crate::reference::attention_causal_gqa`] (f32 arithmetic instead
/// of f64), with the keys and values already gathered in `kv`.
///
/// `q` and `out` are `[shape.n_tokens, n_heads, head_dim]`; query `t` is at absolute
/// position `shape.pos0 + t` and sees keys `0..=shape.pos0 + t`. `shape.kv_len`,
/// `n_kv_heads` and `head_dim` must match `kv`.
///
/// # Panics
/// If the shapes disagree.
pub fn attention_causal_gqa_gemm(
    q: &[f32],
    kv: &AttentionKv,
    out: &mut [f32],
    shape: &AttentionShape,
) {
    let d = shape.head_dim;
    assert_eq!(
        shape.kv_len, kv.kv_len,
        "shape.kv_len must match the gathered kv"
    );
    assert_eq!(shape.n_kv_heads, kv.n_kv_heads, "n_kv_heads mismatch");
    assert_eq!(d, kv.head_dim, "head_dim mismatch");
    shape.validate_queries(q.len(), out.len());
    let q_tok = shape.n_heads * d;
    let n = shape.n_tokens;
    if n == 0 || d == 0 {
        return;
    }
    let group = shape.n_heads / shape.n_kv_heads;
    // Keys past the last query of the block are masked for every row: skip them.
    let visible = shape.pos0 + n;
    let rows = n * group;
    let scale = shape.scale();
    let mut q_group = vec![0f32; rows * d];
    let mut scores = vec![0f32; rows * visible];
    let mut probs = vec![0f32; rows * shape.kv_len];
    let mut o_group = vec![0f32; rows * d];
    for g in 0..shape.n_kv_heads {
        // Row r = t * group + i holds query head g * group + i of token t.
        for t in 0..n {
            let src = t * q_tok + g * group * d;
            q_group[t * group * d..(t + 1) * group * d].copy_from_slice(&q[src..src + group * d]);
        }
        matmul_f32_packed_cols(&q_group, rows, &kv.keys[g], 0..visible, &mut scores);
        for r in 0..rows {
            let seen = shape.pos0 + r / group + 1;
            let s = &scores[r * visible..r * visible + seen];
            let p = &mut probs[r * shape.kv_len..(r + 1) * shape.kv_len];
            softmax_scaled(s, scale, &mut p[..seen]);
            p[seen..].fill(0.0);
        }
        matmul_f32_packed(&probs, rows, &kv.values_t[g], &mut o_group);
        for t in 0..n {
            let dst = t * q_tok + g * group * d;
            out[dst..dst + group * d].copy_from_slice(&o_group[t * group * d..(t + 1) * group * d]);
        }
    }
}

/// `out = softmax(scale * s)`, subtracting the maximum first. The exponentials are
/// written before they are summed: a running sum in the same loop would keep the
/// compiler from vectorizing it.
fn softmax_scaled(s: &[f32], scale: f32, out: &mut [f32]) {
    let max = max_f32(s) * scale;
    softmax_loop(s, scale, max, out);
}

widest! {
    fn softmax_loop(s: &[f32], scale: f32, max: f32, out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(s) {
            *o = exp_approx(v * scale - max);
        }
        normalize_lanes(out);
    }
}
