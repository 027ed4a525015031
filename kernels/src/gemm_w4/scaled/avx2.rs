//! AVX2 variant.
//!
//! The integer products are those of [`crate::gemm_w4::gemm_w4`]'s AVX2 kernel (the
//! stored nibbles against the activations with `vpmaddubsw`, added up in i16 per group,
//! `-8 Σ a` added after: [`crate::gemm_w4::avx2_groups`]). `SPAN = 1`: each group's
//! product is converted to f32 and fused-multiply-added with the sub-scales times the
//! group's activation scale. `SPAN > 1`: the products are multiplied by the sub-scales
//! in i32 (`vpmulld`) and added to the span's i32 sum, converted and
//! fused-multiply-added with the span's activation scale after its groups. The row
//! scales multiply the accumulators at the end. One row (a decode step) takes [`row`]'s
//! kernel, block after block straight into the output. Same operations and order as
//! [`super::scalar`]: bit-identical results. Needs FMA besides AVX2 (every AVX2 CPU of
//! note has it); a CPU without it runs the scalar variant.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{BiasSlots, spans_of};
use crate::cpu::I8Kernel;
use crate::gemm_w4::avx2_groups::{group_dots, group_operands, neg_group_bias, sub_scales};
use crate::gemm_w4::packed::{PackedW4Weights, activation_rows};
use crate::gemm_w4::quant::GROUP_K;
use crate::gemv_f32::for_each_block;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_microtile};

mod row;

/// Rows per microtile.
const MR: usize = 2;

/// Columns per half block.
const HALF: usize = BLOCK / 2;

/// `out[m, cols]` (compact tile) with AVX2 and FMA (scalar without FMA). Shapes are
/// checked by the caller.
///
/// # Panics
/// If the CPU lacks avx2.
pub(super) fn gemm<const SPAN: usize>(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    assert!(I8Kernel::Avx2.is_available(), "CPU lacks avx2");
    if !is_x86_feature_detected!("fma") {
        return super::scalar::gemm::<SPAN>(a, a_scales, m, w, cols, out);
    }
    // SAFETY: avx2 and fma were detected just above.
    unsafe { gemm_impl::<SPAN>(a, a_scales, m, w, cols, out) }
}

#[target_feature(enable = "avx2,fma")]
fn gemm_impl<const SPAN: usize>(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    let groups = w.groups();
    let (kp, spans) = (GROUP_K * groups, spans_of::<SPAN>(groups));
    let padded = activation_rows(a, m, w.k(), groups);
    let mut slots = BiasSlots::new();
    let neg_bias = slots.take(padded.len() / GROUP_K);
    neg_group_bias(&padded, neg_bias);
    let neg_bias = &*neg_bias;
    if m == 1 {
        for_each_block(cols, out, |b, dst| {
            row::block::<SPAN>(&padded, a_scales, neg_bias, w, b, dst)
        });
        return;
    }
    for_each_microtile!(m, cols, out, MR, 1, |r0, R, b0, _N, tile| {
        let a_rows = &padded[r0 * kp..(r0 + R) * kp];
        let scales = &a_scales[r0 * spans..(r0 + R) * spans];
        let bias = &neg_bias[r0 * groups..(r0 + R) * groups];
        micro::<SPAN, R>((a_rows, scales, bias), w, b0, tile);
    });
}

/// Computes `R` rows × the 16 columns of block `b0` into `tile` (`neg_bias`: the rows'
/// `-8 Σ a` per group).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn micro<const SPAN: usize, const R: usize>(
    (a_rows, scales, neg_bias): (&[u8], &[f32], &[i32]),
    w: &PackedW4Weights,
    b0: usize,
    tile: &mut Tile<f32>,
) {
    let groups = w.groups();
    let (kp, spans) = (GROUP_K * groups, spans_of::<SPAN>(groups));
    debug_assert_eq!(a_rows.len(), R * kp);
    let (block, subs) = (w.block(b0), w.block_sub_scales(b0));
    let rows: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| a_rows[r * kp..(r + 1) * kp].as_chunks::<4>().0);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for span in 0..spans {
        let mut sum = [[_mm256_setzero_si256(); 2]; R];
        for g in span * SPAN..((span + 1) * SPAN).min(groups) {
            let bias = std::array::from_fn(|r| neg_bias[r * groups + g]);
            let (group, quads) = group_operands(block, &rows, g);
            let dots = group_dots(group, quads, bias);
            let s = sub_scales(&subs[g * BLOCK..(g + 1) * BLOCK]);
            if SPAN == 1 {
                let s = [_mm256_cvtepi32_ps(s[0]), _mm256_cvtepi32_ps(s[1])];
                for r in 0..R {
                    let a_scale = _mm256_set1_ps(scales[r * spans + span]);
                    for h in 0..2 {
                        let scale = _mm256_mul_ps(s[h], a_scale);
                        let dot = _mm256_cvtepi32_ps(dots[r][h]);
                        acc[r][h] = _mm256_fmadd_ps(dot, scale, acc[r][h]);
                    }
                }
            } else {
                for r in 0..R {
                    for h in 0..2 {
                        let scaled = _mm256_mullo_epi32(dots[r][h], s[h]);
                        sum[r][h] = _mm256_add_epi32(sum[r][h], scaled);
                    }
                }
            }
        }
        if SPAN > 1 {
            for r in 0..R {
                let a_scale = _mm256_set1_ps(scales[r * spans + span]);
                for h in 0..2 {
                    let sum = _mm256_cvtepi32_ps(sum[r][h]);
                    acc[r][h] = _mm256_fmadd_ps(sum, a_scale, acc[r][h]);
                }
            }
        }
    }
    let mut d = [0f32; BLOCK];
    let all = w.row_scales();
    let start = (b0 * BLOCK).min(all.len());
    let have = &all[start..(start + BLOCK).min(all.len())];
    d[..have.len()].copy_from_slice(have);
    for (r, acc) in acc.iter().enumerate() {
        let dst = &mut tile[r * TILE_COLS..r * TILE_COLS + BLOCK];
        let halves = dst.chunks_exact_mut(HALF).zip(d.chunks_exact(HALF));
        for (half, (dst, d)) in acc.iter().zip(halves) {
            // SAFETY: `d` is exactly 8 readable f32 and `dst` 8 writable ones; loadu and
            // storeu have no alignment requirement.
            unsafe {
                let d = _mm256_loadu_ps(d.as_ptr());
                _mm256_storeu_ps(dst.as_mut_ptr(), _mm256_mul_ps(*half, d));
            }
        }
    }
}
