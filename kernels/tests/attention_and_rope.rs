//! The GEMM-based attention and the table RoPE against their scalar references, over
//! random shapes (odd sizes, GQA groups, chunks at an offset, token sub-blocks).

use hetsched_kernels::rope_table::PRECOMPUTED_POSITIONS;
use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{
    AttentionKv, AttentionShape, RopeStyle, RopeTable, attention_causal_gqa,
    attention_causal_gqa_gemm, rope,
};
use proptest::prelude::*;

/// Relative tolerance of the f32 attention against the f64 reference: outputs are convex
/// combinations of values, so the error is bounded by a few ulps of the value magnitude
/// times the softmax's f32 rounding.
const ATTENTION_TOL: f32 = 2e-5;
/// RoPE: f32 angles from f64 and two f32 multiply-adds.
const ROPE_TOL: f32 = 1e-5;

fn close(got: &[f32], want: &[f32], tol: f32) -> Result<(), String> {
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if (g - w).abs() > tol * scale {
            return Err(format!("element {i}: got {g}, want {w} (scale {scale})"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn gemm_attention_matches_reference(
        n_kv_heads in 1usize..4,
        group in 1usize..4,
        head_dim in prop::sample::select(vec![1usize, 2, 7, 16, 33, 64]),
        pos0 in 0usize..40,
        n_tokens in 1usize..40,
        extra in 0usize..5,
        block in 1usize..9,
        seed in any::<u64>(),
    ) {
        let n_heads = n_kv_heads * group;
        let kv_len = pos0 + n_tokens + extra;
        let mut rng = SeededRng::new(seed);
        let q = rng.f32s(n_tokens * n_heads * head_dim);
        let k = rng.f32s(kv_len * n_kv_heads * head_dim);
        let v = rng.f32s(kv_len * n_kv_heads * head_dim);
        let shape = AttentionShape { n_tokens, pos0, kv_len, n_heads, n_kv_heads, head_dim };
        let mut want = vec![0f32; q.len()];
        attention_causal_gqa(&q, &k, &v, &mut want, &shape);

        let kv = AttentionKv::gather(&k, &v, kv_len, n_kv_heads, head_dim);
        let mut got = vec![f32::NAN; q.len()];
        // Token blocks, as a caller splitting the work across threads does.
        let row = n_heads * head_dim;
        for (b, (qb, ob)) in q.chunks(block * row).zip(got.chunks_mut(block * row)).enumerate() {
            let sub = AttentionShape { n_tokens: qb.len() / row, pos0: pos0 + b * block, ..shape };
            attention_causal_gqa_gemm(qb, &kv, ob, &sub);
        }
        close(&got, &want, ATTENTION_TOL).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn rope_table_matches_reference(
        n_heads in 1usize..5,
        half in 1usize..40,
        start in 0usize..300,
        tokens in 1usize..20,
        adjacent in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let head_dim = 2 * half;
        let style = if adjacent { RopeStyle::Adjacent } else { RopeStyle::HalfSplit };
        let mut want = SeededRng::new(seed).f32s(tokens * n_heads * head_dim);
        let mut got = want.clone();
        let positions: Vec<usize> = (start..start + tokens).collect();
        rope(&mut want, &positions, n_heads, head_dim, 10_000.0, style);
        let table = RopeTable::new(head_dim, 10_000.0, style, start + tokens);
        table.apply(&mut got, start..start + tokens, n_heads);
        close(&got, &want, ROPE_TOL).map_err(TestCaseError::fail)?;
    }

    /// Positions across the end of the precomputed rotations (a long context) rotate as
    /// the reference does, and the table stays small.
    #[test]
    fn rope_table_past_its_precomputed_positions_matches_reference(
        offset in 0usize..8,
        tokens in 1usize..16,
        adjacent in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let (n_heads, head_dim) = (2, 16);
        let style = if adjacent { RopeStyle::Adjacent } else { RopeStyle::HalfSplit };
        let start = PRECOMPUTED_POSITIONS - offset;
        let mut want = SeededRng::new(seed).f32s(tokens * n_heads * head_dim);
        let mut got = want.clone();
        let positions: Vec<usize> = (start..start + tokens).collect();
        rope(&mut want, &positions, n_heads, head_dim, 10_000.0, style);
        let table = RopeTable::new(head_dim, 10_000.0, style, 1 << 20);
        prop_assert_eq!(table.max_positions(), 1 << 20);
        table.apply(&mut got, start..start + tokens, n_heads);
        close(&got, &want, ROPE_TOL).map_err(TestCaseError::fail)?;
    }
}
