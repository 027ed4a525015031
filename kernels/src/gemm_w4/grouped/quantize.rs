//! INT8 activations with one scale per row and group of 32 inputs (Q8_0's blocks).
//!
//! The reference ([`quantize_groups_reference`]) is [`crate::reference::quantize_value`]
//! per element with each group's scale; the kernel ([`quantize_groups_into`]) is the same
//! arithmetic as a loop compiled for the widest vector unit (`widest!`), rounding
//! through the low mantissa bits of `x + 1.5 · 2²³` as [`crate::quantize_per_tensor_fast`]
//! does (a plain `round` is a libm call per element on the x86-64 baseline: it made a
//! w4a8-g32 prefill half as fast). The two are bit-identical.

use crate::gemm_w4::quant::GROUP_K;
use crate::reference::quantize_value;
use crate::widest::widest;

/// `1.5 · 2²³`: adding it rounds an f32 of magnitude below 2²² to an integer (ties to
/// even), readable from the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// Largest INT8 magnitude used (symmetric range).
const Q_MAX: f32 = 127.0;

/// Quantizes `x[m, k]` per row and group of [`GROUP_K`] inputs (the last group of a row
/// may be short): scale = the group's largest finite |x| / 127, each value
/// `clamp(round_ties_even(x / scale), -127, 127)`. Returns the `[m, k]` values and the
/// `[m, ceil(k / 32)]` scales. A group without a nonzero finite value gets scale 0 and
/// values 0 (it contributes nothing); NaN quantizes to 0 and ±∞ saturates, neither sets
/// the scale.
///
/// # Panics
/// If `x.len() != m * k`.
pub fn quantize_groups(x: &[f32], m: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = vec![0i8; m * k];
    let mut scales = vec![0f32; m * k.div_ceil(GROUP_K)];
    quantize_groups_into(x, m, k, &mut q, &mut scales);
    (q, scales)
}

/// [`quantize_groups`] into caller-owned buffers.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn quantize_groups_into(x: &[f32], m: usize, k: usize, q: &mut [i8], scales: &mut [f32]) {
    check_shapes(x, m, k, q, scales);
    if k > 0 {
        groups_loop(x, k, q, scales);
    }
}

/// The definition of [`quantize_groups_into`], one element at a time.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn quantize_groups_reference(x: &[f32], m: usize, k: usize, q: &mut [i8], scales: &mut [f32]) {
    check_shapes(x, m, k, q, scales);
    if k == 0 {
        return;
    }
    let groups = k.div_ceil(GROUP_K);
    let rows = x.chunks_exact(k).zip(q.chunks_exact_mut(k));
    for ((x, q), scales) in rows.zip(scales.chunks_exact_mut(groups)) {
        for ((x, q), scale) in x.chunks(GROUP_K).zip(q.chunks_mut(GROUP_K)).zip(scales) {
            let max = x
                .iter()
                .filter(|v| v.is_finite())
                .fold(0f32, |m, v| m.max(v.abs()));
            *scale = max / Q_MAX;
            for (o, &v) in q.iter_mut().zip(x) {
                *o = if *scale > 0.0 {
                    quantize_value(v, *scale)
                } else {
                    0
                };
            }
        }
    }
}

fn check_shapes(x: &[f32], m: usize, k: usize, q: &[i8], scales: &[f32]) {
    assert_eq!(x.len(), m * k, "x must be [m, k]");
    assert_eq!(q.len(), m * k, "q must be [m, k]");
    assert_eq!(
        scales.len(),
        m * k.div_ceil(GROUP_K),
        "scales must be [m, ceil(k / 32)]"
    );
}

widest! {
    fn groups_loop(x: &[f32], k: usize, q: &mut [i8], scales: &mut [f32]) {
        let groups = k.div_ceil(GROUP_K);
        let rows = x.chunks_exact(k).zip(q.chunks_exact_mut(k));
        for ((x, q), scales) in rows.zip(scales.chunks_exact_mut(groups)) {
            // Whole groups as fixed-size arrays (constant trip counts vectorize fully),
            // then the short tail group, if any.
            let (full, x_tail) = x.as_chunks::<GROUP_K>();
            let (full_q, q_tail) = q.as_chunks_mut::<GROUP_K>();
            for ((x, q), scale) in full.iter().zip(full_q).zip(scales.iter_mut()) {
                *scale = quantize_group(x, q);
            }
            if !x_tail.is_empty() {
                scales[groups - 1] = quantize_group(x_tail, q_tail);
            }
        }
    }
}

/// One group of at most [`GROUP_K`] values: writes them, returns the scale.
#[inline(always)]
fn quantize_group(x: &[f32], q: &mut [i8]) -> f32 {
    // Independent lanes and a tree of element-wise maxima vectorize (a running
    // maximum would be a chain of scalar selects); NaN and ±∞ compare false.
    let mut lanes = [0f32; GROUP_K];
    for (m, &v) in lanes.iter_mut().zip(x) {
        let a = v.abs();
        *m = if a < f32::INFINITY { a } else { 0.0 };
    }
    let mut width = GROUP_K / 2;
    while width > 0 {
        for i in 0..width {
            let other = lanes[i + width];
            lanes[i] = if other > lanes[i] { other } else { lanes[i] };
        }
        width /= 2;
    }
    let scale = lanes[0] / Q_MAX;
    if scale == 0.0 {
        q.fill(0);
        return 0.0;
    }
    for (o, &v) in q.iter_mut().zip(x) {
        let c = (v / scale).clamp(-Q_MAX, Q_MAX);
        let c = if c.is_nan() { 0.0 } else { c };
        let bits = (c + ROUND_MAGIC)
            .to_bits()
            .wrapping_sub(ROUND_MAGIC.to_bits());
        *o = bits as i32 as i8;
    }
    scale
}
