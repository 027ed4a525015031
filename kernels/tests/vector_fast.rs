//! The vectorizable element-wise kernels against their scalar twins.

use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{
    block_maxima, exp_approx, max_abs, max_f32, quantize_per_tensor_fast, reference,
    scale_for_max_abs_fast, silu_mul_fast, softmax_in_place, sum_f32,
};
use hetsched_kernels::{dequantize_i32_acc_fast, rms_norm_fast};
use proptest::prelude::*;

/// exp: relative error against f64 over the normal range.
const EXP_TOL: f64 = 3e-7;
/// SiLU·up: relative to max(|result|, 1e-30) plus the exp error carried through.
const SILU_TOL: f32 = 1e-6;

#[test]
fn exp_is_within_a_few_ulp_over_the_normal_range() {
    let mut worst = 0f64;
    let steps = 200_000;
    for i in 0..=steps {
        let x = -87.0 + 175.0 * i as f64 / steps as f64;
        let got = f64::from(exp_approx(x as f32));
        let want = (x as f32 as f64).exp();
        worst = worst.max(((got - want) / want).abs());
    }
    println!("exp_approx worst relative error {worst:.2e}");
    assert!(worst < EXP_TOL, "worst relative error {worst}");
    assert_eq!(exp_approx(0.0), 1.0);
    assert!(exp_approx(f32::NAN).is_nan());
    assert!(exp_approx(-1e4) >= 0.0 && exp_approx(-1e4) < 1e-37);
    assert!(exp_approx(1e4).is_finite());
}

/// softmax in place against the f64 softmax: each probability within 1e-6 of it
/// (relative to the largest, 1), the returned maximum exact and the total within 1e-6
/// relative; lengths with and without a tail of the 16 lanes, a spread that underflows
/// the smallest, ties, empty.
#[test]
fn softmax_in_place_equals_the_f64_softmax() {
    let mut rng = SeededRng::new(52);
    for (len, spread) in [
        (1, 1.0),
        (15, 3.0),
        (16, 10.0),
        (17, 0.5),
        (333, 30.0),
        (1000, 200.0),
    ] {
        let mut s: Vec<f32> = rng.f32s(len).iter().map(|v| v * spread).collect();
        if len > 3 {
            s[2] = s[1];
        }
        let want_max = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f64> = s
            .iter()
            .map(|&v| (f64::from(v) - f64::from(want_max)).exp())
            .collect();
        let want_total: f64 = exps.iter().sum();
        let (max, total) = softmax_in_place(&mut s);
        assert_eq!(max, want_max);
        assert!(
            (f64::from(total) - want_total).abs() <= 1e-6 * want_total,
            "{total} vs {want_total}"
        );
        for (got, e) in s.iter().zip(&exps) {
            assert!(
                (f64::from(*got) - e / want_total).abs() <= 1e-6,
                "{got} vs {}",
                e / want_total
            );
        }
    }
    assert_eq!(softmax_in_place(&mut []), (f32::NEG_INFINITY, 0.0));
}

/// Values around every rounding tie of a scale, plus specials.
fn quant_inputs(seed: u64, len: usize, scale: f32) -> Vec<f32> {
    let mut rng = SeededRng::new(seed);
    let mut x: Vec<f32> = (0..len)
        .map(|i| match i % 4 {
            // Exact ties k + 0.5 (and just beside them).
            0 => ((rng.unit_f32() * 130.0).round() + 0.5) * scale,
            1 => rng.unit_f32() * 200.0 * scale,
            2 => (((rng.unit_f32() * 130.0).round() + 0.5) * scale).next_up(),
            _ => rng.unit_f32() * scale,
        })
        .collect();
    x.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e30,
        -1e30,
    ]);
    x
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn quantize_equals_reference_bit_for_bit(
        seed in any::<u64>(),
        len in 0usize..300,
        scale in 1e-4f32..10.0,
    ) {
        let x = quant_inputs(seed, len, scale);
        let mut want = vec![0i8; x.len()];
        let mut got = vec![0i8; x.len()];
        reference::quantize_per_tensor(&x, scale, &mut want);
        quantize_per_tensor_fast(&x, scale, &mut got);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn max_abs_scale_equals_reference(seed in any::<u64>(), len in 0usize..300, with_nan in any::<bool>()) {
        let mut x = SeededRng::new(seed).f32s(len);
        if with_nan && !x.is_empty() {
            x[len / 2] = f32::NAN;
        }
        prop_assert_eq!(scale_for_max_abs_fast(&x), reference::scale_for_max_abs(&x));
        let want = x.iter().filter(|v| !v.is_nan()).fold(0f32, |m, v| m.max(v.abs()));
        prop_assert_eq!(max_abs(&x), want);
    }

    #[test]
    fn block_maxima_are_each_blocks_max(
        seed in any::<u64>(),
        len in 0usize..700,
        block in 1usize..80,
        with_nan in any::<bool>(),
    ) {
        let mut x = SeededRng::new(seed).f32s(len);
        if with_nan && !x.is_empty() {
            x[len / 3] = f32::NAN;
        }
        let mut got = vec![7.0f32; len.div_ceil(block)];
        block_maxima(&x, block, &mut got);
        let want: Vec<f32> = x.chunks(block).map(max_f32).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn max_and_sum_match_sequential(seed in any::<u64>(), len in 0usize..300) {
        let x = SeededRng::new(seed).f32s(len);
        prop_assert_eq!(max_f32(&x), x.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        let want: f64 = x.iter().map(|&v| f64::from(v)).sum();
        // 16 partial sums of values in [-1, 1): rounding error at most ~len ulps of 1.
        prop_assert!((f64::from(sum_f32(&x)) - want).abs() <= 1e-6 * (len as f64 + 1.0));
    }

    #[test]
    fn silu_mul_matches_reference(seed in any::<u64>(), len in 0usize..300, spread in 0.1f32..100.0) {
        let mut rng = SeededRng::new(seed);
        let gate: Vec<f32> = rng.f32s(len).iter().map(|v| v * spread).collect();
        let up = rng.f32s(len);
        let mut want = vec![0f32; len];
        let mut got = vec![0f32; len];
        reference::silu_mul(&gate, &up, &mut want);
        silu_mul_fast(&gate, &up, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            prop_assert!((g - w).abs() <= SILU_TOL * w.abs().max(1e-30), "{i}: {g} vs {w} (gate {})", gate[i]);
        }
    }

    #[test]
    fn dequantize_equals_reference_bit_for_bit(seed in any::<u64>(), m in 0usize..5, n in 0usize..70) {
        let mut rng = SeededRng::new(seed);
        let acc: Vec<i32> = rng.f32s(m * n).iter().map(|v| (v * 1e6) as i32).collect();
        let scales: Vec<f32> = rng.f32s(n).iter().map(|v| v.abs() * 1e-3).collect();
        let mut want = vec![0f32; m * n];
        let mut got = vec![1f32; m * n];
        reference::dequantize_i32_acc(&acc, m, n, 0.037, &scales, &mut want);
        dequantize_i32_acc_fast(&acc, m, n, 0.037, &scales, &mut got);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn rms_norm_matches_reference(seed in any::<u64>(), rows in 0usize..4, cols in 1usize..600, spread in 0.01f32..100.0) {
        let mut rng = SeededRng::new(seed);
        let x: Vec<f32> = rng.f32s(rows * cols).iter().map(|v| v * spread).collect();
        let weight = rng.f32s(cols);
        let mut want = vec![0f32; rows * cols];
        let mut got = vec![0f32; rows * cols];
        reference::rms_norm(&x, &weight, 1e-5, &mut want, rows, cols);
        rms_norm_fast(&x, &weight, 1e-5, &mut got, rows, cols);
        // Only the f64 sum of squares is reordered: its rounding (~1e-16 relative)
        // moves the f32 result by at most one rounding step.
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            prop_assert!((g - w).abs() <= 2.0 * f32::EPSILON * w.abs(), "{i}: {g} vs {w}");
        }
    }
}
