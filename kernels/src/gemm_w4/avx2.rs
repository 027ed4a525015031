//! AVX2 W4A8 GEMM, nibbles unpacked in registers.
//!
//! Per group of 32 `k` and block (16 columns), the group's exact i32 products of
//! [`super::avx2_groups`] (the stored `q + 8` against the activations with
//! `vpmaddubsw`, `-8 Σ a` added after), multiplied by the integer sub-scales and added
//! to the row's accumulators. Wrapping i32 throughout: equal to the scalar reference
//! exactly.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2_groups::{group_dots, group_operands, neg_group_bias, sub_scales};
use super::packed::{PackedW4Weights, pad_activations};
use super::quant::GROUP_K;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_microtile};

/// Rows per microtile.
const MR: usize = 2;

/// Columns per half block.
const HALF: usize = BLOCK / 2;

/// `out[m, cols]` (compact tile) with AVX2. Shapes and the CPU's features are checked by
/// the caller ([`crate::tile_args::Variants::run`]).
#[target_feature(enable = "avx2")]
pub(crate) fn gemm(a: &[i8], m: usize, w: &PackedW4Weights, cols: Range<usize>, out: &mut [i32]) {
    // Unbiased i8 bit patterns, rows zero-padded to whole groups.
    let padded = pad_activations(a, m, w.k(), w.groups(), 0);
    let mut neg_bias = vec![0; padded.len() / GROUP_K];
    neg_group_bias(&padded, &mut neg_bias);
    let (groups, kp) = (w.groups(), GROUP_K * w.groups());
    for_each_microtile!(m, cols, out, MR, 1, |r0, R, b0, _N, tile| {
        let rows = (
            &padded[r0 * kp..(r0 + R) * kp],
            &neg_bias[r0 * groups..(r0 + R) * groups],
        );
        micro::<R>(rows, w, b0, tile);
    });
}

/// Computes `R` rows × the 16 columns of block `b0` into `tile`. `a_rows` holds `R`
/// zero-padded activation rows of `32 * groups` bytes, `neg_bias` their `-8 Σ a` per
/// group.
#[inline]
#[target_feature(enable = "avx2")]
fn micro<const R: usize>(
    (a_rows, neg_bias): (&[u8], &[i32]),
    w: &PackedW4Weights,
    b0: usize,
    tile: &mut Tile<i32>,
) {
    let groups = w.groups();
    let kp = GROUP_K * groups;
    debug_assert_eq!(a_rows.len(), R * kp);
    let (block, subs) = (w.block(b0), w.block_sub_scales(b0));
    let rows: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| a_rows[r * kp..(r + 1) * kp].as_chunks::<4>().0);
    let mut acc = [[_mm256_setzero_si256(); 2]; R];
    for g in 0..groups {
        let bias = std::array::from_fn(|r| neg_bias[r * groups + g]);
        let (group, quads) = group_operands(block, &rows, g);
        let dots = group_dots(group, quads, bias);
        let s = sub_scales(&subs[g * BLOCK..(g + 1) * BLOCK]);
        for r in 0..R {
            for h in 0..2 {
                let scaled = _mm256_mullo_epi32(dots[r][h], s[h]);
                acc[r][h] = _mm256_add_epi32(acc[r][h], scaled);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let dst = &mut tile[r * TILE_COLS..r * TILE_COLS + BLOCK];
        for (half, dst) in acc.iter().zip(dst.chunks_exact_mut(HALF)) {
            // SAFETY: `dst` is exactly 8 writable i32; storeu has no alignment requirement.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), *half) };
        }
    }
}
