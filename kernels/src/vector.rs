//! Element-wise kernels written for the auto-vectorizer: branch-free loops without libm
//! calls (on the x86-64 baseline, `expf` and `round_ties_even` are library calls, which
//! made quantization and SiLU cost more than the INT8 GEMMs around them). Each has a
//! scalar twin in [`crate::reference`] and a test comparing them.

use crate::reference::quant::Q_MAX;

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
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp_approx(-g)) * u;
    }
}

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

/// Largest element, NaNs ignored (`-inf` for an empty slice): exact, any order.
pub fn max_f32(x: &[f32]) -> f32 {
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

/// Sum in 16 interleaved partial sums (so the loop vectorizes): the result differs from
/// a left-to-right sum by rounding only.
pub fn sum_f32(x: &[f32]) -> f32 {
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
    let limit = f32::from(Q_MAX);
    for (o, &v) in out.iter_mut().zip(x) {
        // Clamping first is equivalent (the bounds are integers) and keeps the value
        // inside the magic constant's exact range.
        let c = (v / scale).clamp(-limit, limit);
        *o = ((c + ROUND_MAGIC) - ROUND_MAGIC) as i8;
    }
}
