//! Rotary position embedding (RoPE).

/// Which dimensions of a head form the rotated pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Pairs `(x[2i], x[2i + 1])`: llama.cpp rope type NORM, used by the LLAMA
    /// architecture on GGUF-converted weights (the converter permutes Q/K).
    Adjacent,
    /// Pairs `(x[i], x[i + head_dim / 2])`: llama.cpp NEOX style, the layout
    /// of Hugging Face `rotate_half` on unpermuted weights.
    HalfSplit,
}

/// Scalar reference RoPE, in place.
///
/// * `x`: row-major `[tokens, n_heads, head_dim]`, where
///   `tokens = positions.len()`.
/// * `positions[t]`: absolute position of token `t`.
/// * `theta_base`: RoPE base (1e5 for SmolLM2, 1e4 for the original llama).
///
/// Pair `i` (of `head_dim / 2`) of every head at position `p` is rotated by
/// angle `p * theta_base^(-2i / head_dim)`:
/// `(a, b) -> (a cos - b sin, a sin + b cos)`; see [`RopeStyle`] for which
/// elements form the pair. Angles and rotations are computed in f64. All of
/// `head_dim` is rotated (llama's `n_rot == head_dim`).
///
/// # Panics
/// If `x.len() != positions.len() * n_heads * head_dim` or `head_dim` is odd.
pub fn rope(
    x: &mut [f32],
    positions: &[usize],
    n_heads: usize,
    head_dim: usize,
    theta_base: f32,
    style: RopeStyle,
) {
    assert_eq!(head_dim % 2, 0, "head_dim must be even");
    assert_eq!(
        x.len(),
        positions.len() * n_heads * head_dim,
        "x must be [tokens, n_heads, head_dim]"
    );
    if head_dim == 0 || n_heads == 0 {
        return;
    }
    let half = head_dim / 2;
    let base = f64::from(theta_base);
    let token_stride = n_heads * head_dim;
    for (token, &pos) in x.chunks_exact_mut(token_stride).zip(positions) {
        for head in token.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let freq = base.powf(-2.0 * i as f64 / head_dim as f64);
                let (sin, cos) = (pos as f64 * freq).sin_cos();
                let (ia, ib) = match style {
                    RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                    RopeStyle::HalfSplit => (i, i + half),
                };
                let a = f64::from(head[ia]);
                let b = f64::from(head[ib]);
                head[ia] = (a * cos - b * sin) as f32;
                head[ib] = (a * sin + b * cos) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 29 % 17) as f32 - 8.0) * 0.25)
            .collect()
    }

    #[test]
    fn position_zero_is_identity() {
        for style in [RopeStyle::Adjacent, RopeStyle::HalfSplit] {
            let orig = sample(2 * 3 * 8);
            let mut x = orig.clone();
            rope(&mut x, &[0, 0], 3, 8, 1e5, style);
            assert_eq!(x, orig, "{style:?}");
        }
    }

    #[test]
    fn preserves_pair_norms() {
        for style in [RopeStyle::Adjacent, RopeStyle::HalfSplit] {
            let orig = sample(3 * 2 * 64);
            let mut x = orig.clone();
            rope(&mut x, &[1, 17, 4000], 2, 64, 1e5, style);
            assert_ne!(x, orig);
            for (h0, h1) in orig.chunks(64).zip(x.chunks(64)) {
                for i in 0..32 {
                    let (a, b) = match style {
                        RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                        RopeStyle::HalfSplit => (i, i + 32),
                    };
                    let n0 = h0[a].hypot(h0[b]);
                    let n1 = h1[a].hypot(h1[b]);
                    assert!((n0 - n1).abs() < 1e-5, "{style:?} pair {i}: {n0} vs {n1}");
                }
            }
        }
    }

    #[test]
    fn first_pair_rotates_by_position_radians() {
        // Pair 0 has frequency base^0 = 1, so angle = position.
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope(&mut x, &[1], 1, 4, 1e4, RopeStyle::Adjacent);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6);
        assert!((x[1] - 1f32.sin()).abs() < 1e-6);
        // Pair 1 (elements 2, 3) has frequency 1e4^(-2/4) = 0.01.
        let mut y = vec![0.0, 0.0, 0.0, 2.0];
        rope(&mut y, &[3], 1, 4, 1e4, RopeStyle::Adjacent);
        assert!((y[2] - (-2.0 * 0.03f32.sin())).abs() < 1e-6, "{y:?}");
        assert!((y[3] - 2.0 * 0.03f32.cos()).abs() < 1e-6, "{y:?}");
        // HalfSplit pairs element 0 with element 2.
        let mut z = vec![1.0, 0.0, 0.0, 0.0];
        rope(&mut z, &[1], 1, 4, 1e4, RopeStyle::HalfSplit);
        assert!((z[0] - 1f32.cos()).abs() < 1e-6);
        assert_eq!(z[1], 0.0);
        assert!((z[2] - 1f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn styles_agree_up_to_the_converter_permutation() {
        // Adjacent index 2i <-> half-split index i, 2i+1 <-> i + d/2.
        let d = 16;
        let orig = sample(d);
        let mut adj = orig.clone();
        rope(&mut adj, &[5], 1, d, 1e5, RopeStyle::Adjacent);
        let mut perm = vec![0.0; d];
        for i in 0..d / 2 {
            perm[i] = orig[2 * i];
            perm[i + d / 2] = orig[2 * i + 1];
        }
        rope(&mut perm, &[5], 1, d, 1e5, RopeStyle::HalfSplit);
        for i in 0..d / 2 {
            assert!((perm[i] - adj[2 * i]).abs() < 1e-6);
            assert!((perm[i + d / 2] - adj[2 * i + 1]).abs() < 1e-6);
        }
    }

    #[test]
    fn dot_product_depends_only_on_relative_position() {
        let d = 64;
        let q = sample(d);
        let k: Vec<f32> = sample(d).iter().rev().copied().collect();
        let dot_at = |pq: usize, pk: usize| {
            let mut qq = q.clone();
            let mut kk = k.clone();
            rope(&mut qq, &[pq], 1, d, 1e5, RopeStyle::Adjacent);
            rope(&mut kk, &[pk], 1, d, 1e5, RopeStyle::Adjacent);
            qq.iter().zip(&kk).map(|(a, b)| a * b).sum::<f32>()
        };
        let d1 = dot_at(10, 3);
        let d2 = dot_at(107, 100);
        assert!((d1 - d2).abs() < 1e-3, "{d1} vs {d2}");
        assert!((dot_at(10, 3) - dot_at(10, 4)).abs() > 1e-3);
    }
}
