//! The optional steps of a model family's decoder layer (`import/src/family.rs`) as the
//! executor runs them, shared by the scheduled prefill ([`crate::StageRunner`]) and the
//! one-token decode step (their weights are `weights/family.rs`'s): the embedding scale, QKV
//! biases, per-head QK-norm, post-norms and the gated activation. Each reduces to
//! nothing for the llama row, whose layers carry none of these weights.

use hetsched_import::{Activation, EmbeddingScale, LlamaConfig};
use hetsched_kernels::{gelu_tanh_mul_fast, rms_norm, silu_mul_fast};

use super::blocks::{ELEMENTS_PER_BLOCK, for_each_block};
use super::weights::ExecModel;

/// Multiplies embedded rows by the family's embedding scale (√hidden for Gemma).
pub fn scale_embeddings(config: &LlamaConfig, x: &mut [f32]) {
    if config.family.embedding_scale == EmbeddingScale::SqrtHidden {
        let scale = (config.hidden as f32).sqrt();
        x.iter_mut().for_each(|v| *v *= scale);
    }
}

/// Adds `bias` (`[width]`) to every row of `x` (`[rows, width]`).
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len().max(1)) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// RMSNorm of every head of `x` (`[rows, heads, head_dim]`) with `weight`
/// (`[head_dim]`), in place.
pub fn norm_heads(x: &mut [f32], weight: &[f32], eps: f32) {
    let d = weight.len().max(1);
    let input = x.to_vec();
    rms_norm(&input, weight, eps, x, input.len() / d, d);
}

/// RMSNorm of rows of `x` (`[rows, weight.len()]`) with `weight`.
pub fn norm_rows(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    let cols = weight.len().max(1);
    rms_norm(x, weight, eps, &mut out, x.len() / cols, cols);
    out
}

/// `act(gate) ⊙ up` with the family's activation.
pub fn gated(activation: Activation, gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; gate.len()];
    gated_into(activation, gate, up, &mut out);
    out
}

/// [`gated`] into `out` (a decode step's buffer, kept across steps).
///
/// # Panics
/// If `gate`, `up` and `out` differ in length.
pub fn gated_into(activation: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "gate, up and out must have the same length"
    );
    // Element by element: blocks on several workers give the same values as one pass.
    let blocks = out
        .chunks_mut(ELEMENTS_PER_BLOCK)
        .zip(
            gate.chunks(ELEMENTS_PER_BLOCK)
                .zip(up.chunks(ELEMENTS_PER_BLOCK)),
        )
        .collect();
    for_each_block(blocks, |(out, (gate, up))| match activation {
        Activation::SiluGlu => silu_mul_fast(gate, up, out),
        Activation::GeluTanhGlu => gelu_tanh_mul_fast(gate, up, out),
    });
}

/// Queries after their projection is dequantized, up to RoPE: the bias, then the
/// per-head norm, where the layer has them (the decode step; the prefill runs them as
/// the separate [`crate::Step::Family`] steps the graph gives it).
pub fn finish_queries(model: &ExecModel, layer: usize, q: &mut [f32]) {
    let w = &model.layers[layer].family;
    if let Some([bq, _, _]) = &w.qkv_bias {
        add_bias(q, bq);
    }
    if let Some([nq, _]) = &w.qk_norm {
        norm_heads(q, nq, model.config.norm_eps);
    }
}

/// Keys and values of `positions` after their projections are dequantized, ready for
/// the cache: the biases, the keys' per-head norm, and RoPE with the layer's table.
pub fn finish_keys(
    model: &ExecModel,
    layer: usize,
    k: &mut [f32],
    v: &mut [f32],
    positions: std::ops::Range<usize>,
) {
    finish_keys_only(model, layer, k, positions);
    finish_values(model, layer, v);
}

/// The keys' half of [`finish_keys`]: bias, per-head norm, RoPE.
pub fn finish_keys_only(
    model: &ExecModel,
    layer: usize,
    k: &mut [f32],
    positions: std::ops::Range<usize>,
) {
    let w = &model.layers[layer].family;
    if let Some([_, bk, _]) = &w.qkv_bias {
        add_bias(k, bk);
    }
    if let Some([_, nk]) = &w.qk_norm {
        norm_heads(k, nk, model.config.norm_eps);
    }
    model
        .rope_of(layer)
        .apply(k, positions, model.config.n_kv_heads);
}

/// The values' half of [`finish_keys`]: the bias.
pub fn finish_values(model: &ExecModel, layer: usize, v: &mut [f32]) {
    if let Some([_, _, bv]) = &model.layers[layer].family.qkv_bias {
        add_bias(v, bv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_ops_on_known_values() {
        let mut x = [1.0, 2.0, 3.0, 4.0];
        add_bias(&mut x, &[10.0, 20.0]);
        assert_eq!(x, [11.0, 22.0, 13.0, 24.0]);
        // Two heads of two: each normalized on its own.
        let mut heads = [3.0, 4.0, 30.0, 40.0];
        norm_heads(&mut heads, &[1.0, 2.0], 0.0);
        let r = (12.5f32).sqrt();
        for (got, want) in heads.iter().zip([3.0 / r, 8.0 / r, 3.0 / r, 8.0 / r]) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
        let silu = gated(Activation::SiluGlu, &[0.0, 1.0], &[1.0, 2.0]);
        assert!((silu[1] - 2.0 * 0.731_058_6).abs() < 1e-5);
        let gelu = gated(Activation::GeluTanhGlu, &[0.0, 1.0], &[1.0, 2.0]);
        assert!((gelu[1] - 2.0 * 0.841_192).abs() < 1e-5);
    }

    #[test]
    fn gated_in_blocks_equals_one_call_bit_for_bit() {
        use hetsched_kernels::seeded::SeededRng;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (gate, up) = (
            SeededRng::new(3).f32s(128 * 1536),
            SeededRng::new(4).f32s(128 * 1536),
        );
        for activation in [Activation::SiluGlu, Activation::GeluTanhGlu] {
            let mut want = vec![0f32; gate.len()];
            match activation {
                Activation::SiluGlu => silu_mul_fast(&gate, &up, &mut want),
                Activation::GeluTanhGlu => gelu_tanh_mul_fast(&gate, &up, &mut want),
            }
            assert_eq!(pool.install(|| gated(activation, &gate, &up)), want);
        }
    }
}
