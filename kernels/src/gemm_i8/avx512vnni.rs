//! AVX-512 VNNI INT8 GEMM (`vpdpbusd`).
//!
//! `vpdpbusd` multiplies **unsigned** bytes by signed bytes. Activations are
//! signed, so the kernel feeds `a + 128` (computed once per call as
//! `a ^ 0x80` into a padded copy, O(m·k); it lies in `0..=255`) and removes
//! the bias afterwards:
//!
//! ```text
//! Σ_p (a[p] + 128) · w[j, p] = Σ_p a[p] · w[j, p] + 128 · Σ_p w[j, p]
//! ```
//!
//! so each output column `j` is corrected by subtracting `128 · colsum[j]`
//! (precomputed in [`PackedI8Weights`]). `vpdpbusd` (unlike `vpdpbusds`)
//! does not saturate: each u8×i8 product (|p| <= 255·128) and the sum of
//! four are exact in i32, and the accumulation wraps modulo 2³², so the
//! result equals the scalar reference exactly whenever the true sum fits in
//! i32.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls
// into `#[target_feature]` functions) need `unsafe`; every block states why
// it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::packed::{GROUP_BYTES, PackedI8Weights, pad_activations};
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_microtile};

/// Rows per microtile.
const MR: usize = 8;

/// `out[m, cols] = a[m, k] · wᵀ` (compact tile) with AVX-512 VNNI. Shapes and
/// the CPU's features are checked by the caller
/// ([`crate::tile_args::Variants::run`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) fn gemm(a: &[i8], m: usize, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    // a + 128 as u8, rows padded to whole groups of 4.
    let biased = pad_activations(a, m, w.k(), w.k_groups(), 0x80);
    if m <= MR {
        return few_rows(&biased, m, w, cols, out);
    }
    let kp = 4 * w.k_groups();
    for_each_microtile!(m, cols, out, MR, 2, |r0, R, b0, N, tile| {
        micro::<R, N>(&biased[r0 * kp..(r0 + R) * kp], w, b0, tile)
    });
}

/// A product of at most [`MR`] rows (a batched decode step's: one row per sequence):
/// one block of 16 columns at a time ([`one_block`]), all rows together, each weight byte
/// read once.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn few_rows(biased: &[u8], m: usize, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    let interleaved = interleave_rows(biased, m, w.k_groups());
    for_each_microtile!(m, cols, out, MR, 1, |_r0, R, b, _N, tile| {
        one_block::<R>(&interleaved, w, b, tile)
    });
}

/// The biased, padded rows (`[m, 4 · k_groups]` bytes) as groups of 4 bytes, rows
/// interleaved within each run of [`MR`] rows (at most `MR` here): the run starting at row `r0` (of `rows`
/// rows) holds row `r0 + r`'s group `g` at `r0 · k_groups + g · rows + r`, so that a
/// microkernel finds the groups it broadcasts at one step at fixed offsets of one
/// pointer rather than one pointer per row.
fn interleave_rows(biased: &[u8], m: usize, k_groups: usize) -> Vec<u32> {
    let groups: Vec<u32> = biased
        .as_chunks::<4>()
        .0
        .iter()
        .map(|g| u32::from_le_bytes(*g))
        .collect();
    let mut out = vec![0u32; m * k_groups];
    for r0 in (0..m).step_by(MR) {
        let rows = MR.min(m - r0);
        let run = &mut out[r0 * k_groups..(r0 + rows) * k_groups];
        for r in 0..rows {
            let row = &groups[(r0 + r) * k_groups..(r0 + r + 1) * k_groups];
            for (g, &v) in row.iter().enumerate() {
                run[g * rows + r] = v;
            }
        }
    }
    out
}

/// Computes `R` rows × `N` blocks into `tile`. `a_rows` holds `R` biased,
/// padded activation rows of `4 * k_groups` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn micro<const R: usize, const N: usize>(
    a_rows: &[u8],
    w: &PackedI8Weights,
    b0: usize,
    tile: &mut Tile<i32>,
) {
    let k_groups = w.k_groups();
    let kp = 4 * k_groups;
    debug_assert_eq!(a_rows.len(), R * kp);
    debug_assert!(b0 + N <= w.n_blocks() && N * BLOCK <= TILE_COLS);
    let blocks: [&[i8]; N] = std::array::from_fn(|j| w.block(b0 + j));
    let rows: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| a_rows[r * kp..(r + 1) * kp].as_chunks::<4>().0);
    let mut acc = [[_mm512_setzero_si512(); N]; R];
    for g in 0..k_groups {
        let wv: [__m512i; N] = std::array::from_fn(|j| {
            let bytes = &blocks[j][g * GROUP_BYTES..(g + 1) * GROUP_BYTES];
            // SAFETY: `bytes` is exactly 64 readable bytes; loadu has no
            // alignment requirement.
            unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
        });
        for r in 0..R {
            let av = _mm512_set1_epi32(i32::from_le_bytes(rows[r][g]));
            for j in 0..N {
                acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], av, wv[j]);
            }
        }
    }
    for j in 0..N {
        let sums = w.col_sums(b0 + j);
        // SAFETY: `sums` is exactly 16 readable i32.
        let sums = unsafe { _mm512_loadu_si512(sums.as_ptr().cast()) };
        let correction = _mm512_slli_epi32::<7>(sums);
        for r in 0..R {
            let v = _mm512_sub_epi32(acc[r][j], correction);
            let dst = &mut tile[r * TILE_COLS + j * BLOCK..r * TILE_COLS + (j + 1) * BLOCK];
            // SAFETY: `dst` is exactly 16 writable i32; storeu has no
            // alignment requirement.
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) };
        }
    }
}

/// Computes `R` rows × block `b` (16 columns) into `tile`. `a_rows` holds `R` biased
/// rows of `k_groups` groups of 4 bytes, interleaved (`[k_groups, R]`, see
/// [`interleave_rows`]).
///
/// One block at a time, so that the weights stream as one contiguous run (two blocks
/// side by side were two runs 9 to 24 KB apart at SmolLM2's shapes, and with several
/// rows, `R` times the arithmetic per weight byte of a one-row product, the loads
/// waited on memory: `decode_rows` in `benches/w4a8.rs` measured 8 rows at 3x the
/// time of one row's product then); even and odd groups go to separate accumulators,
/// `2 R` independent chains, added at the end (exact: INT32 sums wrap the same in any
/// order).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn one_block<const R: usize>(a_rows: &[u32], w: &PackedI8Weights, b: usize, tile: &mut Tile<i32>) {
    let groups = w.block(b).as_chunks::<GROUP_BYTES>().0;
    let a_rows = a_rows.as_chunks::<R>().0;
    debug_assert_eq!(a_rows.len(), groups.len());
    let mut even = [_mm512_setzero_si512(); R];
    let mut odd = [_mm512_setzero_si512(); R];
    let (groups2, group_tail) = groups.as_chunks::<2>();
    let (a2, a_tail) = a_rows.as_chunks::<2>();
    for (pair, a) in groups2.iter().zip(a2) {
        // SAFETY: each group is exactly 64 readable bytes; loadu needs no alignment.
        let (w0, w1) = unsafe {
            (
                _mm512_loadu_si512(pair[0].as_ptr().cast()),
                _mm512_loadu_si512(pair[1].as_ptr().cast()),
            )
        };
        for r in 0..R {
            even[r] = _mm512_dpbusd_epi32(even[r], _mm512_set1_epi32(a[0][r] as i32), w0);
            odd[r] = _mm512_dpbusd_epi32(odd[r], _mm512_set1_epi32(a[1][r] as i32), w1);
        }
    }
    for (group, a) in group_tail.iter().zip(a_tail) {
        // SAFETY: as above.
        let w0 = unsafe { _mm512_loadu_si512(group.as_ptr().cast()) };
        for r in 0..R {
            even[r] = _mm512_dpbusd_epi32(even[r], _mm512_set1_epi32(a[r] as i32), w0);
        }
    }
    // SAFETY: `col_sums(b)` is exactly 16 readable i32.
    let sums = unsafe { _mm512_loadu_si512(w.col_sums(b).as_ptr().cast()) };
    let correction = _mm512_slli_epi32::<7>(sums);
    for r in 0..R {
        let v = _mm512_sub_epi32(_mm512_add_epi32(even[r], odd[r]), correction);
        let dst = &mut tile[r * TILE_COLS..r * TILE_COLS + BLOCK];
        // SAFETY: `dst` is exactly 16 writable i32; storeu has no alignment requirement.
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) };
    }
}
