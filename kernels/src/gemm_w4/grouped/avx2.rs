//! AVX2 group-scaled W4A8 GEMM.
//!
//! The integer products are those of [`super::super::gemm_w4`]'s AVX2 kernel (both
//! operands widened to i16, `vpmaddwd`, two partial sums per column). Per group the two
//! partial sums are folded (`vphaddd`), converted to f32 and fused-multiply-added with
//! the sub-scales times the group's activation scale; the row scales multiply the
//! accumulators at the end. Same operations and order as [`super::scalar`], so the
//! results are bit-identical. Needs FMA besides AVX2 (every AVX2 CPU of note has it); a
//! CPU without it runs the scalar variant.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::packed::{GROUP_BYTES, PackedW4Weights, VEC_BYTES, VECS, pad_activations};
use super::super::quant::GROUP_K;
use crate::cpu::I8Kernel;
use crate::tiling::{BLOCK, TILE_COLS, Tile, for_each_tile};

/// Rows per microtile.
const MR: usize = 2;
/// Columns per half block.
const HALF: usize = BLOCK / 2;

/// `out[m, cols]` (compact tile) with AVX2 and FMA (scalar without FMA). Shapes are
/// checked by the caller.
///
/// # Panics
/// If the CPU lacks avx2.
pub(crate) fn gemm(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    assert!(I8Kernel::Avx2.is_available(), "CPU lacks avx2");
    if !is_x86_feature_detected!("fma") {
        return super::scalar::gemm(a, a_scales, m, w, cols, out);
    }
    // SAFETY: avx2 and fma were detected just above.
    unsafe { gemm_impl(a, a_scales, m, w, cols, out) }
}

#[target_feature(enable = "avx2,fma")]
fn gemm_impl(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    let groups = w.groups();
    let kp = GROUP_K * groups;
    let padded = pad_activations(a, m, w.k(), groups, 0);
    for_each_tile(m, cols, out, MR, 1, |r0, rows, b0, _nb, tile| {
        let a_rows = &padded[r0 * kp..(r0 + rows) * kp];
        let scales = &a_scales[r0 * groups..(r0 + rows) * groups];
        for half in 0..2 {
            match rows {
                1 => micro::<1>((a_rows, scales), w, b0, half, tile),
                2 => micro::<2>((a_rows, scales), w, b0, half, tile),
                _ => unreachable!("rows must be in 1..=MR"),
            }
        }
    });
}

/// Widened signed i16 weights of one 32-byte vector: `[quad v cols 0..4, quad v cols
/// 4..8, quad v+4 cols 0..4, quad v+4 cols 4..8]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(in crate::gemm_w4) fn unpack(bytes: &[u8]) -> [__m256i; 4] {
    debug_assert_eq!(bytes.len(), 32);
    // SAFETY: `bytes` is exactly 32 readable bytes; loadu has no alignment requirement.
    let x = unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) };
    let (mask, eight) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(8));
    let lo = _mm256_sub_epi8(_mm256_and_si256(x, mask), eight);
    let hi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16::<4>(x), mask), eight);
    [
        _mm256_cvtepi8_epi16(_mm256_castsi256_si128(lo)),
        _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(lo)),
        _mm256_cvtepi8_epi16(_mm256_castsi256_si128(hi)),
        _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(hi)),
    ]
}

/// The 8 column sums, in order, of pair sums `lo` (columns 0..4) and `hi` (4..8).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(in crate::gemm_w4) fn fold_pairs(lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(lo, hi))
}

/// Computes `R` rows × half `half` (8 columns) of block `b0` into `tile`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn micro<const R: usize>(
    (a_rows, scales): (&[u8], &[f32]),
    w: &PackedW4Weights,
    b0: usize,
    half: usize,
    tile: &mut Tile<f32>,
) {
    let groups = w.groups();
    let kp = GROUP_K * groups;
    debug_assert_eq!(a_rows.len(), R * kp);
    let (block, subs) = (w.block(b0), w.block_sub_scales(b0));
    let rows: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| a_rows[r * kp..(r + 1) * kp].as_chunks::<4>().0);
    let mut acc = [_mm256_setzero_ps(); R];
    for g in 0..groups {
        let mut part = [[_mm256_setzero_si256(); 2]; R];
        for v in 0..VECS {
            let at = g * GROUP_BYTES + v * VEC_BYTES + half * 32;
            let wv = unpack(&block[at..at + 32]);
            for r in 0..R {
                let quads = &rows[r][g * 8..g * 8 + 8];
                let lo = _mm256_cvtepi8_epi16(_mm_set1_epi32(i32::from_le_bytes(quads[v])));
                let hi = _mm256_cvtepi8_epi16(_mm_set1_epi32(i32::from_le_bytes(quads[v + VECS])));
                for q in 0..2 {
                    let sum = _mm256_add_epi32(
                        _mm256_madd_epi16(wv[q], lo),
                        _mm256_madd_epi16(wv[2 + q], hi),
                    );
                    part[r][q] = _mm256_add_epi32(part[r][q], sum);
                }
            }
        }
        let at = g * BLOCK + half * HALF;
        let s8: [u8; HALF] = std::array::from_fn(|i| subs[at + i] as u8);
        let s = _mm256_cvtepi8_epi32(_mm_set_epi64x(0, i64::from_le_bytes(s8)));
        let s = _mm256_cvtepi32_ps(s);
        for r in 0..R {
            let dot = _mm256_cvtepi32_ps(fold_pairs(part[r][0], part[r][1]));
            let scale = _mm256_mul_ps(s, _mm256_set1_ps(scales[r * groups + g]));
            acc[r] = _mm256_fmadd_ps(dot, scale, acc[r]);
        }
    }
    let mut d = [0f32; HALF];
    let all = w.row_scales();
    let start = (b0 * BLOCK + half * HALF).min(all.len());
    let have = &all[start..(start + HALF).min(all.len())];
    d[..have.len()].copy_from_slice(have);
    // SAFETY: `d` is exactly 8 readable f32.
    let d = unsafe { _mm256_loadu_ps(d.as_ptr()) };
    for (r, acc) in acc.iter().enumerate() {
        let at = r * TILE_COLS + half * HALF;
        let dst = &mut tile[at..at + HALF];
        // SAFETY: `dst` is exactly 8 writable f32; storeu has no alignment requirement.
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), _mm256_mul_ps(*acc, d)) };
    }
}
