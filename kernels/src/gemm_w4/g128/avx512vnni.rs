//! AVX-512 VNNI W4A8 GEMM with activation scales per 128 inputs.
//!
//! A group's product is formed as in [`super::super::gemm_w4_grouped`]'s VNNI kernel:
//! the stored nibbles `q + 8` are `vpdpbusd`'s unsigned operand, the activations its
//! signed one, and the group's partials start from `-8 Σ a`. The partial `Σ q a` then
//! fits an i16 (module docs), so one `vpdpwssd` with the sub-scales as `(s, 0)` word
//! pairs multiplies it by the sub-scale and adds it to an i32 accumulator of the
//! activation group: one instruction per 16 outputs and 32 inputs, where the per-32
//! kernel converts, multiplies and fuses in float. After the activation group's (up to)
//! four weight groups, the i32 sum is converted and fused-multiply-added with the
//! row's activation scale; the row scales multiply the f32 accumulators at the end.
//! Same operations and order as [`super::scalar`]: bit-identical results.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::grouped::avx512vnni::{bias_of, block_row_scales, unpack};
use super::super::packed::{GROUP_BYTES, PackedW4Weights, VEC_BYTES, VECS, pad_activations};
use super::super::quant::GROUP_K;
use super::{SPAN, act_groups};
use crate::cpu::I8Kernel;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_tile};

/// Rows per microtile.
const MR: usize = 4;
/// Blocks of 16 columns per microtile.
const NB: usize = 2;

/// `out[m, cols]` (compact tile) with AVX-512 VNNI. Shapes are checked by the caller.
///
/// # Panics
/// If the CPU lacks avx512f, avx512bw or avx512vnni.
pub(crate) fn gemm(
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
    unsafe { gemm_impl(a, a_scales, m, w, cols, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn gemm_impl(
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
    let bias = bias_of(&padded);
    for_each_tile(m, cols, out, MR, NB, |r0, rows, b0, nb, tile| {
        let rows_in = Rows {
            a: &padded[r0 * kp..(r0 + rows) * kp],
            scales: &a_scales[r0 * spans..(r0 + rows) * spans],
            bias: &bias[r0 * groups..(r0 + rows) * groups],
        };
        if nb == 2 {
            by_rows::<2>(rows, &rows_in, w, b0, tile);
        } else {
            by_rows::<1>(rows, &rows_in, w, b0, tile);
        }
    });
}

/// A microtile's activation rows: padded values, scales per 128 and `8 Σ a` per group.
struct Rows<'a> {
    a: &'a [u8],
    scales: &'a [f32],
    bias: &'a [i32],
}

/// Picks the microkernel instantiation for `rows` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn by_rows<const N: usize>(
    rows: usize,
    a: &Rows<'_>,
    w: &PackedW4Weights,
    b0: usize,
    tile: &mut Tile<f32>,
) {
    match rows {
        1 => micro::<1, N>(a, w, b0, tile),
        2 => micro::<2, N>(a, w, b0, tile),
        3 => micro::<3, N>(a, w, b0, tile),
        4 => micro::<4, N>(a, w, b0, tile),
        _ => unreachable!("rows must be in 1..=MR"),
    }
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

/// Computes `R` rows × `N` blocks into `tile`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn micro<const R: usize, const N: usize>(
    a: &Rows<'_>,
    w: &PackedW4Weights,
    b0: usize,
    tile: &mut Tile<f32>,
) {
    let groups = w.groups();
    let (kp, spans) = (GROUP_K * groups, act_groups(w.k()));
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
            let mut part: [[__m512i; N]; R] =
                std::array::from_fn(|r| [_mm512_set1_epi32(-a.bias[r * groups + g]); N]);
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
            let s: [__m512i; N] =
                std::array::from_fn(|j| sub_scale_words(&subs[j][g * BLOCK..(g + 1) * BLOCK]));
            for r in 0..R {
                for j in 0..N {
                    sum[r][j] = _mm512_dpwssd_epi32(sum[r][j], part[r][j], s[j]);
                }
            }
        }
        for r in 0..R {
            let a_scale = _mm512_set1_ps(a.scales[r * spans + span]);
            for j in 0..N {
                acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][j]), a_scale, acc[r][j]);
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
