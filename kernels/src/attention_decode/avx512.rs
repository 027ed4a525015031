//! AVX-512 forms of the two decode attention products, for heads of a multiple of 16
//! values (SmolLM2's 64, Gemma 3's 256).
//!
//! Why not the portable loop alone: compiled for AVX-512 it still sums each key's dot
//! product down to one float with its own four shuffle-and-add steps, so at 64 values a
//! key the reduction costs as much as the products; and the weighted sum reloads and
//! stores its accumulator at every row. Here sixteen keys' dot products are reduced
//! together (one transpose-and-add tree for all sixteen: 15 shuffle pairs instead of
//! 64), and the weighted sum keeps a block of the accumulator in registers across the
//! rows. Both multiply and add in two roundings, in the portable loop's order, so the
//! results are its bits: the weighted sum its scalar twin's, the dot products the
//! portable loop's 16-lane pairwise sum (which differs from the scalar twin's
//! left-to-right sum by rounding only).

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// Keys whose dot products are reduced together.
const KEYS: usize = 16;
/// Values in one register.
const LANES: usize = 16;
/// Registers of the accumulator a weighted-sum pass keeps (64 values).
const BLOCK_REGS: usize = 4;

/// `out[j] = scale · q · row_j[offset..offset + d]`, the shapes checked by the caller.
///
/// # Safety
/// The CPU must support avx512f; `q.len()` is a multiple of 16 and `rows` holds
/// `out.len()` rows of `stride` with `offset + q.len() <= stride`
/// ([`super::check_rows`]).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn scaled_dots(
    q: &[f32],
    rows: &[f32],
    stride: usize,
    offset: usize,
    scale: f32,
    out: &mut [f32],
) {
    debug_assert_eq!(q.len() % LANES, 0);
    for j0 in (0..out.len()).step_by(KEYS) {
        let keys = (out.len() - j0).min(KEYS);
        // SAFETY: rows `j0..j0 + keys` exist (`j0 + keys <= out.len()`), each with the
        // head at `offset` (the caller's contract).
        let sums = unsafe { block_dots(q, rows.as_ptr().add(j0 * stride + offset), stride, keys) };
        let scaled = _mm512_mul_ps(sums, _mm512_set1_ps(scale));
        let lanes = ((1u32 << keys) - 1) as __mmask16;
        // SAFETY: the masked lanes `0..keys` of the store are `out[j0..j0 + keys]`.
        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(j0), lanes, scaled) };
    }
}

/// Lane `r` (`r < keys`) is `q · row_r`, row `r` starting at `first + r · stride`: per
/// lane a product and a separate add a chunk of 16 values (as the portable loop adds,
/// hence the same bits), then [`sum_each`]'s tree, which is the portable loop's pairwise
/// sum of its 16 lanes.
///
/// Always sixteen rows, a short block's last row standing in for the missing ones (their
/// lanes are not stored): with a fixed count the sixteen accumulators stay in registers,
/// where a loop of `keys` rows kept them on the stack and every add waited on a store
/// (in a profile of a W4A8 decode step, nine in ten of this function's samples sat on
/// the two adds that read the stack).
///
/// # Safety
/// `1 <= keys <= 16`, and `q.len()` values are readable from `first + r · stride` for
/// every `r < keys`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn block_dots(q: &[f32], first: *const f32, stride: usize, keys: usize) -> __m512 {
    debug_assert!((1..=KEYS).contains(&keys));
    // SAFETY: row `min(r, keys - 1)` is one of the caller's readable rows.
    let rows: [*const f32; KEYS] =
        std::array::from_fn(|r| unsafe { first.add(r.min(keys - 1) * stride) });
    let mut acc = [_mm512_setzero_ps(); KEYS];
    for c in 0..q.len() / LANES {
        // SAFETY: `c * 16 + 16 <= q.len()`.
        let qv = unsafe { _mm512_loadu_ps(q.as_ptr().add(c * LANES)) };
        for (a, row) in acc.iter_mut().zip(rows) {
            // SAFETY: each row holds `q.len()` values.
            let kv = unsafe { _mm512_loadu_ps(row.add(c * LANES)) };
            // The same line of the row sixteen keys on (a hint: never faults).
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(KEYS * stride + c * LANES).cast());
            *a = _mm512_add_ps(*a, _mm512_mul_ps(qv, kv));
        }
    }
    sum_each(acc)
}

/// Lane `r` of the result is the sum of the sixteen lanes of `v[r]`.
///
/// Four levels, each adding two halves of a pair of registers so that one register
/// carries twice as many keys at half the partial sums: 512 -> 256 -> 128 -> 64 -> 32
/// bits a key. The keys then sit in the lane order `ORDER` below, which one permute
/// undoes.
#[inline]
#[target_feature(enable = "avx512f")]
fn sum_each(v: [__m512; KEYS]) -> __m512 {
    // Level 1: key i in the low 256 bits, key i + 8 in the high.
    let mut s1 = [_mm512_setzero_ps(); 8];
    for (i, s) in s1.iter_mut().enumerate() {
        let lo = _mm512_shuffle_f32x4::<0x44>(v[i], v[i + 8]);
        let hi = _mm512_shuffle_f32x4::<0xEE>(v[i], v[i + 8]);
        *s = _mm512_add_ps(lo, hi);
    }
    // Level 2: 128-bit blocks hold keys i, i + 8, i + 4, i + 12.
    let mut s2 = [_mm512_setzero_ps(); 4];
    for (i, s) in s2.iter_mut().enumerate() {
        let lo = _mm512_shuffle_f32x4::<0x88>(s1[i], s1[i + 4]);
        let hi = _mm512_shuffle_f32x4::<0xDD>(s1[i], s1[i + 4]);
        *s = _mm512_add_ps(lo, hi);
    }
    // Level 3: each 128-bit block holds two keys, two partial sums each.
    let mut s3 = [_mm512_setzero_ps(); 2];
    for (i, s) in s3.iter_mut().enumerate() {
        let (a, b) = (_mm512_castps_pd(s2[i]), _mm512_castps_pd(s2[i + 2]));
        let lo = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        let hi = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        *s = _mm512_add_ps(lo, hi);
    }
    // Level 4: one sum a key, in the lanes of ORDER.
    let lo = _mm512_shuffle_ps::<0b10_00_10_00>(s3[0], s3[1]);
    let hi = _mm512_shuffle_ps::<0b11_01_11_01>(s3[0], s3[1]);
    let sums = _mm512_add_ps(lo, hi);
    /// The key whose sum lane `l` holds after level 4 (its own inverse, so it is also
    /// the lane key `l`'s sum is in).
    const ORDER: [i32; KEYS] = [0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15];
    // SAFETY: ORDER is 16 readable i32.
    let index = unsafe { _mm512_loadu_si512(ORDER.as_ptr().cast()) };
    _mm512_permutexvar_ps(index, sums)
}

/// `acc[i] += Σ_j p[j] · row_j[offset + i]`, rows in order, each product rounded before
/// its add (bit-identical to the scalar twin); shapes checked by the caller.
///
/// # Safety
/// The CPU must support avx512f; `acc.len()` is a multiple of 16 and `rows` holds
/// `p.len()` rows of `stride` with `offset + acc.len() <= stride`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn add_weighted_rows(
    p: &[f32],
    rows: &[f32],
    stride: usize,
    offset: usize,
    acc: &mut [f32],
) {
    debug_assert_eq!(acc.len() % LANES, 0);
    let d = acc.len();
    let mut col = 0;
    while col < d {
        let regs = ((d - col) / LANES).min(BLOCK_REGS);
        // SAFETY: columns `col..col + 16 · regs` lie inside `acc` and inside every row's
        // head (the caller's contract).
        unsafe {
            match regs {
                4 => weighted_block::<4>(p, rows, stride, offset + col, acc, col),
                3 => weighted_block::<3>(p, rows, stride, offset + col, acc, col),
                2 => weighted_block::<2>(p, rows, stride, offset + col, acc, col),
                _ => weighted_block::<1>(p, rows, stride, offset + col, acc, col),
            }
        }
        col += regs * LANES;
    }
}

/// `N` registers of the accumulator from `acc[col..]`, every row added into them, stored
/// back once.
///
/// # Safety
/// As [`add_weighted_rows`], with `col + 16 · N <= acc.len()` and `start` the row offset
/// of column `col`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_block<const N: usize>(
    p: &[f32],
    rows: &[f32],
    stride: usize,
    start: usize,
    acc: &mut [f32],
    col: usize,
) {
    let out = acc.as_mut_ptr();
    let mut regs = [_mm512_setzero_ps(); N];
    for (r, a) in regs.iter_mut().enumerate() {
        // SAFETY: `col + 16 · N <= acc.len()`.
        *a = unsafe { _mm512_loadu_ps(out.add(col + r * LANES)) };
    }
    let base = rows.as_ptr();
    for (j, &pj) in p.iter().enumerate() {
        let pv = _mm512_set1_ps(pj);
        for (r, a) in regs.iter_mut().enumerate() {
            let at = j * stride + start + r * LANES;
            // SAFETY: row `j < p.len()` holds the head's columns from `start`.
            let v = unsafe { _mm512_loadu_ps(base.add(at)) };
            // The same line of the row sixteen rows on (a hint: never faults).
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at + KEYS * stride).cast());
            *a = _mm512_add_ps(*a, _mm512_mul_ps(pv, v));
        }
    }
    for (r, a) in regs.iter().enumerate() {
        // SAFETY: as the loads above.
        unsafe { _mm512_storeu_ps(out.add(col + r * LANES), *a) };
    }
}
