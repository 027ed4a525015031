//! The passes of the outlier shadow's quantize (clipped per-tensor INT8), compiled for the
//! widest vector unit ([`crate::widest`]).
//!
//! A shadowed activation's range is min(max |x|, clip × the RMS of its bulk), and, at a
//! hot-max site, no more than the max |x| of the channels without resident float rows.
//! [`clip_stats`] takes the sum of squares, the max |x| and that cold max in one pass;
//! [`sum_squares_within`] the bulk's sum of squares; [`saturated_blocks`] finds the blocks
//! of quantized bytes that hold a saturated value (where the outliers are). Each is plain
//! Rust whose baseline copy is its own scalar reference (same code, same order:
//! bit-identical), and the tests below check both against naive loops.

use crate::widest::widest;

/// Lanes of the sums: the order of the additions, so every caller that sums in these
/// lanes gets the same bits.
pub const CLIP_LANES: usize = 16;

/// Bytes per block of [`saturated_blocks`].
pub const SATURATION_BLOCK: usize = 64;

/// One pass over an activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipStats {
    /// Sum of squares of the values that are not NaN, in [`CLIP_LANES`] lanes then the
    /// tail (the order of [`sum_squares_within`] with an infinite limit).
    pub squares: f32,
    /// max |x| (NaN skipped).
    pub max: f32,
    /// max |x| × the value's channel weight in the mask (1: cold, 0: hot), or infinity
    /// without a mask.
    pub cold_max: f32,
}

/// The sum of squares, max |x| and cold max of `x` (`[rows, mask.len()]` when a mask is
/// given: 1.0 for a channel whose outliers read a row from the model file, 0.0 for a hot
/// one). A mask whose width is not a multiple of [`CLIP_LANES`] takes a slower path.
pub fn clip_stats(x: &[f32], mask: Option<&[f32]>) -> ClipStats {
    match mask {
        None => {
            let (squares, max) = squares_and_max(x);
            ClipStats {
                squares,
                max,
                cold_max: f32::INFINITY,
            }
        }
        Some(mask) if !mask.is_empty() && mask.len() % CLIP_LANES == 0 => {
            let (squares, max, cold_max) = masked_stats(x, mask);
            ClipStats {
                squares,
                max,
                cold_max,
            }
        }
        Some(mask) => {
            let (squares, max) = squares_and_max(x);
            let cold_max = if mask.is_empty() {
                0.0
            } else {
                x.iter()
                    .zip(mask.iter().cycle())
                    .fold(0f32, |m, (v, &w)| m.max(v.abs() * w))
            };
            ClipStats {
                squares,
                max,
                cold_max,
            }
        }
    }
}

widest! {
    fn squares_and_max(x: &[f32]) -> (f32, f32) {
        let mut lanes = [0f32; CLIP_LANES];
        let mut maxes = [0f32; CLIP_LANES];
        let mut chunks = x.chunks_exact(CLIP_LANES);
        for chunk in &mut chunks {
            for ((s, m), &v) in lanes.iter_mut().zip(&mut maxes).zip(chunk) {
                let a = v.abs();
                *s += if a <= f32::INFINITY { v * v } else { 0.0 };
                *m = if a > *m { a } else { *m };
            }
        }
        finish(&lanes, &maxes, chunks.remainder())
    }
}

widest! {
    fn masked_stats(x: &[f32], mask: &[f32]) -> (f32, f32, f32) {
        let mut lanes = [0f32; CLIP_LANES];
        let mut maxes = [0f32; CLIP_LANES];
        let mut cold = [0f32; CLIP_LANES];
        let mut chunks = x.chunks_exact(CLIP_LANES);
        let mut at = 0;
        for chunk in &mut chunks {
            let weights = &mask[at..at + CLIP_LANES];
            at = (at + CLIP_LANES) % mask.len();
            for (((s, m), (c, &w)), &v) in lanes
                .iter_mut()
                .zip(&mut maxes)
                .zip(cold.iter_mut().zip(weights))
                .zip(chunk)
            {
                let a = v.abs();
                *s += if a <= f32::INFINITY { v * v } else { 0.0 };
                *m = if a > *m { a } else { *m };
                let aw = a * w;
                *c = if aw > *c { aw } else { *c };
            }
        }
        let tail = chunks.remainder();
        let (squares, max) = finish(&lanes, &maxes, tail);
        let mut cold_max = cold.iter().fold(0f32, |m, &v| if v > m { v } else { m });
        for (i, v) in tail.iter().enumerate() {
            let aw = v.abs() * mask[(at + i) % mask.len()];
            cold_max = if aw > cold_max { aw } else { cold_max };
        }
        (squares, max, cold_max)
    }
}

/// The lanes' sum and max, with the tail's values added after them.
#[inline(always)]
fn finish(lanes: &[f32], maxes: &[f32], tail: &[f32]) -> (f32, f32) {
    let mut squares = 0f32;
    for &s in lanes {
        squares += s;
    }
    let mut tail_squares = 0f32;
    let mut max = maxes.iter().fold(0f32, |m, &v| if v > m { v } else { m });
    for &v in tail {
        let a = v.abs();
        tail_squares += if a <= f32::INFINITY { v * v } else { 0.0 };
        max = if a > max { a } else { max };
    }
    (squares + tail_squares, max)
}

widest! {
    /// The sum of squares of the values of `x` within ±`limit`, and how many there are
    /// (in [`CLIP_LANES`] lanes, then the tail).
    pub fn sum_squares_within(x: &[f32], limit: f32) -> (f32, usize) {
        let mut lanes = [0f32; CLIP_LANES];
        let mut counts = [0u32; CLIP_LANES];
        let mut chunks = x.chunks_exact(CLIP_LANES);
        for chunk in &mut chunks {
            for ((s, n), &v) in lanes.iter_mut().zip(&mut counts).zip(chunk) {
                let inside = v.abs() <= limit;
                *s += if inside { v * v } else { 0.0 };
                *n += u32::from(inside);
            }
        }
        let mut squares = 0f32;
        for &s in &lanes {
            squares += s;
        }
        let mut count = counts.iter().map(|&n| n as usize).sum::<usize>();
        let mut tail_squares = 0f32;
        for &v in chunks.remainder() {
            if v.abs() <= limit {
                tail_squares += v * v;
                count += 1;
            }
        }
        (squares + tail_squares, count)
    }
}

widest! {
    /// The indices of the [`SATURATION_BLOCK`]-byte blocks of `q` holding a value of
    /// magnitude 127 or more (where a clipped quantize put its outliers).
    pub fn saturated_blocks(q: &[i8]) -> Vec<usize> {
        let mut blocks = Vec::new();
        for (b, block) in q.chunks(SATURATION_BLOCK).enumerate() {
            let mut any = 0u8;
            for &v in block {
                any |= u8::from(v.unsigned_abs() >= 127);
            }
            if any != 0 {
                blocks.push(b);
            }
        }
        blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeded::SeededRng;

    fn naive_squares(x: &[f32], limit: f32) -> (f32, usize) {
        let mut lanes = [0f32; CLIP_LANES];
        let mut counts = [0usize; CLIP_LANES];
        let body = x.len() / CLIP_LANES * CLIP_LANES;
        for (i, &v) in x[..body].iter().enumerate() {
            if v.abs() <= limit {
                lanes[i % CLIP_LANES] += v * v;
                counts[i % CLIP_LANES] += 1;
            }
        }
        let mut s = lanes.iter().fold(0f32, |a, &b| a + b);
        let mut tail = 0f32;
        let mut n: usize = counts.iter().sum();
        for &v in &x[body..] {
            if v.abs() <= limit {
                tail += v * v;
                n += 1;
            }
        }
        s += tail;
        (s, n)
    }

    fn inputs() -> Vec<(Vec<f32>, usize)> {
        [(37, 576), (5, 1536), (9, 100), (1, 13), (0, 32)]
            .into_iter()
            .enumerate()
            .map(|(seed, (rows, k))| {
                let mut x = SeededRng::new(seed as u64 + 1).f32s(rows * k);
                for v in x.iter_mut().step_by(97) {
                    *v *= 60.0;
                }
                (x, k)
            })
            .collect()
    }

    #[test]
    fn stats_equal_naive_loops_bit_for_bit() {
        for (x, k) in inputs() {
            let naive_max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mut mask = vec![1f32; k];
            for c in (0..k).step_by(5) {
                mask[c] = 0.0;
            }
            let naive_cold = x
                .iter()
                .enumerate()
                .filter(|(i, _)| mask[i % k] == 1.0)
                .fold(0f32, |m, (_, v)| m.max(v.abs()));
            let squares = naive_squares(&x, f32::INFINITY).0;
            let plain = clip_stats(&x, None);
            assert_eq!(plain.squares.to_bits(), squares.to_bits(), "k {k}");
            assert_eq!(plain.max.to_bits(), naive_max.to_bits());
            assert_eq!(plain.cold_max, f32::INFINITY);
            let masked = clip_stats(&x, Some(&mask));
            assert_eq!(masked.squares.to_bits(), squares.to_bits(), "k {k}");
            assert_eq!(masked.max.to_bits(), naive_max.to_bits());
            assert_eq!(masked.cold_max.to_bits(), naive_cold.to_bits(), "k {k}");
            assert_eq!((squares_and_max_body(&x)), (plain.squares, plain.max));
        }
    }

    /// The baseline copy (the scalar reference) of [`squares_and_max`], for the test above.
    fn squares_and_max_body(x: &[f32]) -> (f32, f32) {
        let mut lanes = [0f32; CLIP_LANES];
        let mut maxes = [0f32; CLIP_LANES];
        let body = x.len() / CLIP_LANES * CLIP_LANES;
        for (i, &v) in x[..body].iter().enumerate() {
            lanes[i % CLIP_LANES] += v * v;
            maxes[i % CLIP_LANES] = maxes[i % CLIP_LANES].max(v.abs());
        }
        finish(&lanes, &maxes, &x[body..])
    }

    #[test]
    fn bulk_squares_equal_naive_loops_bit_for_bit() {
        for (x, _) in inputs() {
            for limit in [0.0, 0.5, 3.0, f32::INFINITY] {
                let (s, n) = sum_squares_within(&x, limit);
                let (ns, nn) = naive_squares(&x, limit);
                assert_eq!((s.to_bits(), n), (ns.to_bits(), nn), "limit {limit}");
            }
        }
    }

    #[test]
    fn saturated_blocks_are_those_with_a_127() {
        let mut q = vec![3i8; 1000];
        q[5] = 127;
        q[64 * 3 + 10] = -127;
        q[64 * 3 + 11] = -128;
        q[999] = -128;
        assert_eq!(saturated_blocks(&q), vec![0, 3, 15]);
        assert!(saturated_blocks(&[126, -126]).is_empty());
        assert!(saturated_blocks(&[]).is_empty());
    }

    #[test]
    fn a_nan_adds_nothing_and_is_no_max() {
        let x = [1.0, f32::NAN, -2.0];
        let s = clip_stats(&x, Some(&[1.0, 1.0, 0.0]));
        assert_eq!((s.squares, s.max, s.cold_max), (5.0, 2.0, 1.0));
    }
}
