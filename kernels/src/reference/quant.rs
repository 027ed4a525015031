//! Symmetric INT8 quantization with NPU semantics.
//!
//! * Symmetric, zero point 0, range `[-127, 127]` (−128 is never produced,
//!   so negation never overflows).
//! * `q = clamp(round_ties_even(x / scale), -127, 127)`: round to nearest,
//!   ties to even, as ONNX `QuantizeLinear` and NPU runtimes do; NaN maps
//!   to 0.
//! * Dequantization is `x ≈ q * scale`.
//! * Scales come from the max-abs ("max-min symmetric") rule:
//!   `scale = max|x| / 127`, so the largest magnitude maps to ±127.

/// Largest magnitude of a quantized value.
pub const Q_MAX: i8 = 127;

/// Per-tensor symmetric scale `max|x| / 127`.
///
/// Returns `1.0` when `x` is empty or all zero (any positive scale
/// represents zeros exactly, and this avoids a division by zero). NaNs are
/// ignored; an infinite value gives an infinite scale.
pub fn scale_for_max_abs(x: &[f32]) -> f32 {
    let max_abs = x.iter().fold(0f32, |m, &v| m.max(v.abs()));
    if max_abs > 0.0 {
        max_abs / f32::from(Q_MAX)
    } else {
        1.0
    }
}

/// Quantizes one value: `clamp(round_ties_even(x / scale), -127, 127)`.
pub fn quantize_value(x: f32, scale: f32) -> i8 {
    let bound = f32::from(Q_MAX);
    // Clamped within half a step of the range first, so the rounding sees small values.
    let q = round_ties_even_small((x / scale).clamp(-bound - 0.5, bound + 0.5));
    // `as` saturates and maps NaN to 0; the clamp keeps -128 out.
    q.clamp(-bound, bound) as i8
}

/// `v.round_ties_even()` for `|v| <= 2^22` (and NaN): adding 1.5 x 2^23 leaves no
/// fraction bits, so the addition rounds to an integer in the default rounding mode
/// (to nearest, ties to even). `round_ties_even` itself is a library call on x86-64
/// without SSE4.1, and loading a model rounds every weight.
pub(crate) fn round_ties_even_small(v: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    debug_assert!(v.is_nan() || v.abs() <= 4_194_304.0, "{v} is out of range");
    (v + SHIFT) - SHIFT
}

/// Per-tensor quantization: `out[i] = quantize_value(x[i], scale)`.
///
/// # Panics
/// If the lengths differ or `scale` is not positive.
pub fn quantize_per_tensor(x: &[f32], scale: f32, out: &mut [i8]) {
    assert_eq!(x.len(), out.len(), "out must have the length of x");
    assert!(scale > 0.0, "scale must be positive");
    for (o, &v) in out.iter_mut().zip(x) {
        *o = quantize_value(v, scale);
    }
}

/// Dequantization: `out[i] = q[i] as f32 * scale`.
///
/// # Panics
/// If the lengths differ.
pub fn dequantize(q: &[i8], scale: f32, out: &mut [f32]) {
    assert_eq!(q.len(), out.len(), "out must have the length of q");
    for (o, &v) in out.iter_mut().zip(q) {
        *o = f32::from(v) * scale;
    }
}

/// Per-output-channel weight quantization.
///
/// `w` is row-major `[n, k]` (one row per output feature). Returns the
/// quantized `[n, k]` matrix and the `n` row scales, each from
/// [`scale_for_max_abs`] of its row.
///
/// # Panics
/// If `w.len() != n * k`.
pub fn quantize_weights_per_row(w: &[f32], n: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    assert_eq!(w.len(), n * k, "w must be [n, k]");
    let mut q = vec![0i8; n * k];
    let mut scales = Vec::with_capacity(n);
    for j in 0..n {
        let row = &w[j * k..(j + 1) * k];
        let s = scale_for_max_abs(row);
        quantize_per_tensor(row, s, &mut q[j * k..(j + 1) * k]);
        scales.push(s);
    }
    (q, scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_rounding_equals_round_ties_even() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut values: Vec<f32> = (-600..=600).map(|i| i as f32 * 0.25).collect();
        values.extend([
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            127.5,
            -127.5,
            4_194_303.5,
            -4_194_304.0,
        ]);
        values.extend([
            f32::MIN_POSITIVE,
            -0.0,
            0.499_999_97,
            -0.499_999_97,
            8_388_607.0 / 2.0,
        ]);
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = f32::from_bits(state as u32);
            if v.is_finite() && v.abs() <= 4_194_304.0 {
                values.push(v);
            }
        }
        for v in values {
            assert_eq!(round_ties_even_small(v), v.round_ties_even(), "{v}");
        }
        assert!(round_ties_even_small(f32::NAN).is_nan());
        for (x, want) in [
            (1e30, 127),
            (-1e30, -127),
            (f32::INFINITY, 127),
            (f32::NAN, 0),
        ] {
            assert_eq!(quantize_value(x, 1.0), want, "{x}");
        }
    }

    #[test]
    fn scale_is_max_abs_over_127_with_zero_guard() {
        assert_eq!(scale_for_max_abs(&[1.0, -254.0, 3.0]), 2.0);
        assert_eq!(scale_for_max_abs(&[0.0, -0.0]), 1.0);
        assert_eq!(scale_for_max_abs(&[]), 1.0);
        assert_eq!(scale_for_max_abs(&[f32::NAN, 63.5]), 0.5);
    }

    #[test]
    fn saturates_at_plus_minus_127() {
        let mut q = [0i8; 4];
        quantize_per_tensor(&[1000.0, -1000.0, 127.4, -128.0], 1.0, &mut q);
        assert_eq!(q, [127, -127, 127, -127]);
        assert_eq!(quantize_value(f32::INFINITY, 1.0), 127);
        assert_eq!(quantize_value(f32::NEG_INFINITY, 1.0), -127);
        assert_eq!(quantize_value(f32::NAN, 1.0), 0);
    }

    #[test]
    fn rounds_to_nearest_ties_to_even() {
        let x = [0.4, 0.5, 0.6, 1.5, 2.5, -0.5, -1.5, -2.5, -2.6];
        let mut q = [0i8; 9];
        quantize_per_tensor(&x, 1.0, &mut q);
        assert_eq!(q, [0, 0, 1, 2, 2, 0, -2, -2, -3]);
        // With a scale: 0.61 / 0.2 = 3.05, -0.59 / 0.2 = -2.95.
        assert_eq!(quantize_value(0.61, 0.2), 3);
        assert_eq!(quantize_value(-0.59, 0.2), -3);
    }

    #[test]
    fn max_abs_maps_to_127_and_roundtrip_error_is_half_a_step() {
        let x: Vec<f32> = (0..100)
            .map(|i| ((i * 37 % 91) as f32 - 45.0) * 0.13)
            .collect();
        let s = scale_for_max_abs(&x);
        let mut q = vec![0i8; x.len()];
        quantize_per_tensor(&x, s, &mut q);
        let max_q = q.iter().map(|v| v.unsigned_abs()).max().unwrap();
        assert_eq!(max_q, 127);
        let mut back = vec![0f32; x.len()];
        dequantize(&q, s, &mut back);
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() <= 0.5 * s * 1.0001, "{a} vs {b}");
        }
    }

    #[test]
    fn dequantize_multiplies() {
        let mut out = [0f32; 3];
        dequantize(&[-127, 0, 3], 0.5, &mut out);
        assert_eq!(out, [-63.5, 0.0, 1.5]);
    }

    #[test]
    fn per_row_weights_have_own_scales() {
        let w = [0.5, -2.0, 1.6, 0.0, 0.0, 0.0, 254.0, 120.0, -63.5];
        let (q, s) = quantize_weights_per_row(&w, 3, 3);
        assert_eq!(s, vec![2.0 / 127.0, 1.0, 2.0]);
        // 0.5 * 63.5 = 31.75 -> 32; 1.6 * 63.5 = 101.6 -> 102.
        assert_eq!(&q[0..3], &[32, -127, 102]);
        assert_eq!(&q[3..6], &[0, 0, 0]);
        // 120 / 2 = 60; -63.5 / 2 = -31.75 -> -32.
        assert_eq!(&q[6..9], &[127, 60, -32]);
    }
}
