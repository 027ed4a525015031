//! The flash-style AVX-512 attention against the scalar f64 reference, over random
//! shapes: GQA groups, head dimensions of one to four steps, chunks at an offset, token
//! blocks of any size (row groups cut mid-token), contexts across several key tiles.

use hetsched_kernels::reference;
use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{
    AttentionShape, FlashKeys, attention_causal_gqa, attention_causal_gqa_flash,
    attention_windowed_gqa_flash, flash_supported,
};
use proptest::prelude::*;

/// The GEMM kernel's tolerance (tests/attention_and_rope.rs): relative to the largest
/// output magnitude.
const ATTENTION_TOL: f32 = 2e-5;

fn close(got: &[f32], want: &[f32], tol: f32) -> Result<(), String> {
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let within = (g - w).abs() <= tol * scale; // false for NaN too
        if !within {
            return Err(format!("element {i}: got {g}, want {w} (scale {scale})"));
        }
    }
    Ok(())
}

/// The queries `q` of `shape` run through `kernel(q_block, out_block, block_shape)` in
/// token blocks of `block`, as the executor splits them (a block's `pos0` its first
/// token's); unwritten outputs stay NaN.
fn in_blocks(
    q: &[f32],
    shape: &AttentionShape,
    block: usize,
    kernel: impl Fn(&[f32], &mut [f32], &AttentionShape),
) -> Vec<f32> {
    let row = shape.n_heads * shape.head_dim;
    let mut got = vec![f32::NAN; q.len()];
    for (b, (qb, ob)) in q
        .chunks(block * row)
        .zip(got.chunks_mut(block * row))
        .enumerate()
    {
        let sub = AttentionShape {
            n_tokens: qb.len() / row,
            pos0: shape.pos0 + b * block,
            ..*shape
        };
        kernel(qb, ob, &sub);
    }
    got
}

fn check(shape: AttentionShape, block: usize, spread: f32, seed: u64) -> Result<(), String> {
    let mut rng = SeededRng::new(seed);
    let (n_heads, kv_heads, d) = (shape.n_heads, shape.n_kv_heads, shape.head_dim);
    let q: Vec<f32> = rng
        .f32s(shape.n_tokens * n_heads * d)
        .iter()
        .map(|v| v * spread)
        .collect();
    let k: Vec<f32> = rng
        .f32s(shape.kv_len * kv_heads * d)
        .iter()
        .map(|v| v * spread)
        .collect();
    let v = rng.f32s(shape.kv_len * kv_heads * d);
    let mut want = vec![0f32; q.len()];
    attention_causal_gqa(&q, &k, &v, &mut want, &shape);
    let keys = FlashKeys::gather(&k, shape.kv_len, kv_heads, d);
    let got = in_blocks(&q, &shape, block, |qb, ob, sub| {
        attention_causal_gqa_flash(qb, &keys, &v, ob, sub);
    });
    close(&got, &want, ATTENTION_TOL)
}

/// The windowed walk against the reference on each query's own window
/// (`reference::attention_windowed_gqa`: causal attention of the query over the keys
/// `max(0, p + 1 - window) ..= p`), with the keys gathered from the first one the chunk's first query sees.
fn check_windowed(
    shape: AttentionShape,
    window: usize,
    block: usize,
    seed: u64,
) -> Result<(), String> {
    let mut rng = SeededRng::new(seed);
    let (n_heads, kv_heads, d) = (shape.n_heads, shape.n_kv_heads, shape.head_dim);
    let q = rng.f32s(shape.n_tokens * n_heads * d);
    let k = rng.f32s(shape.kv_len * kv_heads * d);
    let v = rng.f32s(shape.kv_len * kv_heads * d);
    let mut want = vec![0f32; q.len()];
    reference::attention_windowed_gqa(&q, &k, &v, &mut want, &shape, window);
    let from = (shape.pos0 + 1).saturating_sub(window);
    let keys = FlashKeys::gather_from(&k, from, shape.kv_len, kv_heads, d);
    let got = in_blocks(&q, &shape, block, |qb, ob, sub| {
        attention_windowed_gqa_flash(qb, &keys, &v, ob, sub, window);
    });
    close(&got, &want, ATTENTION_TOL)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn windowed_flash_attention_matches_reference_on_each_window(
        n_kv_heads in 1usize..3,
        group in 1usize..5,
        pos0 in 0usize..150,
        n_tokens in 1usize..70,
        window in prop::sample::select(vec![1usize, 5, 31, 32, 33, 64, 100]),
        block in 1usize..40,
        seed in any::<u64>(),
    ) {
        // The kernel needs AVX-512: on a CPU without it there is nothing to compare (an
        // assumption would reject every case and fail the run).
        if !flash_supported(64) {
            return Ok(());
        }
        let shape = AttentionShape {
            n_tokens,
            pos0,
            kv_len: pos0 + n_tokens,
            n_heads: n_kv_heads * group,
            n_kv_heads,
            head_dim: 64,
        };
        check_windowed(shape, window, block, seed).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn flash_attention_matches_reference(
        n_kv_heads in 1usize..4,
        group in 1usize..5,
        steps in 1usize..5,
        pos0 in 0usize..100,
        n_tokens in 1usize..50,
        extra in 0usize..40,
        block in 1usize..20,
        spread in prop::sample::select(vec![0.1f32, 1.0, 4.0]),
        seed in any::<u64>(),
    ) {
        let head_dim = 64 * steps;
        if !flash_supported(head_dim) {
            return Ok(());
        }
        let shape = AttentionShape {
            n_tokens,
            pos0,
            kv_len: pos0 + n_tokens + extra,
            n_heads: n_kv_heads * group,
            n_kv_heads,
            head_dim,
        };
        check(shape, block, spread, seed).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn smollm2_chunk_at_a_long_context() {
    if !flash_supported(64) {
        println!("SKIP: no AVX-512 on this CPU");
        return;
    }
    // SmolLM2-135M heads, the last 128-token chunk of a 1000-token prompt, 16-token blocks.
    let shape = AttentionShape {
        n_tokens: 128,
        pos0: 872,
        kv_len: 1000,
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
    };
    check(shape, 16, 2.0, 5).unwrap();
}

#[test]
fn unsupported_head_dims_are_reported() {
    assert!(!flash_supported(0));
    assert!(!flash_supported(48));
    assert!(!flash_supported(100));
}
