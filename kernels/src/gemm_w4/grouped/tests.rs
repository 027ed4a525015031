use super::*;
use crate::gemm_w4::quant::GROUP_K;
use crate::gemm_w4::tests::random_rows;
use crate::reference::matmul_f32;
use crate::seeded::SeededRng;

pub(in crate::gemm_w4) fn random_scales(len: usize, seed: u64) -> Vec<f32> {
    SeededRng::new(seed)
        .f32s(len)
        .iter()
        .map(|v| v.abs() * 0.01 + 1e-4)
        .collect()
}

/// `got` equals `want` within f32 rounding of a sum of `terms` products.
pub(in crate::gemm_w4) fn assert_close(got: &[f32], want: &[f32], what: &str) {
    let scale = want.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * scale,
            "{what}: element {i}: {g} vs {w} (max {scale})"
        );
    }
}

fn check_variant(kernel: I8Kernel) {
    if !kernel.is_available() {
        println!("SKIP: {} not supported by this CPU", kernel.name());
        return;
    }
    let mut seed = 1;
    for &m in &[1, 2, 3, 4, 5, 9, 70] {
        for &k in &[1, 4, 31, 32, 33, 64, 100, 576] {
            for &n in &[1, 3, 16, 17, 33] {
                seed += 3;
                let a = SeededRng::new(seed).i8s(m * k);
                let mut rows = random_rows(n, k, seed + 1000);
                rows.row_scales = random_scales(n, seed + 7);
                let scales = random_scales(m * k.div_ceil(GROUP_K), seed + 5);
                let mut want = vec![0f32; m * n];
                gemm_w4_grouped_reference(&a, &scales, m, &rows, &mut want);
                let packed = PackedW4Weights::pack(&rows);
                let mut scalar = vec![-1f32; m * n];
                gemm_w4_grouped_with(I8Kernel::Scalar, &a, &scales, m, &packed, 0..n, &mut scalar);
                let what = format!("{} m={m} k={k} n={n}", kernel.name());
                assert_close(&scalar, &want, &what);
                let mut got = vec![-1f32; m * n];
                gemm_w4_grouped_with(kernel, &a, &scales, m, &packed, 0..n, &mut got);
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
fn extreme_values_agree_in_every_variant() {
    // -128 activations with -8 weights and ±127 sub-scales: the largest group products
    // (32 · 128 · 8 · 127 < 2²⁴, still exact in f32); k = 1536 as the FFN down; one row
    // (the decode kernel) and several.
    let (k, n) = (1536, 19);
    for (m, av, qv, s) in [
        (5, -128i8, -8i8, 127i8),
        (5, 127, -8, -127),
        (5, -128, 7, -127),
        (1, -128, -8, 127),
        (1, 127, -8, -127),
        (1, -128, 7, -127),
        (1, 127, 7, 127),
    ] {
        let a = vec![av; m * k];
        let rows = W4Rows {
            n,
            k,
            q: vec![qv; n * k],
            sub_scales: vec![s; n * k / GROUP_K],
            row_scales: vec![0.5; n],
        };
        let scales = vec![0.25f32; m * k / GROUP_K];
        let mut want = vec![0f32; m * n];
        gemm_w4_grouped_reference(&a, &scales, m, &rows, &mut want);
        let expected = 0.5 * 0.25 * f32::from(s) * (k as f32) * f32::from(av) * f32::from(qv);
        assert!(want.iter().all(|&v| v == expected), "{av} {qv} {s}");
        let packed = PackedW4Weights::pack(&rows);
        for kernel in I8Kernel::ALL.into_iter().filter(|v| v.is_available()) {
            let mut got = vec![0f32; m * n];
            gemm_w4_grouped_with(kernel, &a, &scales, m, &packed, 0..n, &mut got);
            assert_eq!(got, want, "{} {av} {qv} {s}", kernel.name());
        }
    }
}

#[test]
fn column_ranges_are_tiles_of_the_full_product() {
    let (m, k, n) = (6, 96, 70);
    let a = SeededRng::new(2).i8s(m * k);
    let rows = random_rows(n, k, 4);
    let scales = random_scales(m * 3, 9);
    let packed = PackedW4Weights::pack(&rows);
    let mut full = vec![0f32; m * n];
    gemm_w4_grouped(&a, &scales, m, &packed, &mut full);
    for cols in [0..16, 5..37, 33..70, 69..70, 20..20] {
        let mut tile = vec![0f32; m * cols.len()];
        gemm_w4_grouped_cols(&a, &scales, m, &packed, cols.clone(), &mut tile);
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
fn one_row_at_the_model_shapes_matches_scalar_bit_for_bit() {
    // The one-row kernel (a decode step's) over SmolLM2-135M's shapes, whole and in the
    // column tasks a decode step splits them into (ragged, not block-aligned).
    for (k, n, seed) in [(576, 1536, 1), (1536, 576, 2), (576, 576, 3), (576, 192, 4)] {
        let mut a = SeededRng::new(seed).i8s(k);
        a[0] = -128;
        a[k - 1] = 127;
        let mut rows = random_rows(n, k, seed + 10);
        rows.row_scales = random_scales(n, seed + 20);
        let scales = random_scales(k / GROUP_K, seed + 30);
        let packed = PackedW4Weights::pack(&rows);
        for cols in [0..n, 5..37, 100..n - 3, n - 1..n] {
            let mut scalar = vec![0f32; cols.len()];
            gemm_w4_grouped_with(
                I8Kernel::Scalar,
                &a,
                &scales,
                1,
                &packed,
                cols.clone(),
                &mut scalar,
            );
            for kernel in I8Kernel::ALL.into_iter().filter(|v| v.is_available()) {
                let mut got = vec![-1f32; cols.len()];
                gemm_w4_grouped_with(kernel, &a, &scales, 1, &packed, cols.clone(), &mut got);
                assert_eq!(got, scalar, "{} k={k} n={n} {cols:?}", kernel.name());
            }
        }
    }
}

#[test]
fn group_quantization_keeps_each_value_within_half_a_step() {
    let (m, k) = (3, 70);
    let mut x = SeededRng::new(8).f32s(m * k);
    x[5] = 300.0; // a massive activation only costs its own group resolution
    x[k + 32..k + 64].fill(0.0); // an all-zero group
    let (q, scales) = quantize_groups(&x, m, k);
    assert_eq!(scales.len(), m * 3);
    assert_eq!(scales[4], 0.0);
    assert!(q[k + 32..k + 64].iter().all(|&v| v == 0));
    assert_eq!(scales[0], 300.0 / 127.0);
    assert!(
        scales[1] < scales[0] / 50.0,
        "the next group keeps its resolution"
    );
    for (i, (&v, &qv)) in x.iter().zip(&q).enumerate() {
        let s = scales[(i / k) * 3 + (i % k) / GROUP_K];
        assert!(
            (v - f32::from(qv) * s).abs() <= 0.5 * s + 1e-6,
            "{i}: {v} {qv} {s}"
        );
    }
}

#[test]
fn non_finite_inputs_do_not_set_the_scale() {
    let x = [1.0, f32::NAN, -2.0, f32::INFINITY, f32::NEG_INFINITY];
    let (q, scales) = quantize_groups(&x, 1, 5);
    assert_eq!(q, [64, 0, -127, 127, -127]);
    assert_eq!(scales[0], 2.0 / 127.0);
    // A group of denormals only: the scale underflows to 0 and the group to zeros.
    let (q, scales) = quantize_groups(&[1e-44, -1e-44], 1, 2);
    assert_eq!((q, scales), (vec![0, 0], vec![0.0]));
}

#[test]
fn the_fast_quantizer_equals_the_reference_bit_for_bit() {
    for (m, k, seed) in [
        (1, 1, 1),
        (3, 31, 2),
        (2, 33, 3),
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
        // Ties, zeros, a massive value and non-finite ones.
        x[0] = 0.0;
        if m * k > 40 {
            x[7] = 500.0;
            x[11] = f32::NAN;
            x[12] = f32::INFINITY;
            x[33] = x[34] * 0.5;
        }
        // The 16-group batches of the AVX-512 quantizer (two of the AVX2 one's 8-group
        // batches each): specials in a later batch, a
        // group that is all zeros, one whose largest value sits in its last lane and
        // one whose only finite values are negative.
        if m * k > 1100 {
            x[16 * 32 + 5] = f32::NEG_INFINITY;
            x[17 * 32..18 * 32].fill(0.0);
            x[19 * 32 + 31] = -900.0;
            x[20 * 32..21 * 32].fill(f32::NAN);
            x[20 * 32 + 9] = -3.0;
        }
        let groups = m * k.div_ceil(GROUP_K);
        let (mut q, mut s) = (vec![0i8; m * k], vec![0f32; groups]);
        quantize_groups_reference(&x, m, k, &mut q, &mut s);
        let (fast_q, fast_s) = quantize_groups(&x, m, k);
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
    let (a, scales) = quantize_groups(&x, m, k);
    let xq: Vec<f32> = (0..m * k)
        .map(|i| f32::from(a[i]) * scales[(i / k) * 18 + (i % k) / GROUP_K])
        .collect();
    let mut want = vec![0f32; m * n];
    matmul_f32(&xq, &wq, &mut want, m, k, n);
    let mut got = vec![0f32; m * n];
    matmul_w4a8_grouped(&x, m, &packed, &mut got);
    for i in 0..m {
        for j in 0..n {
            let (g, q) = (got[i * n + j], want[i * n + j]);
            let mass: f32 = (0..k).map(|p| (xq[i * k + p] * wq[j * k + p]).abs()).sum();
            assert!((g - q).abs() <= 1e-5 * mass + 1e-6, "({i},{j}) {g} vs {q}");
        }
    }
}
