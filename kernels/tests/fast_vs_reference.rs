//! Property tests: every fast kernel variant available on this CPU against
//! its scalar reference, over random shapes (odd sizes included), random
//! column ranges and random data.

use hetsched_kernels::{
    F32Kernel, I8Kernel, PackedF32Weights, PackedI8Weights, gemm_i8_with, matmul_f32_with,
    reference,
};
use proptest::prelude::*;

/// Shape `(m, k, n)` plus a column range `start..end` within `0..n`.
fn shape_and_cols() -> impl Strategy<Value = (usize, usize, usize, usize, usize)> {
    (1usize..80, 1usize..200, 1usize..80).prop_flat_map(|(m, k, n)| {
        (Just(m), Just(k), Just(n), 0..=n)
            .prop_flat_map(|(m, k, n, s)| (Just(m), Just(k), Just(n), Just(s), s..=n))
    })
}

#[test]
fn report_skipped_variants() {
    for v in I8Kernel::ALL.into_iter().filter(|v| !v.is_available()) {
        println!("SKIP: i8 kernel {} not supported by this CPU", v.name());
    }
    for v in F32Kernel::ALL.into_iter().filter(|v| !v.is_available()) {
        println!("SKIP: f32 kernel {} not supported by this CPU", v.name());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn gemm_i8_variants_equal_reference(
        (m, k, n, c0, c1) in shape_and_cols(),
        seed in any::<u64>(),
    ) {
        let a: Vec<i8> = lcg_bytes(seed, m * k);
        let b: Vec<i8> = lcg_bytes(seed ^ 0xABCD, n * k);
        let mut want = vec![0i32; m * n];
        reference::gemm_i8_reference(&a, &b, &mut want, m, k, n);
        let packed = PackedI8Weights::pack(&b, n, k);
        let nc = c1 - c0;
        for kernel in I8Kernel::ALL.into_iter().filter(|v| v.is_available()) {
            let mut got = vec![i32::MIN; m * nc];
            gemm_i8_with(kernel, &a, m, &packed, c0..c1, &mut got);
            for i in 0..m {
                prop_assert_eq!(
                    &got[i * nc..(i + 1) * nc],
                    &want[i * n + c0..i * n + c1],
                    "{} m={} k={} n={} cols={}..{}", kernel.name(), m, k, n, c0, c1
                );
            }
        }
    }

    #[test]
    fn matmul_f32_variants_within_tolerance(
        (m, k, n, c0, c1) in shape_and_cols(),
        seed in any::<u64>(),
    ) {
        let a: Vec<f32> = lcg_bytes(seed, m * k).iter().map(|&v| f32::from(v) / 64.0).collect();
        let b: Vec<f32> = lcg_bytes(seed ^ 0x1234, n * k).iter().map(|&v| f32::from(v) / 100.0).collect();
        let mut want = vec![0f32; m * n];
        reference::matmul_f32(&a, &b, &mut want, m, k, n);
        let packed = PackedF32Weights::pack(&b, n, k);
        let nc = c1 - c0;
        for kernel in F32Kernel::ALL.into_iter().filter(|v| v.is_available()) {
            let mut got = vec![f32::NAN; m * nc];
            matmul_f32_with(kernel, &a, m, &packed, c0..c1, &mut got);
            for i in 0..m {
                for j in c0..c1 {
                    let mag: f32 = (0..k).map(|p| (a[i * k + p] * b[j * k + p]).abs()).sum();
                    let (g, w) = (got[i * nc + j - c0], want[i * n + j]);
                    prop_assert!(
                        (g - w).abs() <= 1e-4 * mag + f32::MIN_POSITIVE,
                        "{} m={} k={} n={} ({},{}): {} vs {}", kernel.name(), m, k, n, i, j, g, w
                    );
                }
            }
        }
    }

    #[test]
    fn quantize_dequantize_error_is_at_most_half_a_step(
        x in prop::collection::vec(-1e3f32..1e3, 1..300),
    ) {
        let s = reference::scale_for_max_abs(&x);
        let mut q = vec![0i8; x.len()];
        reference::quantize_per_tensor(&x, s, &mut q);
        prop_assert!(q.iter().all(|&v| v >= -127));
        let mut back = vec![0f32; x.len()];
        reference::dequantize(&q, s, &mut back);
        for (a, b) in x.iter().zip(&back) {
            prop_assert!((a - b).abs() <= 0.5 * s * 1.0001 + 1e-6, "{} vs {} (scale {})", a, b, s);
        }
    }
}

/// Deterministic bytes from a 64-bit LCG (top byte of each state).
fn lcg_bytes(seed: u64, len: usize) -> Vec<i8> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 56) as u8 as i8
        })
        .collect()
}
