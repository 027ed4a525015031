//! The two products of one query's attention over a KV cache (a decode step's): the
//! scores `scale · q · k_j` of every cached key, and the probability-weighted sum of the
//! values, each over rows of a cache laid out `[positions, kv_dim]` where one KV head's
//! `d` values sit at `offset` of every row.
//!
//! Why here, not as a plain loop in the decode step: a dot product written as one
//! running sum is a chain of dependent adds the compiler may not reorder (64 of them per
//! key at head dim 64), which profiled at a third of a W4A8 decode step's time at 400
//! cached positions. [`scaled_dots`] sums in 16 interleaved lanes and adds them
//! pairwise, so it vectorizes; the result differs from a left-to-right sum by rounding
//! only (its scalar twin is [`crate::reference::scaled_dots`]). [`add_weighted_rows`] is
//! element-wise (`acc[i] += p_j · v_j[i]`, `j` in order), compiled for the widest vector
//! unit and bit-identical to its twin [`crate::reference::add_weighted_rows`]. On a CPU
//! with AVX-512 and heads of a multiple of 16 values both run in the forms of the private
//! `avx512` module, which reduce sixteen keys at once and keep the accumulator in
//! registers; on a CPU with AVX2 but not AVX-512, in those of the `avx2` module (four
//! keys at once), with the same bits.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use crate::widest::widest;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Which forms of the two products serve a head of `d` values on this CPU.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// [`avx512`]'s: heads of a multiple of 16 values with AVX-512.
    Avx512,
    /// [`avx2`]'s: heads of a multiple of 16 values with AVX2 but not AVX-512.
    Avx2,
    /// The portable loops.
    Portable,
}

fn form(d: usize) -> Form {
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(16) {
        let cpu = crate::cpu::CpuFeatures::detect();
        if cpu.avx512f {
            return Form::Avx512;
        }
        if cpu.avx2 {
            return Form::Avx2;
        }
    }
    let _ = d;
    Form::Portable
}

/// Partial sums of a dot product (one 512-bit register of f32).
const LANES: usize = 16;

/// `out[j] = scale · Σ_i q[i] · rows[j · stride + offset + i]` for every row `j` of
/// `rows` (`[out.len(), stride]`; `q` is one head of `d = q.len()` values at `offset`).
///
/// # Panics
/// If `rows` is not `out.len()` rows of `stride` or a head at `offset` overruns a row.
pub fn scaled_dots(
    q: &[f32],
    rows: &[f32],
    stride: usize,
    offset: usize,
    scale: f32,
    out: &mut [f32],
) {
    check_rows(rows, out.len(), stride, offset, q.len());
    match form(q.len()) {
        // SAFETY (both forms): their instruction set was detected, the head is whole
        // 16-value chunks and the shapes were checked just above.
        #[cfg(target_arch = "x86_64")]
        Form::Avx512 => unsafe { avx512::scaled_dots(q, rows, stride, offset, scale, out) },
        #[cfg(target_arch = "x86_64")]
        Form::Avx2 => unsafe { avx2::scaled_dots(q, rows, stride, offset, scale, out) },
        _ => scaled_dots_loop(q, rows, stride, offset, scale, out),
    }
}

widest! {
    fn scaled_dots_loop(
        q: &[f32],
        rows: &[f32],
        stride: usize,
        offset: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let d = q.len();
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(stride.max(1))) {
            *o = scale * dot_lanes(q, &row[offset..offset + d]);
        }
    }
}

/// `Σ a · b` in [`LANES`] interleaved partial sums, added pairwise, then the tail.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (a16, a_tail) = a.as_chunks::<LANES>();
    let (b16, b_tail) = b.as_chunks::<LANES>();
    for (x, y) in a16.iter().zip(b16) {
        for ((s, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
        width /= 2;
    }
    a_tail
        .iter()
        .zip(b_tail)
        .fold(lanes[0], |s, (&x, &y)| s + x * y)
}

/// `acc[i] += Σ_j p[j] · rows[j · stride + offset + i]`, rows `j` in order (`rows` is
/// `[p.len(), stride]`; the head of `d = acc.len()` values sits at `offset`).
///
/// # Panics
/// If `rows` is not `p.len()` rows of `stride` or a head at `offset` overruns a row.
pub fn add_weighted_rows(p: &[f32], rows: &[f32], stride: usize, offset: usize, acc: &mut [f32]) {
    check_rows(rows, p.len(), stride, offset, acc.len());
    match form(acc.len()) {
        // SAFETY (both forms): as in `scaled_dots`.
        #[cfg(target_arch = "x86_64")]
        Form::Avx512 => unsafe { avx512::add_weighted_rows(p, rows, stride, offset, acc) },
        #[cfg(target_arch = "x86_64")]
        Form::Avx2 => unsafe { avx2::add_weighted_rows(p, rows, stride, offset, acc) },
        _ => add_weighted_rows_loop(p, rows, stride, offset, acc),
    }
}

widest! {
    fn add_weighted_rows_loop(
        p: &[f32],
        rows: &[f32],
        stride: usize,
        offset: usize,
        acc: &mut [f32],
    ) {
        let d = acc.len();
        for (&p, row) in p.iter().zip(rows.chunks_exact(stride.max(1))) {
            for (a, &v) in acc.iter_mut().zip(&row[offset..offset + d]) {
                *a += p * v;
            }
        }
    }
}

/// The shape rule both products share.
pub(crate) fn check_rows(rows: &[f32], count: usize, stride: usize, offset: usize, d: usize) {
    assert_eq!(rows.len(), count * stride, "rows must be [count, stride]");
    assert!(
        offset + d <= stride || count == 0,
        "a head of {d} at {offset} overruns a row of {stride}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::seeded::SeededRng;

    /// Against the scalar twins: the scores within f32 rounding of a sum of `d` products
    /// (relative to `Σ |q · k|`) and bit for bit the portable loop's, the weighted sum bit
    /// for bit; heads at every offset,
    /// head dims with and without a tail of the 16 lanes, no rows.
    #[test]
    fn both_products_equal_their_scalar_twins() {
        let mut rng = SeededRng::new(38);
        for (count, d, heads) in [
            (0, 64, 3),
            (1, 64, 1),
            (7, 64, 3),
            (16, 64, 3),
            (33, 16, 2),
            (130, 64, 3),
            (9, 20, 2),
            (5, 256, 1),
            (40, 256, 1),
            (17, 80, 2),
        ] {
            let stride = d * heads;
            let rows = rng.f32s(count * stride);
            for offset in (0..heads).map(|h| h * d) {
                let q = rng.f32s(d);
                let (mut fast, mut twin) = (vec![0f32; count], vec![0f32; count]);
                scaled_dots(&q, &rows, stride, offset, 0.125, &mut fast);
                reference::scaled_dots(&q, &rows, stride, offset, 0.125, &mut twin);
                // Whichever form ran, the bits of the portable 16-lane loop.
                let mut portable = vec![0f32; count];
                scaled_dots_loop(&q, &rows, stride, offset, 0.125, &mut portable);
                assert_eq!(
                    fast.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    portable.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "count {count} d {d} offset {offset}"
                );
                for (j, (a, b)) in fast.iter().zip(&twin).enumerate() {
                    let row = &rows[j * stride + offset..j * stride + offset + d];
                    let magnitude: f32 =
                        0.125 * q.iter().zip(row).map(|(x, y)| (x * y).abs()).sum::<f32>();
                    assert!(
                        (a - b).abs() <= 1e-6 * magnitude.max(1.0),
                        "{a} vs {b} (d {d})"
                    );
                }
                let p = rng.f32s(count);
                let start = rng.f32s(d);
                let (mut fast, mut twin) = (start.clone(), start);
                add_weighted_rows(&p, &rows, stride, offset, &mut fast);
                reference::add_weighted_rows(&p, &rows, stride, offset, &mut twin);
                assert_eq!(fast, twin, "count {count} d {d} offset {offset}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "overruns a row")]
    fn refuses_a_head_past_the_row() {
        scaled_dots(&[0.0; 64], &[0.0; 192], 192, 160, 1.0, &mut [0.0]);
    }

    #[test]
    #[should_panic(expected = "rows must be [count, stride]")]
    fn refuses_rows_of_another_shape() {
        add_weighted_rows(&[1.0, 1.0], &[0.0; 192], 192, 0, &mut [0.0; 64]);
    }
}
