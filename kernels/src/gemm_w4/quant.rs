//! W4 weight quantization and the scalar reference GEMM over unpacked W4 weights.
//!
//! Format (per output row `j` of `w[n, k]`):
//!
//! * a row scale `d[j]` (f32);
//! * per group of [`GROUP_K`] consecutive `k`, a signed integer sub-scale
//!   `s[j, g]` in `-127..=127` (one byte);
//! * per weight a 4-bit value `q[j, p]` in `-8..=7`;
//!
//! and `w[j, p] ≈ d[j] · s[j, g] · q[j, p]`. Like llama.cpp's Q4_0, each group's
//! value of largest magnitude maps to `-8` (16 levels, the sign carried by the
//! scale), but the group scale is an integer multiple of the row scale: the
//! product `Σ_g s[j, g] · Σ_{p ∈ g} a[p] · q[j, p]` then stays an exact i32, and
//! the only float scaling is the per-row dequantization the W8A8 path already
//! does (the NPU semantics: INT32 accumulation, scales at dequantization).

use crate::reference::quant::round_ties_even_small;

/// Weights per group along `k` (one sub-scale each).
pub const GROUP_K: usize = 32;

/// Largest magnitude of a sub-scale.
const SUB_MAX: f32 = 127.0;

/// W4 weights, unpacked: the input of [`super::PackedW4Weights::pack`] and of
/// [`gemm_w4_reference`].
#[derive(Clone, Debug, PartialEq)]
pub struct W4Rows {
    /// Output features.
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// `[n, k]` values in `-8..=7`.
    pub q: Vec<i8>,
    /// `[n, ceil(k / GROUP_K)]` sub-scales in `-127..=127`.
    pub sub_scales: Vec<i8>,
    /// `[n]` row scales.
    pub row_scales: Vec<f32>,
}

impl W4Rows {
    /// Groups of [`GROUP_K`] along `k` (the last one may be short).
    pub fn groups(&self) -> usize {
        self.k.div_ceil(GROUP_K)
    }

    /// Quantizes row-major `w[n, k]` (one row per output feature).
    ///
    /// Per group, the ideal scale is `m / -8` (`m` the group's value of largest
    /// magnitude, as Q4_0 does); the row scale `d` is the largest ideal scale's
    /// magnitude / 127 and each sub-scale its ideal scale / `d`, rounded away
    /// from zero (never clipping the extreme). The values are then rounded with the
    /// group's actual scale `d · s` and clamped to `-8..=7`. Non-finite weights
    /// are treated as 0.
    ///
    /// # Panics
    /// If `w.len() != n * k`.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w must be [n, k]");
        let groups = k.div_ceil(GROUP_K);
        let mut q = vec![0i8; n * k];
        let mut sub_scales = vec![0i8; n * groups];
        let mut row_scales = vec![0f32; n];
        for j in 0..n {
            let row = &w[j * k..(j + 1) * k];
            let ideal: Vec<f32> = row.chunks(GROUP_K).map(ideal_group_scale).collect();
            let d = ideal.iter().fold(0f32, |m, s| m.max(s.abs())) / SUB_MAX;
            row_scales[j] = if d > 0.0 { d } else { 1.0 };
            let subs = &mut sub_scales[j * groups..(j + 1) * groups];
            let qs = &mut q[j * k..(j + 1) * k];
            for (g, (chunk, qs)) in row.chunks(GROUP_K).zip(qs.chunks_mut(GROUP_K)).enumerate() {
                subs[g] = sub_scale(ideal[g], d);
                let step = d * f32::from(subs[g]);
                for (o, &v) in qs.iter_mut().zip(chunk) {
                    *o = if step == 0.0 || !v.is_finite() {
                        0
                    } else {
                        round_ties_even_small((v / step).clamp(-8.5, 7.5)).clamp(-8.0, 7.0) as i8
                    };
                }
            }
        }
        Self {
            n,
            k,
            q,
            sub_scales,
            row_scales,
        }
    }

    /// The dequantized `[n, k]` weights `d · s · q`.
    pub fn dequantize(&self) -> Vec<f32> {
        let groups = self.groups();
        let mut w = Vec::with_capacity(self.n * self.k);
        for j in 0..self.n {
            for p in 0..self.k {
                let s = self.sub_scales[j * groups + p / GROUP_K];
                let step = self.row_scales[j] * f32::from(s);
                w.push(step * f32::from(self.q[j * self.k + p]));
            }
        }
        w
    }
}

/// `m / -8` for the group's value `m` of largest magnitude (0 for an all-zero or
/// non-finite group).
fn ideal_group_scale(group: &[f32]) -> f32 {
    let m = group
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    m / -8.0
}

/// `ideal / d` rounded away from zero (so the group's extreme is never clipped: a
/// rounded-down scale would clip it by up to half the ratio, several steps in a group
/// far below the row's largest), at most 127 in magnitude.
fn sub_scale(ideal: f32, d: f32) -> i8 {
    if ideal == 0.0 || d == 0.0 {
        return 0;
    }
    let magnitude = (ideal.abs() / d).ceil().clamp(1.0, SUB_MAX);
    (magnitude * ideal.signum()) as i8
}

/// Scalar reference W4A8 GEMM: `out[i, j] = Σ_g s[j, g] · Σ_{p ∈ g} a[i, p] · q[j, p]`
/// in i32 (the row scales are applied at dequantization).
///
/// * `a`: quantized activations, row-major `[m, k]` (`k = w.k`).
/// * `out`: i32 accumulators, row-major `[m, n]`, overwritten.
///
/// Wraps on i32 overflow like the SIMD instructions; with activations in
/// `-128..=127` no group sum overflows and the total cannot for `k < 16_000`.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn gemm_w4_reference(a: &[i8], m: usize, w: &W4Rows, out: &mut [i32]) {
    let (k, n, groups) = (w.k, w.n, w.groups());
    assert_eq!(a.len(), m * k, "a must be [m, k]");
    assert_eq!(out.len(), m * n, "out must be [m, n]");
    for i in 0..m {
        let a_row = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let q_row = &w.q[j * k..(j + 1) * k];
            let subs = &w.sub_scales[j * groups..(j + 1) * groups];
            let mut acc = 0i32;
            for ((a_g, q_g), &s) in a_row.chunks(GROUP_K).zip(q_row.chunks(GROUP_K)).zip(subs) {
                let dot = a_g.iter().zip(q_g).fold(0i32, |d, (&x, &y)| {
                    d.wrapping_add(i32::from(x) * i32::from(y))
                });
                acc = acc.wrapping_add(dot.wrapping_mul(i32::from(s)));
            }
            out[i * n + j] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_extreme_maps_to_minus_eight_and_rest_round() {
        // One row, two groups: the second group is half the first's range.
        let mut w = vec![0f32; 64];
        w[0] = -1.6;
        w[1] = 0.2;
        w[2] = 1.6;
        w[32] = 0.8;
        w[33] = -0.1;
        let r = W4Rows::quantize(&w, 1, 64);
        assert_eq!(r.sub_scales, vec![127, -64]);
        assert!((r.row_scales[0] - 0.2 / 127.0).abs() < 1e-9);
        // -1.6 / 0.2 = -8; 1.6 / 0.2 = 8 clamps to 7; 0.2 / 0.2 = 1.
        assert_eq!(&r.q[..3], &[-8, 1, 7]);
        assert_eq!(r.q[32], -8);
        let back = r.dequantize();
        assert!((back[0] + 1.6).abs() < 1e-6 && (back[1] - 0.2).abs() < 1e-6);
        assert!((back[32] - 0.8 * 64.0 / 63.5).abs() < 1e-6);
    }

    #[test]
    fn error_is_within_half_a_step_except_the_clamped_top() {
        let (n, k) = (7, 100);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let r = W4Rows::quantize(&w, n, k);
        let back = r.dequantize();
        assert_eq!(r.groups(), 4);
        for j in 0..n {
            for p in 0..k {
                let s = r.sub_scales[j * 4 + p / GROUP_K];
                let step = (r.row_scales[j] * f32::from(s)).abs();
                let err = (back[j * k + p] - w[j * k + p]).abs();
                // Rounding: half a step; the value opposite the extreme may clamp
                // at 7 (one step). The extreme itself is never clipped.
                assert!(err <= 1.0001 * step, "({j},{p}) err {err} step {step}");
            }
        }
    }

    #[test]
    fn zero_tiny_and_non_finite_groups() {
        let mut w = vec![0f32; 96];
        w[0] = 100.0;
        w[40] = 1e-6; // far below the row's scale: sub-scale ±1, value 0
        w[70] = f32::NAN;
        let r = W4Rows::quantize(&w, 1, 96);
        assert_eq!(r.sub_scales[1], -1);
        assert_eq!(r.q[40], 0);
        assert_eq!((r.sub_scales[2], r.q[70]), (0, 0));
        let z = W4Rows::quantize(&[0.0; 5], 1, 5);
        assert_eq!((z.row_scales[0], z.sub_scales[0]), (1.0, 0));
    }

    #[test]
    fn reference_applies_the_sub_scale_per_group() {
        // k = 40: a full group and a short one.
        let w = W4Rows {
            n: 1,
            k: 40,
            q: (0..40).map(|p| if p < 32 { 1 } else { -2 }).collect(),
            sub_scales: vec![3, -5],
            row_scales: vec![1.0],
        };
        let a = vec![2i8; 40];
        let mut out = [0i32];
        gemm_w4_reference(&a, 1, &w, &mut out);
        assert_eq!(out[0], 3 * (32 * 2) + (-5) * (8 * 2 * -2));
    }
}
