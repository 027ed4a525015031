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
pub(in crate::gemm_w4) const Q_MAX: f32 = 127.0;

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
    if k == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::widest::avx512_available() {
        // SAFETY: avx512f was detected just above.
        #[allow(unsafe_code)]
        return unsafe { avx512::groups_loop(x, k, q, scales) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::widest::avx2_available() {
        // SAFETY: avx2 and fma were detected just above.
        #[allow(unsafe_code)]
        return unsafe { avx2::groups_loop(x, k, q, scales) };
    }
    groups_loop(x, k, q, scales);
}

/// The definition of [`quantize_groups_into`], one element at a time.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn quantize_groups_reference(x: &[f32], m: usize, k: usize, q: &mut [i8], scales: &mut [f32]) {
    check_shapes(x, m, k, q, scales);
    reference_with_groups_of(GROUP_K, x, k, q, scales);
}

/// The per-element definition with groups of `group` inputs (rows of `k`; shapes checked
/// by the caller): each group's scale is its largest finite |x| / 127, each value
/// [`quantize_value`] with it (0 for scale 0).
pub(in crate::gemm_w4) fn reference_with_groups_of(
    group: usize,
    x: &[f32],
    k: usize,
    q: &mut [i8],
    scales: &mut [f32],
) {
    if k == 0 {
        return;
    }
    let groups = k.div_ceil(group);
    let rows = x.chunks_exact(k).zip(q.chunks_exact_mut(k));
    for ((x, q), scales) in rows.zip(scales.chunks_exact_mut(groups)) {
        for ((x, q), scale) in x.chunks(group).zip(q.chunks_mut(group)).zip(scales) {
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
    let scale = group_max(x) / Q_MAX;
    quantize_with_scale(x, scale, q);
    scale
}

/// The largest finite |x| of a group of at most [`GROUP_K`] values (0 if none).
#[inline(always)]
fn group_max(x: &[f32]) -> f32 {
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
    lanes[0]
}

/// Writes the group's values quantized with `scale` (all 0 for scale 0).
#[inline(always)]
pub(in crate::gemm_w4) fn quantize_with_scale(x: &[f32], scale: f32, q: &mut [i8]) {
    if scale == 0.0 {
        q.fill(0);
        return;
    }
    for (o, &v) in q.iter_mut().zip(x) {
        let c = (v / scale).clamp(-Q_MAX, Q_MAX);
        let c = if c.is_nan() { 0.0 } else { c };
        let bits = (c + ROUND_MAGIC)
            .to_bits()
            .wrapping_sub(ROUND_MAGIC.to_bits());
        *o = bits as i32 as i8;
    }
}

/// The group loop with the groups' maxima taken `BATCH` groups at a time by `batch_scales`
/// (which writes the batch's scales), for the vector forms below: the maxima of one group
/// need a horizontal reduction (a chain of shuffles and maxima per group, which made the
/// group quantizer 3x slower than the per-tensor one); a batch's partial maxima
/// transposed into one vector share the shuffles, and their scales are one division.
/// Maxima are exact and taken in any order, so the result is bit-identical to
/// [`quantize_groups_reference`]. Inlined into each form, so it is compiled with its
/// instruction set.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn batched_groups_loop<const BATCH: usize>(
    x: &[f32],
    k: usize,
    q: &mut [i8],
    scales: &mut [f32],
    batch_scales: impl Fn(&[[f32; GROUP_K]; BATCH], &mut [f32; BATCH]),
) {
    let groups = k.div_ceil(GROUP_K);
    let rows = x.chunks_exact(k).zip(q.chunks_exact_mut(k));
    for ((x, q), scales) in rows.zip(scales.chunks_exact_mut(groups)) {
        let (full, x_tail) = x.as_chunks::<GROUP_K>();
        let (full_q, q_tail) = q.as_chunks_mut::<GROUP_K>();
        let (batches, x_rest) = full.as_chunks::<BATCH>();
        let (q_batches, q_rest) = full_q.as_chunks_mut::<BATCH>();
        let (s_batched, s_rest) = scales.split_at_mut(batches.len() * BATCH);
        let s_batches = s_batched.as_chunks_mut::<BATCH>().0;
        for ((x, q), s) in batches.iter().zip(q_batches).zip(s_batches) {
            batch_scales(x, s);
            for ((x, q), &scale) in x.iter().zip(q.iter_mut()).zip(s.iter()) {
                quantize_with_scale(x, scale, q);
            }
        }
        // The whole groups after the last batch, then the short tail group, if any
        // (its scale is the last of `s_rest`).
        let rest = x_rest.iter().zip(q_rest.iter_mut());
        for ((x, q), s) in rest.zip(s_rest.iter_mut()) {
            *s = quantize_group(x, q);
        }
        if !x_tail.is_empty() {
            s_rest[s_rest.len() - 1] = quantize_group(x_tail, q_tail);
        }
    }
}

/// [`batched_groups_loop`] with AVX-512, 16 groups a batch.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    // reason: x86 SIMD intrinsics (loads through raw pointers, calls into
    // `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
    #![allow(unsafe_code)]

    use std::arch::x86_64::*;

    use super::{GROUP_K, Q_MAX, batched_groups_loop};

    /// Groups whose maxima are taken together.
    const BATCH: usize = 16;

    /// [`super::groups_loop`], 16 whole groups at a time.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    pub(super) fn groups_loop(x: &[f32], k: usize, q: &mut [i8], scales: &mut [f32]) {
        batched_groups_loop::<BATCH>(x, k, q, scales, |x, s| {
            let scale = _mm512_div_ps(maxima(x), _mm512_set1_ps(Q_MAX));
            // SAFETY: `s` is exactly 16 writable f32.
            unsafe { _mm512_storeu_ps(s.as_mut_ptr(), scale) };
        });
    }

    /// Lane `i`: the largest finite |x| of group `i`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    fn maxima(x: &[[f32; GROUP_K]; BATCH]) -> __m512 {
        // Per group, the lane-wise maximum of its two halves (non-finite values as 0).
        let v: [__m512; BATCH] = std::array::from_fn(|g| {
            // SAFETY: each half is exactly 16 readable f32.
            let (lo, hi) = unsafe {
                (
                    _mm512_loadu_ps(x[g].as_ptr()),
                    _mm512_loadu_ps(x[g][16..].as_ptr()),
                )
            };
            _mm512_max_ps(finite_abs(lo), finite_abs(hi))
        });
        // Four levels of pairwise merges: each halves the lanes per group and doubles
        // the groups per vector (256-bit halves, 128-bit quarters, then pairs and
        // single lanes within quarters).
        let c: [__m512; 8] = std::array::from_fn(|i| {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            _mm512_max_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xee>(a, b),
            )
        });
        let d: [__m512; 4] = std::array::from_fn(|i| {
            let (a, b) = (c[2 * i], c[2 * i + 1]);
            _mm512_max_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xdd>(a, b),
            )
        });
        let e: [__m512; 2] = std::array::from_fn(|i| {
            let (a, b) = (d[2 * i], d[2 * i + 1]);
            _mm512_max_ps(
                _mm512_shuffle_ps::<0x44>(a, b),
                _mm512_shuffle_ps::<0xee>(a, b),
            )
        });
        let f = _mm512_max_ps(
            _mm512_shuffle_ps::<0x88>(e[0], e[1]),
            _mm512_shuffle_ps::<0xdd>(e[0], e[1]),
        );
        // Lane `l` of `f` holds group ORDER[l]; put group `i` in lane `i`.
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(order, f)
    }

    /// |x|, with NaN and ±∞ as 0 (they never set a scale).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    fn finite_abs(x: __m512) -> __m512 {
        let a = _mm512_abs_ps(x);
        let finite = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, _mm512_set1_ps(f32::INFINITY));
        _mm512_maskz_mov_ps(finite, a)
    }
}

/// [`batched_groups_loop`] with AVX2, 8 groups a batch.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    // reason: x86 SIMD intrinsics (loads through raw pointers, calls into
    // `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
    #![allow(unsafe_code)]

    use std::arch::x86_64::*;

    use super::{GROUP_K, Q_MAX, batched_groups_loop};

    /// Groups whose maxima are taken together.
    const BATCH: usize = 8;

    /// [`super::groups_loop`], 8 whole groups at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn groups_loop(x: &[f32], k: usize, q: &mut [i8], scales: &mut [f32]) {
        batched_groups_loop::<BATCH>(x, k, q, scales, |x, s| {
            let scale = _mm256_div_ps(maxima(x), _mm256_set1_ps(Q_MAX));
            // SAFETY: `s` is exactly 8 writable f32.
            unsafe { _mm256_storeu_ps(s.as_mut_ptr(), scale) };
        });
    }

    /// Lane `i`: the largest finite |x| of group `i`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn maxima(x: &[[f32; GROUP_K]; BATCH]) -> __m256 {
        // Per group, the lane-wise maximum of its four eighths (non-finite values as 0).
        let v: [__m256; BATCH] = std::array::from_fn(|g| {
            let [a, b, c, d] = [0, 8, 16, 24].map(|at| {
                // SAFETY: `at + 8 <= 32`: each eighth is 8 readable f32.
                finite_abs(unsafe { _mm256_loadu_ps(x[g][at..].as_ptr()) })
            });
            _mm256_max_ps(_mm256_max_ps(a, b), _mm256_max_ps(c, d))
        });
        // Three levels of pairwise merges: each halves the lanes per group and doubles
        // the groups per vector (128-bit halves, then pairs and single lanes within
        // halves).
        let c: [__m256; 4] = std::array::from_fn(|i| {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            _mm256_max_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            )
        });
        let d: [__m256; 2] = std::array::from_fn(|i| {
            let (a, b) = (c[2 * i], c[2 * i + 1]);
            _mm256_max_ps(
                _mm256_shuffle_ps::<0x44>(a, b),
                _mm256_shuffle_ps::<0xee>(a, b),
            )
        });
        let e = _mm256_max_ps(
            _mm256_shuffle_ps::<0x88>(d[0], d[1]),
            _mm256_shuffle_ps::<0xdd>(d[0], d[1]),
        );
        // Lane `l` of `e` holds group [0, 2, 4, 6, 1, 3, 5, 7][l]; put group `i` in lane `i`.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        _mm256_permutevar8x32_ps(e, order)
    }

    /// |x|, with NaN and ±∞ as 0 (they never set a scale).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn finite_abs(x: __m256) -> __m256 {
        let a = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
        let finite = _mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(f32::INFINITY));
        _mm256_and_ps(finite, a)
    }
}
