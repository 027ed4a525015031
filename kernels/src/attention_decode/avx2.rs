//! AVX2 forms of the two decode attention products, for heads of a multiple of 16
//! values, on a CPU without AVX-512 (the reasons are [`super::avx512`]'s: the portable
//! loop reduces each key's sixteen partial sums on its own and keeps the weighted sum's
//! accumulator in memory).
//!
//! A key's sixteen partial sums are two registers of eight; four keys' dot products are
//! formed together (eight accumulators in registers, each load of the query shared by
//! four keys) and reduced together. Multiplies and adds are separate roundings, in the
//! portable loop's order and with its pairwise reduction (lane `i` plus lane `i + 8`,
//! then `+ 4`, `+ 2`, `+ 1`; float addition commutes exactly), so the dot products are
//! the portable loop's bits; the weighted sum keeps 64 values of the accumulator in
//! registers across the rows and is its scalar twin's bits.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// Keys whose dot products are formed and reduced together.
const KEYS: usize = 4;
/// Values in one register.
const LANES: usize = 8;
/// The portable loop's partial sums a key: two registers.
const PARTIALS: usize = 16;
/// Registers of the accumulator a weighted-sum pass keeps (64 values).
const BLOCK_REGS: usize = 8;

/// `out[j] = scale · q · row_j[offset..offset + d]`, the shapes checked by the caller.
///
/// # Safety
/// The CPU must support avx2; `q.len()` is a multiple of 16 and `rows` holds
/// `out.len()` rows of `stride` with `offset + q.len() <= stride`
/// ([`super::check_rows`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn scaled_dots(
    q: &[f32],
    rows: &[f32],
    stride: usize,
    offset: usize,
    scale: f32,
    out: &mut [f32],
) {
    debug_assert_eq!(q.len() % PARTIALS, 0);
    for j0 in (0..out.len()).step_by(KEYS) {
        let keys = (out.len() - j0).min(KEYS);
        // SAFETY: rows `j0..j0 + keys` exist (`j0 + keys <= out.len()`), each with the
        // head at `offset` (the caller's contract).
        let sums = unsafe { block_dots(q, rows.as_ptr().add(j0 * stride + offset), stride, keys) };
        for (o, sum) in out[j0..j0 + keys].iter_mut().zip(sums) {
            *o = sum * scale;
        }
    }
}

/// Element `r` (`r < keys`) is `q · row_r`, row `r` starting at `first + r · stride`: per
/// partial sum a product and a separate add a chunk of 16 values, then the pairwise
/// reduction of [`sum_each`]. Always four rows, a short block's last row standing in for
/// the missing ones (their sums are dropped), so that the accumulators stay in registers.
///
/// # Safety
/// `1 <= keys <= 4`, and `q.len()` values are readable from `first + r · stride` for
/// every `r < keys`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_dots(q: &[f32], first: *const f32, stride: usize, keys: usize) -> [f32; KEYS] {
    debug_assert!((1..=KEYS).contains(&keys));
    // SAFETY: row `min(r, keys - 1)` is one of the caller's readable rows.
    let rows: [*const f32; KEYS] =
        std::array::from_fn(|r| unsafe { first.add(r.min(keys - 1) * stride) });
    let mut acc = [[_mm256_setzero_ps(); 2]; KEYS];
    for c in 0..q.len() / PARTIALS {
        // SAFETY: `16 c + 16 <= q.len()`.
        let qv = unsafe {
            [
                _mm256_loadu_ps(q.as_ptr().add(c * PARTIALS)),
                _mm256_loadu_ps(q.as_ptr().add(c * PARTIALS + LANES)),
            ]
        };
        for (a, row) in acc.iter_mut().zip(rows) {
            for h in 0..2 {
                // SAFETY: each row holds `q.len()` values.
                let kv = unsafe { _mm256_loadu_ps(row.add(c * PARTIALS + h * LANES)) };
                a[h] = _mm256_add_ps(a[h], _mm256_mul_ps(qv[h], kv));
            }
            // The same line of the row a block of keys on (a hint: never faults).
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(KEYS * stride + c * PARTIALS).cast());
        }
    }
    sum_each(acc)
}

/// Element `r` is the portable loop's pairwise sum of key `r`'s sixteen partial sums
/// (`v[r]`: lanes 0-7 and 8-15).
#[inline]
#[target_feature(enable = "avx2")]
fn sum_each(v: [[__m256; 2]; KEYS]) -> [f32; KEYS] {
    // Lane i plus lane i + 8: one register of eight a key.
    let eights = v.map(|[lo, hi]| _mm256_add_ps(lo, hi));
    // Lane i plus lane i + 4: keys 0 and 1 in the halves of one register, 2 and 3 of
    // the other.
    let fours = [(0, 1), (2, 3)].map(|(a, b)| {
        let low = _mm256_permute2f128_ps::<0x20>(eights[a], eights[b]);
        let high = _mm256_permute2f128_ps::<0x31>(eights[a], eights[b]);
        _mm256_add_ps(low, high)
    });
    // Lane i plus lane i + 2: each 128-bit half [k, k, k', k'] (keys 0 and 2 low, 1 and
    // 3 high).
    let low = _mm256_shuffle_ps::<0b01_00_01_00>(fours[0], fours[1]);
    let high = _mm256_shuffle_ps::<0b11_10_11_10>(fours[0], fours[1]);
    let twos = _mm256_add_ps(low, high);
    // Lane 0 plus lane 1: keys 0, 2 in lanes 0, 1 and 1, 3 in lanes 4, 5.
    let ones = _mm256_hadd_ps(twos, twos);
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` is exactly 8 writable f32; storeu needs no alignment.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), ones) };
    [lanes[0], lanes[4], lanes[1], lanes[5]]
}

/// `acc[i] += Σ_j p[j] · row_j[offset + i]`, rows in order, each product rounded before
/// its add (bit-identical to the scalar twin); shapes checked by the caller.
///
/// # Safety
/// The CPU must support avx2; `acc.len()` is a multiple of 16 and `rows` holds
/// `p.len()` rows of `stride` with `offset + acc.len() <= stride`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn add_weighted_rows(
    p: &[f32],
    rows: &[f32],
    stride: usize,
    offset: usize,
    acc: &mut [f32],
) {
    debug_assert_eq!(acc.len() % PARTIALS, 0);
    let d = acc.len();
    let mut col = 0;
    while col < d {
        let regs = ((d - col) / LANES).min(BLOCK_REGS);
        // SAFETY: columns `col..col + 8 · regs` lie inside `acc` and inside every row's
        // head (the caller's contract; `regs` is even, as `d` is a multiple of 16).
        unsafe {
            match regs {
                8 => weighted_block::<8>(p, rows, stride, offset + col, acc, col),
                6 => weighted_block::<6>(p, rows, stride, offset + col, acc, col),
                4 => weighted_block::<4>(p, rows, stride, offset + col, acc, col),
                _ => weighted_block::<2>(p, rows, stride, offset + col, acc, col),
            }
        }
        col += regs * LANES;
    }
}

/// `N` registers of the accumulator from `acc[col..]`, every row added into them, stored
/// back once.
///
/// # Safety
/// As [`add_weighted_rows`], with `col + 8 · N <= acc.len()` and `start` the row offset
/// of column `col`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn weighted_block<const N: usize>(
    p: &[f32],
    rows: &[f32],
    stride: usize,
    start: usize,
    acc: &mut [f32],
    col: usize,
) {
    let out = acc.as_mut_ptr();
    let mut regs = [_mm256_setzero_ps(); N];
    for (r, a) in regs.iter_mut().enumerate() {
        // SAFETY: `col + 8 · N <= acc.len()`.
        *a = unsafe { _mm256_loadu_ps(out.add(col + r * LANES)) };
    }
    let base = rows.as_ptr();
    for (j, &pj) in p.iter().enumerate() {
        let pv = _mm256_set1_ps(pj);
        for (r, a) in regs.iter_mut().enumerate() {
            let at = j * stride + start + r * LANES;
            // SAFETY: row `j < p.len()` holds the head's columns from `start`.
            let v = unsafe { _mm256_loadu_ps(base.add(at)) };
            *a = _mm256_add_ps(*a, _mm256_mul_ps(pv, v));
        }
        // The row's line eight rows on (a hint: never faults).
        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(j * stride + start + 8 * stride).cast());
    }
    for (r, a) in regs.iter().enumerate() {
        // SAFETY: as the loads above.
        unsafe { _mm256_storeu_ps(out.add(col + r * LANES), *a) };
    }
}
