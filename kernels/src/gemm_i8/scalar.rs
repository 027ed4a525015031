//! Portable scalar INT8 GEMM over [`PackedI8Weights`]: the fallback variant.

use std::ops::Range;

use super::packed::{GROUP_BYTES, PackedI8Weights, pad_activations};
use crate::tiling::{BLOCK, for_each_tile};

/// `out[m, cols] = a[m, k] · wᵀ` (compact tile), scalar. Shapes are checked
/// by the caller.
pub(crate) fn gemm(a: &[i8], m: usize, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    let kp = 4 * w.k_groups();
    // i8 bit patterns, rows zero-padded to whole groups of 4.
    let padded = pad_activations(a, m, w.k(), w.k_groups(), 0);
    for_each_tile(m, cols, out, 1, 1, |r0, _rows, b0, _nb, tile| {
        let a_row = padded[r0 * kp..(r0 + 1) * kp].as_chunks::<4>().0;
        let groups = w.block(b0).as_chunks::<GROUP_BYTES>().0;
        let mut acc = [0i32; BLOCK];
        for (a4, group) in a_row.iter().zip(groups) {
            let a4 = a4.map(|v| i32::from(v as i8));
            for (acc, w4) in acc.iter_mut().zip(group.as_chunks::<4>().0) {
                let dot = (0..4).fold(0i32, |s, t| s.wrapping_add(a4[t] * i32::from(w4[t])));
                *acc = acc.wrapping_add(dot);
            }
        }
        tile[..BLOCK].copy_from_slice(&acc);
    });
}
