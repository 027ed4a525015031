//! Portable scalar f32 GEMM over [`PackedF32Weights`]: the fallback variant.

use std::ops::Range;

use super::packed::PackedF32Weights;
use crate::tiling::{BLOCK, for_each_tile};

/// `out[m, cols] = a[m, k] · wᵀ` (compact tile), scalar f32 accumulation.
/// Shapes are checked by the caller.
pub(crate) fn gemm(a: &[f32], m: usize, w: &PackedF32Weights, cols: Range<usize>, out: &mut [f32]) {
    let k = w.k();
    for_each_tile(m, cols, out, 1, 1, |r0, _rows, b0, _nb, tile| {
        let a_row = &a[r0 * k..(r0 + 1) * k];
        let panel = w.block(b0);
        let mut acc = [0f32; BLOCK];
        for (&x, w16) in a_row.iter().zip(panel.chunks_exact(BLOCK)) {
            for (acc, &y) in acc.iter_mut().zip(w16) {
                *acc += x * y;
            }
        }
        tile[..BLOCK].copy_from_slice(&acc);
    });
}
