//! INT8 activations with one scale per row and group of 32 inputs (Q8_0's blocks).

use crate::gemm_w4::quant::GROUP_K;

/// Quantizes `x[m, k]` per row and group of [`GROUP_K`] inputs (the last group of a row
/// may be short): scale = the group's max |x| / 127, values rounded to nearest and
/// clamped to ±127. Returns the `[m, k]` values and the `[m, ceil(k / 32)]` scales. An
/// all-zero group gets scale 0 (it contributes nothing); non-finite inputs count as 0.
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
    let groups = k.div_ceil(GROUP_K);
    assert_eq!(x.len(), m * k, "x must be [m, k]");
    assert_eq!(q.len(), m * k, "q must be [m, k]");
    assert_eq!(scales.len(), m * groups, "scales must be [m, groups]");
    if k == 0 {
        return;
    }
    let rows = x.chunks_exact(k).zip(q.chunks_exact_mut(k));
    for ((x, q), scales) in rows.zip(scales.chunks_exact_mut(groups)) {
        let chunks = x.chunks(GROUP_K).zip(q.chunks_mut(GROUP_K));
        for ((x, q), scale) in chunks.zip(scales.iter_mut()) {
            *scale = quantize_group(x, q);
        }
    }
}

/// One group: returns its scale and writes its values.
#[inline]
fn quantize_group(x: &[f32], q: &mut [i8]) -> f32 {
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.is_finite() { m.max(v.abs()) } else { m });
    if max == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let scale = max / 127.0;
    let inv = 1.0 / scale;
    for (o, &v) in q.iter_mut().zip(x) {
        *o = if v.is_finite() {
            (v * inv).round().clamp(-127.0, 127.0) as i8
        } else {
            0
        };
    }
    scale
}
