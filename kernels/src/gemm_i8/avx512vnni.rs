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
use crate::cpu::I8Kernel;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_tile};

/// Rows per microtile.
const MR: usize = 8;
/// Blocks of 16 columns per microtile.
const NB: usize = 2;

/// `out[m, cols] = a[m, k] · wᵀ` (compact tile) with AVX-512 VNNI. Shapes are
/// checked by the caller.
///
/// # Panics
/// If the CPU lacks avx512f, avx512bw or avx512vnni.
pub(crate) fn gemm(a: &[i8], m: usize, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    assert!(
        I8Kernel::Avx512Vnni.is_available(),
        "CPU lacks avx512f/avx512bw/avx512vnni"
    );
    // SAFETY: the required target features were detected just above.
    unsafe { gemm_impl(a, m, w, cols, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn gemm_impl(a: &[i8], m: usize, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    let kp = 4 * w.k_groups();
    // a + 128 as u8, rows padded to whole groups of 4.
    let biased = pad_activations(a, m, w.k(), w.k_groups(), 0x80);
    for_each_tile(m, cols, out, MR, NB, |r0, rows, b0, nb, tile| {
        let a_rows = &biased[r0 * kp..(r0 + rows) * kp];
        if nb == NB {
            by_rows::<NB>(rows, a_rows, w, b0, tile);
        } else {
            by_rows::<1>(rows, a_rows, w, b0, tile);
        }
    });
}

/// Picks the microkernel instantiation for `rows` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn by_rows<const N: usize>(
    rows: usize,
    a_rows: &[u8],
    w: &PackedI8Weights,
    b0: usize,
    tile: &mut Tile<i32>,
) {
    match rows {
        1 => micro::<1, N>(a_rows, w, b0, tile),
        2 => micro::<2, N>(a_rows, w, b0, tile),
        3 => micro::<3, N>(a_rows, w, b0, tile),
        4 => micro::<4, N>(a_rows, w, b0, tile),
        5 => micro::<5, N>(a_rows, w, b0, tile),
        6 => micro::<6, N>(a_rows, w, b0, tile),
        7 => micro::<7, N>(a_rows, w, b0, tile),
        8 => micro::<8, N>(a_rows, w, b0, tile),
        _ => unreachable!("rows must be in 1..=MR"),
    }
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
