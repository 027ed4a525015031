//! The reference forward's operations that the kernels crate does not have, each built
//! to reduce exactly to the kernel it extends: RoPE with a position scale and
//! per-frequency factors, attention through a sliding window, GELU(tanh)-GLU, per-head
//! RMSNorm and bias adds.

use hetsched_kernels::{AttentionShape, RopeStyle, attention_causal_gqa, rms_norm};

/// RoPE as [`hetsched_kernels::rope`] computes it (angles in f64), pair `i` turning by
/// `position · freqs[i]` ([`crate::LlamaConfig::rope_frequencies`]: the base's powers,
/// scaled linearly and divided by Llama-3's factors). `x` is `[tokens, heads, head_dim]`
/// at positions `0..tokens`, with `head_dim = 2 · freqs.len()`.
pub fn rope_at_frequencies(x: &mut [f32], heads: usize, style: RopeStyle, freqs: &[f64]) {
    let half = freqs.len();
    let head_dim = 2 * half;
    for (pos, token) in x.chunks_exact_mut(heads * head_dim).enumerate() {
        for head in token.chunks_exact_mut(head_dim) {
            for (i, &freq) in freqs.iter().enumerate() {
                let (sin, cos) = (pos as f64 * freq).sin_cos();
                let (ia, ib) = match style {
                    RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                    RopeStyle::HalfSplit => (i, i + half),
                };
                let (a, b) = (f64::from(head[ia]), f64::from(head[ib]));
                head[ia] = (a * cos - b * sin) as f32;
                head[ib] = (a * sin + b * cos) as f32;
            }
        }
    }
}

/// Causal GQA attention of `n` tokens in which token `t` attends to keys
/// `max(0, t + 1 − window) ..= t` (llama.cpp's standard sliding window; `usize::MAX`
/// for none): the kernel's reference attention, run on each query's window of keys.
pub fn attention_windowed(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &AttentionShape,
    window: usize,
) -> Vec<f32> {
    let n = shape.n_tokens;
    let (qw, kw) = (
        shape.n_heads * shape.head_dim,
        shape.n_kv_heads * shape.head_dim,
    );
    let mut out = vec![0f32; n * qw];
    let full = n.min(window);
    let head = AttentionShape {
        n_tokens: full,
        kv_len: full,
        ..*shape
    };
    attention_causal_gqa(
        &q[..full * qw],
        &k[..full * kw],
        &v[..full * kw],
        &mut out[..full * qw],
        &head,
    );
    for t in full..n {
        let first = t + 1 - window;
        let one = AttentionShape {
            n_tokens: 1,
            pos0: window - 1,
            kv_len: window,
            ..*shape
        };
        attention_causal_gqa(
            &q[t * qw..(t + 1) * qw],
            &k[first * kw..(t + 1) * kw],
            &v[first * kw..(t + 1) * kw],
            &mut out[t * qw..(t + 1) * qw],
            &one,
        );
    }
    out
}

/// `gelu(gate) ⊙ up` with GELU's tanh approximation (ggml's `ggml_gelu`).
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let gelu = 0.5 * g * (1.0 + (SQRT_2_OVER_PI * g * (1.0 + 0.044_715 * g * g)).tanh());
        *o = gelu * u;
    }
}

/// RMSNorm of every head of `x` (`[tokens, heads, head_dim]`) with `weight`
/// (`[head_dim]`), in place.
pub fn rms_norm_heads(x: &mut [f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    let input = x.to_vec();
    rms_norm(&input, weight, eps, x, input.len() / d, d);
}

/// Adds `bias` (`[width]`) to every row of `x` (`[rows, width]`).
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetsched_kernels::{rope, seeded::SeededRng};

    /// `base^(−2i/d) · scale / factor`, as the config computes them.
    fn freqs(d: usize, scale: f64, factor: f64) -> Vec<f64> {
        (0..d / 2)
            .map(|i| 1e4f64.powf(-2.0 * i as f64 / d as f64) * scale / factor)
            .collect()
    }

    #[test]
    fn unscaled_rope_is_the_kernel() {
        let mut rng = SeededRng::new(3);
        for style in [RopeStyle::Adjacent, RopeStyle::HalfSplit] {
            let x = rng.f32s(5 * 2 * 8);
            let (mut a, mut b) = (x.clone(), x.clone());
            rope_at_frequencies(&mut a, 2, style, &freqs(8, 1.0, 1.0));
            rope(&mut b, &[0, 1, 2, 3, 4], 2, 8, 1e4, style);
            assert_eq!(a, b);
            // Half the frequencies at position 2p equal the base's at position p.
            let mut half = x.clone();
            rope_at_frequencies(&mut half, 2, style, &freqs(8, 1.0, 2.0));
            let mut p1 = x[2 * 16..3 * 16].to_vec();
            rope(&mut p1, &[1], 2, 8, 1e4, style);
            for (h, p) in half[2 * 16..3 * 16].iter().zip(&p1) {
                assert!((h - p).abs() < 1e-6);
            }
            assert_ne!(half, a);
        }
    }

    #[test]
    fn a_window_wider_than_the_prompt_is_plain_causal_attention() {
        let mut rng = SeededRng::new(4);
        let shape = AttentionShape {
            n_tokens: 6,
            pos0: 0,
            kv_len: 6,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
        };
        let (q, k, v) = (rng.f32s(6 * 8), rng.f32s(6 * 4), rng.f32s(6 * 4));
        let mut plain = vec![0f32; 6 * 8];
        attention_causal_gqa(&q, &k, &v, &mut plain, &shape);
        assert_eq!(attention_windowed(&q, &k, &v, &shape, usize::MAX), plain);
        assert_eq!(attention_windowed(&q, &k, &v, &shape, 6), plain);
        // Window 1: every token sees only its own value.
        let one = attention_windowed(&q, &k, &v, &shape, 1);
        for t in 0..6 {
            for h in 0..2 {
                for (o, w) in one[t * 8 + h * 4..t * 8 + h * 4 + 4]
                    .iter()
                    .zip(&v[t * 4..t * 4 + 4])
                {
                    assert!((o - w).abs() < 1e-6);
                }
            }
        }
        // Window 3: token 5 sees keys 3..=5 only, token 2 keys 0..=2: changing key 0
        // changes token 2's row and leaves token 5's alone.
        let w3 = attention_windowed(&q, &k, &v, &shape, 3);
        let mut k2 = k.clone();
        k2[..4].iter_mut().for_each(|x| *x += 1.0);
        let w3b = attention_windowed(&q, &k2, &v, &shape, 3);
        assert_eq!(w3[5 * 8..], w3b[5 * 8..]);
        assert_ne!(w3[2 * 8..3 * 8], w3b[2 * 8..3 * 8]);
    }

    #[test]
    fn gelu_known_values() {
        let mut out = [0f32; 3];
        gelu_tanh_mul(&[0.0, 1.0, -1.0], &[1.0, 2.0, 1.0], &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 2.0 * 0.841_192).abs() < 1e-5, "{}", out[1]);
        assert!((out[2] + 0.158_808).abs() < 1e-5, "{}", out[2]);
    }
}
