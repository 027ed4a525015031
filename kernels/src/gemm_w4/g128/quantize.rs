//! INT8 activations with one scale per row and group of 128 inputs (`w4a8-g128`).
//!
//! The reference ([`quantize_groups128_reference`]) is [`crate::reference::quantize_value`]
//! per element with each group's scale; the kernel ([`quantize_groups128_into`]) is the
//! same arithmetic as a loop compiled for the widest vector unit, its values quantized by
//! the per-32 quantizer's loop (rounding through the mantissa bits of `x + 1.5 · 2²³`).
//! A group's maximum takes one horizontal reduction per 128 values (four 32-lane slices
//! folded lane-wise first; with AVX-512, eight 16-lane vectors and one
//! `reduce_max`: the portable loop's reduction tree made the quantizer 1.8x slower than
//! the per-32 one). Maxima are exact in any order, so the two are bit-identical.

use super::ACT_GROUP_K;
use crate::gemm_w4::grouped::quantize::{Q_MAX, quantize_with_scale, reference_with_groups_of};
use crate::gemm_w4::quant::GROUP_K;
use crate::widest::widest;

/// Quantizes `x[m, k]` per row and group of [`ACT_GROUP_K`] inputs (the last group of a
/// row may be short): scale = the group's largest finite |x| / 127, each value
/// `clamp(round_ties_even(x / scale), -127, 127)`. Returns the `[m, k]` values and the
/// `[m, ceil(k / 128)]` scales. A group without a nonzero finite value gets scale 0 and
/// values 0; NaN quantizes to 0 and ±∞ saturates, neither sets the scale.
///
/// # Panics
/// If `x.len() != m * k`.
pub fn quantize_groups128(x: &[f32], m: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = vec![0i8; m * k];
    let mut scales = vec![0f32; m * k.div_ceil(ACT_GROUP_K)];
    quantize_groups128_into(x, m, k, &mut q, &mut scales);
    (q, scales)
}

/// [`quantize_groups128`] into caller-owned buffers.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn quantize_groups128_into(x: &[f32], m: usize, k: usize, q: &mut [i8], scales: &mut [f32]) {
    check_shapes(x, m, k, q, scales);
    if k == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::widest::avx512_available() {
        // SAFETY: avx512f, avx512bw, avx512dq and avx512vl were detected just above.
        #[allow(unsafe_code)]
        return unsafe { avx512::rows_loop(x, k, q, scales) };
    }
    rows_loop(x, k, q, scales);
}

/// The definition of [`quantize_groups128_into`], one element at a time.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn quantize_groups128_reference(
    x: &[f32],
    m: usize,
    k: usize,
    q: &mut [i8],
    scales: &mut [f32],
) {
    check_shapes(x, m, k, q, scales);
    reference_with_groups_of(ACT_GROUP_K, x, k, q, scales);
}

fn check_shapes(x: &[f32], m: usize, k: usize, q: &[i8], scales: &[f32]) {
    assert_eq!(x.len(), m * k, "x must be [m, k]");
    assert_eq!(q.len(), m * k, "q must be [m, k]");
    assert_eq!(
        scales.len(),
        m * k.div_ceil(ACT_GROUP_K),
        "scales must be [m, ceil(k / 128)]"
    );
}

widest! {
    fn rows_loop(x: &[f32], k: usize, q: &mut [i8], scales: &mut [f32]) {
        let groups = k.div_ceil(ACT_GROUP_K);
        let rows = x.chunks_exact(k).zip(q.chunks_exact_mut(k));
        for ((x, q), scales) in rows.zip(scales.chunks_exact_mut(groups)) {
            let groups = x.chunks(ACT_GROUP_K).zip(q.chunks_mut(ACT_GROUP_K));
            for ((x, q), scale) in groups.zip(scales) {
                *scale = group_max(x) / Q_MAX;
                quantize_with_scale(x, *scale, q);
            }
        }
    }
}

/// The largest finite |x| of a group of at most [`ACT_GROUP_K`] values (0 if none).
#[inline(always)]
fn group_max(x: &[f32]) -> f32 {
    // 32 independent lanes (whole slices of 32 as fixed-size arrays, which vectorize),
    // then one tree of element-wise maxima; NaN and ±∞ compare false.
    let mut lanes = [0f32; GROUP_K];
    let (slices, tail) = x.as_chunks::<GROUP_K>();
    for slice in slices {
        fold_into(&mut lanes, slice);
    }
    fold_into(&mut lanes, tail);
    let mut width = GROUP_K / 2;
    while width > 0 {
        for i in 0..width {
            let other = lanes[i + width];
            lanes[i] = if other > lanes[i] { other } else { lanes[i] };
        }
        width /= 2;
    }
    lanes[0]
}

/// `lanes[i] = max(lanes[i], |x[i]|)` over the finite values of `x` (at most 32).
#[inline(always)]
fn fold_into(lanes: &mut [f32; GROUP_K], x: &[f32]) {
    for (m, &v) in lanes.iter_mut().zip(x) {
        let a = v.abs();
        let a = if a < f32::INFINITY { a } else { 0.0 };
        *m = if a > *m { a } else { *m };
    }
}

/// The row loop with each whole group's maximum from eight 16-lane vectors.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    // reason: x86 SIMD intrinsics (loads through raw pointers, calls into
    // `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
    #![allow(unsafe_code)]

    use std::arch::x86_64::*;

    use super::{ACT_GROUP_K, Q_MAX, group_max, quantize_with_scale};

    /// [`super::rows_loop`] with [`whole_group_max`] for the whole groups.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    pub(super) fn rows_loop(x: &[f32], k: usize, q: &mut [i8], scales: &mut [f32]) {
        let groups = k.div_ceil(ACT_GROUP_K);
        let rows = x.chunks_exact(k).zip(q.chunks_exact_mut(k));
        for ((x, q), scales) in rows.zip(scales.chunks_exact_mut(groups)) {
            let groups = x.chunks(ACT_GROUP_K).zip(q.chunks_mut(ACT_GROUP_K));
            for ((x, q), scale) in groups.zip(scales) {
                let whole = (
                    <&[f32; ACT_GROUP_K]>::try_from(x),
                    <&mut [i8; ACT_GROUP_K]>::try_from(&mut *q),
                );
                if let (Ok(x), Ok(q)) = whole {
                    // Fixed lengths: the quantize loop compiles without a remainder.
                    *scale = whole_group_max(x) / Q_MAX;
                    quantize_with_scale(x, *scale, q);
                } else {
                    *scale = group_max(x) / Q_MAX;
                    quantize_with_scale(x, *scale, q);
                }
            }
        }
    }

    /// The largest finite |x| of 128 values (NaN and ±∞ as 0).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    fn whole_group_max(x: &[f32; ACT_GROUP_K]) -> f32 {
        let (vectors, _) = x.as_chunks::<16>();
        let mut max = _mm512_setzero_ps();
        for v in vectors {
            // SAFETY: `v` is exactly 16 readable f32.
            let a = _mm512_abs_ps(unsafe { _mm512_loadu_ps(v.as_ptr()) });
            let finite = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, _mm512_set1_ps(f32::INFINITY));
            max = _mm512_max_ps(max, _mm512_maskz_mov_ps(finite, a));
        }
        _mm512_reduce_max_ps(max)
    }
}
