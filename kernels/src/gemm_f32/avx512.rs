//! AVX-512F f32 GEMM: 8 rows × 32 columns of FMA accumulators per microtile.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls
// into `#[target_feature]` functions) need `unsafe`; every block states why
// it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::packed::PackedF32Weights;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_microtile};

/// Rows per microtile.
const MR: usize = 8;
/// Blocks of 16 columns per microtile.
const NB: usize = 2;

/// `out[m, cols] = a[m, k] · wᵀ` (compact tile) with AVX-512F. Shapes and
/// the CPU's features are checked by the caller
/// ([`crate::tile_args::Variants::run`]).
#[target_feature(enable = "avx512f")]
pub(crate) fn gemm(a: &[f32], m: usize, w: &PackedF32Weights, cols: Range<usize>, out: &mut [f32]) {
    let k = w.k();
    assert_eq!(a.len(), m * k);
    for_each_microtile!(m, cols, out, MR, NB, |r0, R, b0, N, tile| {
        micro::<R, N>(&a[r0 * k..(r0 + R) * k], w, b0, tile)
    });
}

/// Computes `R` rows × `N` blocks into `tile`.
#[inline]
#[target_feature(enable = "avx512f")]
fn micro<const R: usize, const N: usize>(
    a_rows: &[f32],
    w: &PackedF32Weights,
    b0: usize,
    tile: &mut Tile<f32>,
) {
    let k = w.k();
    debug_assert_eq!(a_rows.len(), R * k);
    debug_assert!(b0 + N <= w.n_blocks() && N * BLOCK <= TILE_COLS);
    let panels: [&[f32]; N] = std::array::from_fn(|j| w.block(b0 + j));
    let rows: [&[f32]; R] = std::array::from_fn(|r| &a_rows[r * k..(r + 1) * k]);
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for p in 0..k {
        let wv: [__m512; N] = std::array::from_fn(|j| {
            let w16 = &panels[j][p * BLOCK..(p + 1) * BLOCK];
            // SAFETY: `w16` is exactly 16 readable f32; loadu has no
            // alignment requirement.
            unsafe { _mm512_loadu_ps(w16.as_ptr()) }
        });
        for r in 0..R {
            let av = _mm512_set1_ps(rows[r][p]);
            for j in 0..N {
                acc[r][j] = _mm512_fmadd_ps(av, wv[j], acc[r][j]);
            }
        }
    }
    for r in 0..R {
        for j in 0..N {
            let dst = &mut tile[r * TILE_COLS + j * BLOCK..r * TILE_COLS + (j + 1) * BLOCK];
            // SAFETY: `dst` is exactly 16 writable f32; storeu has no
            // alignment requirement.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), acc[r][j]) };
        }
    }
}
