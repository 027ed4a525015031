//! Portable scalar W4A8 GEMM with activation scales per 128 inputs: the fallback
//! variant, and the definition of the operation order the SIMD variants repeat (so all
//! of them agree bit for bit).

use std::ops::Range;

use super::super::grouped::scalar::group_dot;
use super::super::packed::{PackedW4Weights, pad_activations};
use super::super::quant::GROUP_K;
use super::{SPAN, act_groups};
use crate::tiling::{BLOCK, for_each_tile};

/// `out[m, cols]` (compact tile), scalar. Shapes are checked by the caller.
pub(crate) fn gemm(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    let (groups, spans) = (w.groups(), act_groups(w.k()));
    let kp = GROUP_K * groups;
    let padded = pad_activations(a, m, w.k(), groups, 0);
    for_each_tile(m, cols, out, 1, 1, |r0, _rows, b0, _nb, tile| {
        let a_row = &padded[r0 * kp..(r0 + 1) * kp];
        let a_s = &a_scales[r0 * spans..(r0 + 1) * spans];
        let (block, subs) = (w.block(b0), w.block_sub_scales(b0));
        for (c, out) in tile[..BLOCK].iter_mut().enumerate() {
            let mut acc = 0f32;
            for (span, &scale) in a_s.iter().enumerate() {
                // Exact: at most 4 · 127 · 32 · 127 · 8 < 2²⁴ (module docs).
                let sum: i32 = (span * SPAN..((span + 1) * SPAN).min(groups))
                    .map(|g| i32::from(subs[g * BLOCK + c]) * group_dot(block, a_row, g, c))
                    .sum();
                acc = (sum as f32).mul_add(scale, acc);
            }
            let j = b0 * BLOCK + c;
            *out = acc * w.row_scales().get(j).copied().unwrap_or(0.0);
        }
    });
}
