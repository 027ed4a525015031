//! The one-row product (a decode step's linear): one block of 16 columns against one
//! activation row, group after group, for both spans.
//!
//! Per group (256 weight bytes) it issues 4 loads, 8 masks and 8 `vpdpbusd` with the
//! activation quads as embedded broadcasts. The nibbles are not shifted: the high one is
//! kept in place, `x & 0xf0 = 16 (q + 8)`, and multiplied in a second chain whose sum,
//! `16 Σ (q + 8) a`, is a multiple of 16 and shifted right once per group (exact), instead
//! of once per 64 bytes. The low chain starts from `-8 Σ a` (the bias of the stored
//! `q + 8`), so the two chains add up to the group's exact `Σ q a`, the same i32 the
//! multi-row microkernel forms; what follows (per group for `SPAN = 1`, per span
//! otherwise) are the float operations of [`crate::gemm_w4::scaled::scalar`], in the same
//! order, and the results are bit-identical.
//!
//! The two chains are independent, so a group's 8 products form two chains of 4 rather
//! than one of 8; the loop walks chunks of the block, the activations and the scales
//! without bounds checks, and prefetches [`ROW_PREFETCH_GROUPS`] groups ahead. One
//! block at a time, so that the weights stream as one sequential run, as the INT8
//! matrix-vector kernel reads them: two blocks side by side (two runs a block apart)
//! streamed 0.55x the INT8 kernel's bytes per second from memory, one block 0.76x (the
//! multi-row microkernel with one row, `decode_gemv` in `benches/w4a8.rs`).

use std::arch::x86_64::*;

use super::super::{row_groups, row_spans};
use super::{block_row_scales, sub_scale_words, sub_scales_i32};
use crate::gemm_w4::packed::{GROUP_BYTES, PackedW4Weights, VEC_BYTES, VECS};
use crate::tiling::BLOCK;

/// Groups ahead of the one multiplied whose weight bytes are prefetched: 12 KiB, a block
/// or more ahead (SmolLM2's blocks are 18 or 48 groups), as the blocks follow each other
/// in memory. A one-row product does little arithmetic per byte, so the loads wait on
/// memory unless requested early: from memory, on one thread, 8 groups ahead streamed
/// 19.5 GiB/s, 16 groups 23-25, 32 groups 26.7, 48 groups 24-28 and 64 groups 29.3, 128
/// groups 21 (`decode_gemv`); in `generate --precision w4a8-g32` (two threads sharing the
/// bandwidth) 48 groups decoded 8% faster than 8 and 1% faster than 32.
const ROW_PREFETCH_GROUPS: usize = 48;

/// `out = d · Σ_span a_scale[span] · Σ_{g ∈ span} s[g] · Σ_{p ∈ g} a[p] · q[p]` for the 16
/// columns of block `b`, in the order of [`crate::gemm_w4::scaled::scalar`]. `a_row` is the
/// zero-padded activation row (`32 · groups` bytes), `scales` its scale per span and
/// `neg_bias` its `-8 Σ a` per group.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) fn block<const SPAN: usize>(
    a_row: &[u8],
    scales: &[f32],
    neg_bias: &[i32],
    w: &PackedW4Weights,
    b: usize,
    out: &mut [f32],
) {
    debug_assert!(out.len() >= BLOCK);
    let mut acc = _mm512_setzero_ps();
    if SPAN == 1 {
        for (a_scale, (group, sub, quads, neg_bias)) in row_groups(w, b, a_row, neg_bias, scales) {
            let dot = group_dot(group, quads, neg_bias);
            let s = _mm512_cvtepi32_ps(sub_scales_i32(sub));
            let scale = _mm512_mul_ps(s, _mm512_set1_ps(a_scale));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
        }
    } else {
        for (a_scale, groups) in row_spans::<SPAN>(w, b, a_row, neg_bias, scales) {
            let mut sum = _mm512_setzero_si512();
            for (group, sub, quads, neg_bias) in groups {
                let dot = group_dot(group, quads, neg_bias);
                sum = _mm512_dpwssd_epi32(sum, dot, sub_scale_words(sub));
            }
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(a_scale), acc);
        }
    }
    let d = block_row_scales(w, b);
    // SAFETY: `out` holds at least 16 writable f32; storeu needs no alignment.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), _mm512_mul_ps(acc, d)) };
}

/// The exact `Σ q a` of one group's 16 columns (`group`: its 256 packed bytes, `quads`:
/// its 32 activations as quads, `neg_bias`: their `-8 Σ a`), and the prefetch of the group
/// [`ROW_PREFETCH_GROUPS`] ahead.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn group_dot(group: &[u8; GROUP_BYTES], quads: &[[u8; 4]; 8], neg_bias: i32) -> __m512i {
    let ahead = group
        .as_ptr()
        .wrapping_add(ROW_PREFETCH_GROUPS * GROUP_BYTES);
    for line in (0..GROUP_BYTES).step_by(64) {
        // A hint: it never faults, so an address past the weights is harmless.
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
    }
    let (lo_mask, hi_mask) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0xf0u8 as i8));
    let mut lo = _mm512_set1_epi32(neg_bias);
    let mut hi = _mm512_setzero_si512();
    for (v, bytes) in group.as_chunks::<VEC_BYTES>().0.iter().enumerate() {
        // SAFETY: `bytes` is exactly 64 readable bytes; loadu needs no alignment.
        let x = unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) };
        let a_lo = _mm512_set1_epi32(i32::from_le_bytes(quads[v]));
        let a_hi = _mm512_set1_epi32(i32::from_le_bytes(quads[v + VECS]));
        lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(x, lo_mask), a_lo);
        hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(x, hi_mask), a_hi);
    }
    // `hi` is 16 times an i32 (at most 16 · 15 · 128 · 16 in magnitude): exact.
    _mm512_add_epi32(lo, _mm512_srai_epi32::<4>(hi))
}
