//! AVX-512 VNNI variant.
//!
//! The products are those of [`crate::gemm_w4::gemm_w4`]'s VNNI kernel with the operands'
//! roles swapped: the stored nibbles `q + 8` (0..=15) are `vpdpbusd`'s unsigned operand,
//! as they are (no subtraction per load), and the activations its signed one, so a
//! group's product is `Σ (q + 8) a = Σ q a + 8 Σ a`. The second term depends only on
//! the row and group ([`super::group_bias`], computed once per call): the group's i32
//! partials start from `-8 Σ a` instead of zero, so it costs nothing in the loop.
//!
//! `SPAN = 1`: the group's product is converted and fused-multiply-added with
//! `s · a_scale` (the sub-scales converted to f32 once per group and block, times the
//! row's activation scale: off the accumulation chain, where an integer `vpmulld` sat in
//! a first version, 15-20% slower). `SPAN > 1`: the product fits an i16 (the g128 module
//! docs), so one `vpdpwssd` with the sub-scales as `(s, 0)` word pairs multiplies it by
//! the sub-scale and adds it to the span's i32 sum, converted and fused-multiply-added
//! with the span's activation scale after its groups. The row scales multiply the f32
//! accumulators at the end. Same operations and order as [`super::scalar`]:
//! bit-identical results.
//!
//! Why the swap here and not in the integer W4A8 kernel: there the bias of the
//! activations could be removed once per column at the end; with a float scale per
//! group it would need a per-column, per-group correction stored beside the weights
//! (one more bit per weight), while `8 Σ a` is one i32 per row and group.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{BiasSlots, group_bias, spans_of};
use crate::cpu::I8Kernel;
use crate::gemm_w4::packed::{GROUP_BYTES, PackedW4Weights, VEC_BYTES, VECS, activation_rows};
use crate::gemm_w4::quant::GROUP_K;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_microtile};

mod row;

/// Rows per microtile (as the integer W4A8 kernel: 8 partials, 8 accumulators, 4
/// unpacked weight vectors and the broadcasts fit the 32 zmm registers).
const MR: usize = 4;
/// Groups ahead of the one multiplied whose weight bytes the multi-row microkernel
/// prefetches (2 KiB a block); the one-row kernel reaches further ([`row`]).
const PREFETCH_GROUPS: usize = 8;

/// `out[m, cols]` (compact tile) with AVX-512 VNNI. Shapes are checked by the caller.
///
/// # Panics
/// If the CPU lacks avx512f, avx512bw or avx512vnni.
pub(super) fn gemm<const SPAN: usize>(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    assert!(
        I8Kernel::Avx512Vnni.is_available(),
        "CPU lacks avx512f/avx512bw/avx512vnni"
    );
    // SAFETY: the required target features were detected just above.
    unsafe { gemm_impl::<SPAN>(a, a_scales, m, w, cols, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn gemm_impl<const SPAN: usize>(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    let padded = activation_rows(a, m, w.k(), w.groups());
    let mut slots = BiasSlots::new();
    let neg_bias = slots.take(padded.len() / GROUP_K);
    neg_bias_of(&padded, neg_bias);
    let neg_bias = &*neg_bias;
    if m == 1 {
        one_row::<SPAN>(&padded, a_scales, neg_bias, w, cols, out);
        return;
    }
    let groups = w.groups();
    let (kp, spans) = (GROUP_K * groups, spans_of::<SPAN>(groups));
    for_each_microtile!(m, cols, out, MR, 2, |r0, R, b0, N, tile| {
        let rows = Rows {
            a: &padded[r0 * kp..(r0 + R) * kp],
            scales: &a_scales[r0 * spans..(r0 + R) * spans],
            neg_bias: &neg_bias[r0 * groups..(r0 + R) * groups],
        };
        micro::<SPAN, R, N>(&rows, w, b0, tile)
    });
}

/// The one-row product of `cols` into `out` (`[cols.len()]`), one block at a time: the
/// weights stream as one sequential run (block after block), as the INT8 matrix-vector
/// kernel reads them ([`row`]). A whole block is stored straight into `out`; only a block
/// cut by the range's ends goes through a buffer (a tile copied out per block, as
/// [`crate::tiling::for_each_tile`] does, costs a `memcpy` call a block: 1.4% of a
/// `w4a8-g32` decode step's samples in a profile).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn one_row<const SPAN: usize>(
    padded: &[u8],
    a_scales: &[f32],
    neg_bias: &[i32],
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    let mut cut = [0f32; BLOCK];
    for b in cols.start / BLOCK..cols.end.div_ceil(BLOCK) {
        let (c0, c1) = ((b * BLOCK).max(cols.start), ((b + 1) * BLOCK).min(cols.end));
        let dst = &mut out[c0 - cols.start..c1 - cols.start];
        if dst.len() == BLOCK {
            row::block::<SPAN>(padded, a_scales, neg_bias, w, b, dst);
        } else {
            row::block::<SPAN>(padded, a_scales, neg_bias, w, b, &mut cut);
            dst.copy_from_slice(&cut[c0 - b * BLOCK..c1 - b * BLOCK]);
        }
    }
}

/// `-`[`group_bias`] with `vpsadbw`: per 64 bytes (two groups), the sums of `a + 128` of
/// each 8 bytes, four of them per group, less `128 · 32`. Negated, so that the kernels
/// start a group's partials from a broadcast of it.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn neg_bias_of(padded: &[u8], out: &mut [i32]) {
    debug_assert_eq!(out.len(), padded.len() / GROUP_K);
    let (pairs, rest) = padded.as_chunks::<{ 2 * GROUP_K }>();
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut slots = out.iter_mut();
    for pair in pairs {
        // SAFETY: `pair` is exactly 64 readable bytes; loadu has no alignment requirement.
        let x = unsafe { _mm512_loadu_si512(pair.as_ptr().cast()) };
        let sums = _mm512_sad_epu8(_mm512_xor_si512(x, flip), _mm512_setzero_si512());
        let mut lanes = [0u64; 8];
        // SAFETY: `lanes` is exactly 64 writable bytes.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), sums) };
        for (group, slot) in lanes.chunks_exact(4).zip(&mut slots) {
            let biased = group.iter().sum::<u64>() as i32;
            *slot = -8 * (biased - 128 * GROUP_K as i32);
        }
    }
    for (bias, slot) in group_bias(rest).into_iter().zip(slots) {
        *slot = -bias;
    }
}

/// A microtile's activation rows: padded values, scales per span and `-8 Σ a` per group.
struct Rows<'a> {
    a: &'a [u8],
    scales: &'a [f32],
    neg_bias: &'a [i32],
}

/// The stored `q + 8` of quads `v` (low nibbles) and `v + 4` (high) of one vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn unpack(bytes: &[u8]) -> (__m512i, __m512i) {
    debug_assert_eq!(bytes.len(), VEC_BYTES);
    // SAFETY: `bytes` is exactly 64 readable bytes; loadu has no alignment requirement.
    let x = unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) };
    let mask = _mm512_set1_epi8(0x0f);
    (
        _mm512_and_si512(x, mask),
        _mm512_and_si512(_mm512_srli_epi16::<4>(x), mask),
    )
}

/// The row scales of block `b` (0 for padding columns).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn block_row_scales(w: &PackedW4Weights, b: usize) -> __m512 {
    // A masked load, not a copy into a zeroed array: the copy's length is not a constant,
    // so it was a `memcpy` call per block, 2.5% of a W4A8 decode step's samples.
    let all = w.row_scales();
    let start = (b * BLOCK).min(all.len());
    let have = (all.len() - start).min(BLOCK);
    let lanes = ((1u32 << have) - 1) as __mmask16;
    // SAFETY: only the `have` lanes the mask keeps are read, `all[start..start + have]`;
    // masked-off lanes are neither read nor able to fault, and `start <= all.len()`.
    unsafe { _mm512_maskz_loadu_ps(lanes, all.as_ptr().add(start)) }
}

/// The 16 sub-scales at `s` widened to i32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn sub_scales_i32(s: &[i8]) -> __m512i {
    debug_assert_eq!(s.len(), BLOCK);
    // SAFETY: `s` is exactly 16 readable bytes.
    _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(s.as_ptr().cast()) })
}

/// The 16 sub-scales at `s` as `(s, 0)` i16 pairs: `vpdpwssd` with a partial that fits
/// an i16 (its high word 0 or −1) then adds exactly `s · partial`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn sub_scale_words(s: &[i8]) -> __m512i {
    debug_assert_eq!(s.len(), BLOCK);
    // SAFETY: `s` is exactly 16 readable bytes.
    let s = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(s.as_ptr().cast()) });
    _mm512_cvtepu16_epi32(s)
}

/// `Σ q a` of group `g` for `R` rows and `N` blocks (the partials start from `-8 Σ a`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn group_products<const R: usize, const N: usize>(
    a: &Rows<'_>,
    rows: &[&[[u8; 4]]; R],
    blocks: &[&[u8]; N],
    groups: usize,
    g: usize,
) -> [[__m512i; N]; R] {
    let mut part: [[__m512i; N]; R] =
        std::array::from_fn(|r| [_mm512_set1_epi32(a.neg_bias[r * groups + g]); N]);
    for v in 0..VECS {
        let wv: [(__m512i, __m512i); N] = std::array::from_fn(|j| {
            let at = g * GROUP_BYTES + v * VEC_BYTES;
            unpack(&blocks[j][at..at + VEC_BYTES])
        });
        for r in 0..R {
            let quads = &rows[r][g * 8..g * 8 + 8];
            let lo = _mm512_set1_epi32(i32::from_le_bytes(quads[v]));
            let hi = _mm512_set1_epi32(i32::from_le_bytes(quads[v + VECS]));
            for j in 0..N {
                part[r][j] = _mm512_dpbusd_epi32(part[r][j], wv[j].0, lo);
                part[r][j] = _mm512_dpbusd_epi32(part[r][j], wv[j].1, hi);
            }
        }
    }
    part
}

/// Asks for the group at byte `at` of each block (the next block's start, when past
/// the end: blocks are contiguous) to be brought to the L1 cache.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn prefetch<const N: usize>(blocks: &[&[u8]; N], at: usize) {
    for block in blocks {
        let group = block.as_ptr().wrapping_add(at);
        for line in (0..GROUP_BYTES).step_by(64) {
            // A hint: it never faults, so an address past the weights is harmless.
            _mm_prefetch::<_MM_HINT_T0>(group.wrapping_add(line).cast());
        }
    }
}

/// Computes `R` rows × `N` blocks into `tile`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn micro<const SPAN: usize, const R: usize, const N: usize>(
    a: &Rows<'_>,
    w: &PackedW4Weights,
    b0: usize,
    tile: &mut Tile<f32>,
) {
    let groups = w.groups();
    let (kp, spans) = (GROUP_K * groups, spans_of::<SPAN>(groups));
    debug_assert_eq!(a.a.len(), R * kp);
    debug_assert!(N * BLOCK <= TILE_COLS);
    let blocks: [&[u8]; N] = std::array::from_fn(|j| w.block(b0 + j));
    let subs: [&[i8]; N] = std::array::from_fn(|j| w.block_sub_scales(b0 + j));
    let rows: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| a.a[r * kp..(r + 1) * kp].as_chunks::<4>().0);
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for span in 0..spans {
        let mut sum = [[_mm512_setzero_si512(); N]; R];
        for g in span * SPAN..((span + 1) * SPAN).min(groups) {
            prefetch(&blocks, (g + PREFETCH_GROUPS) * GROUP_BYTES);
            let part = group_products(a, &rows, &blocks, groups, g);
            let at = g * BLOCK..(g + 1) * BLOCK;
            if SPAN == 1 {
                let s: [__m512; N] = std::array::from_fn(|j| {
                    _mm512_cvtepi32_ps(sub_scales_i32(&subs[j][at.clone()]))
                });
                for r in 0..R {
                    let a_scale = _mm512_set1_ps(a.scales[r * spans + span]);
                    for j in 0..N {
                        let scale = _mm512_mul_ps(s[j], a_scale);
                        let dot = _mm512_cvtepi32_ps(part[r][j]);
                        acc[r][j] = _mm512_fmadd_ps(dot, scale, acc[r][j]);
                    }
                }
            } else {
                let s: [__m512i; N] =
                    std::array::from_fn(|j| sub_scale_words(&subs[j][at.clone()]));
                for r in 0..R {
                    for j in 0..N {
                        sum[r][j] = _mm512_dpwssd_epi32(sum[r][j], part[r][j], s[j]);
                    }
                }
            }
        }
        if SPAN > 1 {
            for r in 0..R {
                let a_scale = _mm512_set1_ps(a.scales[r * spans + span]);
                for j in 0..N {
                    acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][j]), a_scale, acc[r][j]);
                }
            }
        }
    }
    for j in 0..N {
        let d = block_row_scales(w, b0 + j);
        for (r, acc) in acc.iter().enumerate() {
            let dst = &mut tile[r * TILE_COLS + j * BLOCK..r * TILE_COLS + (j + 1) * BLOCK];
            // SAFETY: `dst` is exactly 16 writable f32; storeu has no alignment
            // requirement.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), _mm512_mul_ps(acc[j], d)) };
        }
    }
}
