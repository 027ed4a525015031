use super::*;
use crate::gemm_w4::grouped::tests::{assert_close, random_scales};
use crate::gemm_w4::tests::random_rows;
use crate::reference::matmul_f32;
use crate::seeded::SeededRng;

/// Random activations in −127..=127 (the kernels' domain).
fn random_activations(len: usize, seed: u64) -> Vec<i8> {
    let mut a = SeededRng::new(seed).i8s(len);
    a.iter_mut()
        .filter(|v| **v == i8::MIN)
        .for_each(|v| *v = -127);
    a
}

// `assert_close`: within 1e-5 of the largest |want|; here the f32 accumulation adds at
// most 12 exact products (k ≤ 1536), each rounding by at most 2⁻²⁴ of the running sum.

fn check_variant(kernel: I8Kernel) {
    if !kernel.is_available() {
        println!("SKIP: {} not supported by this CPU", kernel.name());
        return;
    }
    let mut seed = 1;
    for &m in &[1, 2, 3, 4, 5, 9, 70] {
        for &k in &[1, 31, 32, 33, 100, 128, 129, 200, 576, 1536] {
            for &n in &[1, 3, 16, 17, 33] {
                seed += 3;
                let a = random_activations(m * k, seed);
                let mut rows = random_rows(n, k, seed + 1000);
                rows.row_scales = random_scales(n, seed + 7);
                let scales = random_scales(m * act_groups(k), seed + 5);
                let mut want = vec![0f32; m * n];
                gemm_w4_g128_reference(&a, &scales, m, &rows, &mut want);
                let packed = PackedW4Weights::pack(&rows);
                let mut scalar = vec![-1f32; m * n];
                gemm_w4_g128_with(I8Kernel::Scalar, &a, &scales, m, &packed, 0..n, &mut scalar);
                let what = format!("{} m={m} k={k} n={n}", kernel.name());
                assert_close(&scalar, &want, &what);
                let mut got = vec![-1f32; m * n];
                gemm_w4_g128_with(kernel, &a, &scales, m, &packed, 0..n, &mut got);
                // Same operations in the same order: bit-identical to the scalar kernel.
                assert_eq!(got, scalar, "{what}");
            }
        }
    }
}

#[test]
fn scalar_matches_reference() {
    check_variant(I8Kernel::Scalar);
}

#[test]
fn avx2_matches_scalar_bit_for_bit() {
    check_variant(I8Kernel::Avx2);
}

#[test]
fn avx512_vnni_matches_scalar_bit_for_bit() {
    check_variant(I8Kernel::Avx512Vnni);
}

#[test]
fn extreme_values_are_exact_in_every_variant() {
    // ±127 activations with -8 weights and ±127 sub-scales: a group product of -32 512
    // (the i16 edge the VNNI kernel relies on), four of them per activation group times
    // 127 (just under 2²⁴, still exact in f32); k = 1536 as the FFN down, 576 = 4.5
    // activation groups as SmolLM2's hidden width; one row (the decode kernel) and several.
    for (k, m) in [(1536, 5), (576, 5), (1536, 1), (576, 1)] {
        let n = 19;
        for (av, qv, s) in [(127i8, -8i8, 127i8), (-127, -8, -127), (127, 7, -127)] {
            let a = vec![av; m * k];
            let rows = W4Rows {
                n,
                k,
                q: vec![qv; n * k],
                sub_scales: vec![s; n * k / GROUP_K],
                row_scales: vec![0.5; n],
            };
            let scales = vec![0.25f32; m * act_groups(k)];
            let mut want = vec![0f32; m * n];
            gemm_w4_g128_reference(&a, &scales, m, &rows, &mut want);
            let expected = 0.5 * 0.25 * f32::from(s) * (k as f32) * f32::from(av) * f32::from(qv);
            assert!(want.iter().all(|&v| v == expected), "{av} {qv} {s}");
            let packed = PackedW4Weights::pack(&rows);
            for kernel in I8Kernel::ALL.into_iter().filter(|v| v.is_available()) {
                let mut got = vec![0f32; m * n];
                gemm_w4_g128_with(kernel, &a, &scales, m, &packed, 0..n, &mut got);
                assert_eq!(got, want, "{} k={k} {av} {qv} {s}", kernel.name());
            }
        }
    }
}

#[test]
#[should_panic(expected = "-127..=127")]
fn an_activation_of_minus_128_is_refused() {
    let rows = random_rows(16, 32, 3);
    let packed = PackedW4Weights::pack(&rows);
    let mut a = vec![1i8; 32];
    a[9] = i8::MIN;
    let mut out = vec![0f32; 16];
    gemm_w4_g128(&a, &[0.5], 1, &packed, &mut out);
}

#[test]
fn one_row_at_the_model_shapes_matches_scalar_bit_for_bit() {
    // The one-row kernel (a decode step's) over SmolLM2-135M's shapes, whole and in the
    // column tasks a decode step splits them into (ragged, not block-aligned).
    for (k, n, seed) in [(576, 1536, 1), (1536, 576, 2), (576, 576, 3), (576, 192, 4)] {
        let a = random_activations(k, seed);
        let mut rows = random_rows(n, k, seed + 10);
        rows.row_scales = random_scales(n, seed + 20);
        let scales = random_scales(act_groups(k), seed + 30);
        let packed = PackedW4Weights::pack(&rows);
        for cols in [0..n, 5..37, 100..n - 3, n - 1..n] {
            let mut scalar = vec![0f32; cols.len()];
            let c = cols.clone();
            gemm_w4_g128_with(I8Kernel::Scalar, &a, &scales, 1, &packed, c, &mut scalar);
            for kernel in I8Kernel::ALL.into_iter().filter(|v| v.is_available()) {
                let mut got = vec![-1f32; cols.len()];
                gemm_w4_g128_with(kernel, &a, &scales, 1, &packed, cols.clone(), &mut got);
                assert_eq!(got, scalar, "{} k={k} n={n} {cols:?}", kernel.name());
            }
        }
    }
}

#[test]
fn column_ranges_are_tiles_of_the_full_product() {
    let (m, k, n) = (6, 288, 70);
    let a = random_activations(m * k, 2);
    let rows = random_rows(n, k, 4);
    let scales = random_scales(m * act_groups(k), 9);
    let packed = PackedW4Weights::pack(&rows);
    let mut full = vec![0f32; m * n];
    gemm_w4_g128(&a, &scales, m, &packed, &mut full);
    for cols in [0..16, 5..37, 33..70, 69..70, 20..20] {
        let mut tile = vec![0f32; m * cols.len()];
        gemm_w4_g128_cols(&a, &scales, m, &packed, cols.clone(), &mut tile);
        for r in 0..m {
            let want = &full[r * n + cols.start..r * n + cols.end];
            assert_eq!(
                &tile[r * cols.len()..(r + 1) * cols.len()],
                want,
                "{cols:?}"
            );
        }
    }
}

#[test]
fn group_quantization_keeps_each_value_within_half_a_step() {
    let (m, k) = (3, 300);
    let mut x = SeededRng::new(8).f32s(m * k);
    x[5] = 300.0; // a massive activation costs its own group of 128 resolution
    x[k + 128..k + 256].fill(0.0); // an all-zero group
    let (q, scales) = quantize_groups128(&x, m, k);
    assert_eq!(scales.len(), m * 3);
    assert_eq!(scales[4], 0.0);
    assert!(q[k + 128..k + 256].iter().all(|&v| v == 0));
    assert_eq!(scales[0], 300.0 / 127.0);
    assert!(
        scales[1] < scales[0] / 50.0,
        "the next group keeps its resolution"
    );
    for (i, (&v, &qv)) in x.iter().zip(&q).enumerate() {
        let s = scales[(i / k) * 3 + (i % k) / ACT_GROUP_K];
        assert!(
            (v - f32::from(qv) * s).abs() <= 0.5 * s + 1e-6,
            "{i}: {v} {qv} {s}"
        );
        assert_ne!(qv, i8::MIN);
    }
}

#[test]
fn the_fast_quantizer_equals_the_reference_bit_for_bit() {
    for (m, k, seed) in [
        (1, 1, 1),
        (3, 31, 2),
        (2, 129, 3),
        (5, 100, 4),
        (4, 576, 5),
        (2, 1536, 6),
        (3, 1000, 7),
    ] {
        let mut x: Vec<f32> = SeededRng::new(seed)
            .f32s(m * k)
            .iter()
            .map(|v| v * 10f32.powi((seed % 5) as i32 - 2))
            .collect();
        // Ties, zeros, a massive value, non-finite values, a group whose largest value
        // sits in its last slice of 32 and one whose only finite value is negative.
        x[0] = 0.0;
        if m * k > 600 {
            x[7] = 500.0;
            x[11] = f32::NAN;
            x[12] = f32::INFINITY;
            x[33] = x[34] * 0.5;
            x[128 + 127] = -900.0;
            x[256..384].fill(f32::NAN);
            x[256 + 70] = -3.0;
            x[384 + 5] = f32::NEG_INFINITY;
        }
        let groups = m * k.div_ceil(ACT_GROUP_K);
        let (mut q, mut s) = (vec![0i8; m * k], vec![0f32; groups]);
        quantize_groups128_reference(&x, m, k, &mut q, &mut s);
        let (fast_q, fast_s) = quantize_groups128(&x, m, k);
        assert_eq!((fast_q, fast_s), (q, s), "m={m} k={k}");
    }
}

#[test]
fn matmul_equals_the_float_product_of_the_quantized_operands() {
    let (m, k, n) = (7, 576, 40);
    let mut x = SeededRng::new(12).f32s(m * k);
    x[3] = 200.0; // a massive activation, as SmolLM2's
    let w = SeededRng::new(13).f32s(n * k);
    let packed = PackedW4Weights::quantize(&w, n, k);
    let wq = packed.to_rows().dequantize();
    let (a, scales) = quantize_groups128(&x, m, k);
    let spans = act_groups(k);
    let xq: Vec<f32> = (0..m * k)
        .map(|i| f32::from(a[i]) * scales[(i / k) * spans + (i % k) / ACT_GROUP_K])
        .collect();
    let mut want = vec![0f32; m * n];
    matmul_f32(&xq, &wq, &mut want, m, k, n);
    let mut got = vec![0f32; m * n];
    matmul_w4a8_g128(&x, m, &packed, &mut got);
    for i in 0..m {
        for j in 0..n {
            let (g, q) = (got[i * n + j], want[i * n + j]);
            let mass: f32 = (0..k).map(|p| (xq[i * k + p] * wq[j * k + p]).abs()).sum();
            assert!((g - q).abs() <= 1e-5 * mass + 1e-6, "({i},{j}) {g} vs {q}");
        }
    }
}
