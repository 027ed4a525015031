//! The inner product the AVX2 W4A8 kernels share (the per-tensor [`super::gemm_w4`] and
//! the activation-scaled ones of `scaled/`): a weight group's exact i32 products for the
//! 16 columns of a block.
//!
//! The stored nibbles `q + 8` (0..=15) are `vpmaddubsw`'s unsigned operand as they are
//! and the activations its signed one, so a group's product is `Σ (q + 8) a = Σ q a +
//! 8 Σ a`; the second term is one i32 per row and group ([`neg_group_bias`], once per
//! call), added negated after the group. A 32-byte load holds quads `v` and `v + 4` of 8
//! columns (half a 64-byte vector): a mask, and a shift and a mask, give the two
//! operands, each multiplied with its quad's activations broadcast. The group's eight
//! `vpmaddubsw` results add up in i16 (a lane sums 16 products of at most 15 · 128:
//! 30720, exact), and one `vpmaddwd` against ones gives each column's i32, in column
//! order. Per 32 bytes of weights that is 2 multiplies and 6 other operations, where
//! widening both operands to i16 for `vpmaddwd` took 4 multiplies and some 16 others,
//! and a fold of two partial sums per column at the end.

// reason: x86 SIMD intrinsics (loads through raw pointers) need `unsafe`; every block
// states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::packed::{GROUP_BYTES, VEC_BYTES, VECS};
use super::quant::GROUP_K;
use crate::tiling::BLOCK;

/// `Σ q a` of one weight group (`group`: its 256 packed bytes) for `R` activation rows
/// (`quads[r]`: row `r`'s 32 activations of the group as 4-byte quads) and the block's
/// 16 columns, per row two vectors of 8 i32 (columns `0..8` and `8..16`, in order);
/// `neg_bias[r]` is row `r`'s `-8 Σ a` of the group. Both halves of each 64-byte vector
/// in one pass share the activations' broadcasts.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn group_dots<const R: usize>(
    group: &[u8; GROUP_BYTES],
    quads: [&[[u8; 4]; 8]; R],
    neg_bias: [i32; R],
) -> [[__m256i; 2]; R] {
    let mask = _mm256_set1_epi8(0x0f);
    let mut sums = [[_mm256_setzero_si256(); 2]; R];
    for (v, bytes) in group.as_chunks::<VEC_BYTES>().0.iter().enumerate() {
        // SAFETY: `bytes` is exactly 64 readable bytes, two 32-byte loads; loadu has no
        // alignment requirement.
        let x = unsafe {
            [
                _mm256_loadu_si256(bytes.as_ptr().cast()),
                _mm256_loadu_si256(bytes.as_ptr().add(32).cast()),
            ]
        };
        let mut lo = [_mm256_setzero_si256(); 2];
        let mut hi = [_mm256_setzero_si256(); 2];
        for h in 0..2 {
            lo[h] = _mm256_and_si256(x[h], mask);
            hi[h] = _mm256_and_si256(_mm256_srli_epi16::<4>(x[h]), mask);
        }
        for r in 0..R {
            let a_lo = _mm256_set1_epi32(i32::from_le_bytes(quads[r][v]));
            let a_hi = _mm256_set1_epi32(i32::from_le_bytes(quads[r][v + VECS]));
            for h in 0..2 {
                let both = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo[h], a_lo),
                    _mm256_maddubs_epi16(hi[h], a_hi),
                );
                sums[r][h] = _mm256_add_epi16(sums[r][h], both);
            }
        }
    }
    let ones = _mm256_set1_epi16(1);
    let mut dots = [[_mm256_setzero_si256(); 2]; R];
    for r in 0..R {
        let bias = _mm256_set1_epi32(neg_bias[r]);
        for h in 0..2 {
            dots[r][h] = _mm256_add_epi32(_mm256_madd_epi16(sums[r][h], ones), bias);
        }
    }
    dots
}

/// Group `g`'s packed bytes of a block (`block`: its `groups · 256` bytes) and the 32
/// activations of group `g` of each row (`rows[r]`: a row as quads), as
/// [`group_dots`] takes them.
#[inline]
pub(super) fn group_operands<'a, const R: usize>(
    block: &'a [u8],
    rows: &[&'a [[u8; 4]]; R],
    g: usize,
) -> (&'a [u8; GROUP_BYTES], [&'a [[u8; 4]; 8]; R]) {
    let group = block[g * GROUP_BYTES..(g + 1) * GROUP_BYTES]
        .try_into()
        .expect("a group is GROUP_BYTES long");
    let quads = std::array::from_fn(|r| {
        rows[r][g * 8..g * 8 + 8]
            .try_into()
            .expect("a group's activations are 8 quads")
    });
    (group, quads)
}

/// A group's 16 sub-scales of a block (`subs`, 16 bytes) as two vectors of 8 i32.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn sub_scales(subs: &[i8]) -> [__m256i; 2] {
    let subs: &[i8; BLOCK] = subs.try_into().expect("a group's sub-scales are 16 bytes");
    // SAFETY: `subs` is exactly 16 readable bytes; loadu has no alignment requirement.
    let s = unsafe { _mm_loadu_si128(subs.as_ptr().cast()) };
    [
        _mm256_cvtepi8_epi32(s),
        _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(s)),
    ]
}

/// `-8 Σ a` of every row and group of the zero-padded activation rows `padded`
/// (`[m, 32 · groups]`) into `out` (one per group): what the stored `q + 8` add to a
/// group's product, negated. `vpsadbw` sums each 8 bytes of `a + 128`.
#[target_feature(enable = "avx2")]
pub(super) fn neg_group_bias(padded: &[u8], out: &mut [i32]) {
    let (groups, rest) = padded.as_chunks::<GROUP_K>();
    debug_assert!(rest.is_empty(), "rows are whole groups");
    debug_assert_eq!(groups.len(), out.len());
    let flip = _mm256_set1_epi8(i8::MIN);
    for (group, slot) in groups.iter().zip(out) {
        // SAFETY: `group` is exactly 32 readable bytes; loadu has no alignment
        // requirement.
        let x = unsafe { _mm256_loadu_si256(group.as_ptr().cast()) };
        let sums = _mm256_sad_epu8(_mm256_xor_si256(x, flip), _mm256_setzero_si256());
        let pair = _mm_add_epi64(
            _mm256_castsi256_si128(sums),
            _mm256_extracti128_si256::<1>(sums),
        );
        let biased = _mm_cvtsi128_si64(pair) + _mm_extract_epi64::<1>(pair);
        *slot = -8 * (biased as i32 - 128 * GROUP_K as i32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_w4::scaled::group_bias;
    use crate::seeded::SeededRng;

    /// The vector bias equals the scalar [`group_bias`] negated, at the extremes of i8 too.
    #[test]
    fn group_bias_matches_the_plain_sum() {
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = SeededRng::new(3);
        let mut padded: Vec<u8> = rng.i8s(GROUP_K * 9).iter().map(|&v| v as u8).collect();
        padded[..GROUP_K].fill(0x80);
        padded[GROUP_K..2 * GROUP_K].fill(0x7f);
        let want: Vec<i32> = group_bias(&padded).iter().map(|b| -b).collect();
        let mut got = vec![0; want.len()];
        // SAFETY: avx2 was detected above.
        unsafe { neg_group_bias(&padded, &mut got) };
        assert_eq!(got, want);
    }
}
