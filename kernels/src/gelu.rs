//! GELU(gate) · up with GELU's tanh approximation (Gemma's gated feed-forward; ggml's
//! `ggml_gelu`): the scalar reference, and a twin written for the auto-vectorizer.
//!
//! `gelu(x) = ½·x·(1 + tanh(y))` with `y = √(2/π)·(x + 0.044715·x³)`. Since
//! `½·(1 + tanh(y)) = 1 / (1 + e^(−2y))`, the fast form is `x / (1 + e^(−2y))`, the shape
//! of SiLU's, with [`exp_approx`] (no libm call, so the loop vectorizes).

use crate::vector::exp_approx;

/// `√(2/π)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic term's coefficient.
const CUBIC: f32 = 0.044_715;

/// `out[i] = gelu_tanh(gate[i]) · up[i]`, with `tanh` from the standard library: the
/// reference.
///
/// # Panics
/// If the lengths differ.
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    check_lengths(gate, up, out);
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let y = SQRT_2_OVER_PI * g * (1.0 + CUBIC * g * g);
        *o = 0.5 * g * (1.0 + y.tanh()) * u;
    }
}

/// [`gelu_tanh_mul`] through [`exp_approx`] (within a few ulp of the reference's
/// relative error, tested below).
///
/// # Panics
/// If the lengths differ.
pub fn gelu_tanh_mul_fast(gate: &[f32], up: &[f32], out: &mut [f32]) {
    check_lengths(gate, up, out);
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let y = SQRT_2_OVER_PI * g * (1.0 + CUBIC * g * g);
        *o = g / (1.0 + exp_approx(-2.0 * y)) * u;
    }
}

fn check_lengths(gate: &[f32], up: &[f32], out: &[f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "gate and up must have the same length"
    );
    assert_eq!(gate.len(), out.len(), "out must have the length of gate");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeded::SeededRng;

    #[test]
    fn known_values() {
        let mut out = [0f32; 3];
        gelu_tanh_mul(&[0.0, 1.0, -1.0], &[1.0, 2.0, 1.0], &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 2.0 * 0.841_192).abs() < 1e-5, "{}", out[1]);
        assert!((out[2] + 0.158_808).abs() < 1e-5, "{}", out[2]);
    }

    #[test]
    fn the_fast_form_follows_the_reference() {
        let mut rng = SeededRng::new(11);
        // Gates over the range activations reach, and far tails (where tanh saturates).
        let mut gate: Vec<f32> = rng.f32s(4096).into_iter().map(|x| 8.0 * x).collect();
        gate.extend([-100.0, -20.0, -9.0, 0.0, 1e-6, 9.0, 20.0, 100.0]);
        let up = vec![1.0f32; gate.len()];
        let (mut slow, mut fast) = (vec![0f32; gate.len()], vec![0f32; gate.len()]);
        gelu_tanh_mul(&gate, &up, &mut slow);
        gelu_tanh_mul_fast(&gate, &up, &mut fast);
        for ((g, s), f) in gate.iter().zip(&slow).zip(&fast) {
            // Absolute error for results near 0 (the negative tail), relative elsewhere.
            let tolerance = 1e-6 + 4.0 * f32::EPSILON * s.abs().max(f.abs());
            assert!((s - f).abs() <= tolerance, "gelu({g}): {s} vs {f}");
            assert!(f.is_finite());
        }
    }

    #[test]
    #[should_panic(expected = "same length")]
    fn mismatched_lengths_panic() {
        gelu_tanh_mul_fast(&[1.0], &[1.0, 2.0], &mut [0.0]);
    }
}
