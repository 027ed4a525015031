//! AVX2 + FMA f32 GEMM: 6 rows × 16 columns of FMA accumulators per
//! microtile (12 of the 16 ymm registers).

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls
// into `#[target_feature]` functions) need `unsafe`; every block states why
// it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::packed::PackedF32Weights;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_microtile};

/// Rows per microtile.
const MR: usize = 6;

/// `out[m, cols] = a[m, k] · wᵀ` (compact tile) with AVX2 + FMA. Shapes and
/// the CPU's features are checked by the caller
/// ([`crate::tile_args::Variants::run`]).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn gemm(a: &[f32], m: usize, w: &PackedF32Weights, cols: Range<usize>, out: &mut [f32]) {
    let k = w.k();
    assert_eq!(a.len(), m * k);
    for_each_microtile!(m, cols, out, MR, 1, |r0, R, b0, _N, tile| {
        micro::<R>(&a[r0 * k..(r0 + R) * k], w, b0, tile)
    });
}

/// Computes `R` rows × one block (16 columns) into `tile`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn micro<const R: usize>(a_rows: &[f32], w: &PackedF32Weights, b0: usize, tile: &mut Tile<f32>) {
    let k = w.k();
    debug_assert_eq!(a_rows.len(), R * k);
    const { assert!(BLOCK <= TILE_COLS) };
    let panel = w.block(b0);
    let rows: [&[f32]; R] = std::array::from_fn(|r| &a_rows[r * k..(r + 1) * k]);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for p in 0..k {
        let w16 = &panel[p * BLOCK..(p + 1) * BLOCK];
        // SAFETY: `w16` is exactly 16 readable f32: two 8-lane loads at
        // offsets 0 and 8; loadu has no alignment requirement.
        let wv = unsafe {
            [
                _mm256_loadu_ps(w16.as_ptr()),
                _mm256_loadu_ps(w16.as_ptr().add(8)),
            ]
        };
        for r in 0..R {
            let av = _mm256_set1_ps(rows[r][p]);
            acc[r][0] = _mm256_fmadd_ps(av, wv[0], acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, wv[1], acc[r][1]);
        }
    }
    for r in 0..R {
        for h in 0..2 {
            let dst = &mut tile[r * TILE_COLS + h * 8..r * TILE_COLS + (h + 1) * 8];
            // SAFETY: `dst` is exactly 8 writable f32; storeu has no
            // alignment requirement.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), acc[r][h]) };
        }
    }
}
