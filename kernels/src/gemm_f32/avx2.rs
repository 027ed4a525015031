//! AVX2 + FMA f32 GEMM: 6 rows × 16 columns of FMA accumulators per
//! microtile (12 of the 16 ymm registers).

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls
// into `#[target_feature]` functions) need `unsafe`; every block states why
// it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::packed::PackedF32Weights;
use crate::cpu::F32Kernel;
use crate::tiling::{BLOCK, MicroKernel, TILE_COLS, Tile, for_each_microtile};

/// `out[m, cols] = a[m, k] · wᵀ` (compact tile) with AVX2 + FMA. Shapes are
/// checked by the caller.
///
/// # Panics
/// If the CPU lacks avx2 or fma.
pub(crate) fn gemm(a: &[f32], m: usize, w: &PackedF32Weights, cols: Range<usize>, out: &mut [f32]) {
    assert!(F32Kernel::Avx2Fma.is_available(), "CPU lacks avx2/fma");
    // SAFETY: the required target features were detected just above.
    unsafe { gemm_impl(a, m, w, cols, out) }
}

#[target_feature(enable = "avx2,fma")]
fn gemm_impl(a: &[f32], m: usize, w: &PackedF32Weights, cols: Range<usize>, out: &mut [f32]) {
    assert_eq!(a.len(), m * w.k());
    for_each_microtile(&Tiles { a, w }, m, cols, out);
}

/// The operands of one product, as the tile driver's kernel.
struct Tiles<'a> {
    a: &'a [f32],
    w: &'a PackedF32Weights,
}

impl MicroKernel for Tiles<'_> {
    type Out = f32;
    /// 6 rows × 2 accumulators: 12 of the 16 ymm registers.
    const MR: usize = 6;
    const NB: usize = 1;

    #[inline(always)]
    fn tile<const R: usize, const N: usize>(&self, r0: usize, b0: usize, tile: &mut Tile<f32>) {
        let k = self.w.k();
        let a_rows = &self.a[r0 * k..(r0 + R) * k];
        // SAFETY: `Tiles` is only made by `gemm_impl`, which runs with avx2 and fma.
        unsafe { micro::<R>(a_rows, self.w, b0, tile) }
    }
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
