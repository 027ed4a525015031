//! Causal grouped-query attention (GQA) over a KV cache.

/// Shapes of one [`attention_causal_gqa`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Number of query tokens in this chunk (`n`).
    pub n_tokens: usize,
    /// Absolute position of the first query token; query `t` is at `pos0 + t`.
    pub pos0: usize,
    /// Number of cached key/value positions; must be `>= pos0 + n_tokens`.
    pub kv_len: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads; must divide `n_heads`.
    pub n_kv_heads: usize,
    /// Dimension of every head.
    pub head_dim: usize,
}

impl AttentionShape {
    /// Softmax scale `1 / sqrt(head_dim)`.
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// KV head used by query head `h`: `h / (n_heads / n_kv_heads)`.
    pub fn kv_head_of(&self, h: usize) -> usize {
        h / (self.n_heads / self.n_kv_heads)
    }

    /// Checks the head grouping, the positions and the query/output lengths (the caches
    /// are checked by each kernel against its own layout).
    pub(crate) fn validate_queries(&self, q: usize, out: usize) {
        assert!(
            self.n_kv_heads > 0 && self.n_heads.is_multiple_of(self.n_kv_heads),
            "n_kv_heads must divide n_heads"
        );
        assert!(
            self.kv_len >= self.pos0 + self.n_tokens,
            "kv_len must be >= pos0 + n_tokens"
        );
        let q_len = self.n_tokens * self.n_heads * self.head_dim;
        assert_eq!(q, q_len, "q must be [n_tokens, n_heads, head_dim]");
        assert_eq!(out, q_len, "out must be [n_tokens, n_heads, head_dim]");
    }

    fn validate(&self, q: usize, k: usize, v: usize, out: usize) {
        self.validate_queries(q, out);
        let kv = self.kv_len * self.n_kv_heads * self.head_dim;
        assert_eq!(k, kv, "k_cache must be [kv_len, n_kv_heads, head_dim]");
        assert_eq!(v, kv, "v_cache must be [kv_len, n_kv_heads, head_dim]");
    }
}

/// Scalar reference causal GQA attention for a chunk of query tokens.
///
/// * `q`: row-major `[n_tokens, n_heads, head_dim]` (RoPE already applied).
/// * `k_cache`, `v_cache`: row-major `[kv_len, n_kv_heads, head_dim]`; the
///   chunk's own keys/values must already be written at positions
///   `pos0..pos0 + n_tokens`.
/// * `out`: row-major `[n_tokens, n_heads, head_dim]`, overwritten.
///
/// Query token `t` sits at absolute position `p = pos0 + t` and attends to
/// keys `0..=p` (causal mask; later cache entries are ignored). Head `h`
/// reads KV head [`AttentionShape::kv_head_of`]`(h)`. Scores are
/// `scale * q·k` with [`AttentionShape::scale`]; the softmax subtracts the
/// row maximum. Everything is accumulated in f64.
///
/// # Panics
/// If the shape is inconsistent (see [`AttentionShape`]) or a slice length
/// does not match it.
pub fn attention_causal_gqa(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
    shape: &AttentionShape,
) {
    shape.validate(q.len(), k_cache.len(), v_cache.len(), out.len());
    let d = shape.head_dim;
    let scale = f64::from(shape.scale());
    let q_tok = shape.n_heads * d;
    let kv_tok = shape.n_kv_heads * d;
    let mut scores = vec![0f64; shape.kv_len];
    let mut acc = vec![0f64; d];
    for t in 0..shape.n_tokens {
        let p = shape.pos0 + t;
        for h in 0..shape.n_heads {
            let g = shape.kv_head_of(h);
            let q_vec = &q[t * q_tok + h * d..t * q_tok + (h + 1) * d];
            let mut max = f64::NEG_INFINITY;
            for (j, s) in scores[..=p].iter_mut().enumerate() {
                let k_vec = &k_cache[j * kv_tok + g * d..j * kv_tok + (g + 1) * d];
                let dot: f64 = q_vec
                    .iter()
                    .zip(k_vec)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                *s = dot * scale;
                max = max.max(*s);
            }
            let mut denom = 0f64;
            acc.fill(0.0);
            for (j, &s) in scores[..=p].iter().enumerate() {
                let w = (s - max).exp();
                denom += w;
                let v_vec = &v_cache[j * kv_tok + g * d..j * kv_tok + (g + 1) * d];
                for (a, &v) in acc.iter_mut().zip(v_vec) {
                    *a += w * f64::from(v);
                }
            }
            let o = &mut out[t * q_tok + h * d..t * q_tok + (h + 1) * d];
            for (o, &a) in o.iter_mut().zip(&acc) {
                *o = (a / denom) as f32;
            }
        }
    }
}

/// [`attention_causal_gqa`] through a sliding window (Gemma 3's local layers): the query at
/// position `p` attends to keys `max(0, p + 1 - window) ..= p` only, each query computed
/// by [`attention_causal_gqa`] over its own keys.
///
/// # Panics
/// As [`attention_causal_gqa`].
pub fn attention_windowed_gqa(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
    shape: &AttentionShape,
    window: usize,
) {
    shape.validate(q.len(), k_cache.len(), v_cache.len(), out.len());
    let (row, kv_row) = (
        shape.n_heads * shape.head_dim,
        shape.n_kv_heads * shape.head_dim,
    );
    for (t, (query, out)) in q.chunks(row).zip(out.chunks_mut(row)).enumerate() {
        let pos = shape.pos0 + t;
        let first = (pos + 1).saturating_sub(window);
        let one = AttentionShape {
            n_tokens: 1,
            pos0: pos - first,
            kv_len: pos + 1 - first,
            ..*shape
        };
        let span = first * kv_row..(pos + 1) * kv_row;
        attention_causal_gqa(query, &k_cache[span.clone()], &v_cache[span], out, &one);
    }
}

/// One head's attention scores over cached keys, the twin of
/// [`crate::attention_decode::scaled_dots`]: `out[j] = scale · Σ_i q[i] · key_j[i]` with
/// `key_j` the `q.len()` values at `j · stride + offset`, summed left to right.
///
/// # Panics
/// If `rows` is not `out.len()` rows of `stride` or a head at `offset` overruns a row.
pub fn scaled_dots(
    q: &[f32],
    rows: &[f32],
    stride: usize,
    offset: usize,
    scale: f32,
    out: &mut [f32],
) {
    crate::attention_decode::check_rows(rows, out.len(), stride, offset, q.len());
    for (j, o) in out.iter_mut().enumerate() {
        let key = &rows[j * stride + offset..j * stride + offset + q.len()];
        *o = scale * q.iter().zip(key).map(|(a, b)| a * b).sum::<f32>();
    }
}

/// One head's probability-weighted values, the twin of
/// [`crate::attention_decode::add_weighted_rows`]: `acc[i] += Σ_j p[j] · value_j[i]` with
/// `value_j` the `acc.len()` values at `j · stride + offset`, rows in order.
///
/// # Panics
/// If `rows` is not `p.len()` rows of `stride` or a head at `offset` overruns a row.
pub fn add_weighted_rows(p: &[f32], rows: &[f32], stride: usize, offset: usize, acc: &mut [f32]) {
    crate::attention_decode::check_rows(rows, p.len(), stride, offset, acc.len());
    for (j, &p) in p.iter().enumerate() {
        for (i, a) in acc.iter_mut().enumerate() {
            *a += p * rows[j * stride + offset + i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(len: usize, mul: usize, off: f32) -> Vec<f32> {
        (0..len)
            .map(|i| (i * mul % 23) as f32 * 0.1 - off)
            .collect()
    }

    #[test]
    fn single_key_returns_its_value() {
        let shape = AttentionShape {
            n_tokens: 1,
            pos0: 0,
            kv_len: 1,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
        };
        let q = seq(8, 5, 1.0);
        let k = seq(4, 3, 0.5);
        let v = [1.5, -2.0, 0.25, 7.0];
        let mut out = vec![0.0; 8];
        attention_causal_gqa(&q, &k, &v, &mut out, &shape);
        assert_eq!(&out[..4], &v);
        assert_eq!(&out[4..], &v);
    }

    #[test]
    fn hand_computed_softmax_weights() {
        // head_dim 4, scale 1/2. q = [2 ln 3, 0, 0, 0]; k0 = 0, k1 = e0.
        // Scores: 0 and ln 3 -> weights 1/4 and 3/4.
        let shape = AttentionShape {
            n_tokens: 1,
            pos0: 1,
            kv_len: 2,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 4,
        };
        let q = [2.0 * 3f32.ln(), 0.0, 0.0, 0.0];
        let k = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let v = [4.0, 0.0, 8.0, 0.0, 0.0, 4.0, 0.0, -8.0];
        let mut out = [0.0; 4];
        attention_causal_gqa(&q, &k, &v, &mut out, &shape);
        let want = [1.0, 3.0, 2.0, -6.0];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-5, "{out:?}");
        }
    }

    #[test]
    fn causal_mask_hides_future_keys() {
        // Two query tokens at positions 0 and 1, cache of 4 positions.
        let shape = AttentionShape {
            n_tokens: 2,
            pos0: 0,
            kv_len: 4,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 2,
        };
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = seq(8, 7, 0.3);
        let mut v = vec![10.0, 20.0, 30.0, 40.0, 0.0, 0.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        attention_causal_gqa(&q, &k, &v, &mut out, &shape);
        // Token 0 sees only key 0.
        assert_eq!(&out[..2], &[10.0, 20.0]);
        // Changing future entries (positions 2, 3) changes nothing.
        v[4..].copy_from_slice(&[1e6, -1e6, 5e5, 3e3]);
        let mut out2 = [0.0; 4];
        attention_causal_gqa(&q, &k, &v, &mut out2, &shape);
        assert_eq!(out, out2);
        // Token 1 mixes keys 0 and 1 only: strictly between the two values.
        assert!(out[2] > 10.0 && out[2] < 30.0 && out[3] > 20.0 && out[3] < 40.0);
    }

    #[test]
    fn gqa_head_mapping() {
        // 4 query heads, 2 KV heads: heads 0,1 -> kv 0; heads 2,3 -> kv 1.
        let shape = AttentionShape {
            n_tokens: 1,
            pos0: 1,
            kv_len: 2,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 2,
        };
        assert_eq!(
            (0..4).map(|h| shape.kv_head_of(h)).collect::<Vec<_>>(),
            [0, 0, 1, 1]
        );
        let q = vec![0.0; 8]; // uniform weights over both keys
        let k = seq(8, 3, 0.0);
        // v[pos][kv_head] = [a, b]
        let v = [1.0, 1.0, 100.0, 100.0, 3.0, 3.0, 300.0, 300.0];
        let mut out = [0.0; 8];
        attention_causal_gqa(&q, &k, &v, &mut out, &shape);
        assert_eq!(out, [2.0, 2.0, 2.0, 2.0, 200.0, 200.0, 200.0, 200.0]);
    }

    #[test]
    fn stable_for_huge_scores() {
        let shape = AttentionShape {
            n_tokens: 1,
            pos0: 1,
            kv_len: 2,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 1,
        };
        let q = [1e4];
        let k = [1e4, -1e4];
        let v = [5.0, -5.0];
        let mut out = [0.0];
        attention_causal_gqa(&q, &k, &v, &mut out, &shape);
        assert_eq!(out, [5.0]);
    }

    #[test]
    fn chunked_prefill_matches_whole_prefill() {
        let (n_heads, n_kv, d, total) = (6, 2, 8, 7);
        let q = seq(total * n_heads * d, 11, 1.1);
        let k = seq(total * n_kv * d, 13, 1.2);
        let v = seq(total * n_kv * d, 17, 0.9);
        let whole = AttentionShape {
            n_tokens: total,
            pos0: 0,
            kv_len: total,
            n_heads,
            n_kv_heads: n_kv,
            head_dim: d,
        };
        let mut out = vec![0.0; q.len()];
        attention_causal_gqa(&q, &k, &v, &mut out, &whole);
        // Tokens 3..7 as a second chunk over the same cache.
        let chunk = AttentionShape {
            n_tokens: 4,
            pos0: 3,
            ..whole
        };
        let tok = n_heads * d;
        let mut out_chunk = vec![0.0; 4 * tok];
        attention_causal_gqa(&q[3 * tok..], &k, &v, &mut out_chunk, &chunk);
        assert_eq!(&out[3 * tok..], &out_chunk[..]);
    }

    #[test]
    #[should_panic(expected = "kv_len must be >= pos0 + n_tokens")]
    fn rejects_short_cache() {
        let shape = AttentionShape {
            n_tokens: 2,
            pos0: 1,
            kv_len: 2,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 1,
        };
        attention_causal_gqa(&[0.0; 2], &[0.0; 2], &[0.0; 2], &mut [0.0; 2], &shape);
    }
}
