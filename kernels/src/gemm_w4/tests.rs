use super::*;
use crate::reference::matmul_f32;
use crate::seeded::SeededRng;

/// Random W4 rows: values over all of `-8..=7`, sub-scales over `-127..=127`.
pub(super) fn random_rows(n: usize, k: usize, seed: u64) -> W4Rows {
    let groups = k.div_ceil(GROUP_K);
    W4Rows {
        n,
        k,
        q: SeededRng::new(seed)
            .bytes(n * k)
            .iter()
            .map(|&b| (b % 16) as i8 - 8)
            .collect(),
        sub_scales: SeededRng::new(seed + 1)
            .i8s(n * groups)
            .iter()
            .map(|&s| s.max(-127))
            .collect(),
        row_scales: vec![1.0; n],
    }
}

fn available() -> impl Iterator<Item = I8Kernel> {
    I8Kernel::ALL.into_iter().filter(|v| v.is_available())
}

fn check_variant(kernel: I8Kernel) {
    if !kernel.is_available() {
        println!("SKIP: {} not supported by this CPU", kernel.name());
        return;
    }
    let mut seed = 1;
    for &m in &[1, 2, 3, 8, 9, 17, 70] {
        for &k in &[1, 4, 31, 32, 33, 64, 100, 576] {
            for &n in &[1, 3, 16, 17, 33] {
                seed += 3;
                let a = SeededRng::new(seed).i8s(m * k);
                let rows = random_rows(n, k, seed + 1000);
                let mut want = vec![0i32; m * n];
                gemm_w4_reference(&a, m, &rows, &mut want);
                let packed = PackedW4Weights::pack(&rows);
                let mut got = vec![-1i32; m * n];
                gemm_w4_with(kernel, &a, m, &packed, 0..n, &mut got);
                assert_eq!(got, want, "{} m={m} k={k} n={n}", kernel.name());
            }
        }
    }
}

#[test]
fn scalar_matches_reference_exactly() {
    check_variant(I8Kernel::Scalar);
}

#[test]
fn avx2_matches_reference_exactly() {
    check_variant(I8Kernel::Avx2);
}

#[test]
fn avx512_vnni_matches_reference_exactly() {
    check_variant(I8Kernel::Avx512Vnni);
}

#[test]
fn extreme_values_are_exact_in_every_variant() {
    // -128 activations stress the +128 bias (biased value 0); -8 weights and ±127
    // sub-scales the largest group products; k = 1536 the largest total (FFN down).
    let (m, k, n) = (5, 1536, 19);
    for (av, qv, s) in [
        (-128i8, -8i8, 127i8),
        (127, -8, -127),
        (-128, 7, -127),
        (127, 7, 127),
    ] {
        let a = vec![av; m * k];
        let rows = W4Rows {
            n,
            k,
            q: vec![qv; n * k],
            sub_scales: vec![s; n * k / GROUP_K],
            row_scales: vec![1.0; n],
        };
        let mut want = vec![0i32; m * n];
        gemm_w4_reference(&a, m, &rows, &mut want);
        assert_eq!(
            i64::from(want[0]),
            i64::from(av) * i64::from(qv) * i64::from(s) * k as i64
        );
        let packed = PackedW4Weights::pack(&rows);
        for kernel in available() {
            let mut got = vec![0i32; m * n];
            gemm_w4_with(kernel, &a, m, &packed, 0..n, &mut got);
            assert_eq!(got, want, "{} a={av} q={qv} s={s}", kernel.name());
        }
    }
}

#[test]
fn column_ranges_match_full_output() {
    let (m, k, n) = (11, 96, 70);
    let a = SeededRng::new(7).i8s(m * k);
    let rows = random_rows(n, k, 8);
    let packed = PackedW4Weights::pack(&rows);
    let mut full = vec![0i32; m * n];
    gemm_w4_reference(&a, m, &rows, &mut full);
    for kernel in available() {
        for cols in [0..0, 0..1, 5..21, 16..32, 15..17, 33..70, 69..70, 0..70] {
            let nc = cols.len();
            let mut got = vec![0i32; m * nc];
            gemm_w4_with(kernel, &a, m, &packed, cols.clone(), &mut got);
            for i in 0..m {
                assert_eq!(
                    &got[i * nc..(i + 1) * nc],
                    &full[i * n + cols.start..i * n + cols.end],
                    "{} cols={cols:?} row {i}",
                    kernel.name()
                );
            }
        }
    }
}

#[test]
fn degenerate_shapes() {
    for kernel in available() {
        // k = 0: no groups, all accumulators 0.
        let packed = PackedW4Weights::quantize(&[], 3, 0);
        let mut out = vec![7i32; 2 * 3];
        gemm_w4_with(kernel, &[], 2, &packed, 0..3, &mut out);
        assert_eq!(out, vec![0; 6], "{}", kernel.name());
        let packed = PackedW4Weights::quantize(&[1.0, 2.0], 1, 2);
        gemm_w4_with(kernel, &[], 0, &packed, 0..1, &mut []);
        let packed = PackedW4Weights::quantize(&[], 0, 2);
        gemm_w4_with(kernel, &[1, 2], 1, &packed, 0..0, &mut []);
    }
}

#[test]
#[should_panic(expected = "out must be [m, cols.len()]")]
fn rejects_wrong_output_length() {
    let packed = PackedW4Weights::quantize(&[1.0, 2.0, 3.0, 4.0], 2, 2);
    gemm_w4(&[1, 1], 1, &packed, &mut [0; 3]);
}

#[test]
fn w4a8_linear_approximates_f32_after_scaling() {
    let (m, k, n) = (4, 160, 24);
    let x: Vec<f32> = SeededRng::new(11)
        .i8s(m * k)
        .iter()
        .map(|&v| f32::from(v) / 37.0)
        .collect();
    let wf: Vec<f32> = SeededRng::new(12)
        .i8s(n * k)
        .iter()
        .map(|&v| f32::from(v) / 91.0)
        .collect();
    let packed = PackedW4Weights::quantize(&wf, n, k);
    let mut got = vec![0f32; m * n];
    matmul_w4a8(&x, m, &packed, &mut got);
    // The same arithmetic in f32 with the dequantized weights and activations: equal up
    // to f32 rounding of the scaling (the integer part is exact).
    let wq = packed.to_rows().dequantize();
    let a_scale = scale_for_max_abs_fast(&x);
    let mut a_q = vec![0i8; m * k];
    quantize_per_tensor_fast(&x, a_scale, &mut a_q);
    let xq: Vec<f32> = a_q.iter().map(|&v| f32::from(v) * a_scale).collect();
    let mut want_q = vec![0f32; m * n];
    matmul_f32(&xq, &wq, &mut want_q, m, k, n);
    let mut want = vec![0f32; m * n];
    matmul_f32(&x, &wf, &mut want, m, k, n);
    for i in 0..m {
        for j in 0..n {
            let (g, q, f) = (got[i * n + j], want_q[i * n + j], want[i * n + j]);
            let mass: f32 = (0..k).map(|p| (xq[i * k + p] * wq[j * k + p]).abs()).sum();
            assert!((g - q).abs() <= 1e-5 * mass + 1e-6, "({i},{j}) {g} vs {q}");
            // Against f32: per term |x| · (weight step) (a step: the clamped top may
            // lose one) + |w| · (x step / 2) + their product.
            let rows = packed.to_rows();
            let bound: f32 = (0..k)
                .map(|p| {
                    let s = rows.sub_scales[j * rows.groups() + p / GROUP_K];
                    let w_step = (rows.row_scales[j] * f32::from(s)).abs();
                    x[i * k + p].abs() * w_step
                        + wf[j * k + p].abs() * a_scale * 0.5
                        + w_step * a_scale * 0.5
                })
                .sum();
            assert!(
                (g - f).abs() <= bound * 1.001 + 1e-6,
                "({i},{j}) {g} vs {f}"
            );
        }
    }
}
