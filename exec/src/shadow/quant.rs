//! The quantize operator of a shadowed site ([`QuantRule::Clip`] and
//! [`QuantRule::HotMax`](super::QuantRule::HotMax)) in three passes over the
//! activation instead of six.
//!
//! The straightforward form ([`clip_limit`] then a scan for the values beyond) reads the
//! activation once for its RMS, once for its max |x|, once more per channel for a hot-max
//! site's cold max (an iterator over `hot.iter().cycle()` that does not vectorize), once for
//! the bulk's RMS, once to quantize and once more to find the outliers. On a 2-core
//! machine where the quantize runs on the CPU lane beside the INT8 GEMMs, those passes over
//! a `[chunk, 1536]` down input are a visible share of the prefill. Here the RMS, the max
//! and the cold max come from one pass, and the outliers from the quantized bytes (a value
//! beyond the limit saturates to ±127, so only saturated bytes are looked at again).
//! The passes are [`hetsched_kernels::clip_stats`]'s, compiled for the widest vector unit;
//! the result is bit-identical to the straightforward form (same lane order for the sums;
//! a max does not depend on order): `tests` below check it against that form.

use hetsched_kernels::{
    ClipStats, SATURATION_BLOCK, clip_stats, quantize_per_tensor_fast, saturated_blocks,
    sum_squares_within,
};

use crate::activation::Act;

/// Per-tensor INT8 with the scale clipped at min(max |x|, `clip` × the bulk's RMS) (and,
/// given `cold`, at most the max |x| of the channels whose `cold` entry is 1, for a
/// `[rows, cold.len()]` activation), each value beyond the limit an outlier: the
/// quantize of [`QuantRule::Clip`](super::QuantRule::Clip) (`cold: None`) and of
/// [`QuantRule::HotMax`](super::QuantRule::HotMax).
pub fn quantize_clipped(x: Vec<f32>, clip: f32, cold: Option<&[f32]>) -> Act {
    let ClipStats {
        squares,
        max,
        cold_max,
    } = clip_stats(&x, cold);
    let rms = (squares / x.len().max(1) as f32).sqrt();
    let (bulk_squares, bulk) = sum_squares_within(&x, clip * rms);
    let bulk_rms = (bulk_squares / bulk.max(1) as f32).sqrt();
    let limit = cold_max.min(max.min(clip * bulk_rms));
    quantize_beyond(x, limit)
}

/// A hot-max site's per-channel mask for [`quantize_clipped`]: 1 for a channel outside
/// `hot`, 0 for a hot one.
pub fn cold_mask(hot: &[bool]) -> Vec<f32> {
    hot.iter().map(|&h| if h { 0.0 } else { 1.0 }).collect()
}

/// Per-tensor INT8 with the scale `limit` / 127, each value beyond `limit` an outlier
/// (its index and the part its saturated INT8 value misses).
pub fn quantize_beyond(x: Vec<f32>, limit: f32) -> Act {
    let scale = if limit > 0.0 { limit / 127.0 } else { 1.0 };
    let mut q = vec![0i8; x.len()];
    quantize_per_tensor_fast(&x, scale, &mut q);
    let outliers = if limit > 0.0 {
        saturated_beyond(&x, &q, limit, scale)
    } else {
        // Scale 1: a value beyond 0 need not saturate; look at every one.
        beyond(&x, &q, 0, limit, scale)
    };
    Act::Int8 { q, scale, outliers }
}

/// The outliers among the saturated bytes of `q`: with the scale `limit` / 127 a value
/// beyond `limit` quantizes to ±127, so blocks without one are skipped after a byte scan.
fn saturated_beyond(x: &[f32], q: &[i8], limit: f32, scale: f32) -> Vec<(u32, f32)> {
    let mut outliers = Vec::new();
    for b in saturated_blocks(q) {
        let from = b * SATURATION_BLOCK;
        let to = (from + SATURATION_BLOCK).min(q.len());
        outliers.extend(beyond(&x[from..to], &q[from..to], from, limit, scale));
    }
    outliers
}

/// The values of `x` (starting at flat index `from`) beyond `limit`, with their residuals.
fn beyond(x: &[f32], q: &[i8], from: usize, limit: f32, scale: f32) -> Vec<(u32, f32)> {
    x.iter()
        .zip(q)
        .enumerate()
        .filter(|(_, (v, _))| v.abs() > limit)
        .map(|(i, (&v, &qv))| ((from + i) as u32, v - f32::from(qv) * scale))
        .collect()
}

#[cfg(test)]
mod tests {
    use hetsched_kernels::seeded::SeededRng;

    use super::*;
    use crate::values::clip_limit;

    /// The straightforward form: [`clip_limit`], the cold max by channel, then every value
    /// looked at.
    fn reference(x: &[f32], clip: f32, hot: Option<&[bool]>) -> Act {
        let mut limit = clip_limit(x, clip);
        if let Some(hot) = hot {
            let cold_max = x
                .iter()
                .zip(hot.iter().cycle())
                .filter(|&(_, &h)| !h)
                .fold(0f32, |m, (v, _)| m.max(v.abs()));
            limit = cold_max.min(limit);
        }
        let scale = if limit > 0.0 { limit / 127.0 } else { 1.0 };
        let mut q = vec![0i8; x.len()];
        quantize_per_tensor_fast(x, scale, &mut q);
        let outliers = beyond(x, &q, 0, limit, scale);
        Act::Int8 { q, scale, outliers }
    }

    /// A `[rows, k]` activation with a few massive channels and rare spikes elsewhere.
    fn activation(rows: usize, k: usize, seed: u64) -> Vec<f32> {
        let mut x = SeededRng::new(seed).f32s(rows * k);
        for r in 0..rows {
            x[r * k + 3] *= 300.0;
            x[r * k + k / 2] *= 40.0;
        }
        for i in (7..x.len()).step_by(997) {
            x[i] *= 25.0;
        }
        x
    }

    fn assert_same(fast: &Act, slow: &Act) {
        match (fast, slow) {
            (
                Act::Int8 {
                    q: fq,
                    scale: fs,
                    outliers: fo,
                },
                Act::Int8 {
                    q: sq,
                    scale: ss,
                    outliers: so,
                },
            ) => {
                assert_eq!(fs.to_bits(), ss.to_bits(), "scale");
                assert_eq!(fq, sq, "quantized values");
                assert_eq!(fo.len(), so.len(), "outlier count");
                for (a, b) in fo.iter().zip(so) {
                    assert_eq!((a.0, a.1.to_bits()), (b.0, b.1.to_bits()), "outlier");
                }
            }
            _ => panic!("both quantize to per-tensor INT8"),
        }
    }

    #[test]
    fn clip_equals_the_straightforward_form_bit_for_bit() {
        // Widths a multiple of the lanes and not, with and without a tail.
        for (rows, k, seed) in [(37, 576, 1), (5, 1536, 2), (9, 100, 3), (1, 13, 4)] {
            let x = activation(rows, k, seed);
            let fast = quantize_clipped(x.clone(), 4.0, None);
            let slow = reference(&x, 4.0, None);
            assert_same(&fast, &slow);
            let Act::Int8 { outliers, .. } = &fast else {
                unreachable!()
            };
            // (One row of 13 is too short for its massive value to stand out of the RMS.)
            assert!(
                rows == 1 || !outliers.is_empty(),
                "the massive channel is shadowed"
            );
        }
    }

    #[test]
    fn hot_max_equals_the_straightforward_form_bit_for_bit() {
        for (rows, k, seed) in [(37, 576, 5), (5, 1536, 6), (9, 100, 7), (3, 13, 8)] {
            let x = activation(rows, k, seed);
            let mut hot = vec![false; k];
            hot[3] = true;
            for clip in [6.0, 1000.0] {
                let fast = quantize_clipped(x.clone(), clip, Some(&cold_mask(&hot)));
                assert_same(&fast, &reference(&x, clip, Some(&hot)));
            }
        }
    }

    #[test]
    fn a_zero_tensor_and_an_all_hot_mask_keep_their_meaning() {
        let zeros = vec![0f32; 64];
        assert_same(
            &quantize_clipped(zeros.clone(), 4.0, None),
            &reference(&zeros, 4.0, None),
        );
        let x = activation(4, 32, 9);
        // Every channel hot: the cold max is 0, every nonzero value is an outlier.
        let hot = vec![true; 32];
        let fast = quantize_clipped(x.clone(), 6.0, Some(&cold_mask(&hot)));
        assert_same(&fast, &reference(&x, 6.0, Some(&hot)));
        let Act::Int8 { outliers, .. } = fast else {
            unreachable!()
        };
        assert_eq!(outliers.len(), x.iter().filter(|v| **v != 0.0).count());
    }
}
