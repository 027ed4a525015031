//! AVX-512 VNNI W4A8 GEMM (`vpdpbusd`), nibbles unpacked in registers.
//!
//! Per group of 32 `k` and block of 16 columns, four 64-byte loads hold the group's
//! 512 nibbles; `x & 0x0f` and `(x >> 4) & 0x0f`, minus 8, are the signed
//! `vpdpbusd` operands of two quads of `k` (the layout of [`PackedW4Weights`]).
//! The weight matrix is never expanded in memory: each unpacked vector lives in a
//! register and feeds the products of every row of the microtile.
//!
//! The group's products accumulate in their own i32 registers (`vpdpbusd` from zero,
//! eight per group), which are then multiplied by the group's integer sub-scales
//! (`vpmulld`) and added to the row's accumulators: the per-group scale costs two
//! instructions per 16 outputs and 32 `k`, and the result stays an exact i32 (like
//! llama.cpp's Q4_0 × Q8_0, but without its per-group float conversion).
//!
//! As in the W8A8 kernel, activations are fed as `a + 128` (u8) and the bias is
//! removed at the end: `Σ_g s · Σ (a + 128) q = Σ_g s · Σ a q + 128 · Σ_g s · Σ q`,
//! the last term a per-column constant of the packed weights. `vpdpbusd`, `vpmulld`
//! and `vpaddd` wrap modulo 2³² like the scalar reference, so the result equals it
//! exactly.
//!
//! Tried and dropped: feeding the stored `q + 8` without the per-vector subtraction and
//! removing `8 Σ a` per row and group instead (a `vpsubd` per accumulator and group in
//! place of two `vpsubb` per load) was no faster on Zen 5 and slower on a Xeon in a
//! side-by-side run (docs/real-execution.md, "W4A8").

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::packed::{GROUP_BYTES, PackedW4Weights, VEC_BYTES, VECS, pad_activations};
use super::quant::GROUP_K;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_microtile};

/// Rows per microtile. 4 rows × 2 blocks keep 8 group partials, 8 accumulators, 4
/// unpacked weight vectors and 2 broadcasts in the 32 zmm registers, and halve the
/// activation broadcasts per `vpdpbusd` against one block; of 8 × 1, 6 × 2 and 4 × 2
/// it ran fastest (`cargo bench -p hetsched-kernels --bench w4a8`, docs/real-execution.md).
const MR: usize = 4;

/// `out[m, cols]` (compact tile) with AVX-512 VNNI. Shapes and the CPU's features are checked by
/// the caller ([`crate::tile_args::Variants::run`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) fn gemm(a: &[i8], m: usize, w: &PackedW4Weights, cols: Range<usize>, out: &mut [i32]) {
    // a + 128 as u8, rows padded to whole groups.
    let biased = pad_activations(a, m, w.k(), w.groups(), 0x80);
    let kp = GROUP_K * w.groups();
    for_each_microtile!(m, cols, out, MR, 2, |r0, R, b0, N, tile| {
        micro::<R, N>(&biased[r0 * kp..(r0 + R) * kp], w, b0, tile)
    });
}

/// The signed weights of quads `v` (low nibbles) and `v + 4` (high) of one 64-byte
/// vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn unpack(bytes: &[u8]) -> (__m512i, __m512i) {
    debug_assert_eq!(bytes.len(), VEC_BYTES);
    // SAFETY: `bytes` is exactly 64 readable bytes; loadu has no alignment
    // requirement.
    let x = unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) };
    let (mask, eight) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(8));
    let lo = _mm512_sub_epi8(_mm512_and_si512(x, mask), eight);
    let hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16::<4>(x), mask), eight);
    (lo, hi)
}

/// Computes `R` rows × `N` blocks into `tile`. `a_rows` holds `R` biased, padded
/// activation rows of `32 * groups` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn micro<const R: usize, const N: usize>(
    a_rows: &[u8],
    w: &PackedW4Weights,
    b0: usize,
    tile: &mut Tile<i32>,
) {
    let groups = w.groups();
    let kp = GROUP_K * groups;
    debug_assert_eq!(a_rows.len(), R * kp);
    debug_assert!(N * BLOCK <= TILE_COLS);
    let blocks: [&[u8]; N] = std::array::from_fn(|j| w.block(b0 + j));
    let subs: [&[i8]; N] = std::array::from_fn(|j| w.block_sub_scales(b0 + j));
    let rows: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| a_rows[r * kp..(r + 1) * kp].as_chunks::<4>().0);
    let mut acc = [[_mm512_setzero_si512(); N]; R];
    for g in 0..groups {
        let mut part = [[_mm512_setzero_si512(); N]; R];
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
                    part[r][j] = _mm512_dpbusd_epi32(part[r][j], lo, wv[j].0);
                    part[r][j] = _mm512_dpbusd_epi32(part[r][j], hi, wv[j].1);
                }
            }
        }
        for j in 0..N {
            let s = &subs[j][g * BLOCK..(g + 1) * BLOCK];
            // SAFETY: `s` is exactly 16 readable bytes.
            let s = _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(s.as_ptr().cast()) });
            for r in 0..R {
                acc[r][j] = _mm512_add_epi32(acc[r][j], _mm512_mullo_epi32(part[r][j], s));
            }
        }
    }
    for j in 0..N {
        let corr = w.col_corrections(b0 + j);
        // SAFETY: `corr` is exactly 16 readable i32.
        let corr = unsafe { _mm512_loadu_si512(corr.as_ptr().cast()) };
        let correction = _mm512_slli_epi32::<7>(corr);
        for r in 0..R {
            let v = _mm512_sub_epi32(acc[r][j], correction);
            let dst = &mut tile[r * TILE_COLS + j * BLOCK..r * TILE_COLS + (j + 1) * BLOCK];
            // SAFETY: `dst` is exactly 16 writable i32; storeu has no alignment
            // requirement.
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) };
        }
    }
}
