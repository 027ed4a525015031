//! The one-row product (a decode step's linear) with AVX2: one block of 16 columns
//! against one activation row, group after group, for both spans.
//!
//! The inner product is the multi-row microkernel's ([`group_dots`] with one row), so
//! the results are bit-identical to it and to [`crate::gemm_w4::scaled::scalar`]; what
//! differs is how the operands arrive. The loop walks chunks of the block, the
//! activations and the scales without bounds checks or a tile buffer, stores a whole
//! block straight into the output, and prefetches [`ROW_PREFETCH_GROUPS`] groups ahead:
//! a one-row product does little arithmetic per byte, so its loads wait on memory unless
//! requested early. One block at a time, so that the weights stream as one sequential
//! run (blocks follow each other in memory).

use std::arch::x86_64::*;

use super::super::{row_groups, row_spans};
use crate::gemm_w4::avx2_groups::{group_dots, sub_scales};
use crate::gemm_w4::packed::{GROUP_BYTES, PackedW4Weights};
use crate::tiling::BLOCK;

/// Groups ahead of the one multiplied whose weight bytes are prefetched: 12 KiB, a block
/// or more ahead (SmolLM2's blocks are 18 or 48 groups), the AVX-512 one-row kernel's
/// distance. On one thread of an AVX2-only EPYC, 24, 48 and 96 groups streamed alike from
/// memory within the bench's spread (`decode_gemv` in `benches/w4a8.rs`: 12.8-14.6 GiB/s).
const ROW_PREFETCH_GROUPS: usize = 48;

/// `out = d · Σ_span a_scale[span] · Σ_{g ∈ span} s[g] · Σ_{p ∈ g} a[p] · q[p]` for the 16
/// columns of block `b`, in the order of [`crate::gemm_w4::scaled::scalar`]. `a_row` is
/// the zero-padded activation row (`32 · groups` bytes), `scales` its scale per span and
/// `neg_bias` its `-8 Σ a` per group.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn block<const SPAN: usize>(
    a_row: &[u8],
    scales: &[f32],
    neg_bias: &[i32],
    w: &PackedW4Weights,
    b: usize,
    out: &mut [f32; BLOCK],
) {
    let mut acc = [_mm256_setzero_ps(); 2];
    if SPAN == 1 {
        for (a_scale, (group, sub, quads, neg_bias)) in row_groups(w, b, a_row, neg_bias, scales) {
            let a_scale = _mm256_set1_ps(a_scale);
            let dots = group_dot(group, quads, neg_bias);
            let s = sub_scales(sub);
            for h in 0..2 {
                let scale = _mm256_mul_ps(_mm256_cvtepi32_ps(s[h]), a_scale);
                acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[h]), scale, acc[h]);
            }
        }
    } else {
        for (a_scale, groups) in row_spans::<SPAN>(w, b, a_row, neg_bias, scales) {
            let a_scale = _mm256_set1_ps(a_scale);
            let mut sum = [_mm256_setzero_si256(); 2];
            for (group, sub, quads, neg_bias) in groups {
                let dots = group_dot(group, quads, neg_bias);
                let s = sub_scales(sub);
                for h in 0..2 {
                    sum[h] = _mm256_add_epi32(sum[h], _mm256_mullo_epi32(dots[h], s[h]));
                }
            }
            for h in 0..2 {
                acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[h]), a_scale, acc[h]);
            }
        }
    }
    let d = row_scales(w, b);
    for (h, half) in out
        .as_chunks_mut::<{ BLOCK / 2 }>()
        .0
        .iter_mut()
        .enumerate()
    {
        // SAFETY: `half` is exactly 8 writable f32; storeu needs no alignment.
        unsafe { _mm256_storeu_ps(half.as_mut_ptr(), _mm256_mul_ps(acc[h], d[h])) };
    }
}

/// [`group_dots`] of one row, and the prefetch of the group [`ROW_PREFETCH_GROUPS`] ahead.
#[inline]
#[target_feature(enable = "avx2")]
fn group_dot(group: &[u8; GROUP_BYTES], quads: &[[u8; 4]; 8], neg_bias: i32) -> [__m256i; 2] {
    let ahead = group
        .as_ptr()
        .wrapping_add(ROW_PREFETCH_GROUPS * GROUP_BYTES);
    for line in (0..GROUP_BYTES).step_by(64) {
        // A hint: it never faults, so an address past the weights is harmless.
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
    }
    let [dots] = group_dots::<1>(group, [quads], [neg_bias]);
    dots
}

/// The row scales of block `b` as two vectors of 8 (0 for padding columns).
#[inline]
#[target_feature(enable = "avx2")]
fn row_scales(w: &PackedW4Weights, b: usize) -> [__m256; 2] {
    let all = w.row_scales();
    let start = (b * BLOCK).min(all.len());
    let have = &all[start..(start + BLOCK).min(all.len())];
    match <&[f32; BLOCK]>::try_from(have) {
        // SAFETY: `whole` is exactly 16 readable f32; loadu needs no alignment.
        Ok(whole) => unsafe {
            [
                _mm256_loadu_ps(whole.as_ptr()),
                _mm256_loadu_ps(whole.as_ptr().add(BLOCK / 2)),
            ]
        },
        Err(_) => {
            let mut d = [0f32; BLOCK];
            d[..have.len()].copy_from_slice(have);
            // SAFETY: `d` is exactly 16 readable f32; loadu needs no alignment.
            unsafe {
                [
                    _mm256_loadu_ps(d.as_ptr()),
                    _mm256_loadu_ps(d.as_ptr().add(BLOCK / 2)),
                ]
            }
        }
    }
}
