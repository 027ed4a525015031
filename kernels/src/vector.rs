//! Element-wise kernels written for the auto-vectorizer: branch-free loops without libm
//! calls (on the x86-64 baseline, `expf` and `round_ties_even` are library calls, which
//! made quantization and SiLU cost more than the INT8 GEMMs around them). Each has a
//! scalar twin in [`crate::reference`] and a test comparing them.

use crate::reference::quant::Q_MAX;
use crate::widest::widest;

/// 1.5 · 2²³: adding and subtracting it rounds an f32 of magnitude below 2²² to the
/// nearest integer, ties to even (the default rounding mode), without a libm call.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `e^x` to within 2 ulp over the normal range (Cephes `expf`: range reduction by
/// `ln 2`, a degree-6 polynomial). Inputs are clamped to `[-87.3, 88.3]`: below,
/// the result is the smallest normal power instead of a subnormal or 0; above,
/// about 2.2e38 instead of infinity. NaN gives NaN.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part exact in f32 and the remainder.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.3, 88.3);
    let shifted = x * LOG2E + ROUND_MAGIC;
    let k = shifted - ROUND_MAGIC;
    // The low mantissa bits of `shifted` hold k as a two's complement integer.
    let k_int = shifted.to_bits().wrapping_sub(ROUND_MAGIC.to_bits()) as i32;
    let r = x - k * LN2_HI - k * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 0.166_666_65)
        * r
        + 0.5;
    let p = p * r * r + r + 1.0;
    p * f32::from_bits(((k_int + 127) as u32) << 23)
}

/// `out[i] = silu(gate[i]) * up[i]` with [`exp_approx`]; the twin of
/// [`crate::reference::silu_mul`] (relative error a few ulp).
///
/// # Panics
/// If the lengths differ.
pub fn silu_mul_fast(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "gate and up must have the same length"
    );
    assert_eq!(gate.len(), out.len(), "out must have the length of gate");
    silu_mul_loop(gate, up, out);
}

widest! {
    fn silu_mul_loop(gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + exp_approx(-g)) * u;
        }
    }
}

widest! {
/// Largest `|x|`, NaNs ignored (0 for an empty slice): exact, any order.
pub fn max_abs(x: &[f32]) -> f32 {
    // Independent lanes let the loop vectorize; a NaN compares false and is skipped.
    let mut lanes = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            let a = v.abs();
            *m = if a > *m { a } else { *m };
        }
    }
    let mut m = lanes
        .iter()
        .copied()
        .fold(0f32, |m, v| if v > m { v } else { m });
    for &v in chunks.remainder() {
        let a = v.abs();
        m = if a > m { a } else { m };
    }
    m
}
}

widest! {
/// Largest element, NaNs ignored (`-inf` for an empty slice): exact, any order.
pub fn max_f32(x: &[f32]) -> f32 {
    max_in_lanes(x)
}
}

widest! {
/// `out[b]` = [`max_f32`] of the `b`-th run of `block` values of `x` (the last run may be
/// shorter), for as many runs as `out` holds; one call for all of them, where a call per
/// run costs as much as the run's comparisons (a 4-bit head's 768 runs of 64 logits).
///
/// # Panics
/// If `block` is 0.
pub fn block_maxima(x: &[f32], block: usize, out: &mut [f32]) {
    assert!(block > 0, "blocks of at least one value");
    for (run, m) in x.chunks(block).zip(out.iter_mut()) {
        *m = max_in_lanes(run);
    }
}
}

/// [`max_f32`]'s arithmetic, inlined into the callers' widest bodies: 16 lanes, then
/// the lanes and the tail.
#[inline(always)]
fn max_in_lanes(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = if v > *m { v } else { *m };
        }
    }
    let tail = chunks.remainder().iter().copied();
    lanes
        .into_iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, v| if v > m { v } else { m })
}

/// `s[i] = e^(s[i] - max) / Σ_j e^(s[j] - max)` in place, `max` the largest of `s` (NaNs
/// ignored), with [`exp_approx`] and [`sum_f32`]'s lanes; returns `(max, Σ)`, which merge
/// the softmaxes of several runs of one row. Empty: `(-inf, 0)`. A decode step's
/// attention runs it on every head's scores: with a libm `expf` call per score and one
/// running sum (a chain of dependent adds) it was 3% of a W4A8 step's samples at 200
/// cached positions.
pub fn softmax_in_place(s: &mut [f32]) -> (f32, f32) {
    let max = max_f32(s);
    (max, softmax_loop(s, max))
}

widest! {
    fn softmax_loop(s: &mut [f32], max: f32) -> f32 {
        for v in s.iter_mut() {
            *v = exp_approx(*v - max);
        }
        normalize_lanes(s)
    }
}

/// `x[i] /= Σ x` (as a multiply by the inverse of [`sum_f32`]'s lane sum), inlined into
/// its caller (an `#[inline(always)]` body of [`widest!`]); returns the sum. The last step
/// of both softmaxes, the decode attention's and the prefill's.
#[inline(always)]
pub(crate) fn normalize_lanes(x: &mut [f32]) -> f32 {
    let total = sum_f32_lanes(x);
    let inverse = 1.0 / total;
    for v in x.iter_mut() {
        *v *= inverse;
    }
    total
}

/// Sum in 16 interleaved partial sums (so the loop vectorizes): the result differs from
/// a left-to-right sum by rounding only.
pub fn sum_f32(x: &[f32]) -> f32 {
    sum_f32_lanes(x)
}

/// [`sum_f32`] inlined into its caller (an `#[inline(always)]` body of [`widest!`]).
#[inline(always)]
pub(crate) fn sum_f32_lanes(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for chunk in &mut chunks {
        for (s, &v) in lanes.iter_mut().zip(chunk) {
            *s += v;
        }
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// The twin of [`crate::reference::scale_for_max_abs`]: `max|x| / 127`, or 1 for an
/// all-zero (or empty) tensor.
pub fn scale_for_max_abs_fast(x: &[f32]) -> f32 {
    let m = max_abs(x);
    if m > 0.0 { m / f32::from(Q_MAX) } else { 1.0 }
}

/// The twin of [`crate::reference::quantize_per_tensor`], bit-exact:
/// `clamp(round_ties_even(x / scale), -127, 127)`, NaN to 0.
///
/// # Panics
/// If the lengths differ or `scale` is not positive.
pub fn quantize_per_tensor_fast(x: &[f32], scale: f32, out: &mut [i8]) {
    assert_eq!(x.len(), out.len(), "out must have the length of x");
    assert!(scale > 0.0, "scale must be positive");
    quantize_loop(x, scale, out);
}

widest! {
    fn quantize_loop(x: &[f32], scale: f32, out: &mut [i8]) {
        let limit = f32::from(Q_MAX);
        for (o, &v) in out.iter_mut().zip(x) {
            // Clamping first is equivalent (the bounds are integers) and keeps the value
            // inside the magic constant's exact range.
            let c = (v / scale).clamp(-limit, limit);
            // NaN to 0, then the rounded integer read from the low mantissa bits of
            // `c + ROUND_MAGIC` (as in `exp_approx`): integer operations that vectorize,
            // where the saturating float-to-int cast `as` needs is split into scalars.
            let c = if c.is_nan() { 0.0 } else { c };
            let bits = (c + ROUND_MAGIC).to_bits().wrapping_sub(ROUND_MAGIC.to_bits());
            *o = bits as i32 as i8;
        }
    }
}

/// The twin of [`crate::reference::dequantize_i32_acc`], bit-exact:
/// `out[i, j] = acc[i, j] as f32 * (a_scale * w_scales[j])`.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn dequantize_i32_acc_fast(
    acc: &[i32],
    m: usize,
    n: usize,
    a_scale: f32,
    w_scales: &[f32],
    out: &mut [f32],
) {
    assert_eq!(acc.len(), m * n, "acc must be [m, n]");
    assert_eq!(out.len(), m * n, "out must be [m, n]");
    assert_eq!(w_scales.len(), n, "w_scales must be [n]");
    if n > 0 {
        dequantize_loop(acc, a_scale, w_scales, out);
    }
}

widest! {
    fn dequantize_loop(acc: &[i32], a_scale: f32, w_scales: &[f32], out: &mut [f32]) {
        let n = w_scales.len();
        for (acc_row, out_row) in acc.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            for ((o, &v), &ws) in out_row.iter_mut().zip(acc_row).zip(w_scales) {
                *o = v as f32 * (a_scale * ws);
            }
        }
    }
}

/// The twin of [`crate::reference::rms_norm`]: the same formula, the mean of squares
/// summed in f64 over 8 interleaved partial sums (so the loop vectorizes) instead of left
/// to right; the result differs from the reference by the rounding of that sum only.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn rms_norm_fast(
    x: &[f32],
    weight: &[f32],
    eps: f32,
    out: &mut [f32],
    rows: usize,
    cols: usize,
) {
    assert_eq!(x.len(), rows * cols, "x must be [rows, cols]");
    assert_eq!(out.len(), rows * cols, "out must be [rows, cols]");
    assert_eq!(weight.len(), cols, "weight must be [cols]");
    if cols > 0 {
        rms_norm_loop(x, weight, eps, out);
    }
}

widest! {
    fn rms_norm_loop(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let cols = weight.len();
        for (x_row, out_row) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
            let mut lanes = [0f64; 8];
            let mut chunks = x_row.chunks_exact(8);
            for chunk in &mut chunks {
                for (s, &v) in lanes.iter_mut().zip(chunk) {
                    *s += f64::from(v) * f64::from(v);
                }
            }
            let tail = chunks.remainder().iter().map(|&v| f64::from(v) * f64::from(v));
            let mean = (lanes.iter().sum::<f64>() + tail.sum::<f64>()) / cols as f64;
            let inv = (1.0 / (mean + f64::from(eps)).sqrt()) as f32;
            for ((o, &v), &w) in out_row.iter_mut().zip(x_row).zip(weight) {
                *o = v * inv * w;
            }
        }
    }
}
