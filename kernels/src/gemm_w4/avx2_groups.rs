//! The inner product the AVX2 W4A8 kernels share (the per-tensor [`super::gemm_w4`] and
//! the activation-scaled ones of `scaled/`): a weight group's exact i32 products for the
//! 8 columns of half a block, both operands widened to i16 and multiplied with
//! `vpmaddwd`, two partial sums per column.

// reason: x86 SIMD intrinsics (loads through raw pointers) need `unsafe`; every block
// states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::packed::{GROUP_BYTES, VEC_BYTES, VECS};

/// Widened signed i16 weights of one 32-byte vector: `[quad v cols 0..4, quad v cols
/// 4..8, quad v+4 cols 0..4, quad v+4 cols 4..8]`.
#[inline]
#[target_feature(enable = "avx2")]
fn unpack(bytes: &[u8]) -> [__m256i; 4] {
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
#[target_feature(enable = "avx2")]
pub(super) fn fold_pairs(lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(lo, hi))
}

/// `Σ q a` of group `g` of a packed `block` for `R` zero-padded activation rows (as
/// 4-byte quads) and the 8 columns of half `half`: `[r][q]` holds columns `4q..4q + 4`,
/// two partial sums each ([`fold_pairs`] adds them).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn group_pairs<const R: usize>(
    block: &[u8],
    rows: &[&[[u8; 4]]; R],
    g: usize,
    half: usize,
) -> [[__m256i; 2]; R] {
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
    part
}
