//! Element-wise operations: SiLU-gated product and residual add.

/// SiLU (swish): `x * sigmoid(x) = x / (1 + e^-x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Gated FFN activation: `out[i] = silu(gate[i]) * up[i]`.
///
/// All three slices have the same length (any shape, e.g. `[tokens, ffn]`).
///
/// # Panics
/// If the lengths differ.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "gate and up must have the same length"
    );
    assert_eq!(gate.len(), out.len(), "out must have the length of gate");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// Residual add in place: `dst[i] += src[i]`.
///
/// # Panics
/// If the lengths differ.
pub fn add_inplace(dst: &mut [f32], src: &[f32]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "dst and src must have the same length"
    );
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_known_values() {
        assert_eq!(silu(0.0), 0.0);
        // silu(1) = 1 / (1 + e^-1) = 0.7310586
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        // silu(-1) = -1 / (1 + e) = -0.26894142
        assert!((silu(-1.0) + 0.268_941_42).abs() < 1e-6);
        // Large inputs: identity on the right, zero on the left, no NaN.
        assert_eq!(silu(100.0), 100.0);
        assert_eq!(silu(-200.0), 0.0);
    }

    #[test]
    fn silu_mul_multiplies_by_up() {
        let gate = [0.0, 1.0, -1.0];
        let up = [5.0, 2.0, -3.0];
        let mut out = [9.0; 3];
        silu_mul(&gate, &up, &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 2.0 * 0.731_058_6).abs() < 1e-6);
        assert!((out[2] - 3.0 * 0.268_941_42).abs() < 1e-6);
    }

    #[test]
    fn add_inplace_adds() {
        let mut d = [1.0, 2.0, 3.0];
        add_inplace(&mut d, &[0.5, -2.0, 10.0]);
        assert_eq!(d, [1.5, 0.0, 13.0]);
    }

    #[test]
    #[should_panic(expected = "same length")]
    fn add_inplace_checks_length() {
        add_inplace(&mut [1.0], &[1.0, 2.0]);
    }
}
