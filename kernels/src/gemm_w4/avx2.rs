//! AVX2 W4A8 GEMM, nibbles unpacked in registers.
//!
//! As the W8A8 AVX2 kernel: both operands sign-extended to i16 and multiplied with
//! `vpmaddwd`, exact, no activation bias. Per group of 32 `k` and half block (8
//! columns), a 32-byte load of a packed vector holds quads `v` and `v + 4` of 8
//! columns; masked, shifted and widened they give four `vpmaddwd` operands (4
//! columns × 4 `k` each, two i32 partial sums per column). The group's sums are
//! multiplied by the integer sub-scales, each repeated for the two partial sums of
//! its column, and added to the row's accumulators; the partial sums are folded
//! with `vphaddd` at the end. Wrapping i32 throughout: equal to the scalar
//! reference exactly.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2_groups::{fold_pairs, group_pairs};
use super::packed::{PackedW4Weights, pad_activations};
use super::quant::GROUP_K;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_microtile};

/// Rows per microtile (16 ymm registers: 4 accumulators per row).
const MR: usize = 2;

/// Columns per half block.
const HALF: usize = BLOCK / 2;

/// `out[m, cols]` (compact tile) with AVX2. Shapes and the CPU's features are checked by
/// the caller ([`crate::tile_args::Variants::run`]).
#[target_feature(enable = "avx2")]
pub(crate) fn gemm(a: &[i8], m: usize, w: &PackedW4Weights, cols: Range<usize>, out: &mut [i32]) {
    // Unbiased i8 bit patterns, rows zero-padded to whole groups.
    let padded = pad_activations(a, m, w.k(), w.groups(), 0);
    let kp = GROUP_K * w.groups();
    for_each_microtile!(m, cols, out, MR, 1, |r0, R, b0, _N, tile| {
        for half in 0..2 {
            micro::<R>(&padded[r0 * kp..(r0 + R) * kp], w, b0, half, tile);
        }
    });
}

/// The sub-scales of 8 columns, each repeated twice, as two vectors of 8 i32
/// (columns 0..4 and 4..8), matching `vpmaddwd`'s two partial sums per column.
#[inline]
#[target_feature(enable = "avx2")]
fn pair_scales(subs: &[i8]) -> [__m256i; 2] {
    debug_assert_eq!(subs.len(), HALF);
    let bytes: [u8; HALF] = std::array::from_fn(|i| subs[i] as u8);
    let s = _mm_set_epi64x(0, i64::from_le_bytes(bytes));
    let dup = _mm_shuffle_epi8(
        s,
        _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
    );
    [
        _mm256_cvtepi8_epi32(dup),
        _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(dup)),
    ]
}

/// Computes `R` rows × half `half` (8 columns) of block `b0` into `tile`. `a_rows`
/// holds `R` zero-padded activation rows of `32 * groups` bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn micro<const R: usize>(
    a_rows: &[u8],
    w: &PackedW4Weights,
    b0: usize,
    half: usize,
    tile: &mut Tile<i32>,
) {
    let groups = w.groups();
    let kp = GROUP_K * groups;
    debug_assert_eq!(a_rows.len(), R * kp);
    let (block, subs) = (w.block(b0), w.block_sub_scales(b0));
    let rows: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| a_rows[r * kp..(r + 1) * kp].as_chunks::<4>().0);
    // acc[r][q]: columns 4q..4q+4 of the half, two partial sums each.
    let mut acc = [[_mm256_setzero_si256(); 2]; R];
    for g in 0..groups {
        let part = group_pairs(block, &rows, g, half);
        let at = g * BLOCK + half * HALF;
        let s = pair_scales(&subs[at..at + HALF]);
        for r in 0..R {
            for q in 0..2 {
                acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_mullo_epi32(part[r][q], s[q]));
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let v = fold_pairs(acc[0], acc[1]);
        let at = r * TILE_COLS + half * HALF;
        let dst = &mut tile[at..at + HALF];
        // SAFETY: `dst` is exactly 8 writable i32; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) };
    }
}
