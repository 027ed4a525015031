//! Portable scalar variant: the fallback, and the definition of the operation order the
//! SIMD variants repeat (so all of them agree bit for bit).

use std::ops::Range;

use super::spans_of;
use crate::gemm_w4::packed::{GROUP_BYTES, PackedW4Weights, VEC_BYTES, VECS, activation_rows};
use crate::gemm_w4::quant::GROUP_K;
use crate::tiling::{BLOCK, for_each_tile};

/// `out[m, cols]` (compact tile), scalar. Shapes are checked by the caller.
pub(super) fn gemm<const SPAN: usize>(
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
    for_each_tile(m, cols, out, 1, 1, |r0, _rows, b0, _nb, tile| {
        let a_row = &padded[r0 * kp..(r0 + 1) * kp];
        let a_s = &a_scales[r0 * spans..(r0 + 1) * spans];
        let (block, subs) = (w.block(b0), w.block_sub_scales(b0));
        for (c, out) in tile[..BLOCK].iter_mut().enumerate() {
            let mut acc = 0f32;
            for (span, &a_scale) in a_s.iter().enumerate() {
                let span_groups = span * SPAN..((span + 1) * SPAN).min(groups);
                if SPAN == 1 {
                    let g = span;
                    // |dot| <= 32 · 128 · 8: exact in f32.
                    let dot = group_dot(block, a_row, g, c);
                    let scale = f32::from(subs[g * BLOCK + c]) * a_scale;
                    acc = (dot as f32).mul_add(scale, acc);
                } else {
                    // Exact: at most 4 · 127 · 32 · 127 · 8 < 2²⁴ (the g128 module docs).
                    let sum: i32 = span_groups
                        .map(|g| i32::from(subs[g * BLOCK + c]) * group_dot(block, a_row, g, c))
                        .sum();
                    acc = (sum as f32).mul_add(a_scale, acc);
                }
            }
            let j = b0 * BLOCK + c;
            *out = acc * w.row_scales().get(j).copied().unwrap_or(0.0);
        }
    });
}

/// `Σ_{p ∈ g} a[p] · q[c, p]` of group `g` and column `c` (within its block) of a packed
/// block, over a zero-padded activation row `a_row`.
fn group_dot(block: &[u8], a_row: &[u8], g: usize, c: usize) -> i32 {
    let bytes = &block[g * GROUP_BYTES..(g + 1) * GROUP_BYTES];
    let a_g = &a_row[g * GROUP_K..(g + 1) * GROUP_K];
    let mut dot = 0i32;
    for v in 0..VECS {
        for e in 0..4 {
            let byte = bytes[v * VEC_BYTES + c * 4 + e];
            let lo = i32::from(byte & 0x0f) - 8;
            let hi = i32::from(byte >> 4) - 8;
            dot += lo * i32::from(a_g[4 * v + e] as i8);
            dot += hi * i32::from(a_g[4 * (v + VECS) + e] as i8);
        }
    }
    dot
}
