//! Causal GQA attention against `reference::attention_causal_gqa`:
//! |diff| <= 1e-5 · (max|v| + 0.1) per element for the f32 kernels, and
//! [`TENSOR_CORE_TOL`] · (max|v| + 0.1) for the tensor-core kernel (f16 Q, K, V and
//! probabilities), which runs where the device has KHR cooperative matrices.

mod common;

use hetsched_gpu::{AttentionShape, GpuError, GpuOptions};
use hetsched_kernels::{reference, seeded::SeededRng};

/// Error budget of the tensor-core kernel, relative to max|v| + 0.1: its inputs are rounded
/// to f16 (2^-11 relative), so scores of magnitude ~15 (this test's data) move by ~1e-2 and
/// the probabilities by as much, relative.
const TENSOR_CORE_TOL: f32 = 2e-2;

fn check(ctx: &hetsched_gpu::GpuContext, s: AttentionShape, seed: u64) {
    let mut rng = SeededRng::new(seed);
    let q: Vec<f32> = rng
        .f32s(s.n_tokens * s.n_heads * s.head_dim)
        .into_iter()
        .map(|x| x * 4.0)
        .collect();
    let kv = s.kv_len * s.n_kv_heads * s.head_dim;
    let k: Vec<f32> = rng.f32s(kv).into_iter().map(|x| x * 4.0).collect();
    let v = rng.f32s(kv);
    let got = ctx.attention_causal_gqa(&q, &k, &v, &s).unwrap();
    let mut want = vec![0.0; q.len()];
    reference::attention_causal_gqa(&q, &k, &v, &mut want, &s);
    let vmax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let tol = vec![vmax + 0.1; want.len()];
    let tensor = ctx.attention_on_tensor_cores(&s);
    let worst = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs() / (vmax + 0.1))
        .fold(0f32, f32::max);
    eprintln!("{s:?}: tensor cores {tensor}, max |diff| / (max|v| + 0.1) = {worst:.2e}");
    let rel = if tensor { TENSOR_CORE_TOL } else { 1e-5 };
    common::assert_close(&format!("{s:?}"), &got, &want, &tol, rel);
}

fn shape(
    n_tokens: usize,
    pos0: usize,
    kv_len: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
) -> AttentionShape {
    AttentionShape {
        n_tokens,
        pos0,
        kv_len,
        n_heads,
        n_kv_heads,
        head_dim,
    }
}

#[test]
fn matches_reference_with_past_offset_and_gqa() {
    let Some(ctx) = common::gpu() else { return };
    // Where the default context runs the tensor-core kernel, the f32 kernels (the
    // reference path) are checked too, through a context that asks for them.
    let f32_ctx = ctx
        .attention_on_tensor_cores(&shape(64, 0, 64, 1, 1, 64))
        .then(|| {
            common::gpu_with(GpuOptions {
                f32_attention: true,
                ..Default::default()
            })
        })
        .flatten();
    // First chunk, later chunk with a past, cache longer than needed (ignored future), SmolLM2
    // heads (9 q / 3 kv / 64), odd head dims, one token, more than 64 keys per block.
    for (i, s) in [
        shape(1, 0, 1, 1, 1, 1),
        shape(7, 0, 7, 4, 2, 8),
        shape(5, 60, 70, 9, 3, 64),
        shape(33, 100, 200, 9, 3, 64),
        shape(40, 17, 57, 9, 3, 64),
        shape(20, 0, 20, 4, 4, 128),
        shape(3, 2, 5, 6, 1, 130),
        shape(2, 250, 252, 2, 2, 256),
        // The flash kernel (head_dim <= 64): several 32-query blocks over many 32-key
        // blocks, a ragged last block of each, head dims off its vec4s.
        shape(100, 300, 400, 9, 3, 64),
        shape(70, 0, 70, 2, 1, 48),
        shape(65, 31, 96, 3, 3, 6),
        // The tensor-core kernel: ragged 64-query blocks over 16 key blocks (one range), and
        // its key split (3 ranges of 64-key blocks, the last ragged, merged by the last
        // workgroup of each query block).
        shape(130, 900, 1030, 9, 3, 64),
        shape(20, 4000, 4020, 3, 1, 64),
    ]
    .into_iter()
    .enumerate()
    {
        check(ctx, s, 30 + i as u64);
        if let Some(f32_ctx) = &f32_ctx {
            check(f32_ctx, s, 30 + i as u64);
        }
    }
}

/// Windowed attention against `reference::attention_windowed_gqa`: the plain kernel for a chunk (head dims 64 and 256), the
/// decode kernel for a few tokens (its runs of 64 keys split so that some runs lie wholly
/// before the window and see no key), windows of one key and wider than the cache.
#[test]
fn windowed_matches_the_reference_on_each_querys_keys() {
    let Some(ctx) = common::gpu() else { return };
    for (i, (n_tokens, pos0, head_dim, window)) in [
        (20, 13, 64, 5),
        (20, 0, 256, 8),
        (9, 40, 16, 1),
        (3, 300, 64, 70),
        (2, 200, 256, 1000),
    ]
    .into_iter()
    .enumerate()
    {
        let (n_heads, n_kv_heads) = (4, 2);
        let kv_len = pos0 + n_tokens;
        let s = shape(n_tokens, pos0, kv_len, n_heads, n_kv_heads, head_dim);
        let mut rng = SeededRng::new(70 + i as u64);
        let q: Vec<f32> = rng.f32s(n_tokens * n_heads * head_dim);
        let kv_row = n_kv_heads * head_dim;
        let k: Vec<f32> = rng
            .f32s(kv_len * kv_row)
            .into_iter()
            .map(|x| x * 4.0)
            .collect();
        let v = rng.f32s(kv_len * kv_row);
        let got = ctx
            .attention_causal_gqa_windowed(&q, (&k, &v), &s, window)
            .unwrap();
        let mut want = vec![0.0; q.len()];
        reference::attention_windowed_gqa(&q, &k, &v, &mut want, &s, window);
        let vmax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let tol = vec![vmax + 0.1; want.len()];
        common::assert_close(&format!("{s:?} window {window}"), &got, &want, &tol, 1e-5);
    }
}

#[test]
fn rejects_bad_shapes() {
    let Some(ctx) = common::gpu() else { return };
    let s = AttentionShape {
        n_tokens: 2,
        pos0: 1,
        kv_len: 2,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 1,
    };
    let err = ctx
        .attention_causal_gqa(&[0.0; 2], &[0.0; 2], &[0.0; 2], &s)
        .unwrap_err();
    assert!(err.to_string().contains("kv_len"), "{err}");
    let s = AttentionShape {
        n_tokens: 1,
        pos0: 0,
        kv_len: 1,
        n_heads: 3,
        n_kv_heads: 2,
        head_dim: 1,
    };
    assert!(matches!(
        ctx.attention_causal_gqa(&[0.0; 3], &[0.0; 2], &[0.0; 2], &s),
        Err(GpuError::Shape { .. })
    ));
    let s = AttentionShape {
        n_tokens: 1,
        pos0: 0,
        kv_len: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 300,
    };
    assert!(
        ctx.attention_causal_gqa(&[0.0; 300], &[0.0; 300], &[0.0; 300], &s)
            .is_err()
    );
}
