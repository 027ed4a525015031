//! AVX2 INT8 GEMM.
//!
//! `vpmaddubsw` (`_mm256_maddubs_epi16`) would need the u8×i8 bias trick and
//! saturates its i16 pair sums, so it is not used. Instead both operands are
//! sign-extended to i16 (`vpmovsxbw`) and multiplied with `vpmaddwd`
//! (`_mm256_madd_epi16`), which sums adjacent i16 products into exact i32
//! lanes (an i8 pair sum is at most 2 · 128² = 32768, far inside i32). No
//! bias and no correction are needed; the result equals the scalar
//! reference exactly (wrapping modulo 2³² like it).
//!
//! Per group of 4 k, a 128-bit load of the packed block holds 4 columns ×
//! 4 k; after widening, `vpmaddwd` with the broadcast activations
//! `[a0 a1 a2 a3]×4` gives two partial sums per column, which are folded
//! with `vphaddd` at the end.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls
// into `#[target_feature]` functions) need `unsafe`; every block states why
// it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::packed::{GROUP_BYTES, PackedI8Weights, pad_activations};
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_microtile};

/// Rows per microtile.
const MR: usize = 3;

/// `out[m, cols] = a[m, k] · wᵀ` (compact tile) with AVX2. Shapes and the
/// CPU's features are checked by the caller
/// ([`crate::tile_args::Variants::run`]).
#[target_feature(enable = "avx2")]
pub(crate) fn gemm(a: &[i8], m: usize, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    // Unbiased i8 bit patterns, rows zero-padded to whole groups of 4.
    let padded = pad_activations(a, m, w.k(), w.k_groups(), 0);
    let kp = 4 * w.k_groups();
    for_each_microtile!(m, cols, out, MR, 1, |r0, R, b0, _N, tile| {
        micro::<R>(&padded[r0 * kp..(r0 + R) * kp], w, b0, tile)
    });
}

/// Folds the pair sums of 8 columns: `lo` holds columns 0..4 and `hi`
/// columns 4..8, two partial sums per column; returns the 8 column sums in
/// order.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn fold_pairs(lo: __m256i, hi: __m256i) -> __m256i {
    // hadd: [c0 c1 c4 c5 | c2 c3 c6 c7] (per 128-bit lane), then reorder the
    // 64-bit quarters 0, 2, 1, 3.
    let h = _mm256_hadd_epi32(lo, hi);
    _mm256_permute4x64_epi64::<0b11_01_10_00>(h)
}

/// Computes `R` rows × one block (16 columns) into `tile`. `a_rows` holds
/// `R` zero-padded activation rows of `4 * k_groups` bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn micro<const R: usize>(a_rows: &[u8], w: &PackedI8Weights, b0: usize, tile: &mut Tile<i32>) {
    let kp = 4 * w.k_groups();
    debug_assert_eq!(a_rows.len(), R * kp);
    const { assert!(BLOCK <= TILE_COLS) };
    let block = w.block(b0);
    let rows: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| a_rows[r * kp..(r + 1) * kp].as_chunks::<4>().0);
    // acc[r][q]: quarter q = columns 4q..4q+4, two partial sums each.
    let mut acc = [[_mm256_setzero_si256(); 4]; R];
    for g in 0..w.k_groups() {
        let bytes = &block[g * GROUP_BYTES..(g + 1) * GROUP_BYTES];
        let wq: [__m256i; 4] = std::array::from_fn(|q| {
            let quarter = &bytes[q * 16..(q + 1) * 16];
            // SAFETY: `quarter` is exactly 16 readable bytes; loadu has no
            // alignment requirement.
            let v = unsafe { _mm_loadu_si128(quarter.as_ptr().cast()) };
            _mm256_cvtepi8_epi16(v)
        });
        for r in 0..R {
            // [a0 a1 a2 a3] repeated 4 times, widened to 16 × i16.
            let av = _mm256_cvtepi8_epi16(_mm_set1_epi32(i32::from_le_bytes(rows[r][g])));
            for q in 0..4 {
                acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(wq[q], av));
            }
        }
    }
    for r in 0..R {
        let halves = [
            fold_pairs(acc[r][0], acc[r][1]),
            fold_pairs(acc[r][2], acc[r][3]),
        ];
        for (h, v) in halves.into_iter().enumerate() {
            let dst = &mut tile[r * TILE_COLS + h * 8..r * TILE_COLS + (h + 1) * 8];
            // SAFETY: `dst` is exactly 8 writable i32; storeu has no
            // alignment requirement.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) };
        }
    }
}
