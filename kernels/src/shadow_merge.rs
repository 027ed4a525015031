//! The dequantize of a shadowed INT8 linear with its float shadow added in the same pass
//! (seed 000's Eq. 1 merge), and the shadow's own product, each compiled for the widest
//! vector unit ([`crate::widest`]).
//!
//! [`crate::dequantize_i32_acc_fast`] then a second pass adding the shadow reads and writes
//! the `[rows, n]` output twice and allocates it once more; here the shadow's buffer
//! becomes the output. Bit-identical to the two passes (the same product, then the same
//! addition: IEEE addition commutes), checked by the test below.

use crate::widest::widest;

/// `out[i, j] = acc[i, j] as f32 * (a_scale * w_scales[j]) + out[i, j]`, where `out`
/// holds the float shadow on entry.
///
/// # Panics
/// If `acc` and `out` differ in length or are not whole rows of `w_scales.len()`.
pub fn dequantize_add_shadow(acc: &[i32], a_scale: f32, w_scales: &[f32], out: &mut [f32]) {
    assert_eq!(acc.len(), out.len(), "acc and out must both be [m, n]");
    let n = w_scales.len();
    if n == 0 {
        assert!(acc.is_empty(), "no columns: no accumulators");
        return;
    }
    assert_eq!(acc.len() % n, 0, "acc must be whole rows of n");
    dequantize_add_loop(acc, a_scale, w_scales, out);
}

widest! {
    fn dequantize_add_loop(acc: &[i32], a_scale: f32, w_scales: &[f32], out: &mut [f32]) {
        let n = w_scales.len();
        for (acc_row, out_row) in acc.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            for ((o, &v), &ws) in out_row.iter_mut().zip(acc_row).zip(w_scales) {
                *o += v as f32 * (a_scale * ws);
            }
        }
    }
}

/// The float shadow of a block of output rows: for each outlier `(i, r)` (flat index into
/// a `[rows, k]` activation whose row block starts at flat index `first`, ascending), adds
/// `r` × the float row of its channel `i % k` (`rows_by_channel[i % k]`, `n` wide) to its
/// output row of `out` (`[out.len() / n, n]`).
///
/// # Panics
/// If an outlier lies outside the block or its channel's row is not `n` wide.
pub fn shadow_scatter(
    out: &mut [f32],
    n: usize,
    k: usize,
    first: u32,
    outliers: &[(u32, f32)],
    rows_by_channel: &[&[f32]],
) {
    assert_eq!(rows_by_channel.len(), k, "one row per input channel");
    for &(i, _) in outliers {
        assert!(i >= first, "outlier before the block");
        let (row, c) = ((i - first) as usize / k, i as usize % k);
        assert!((row + 1) * n <= out.len(), "outlier after the block");
        assert_eq!(rows_by_channel[c].len(), n, "channel {c}'s row");
    }
    scatter_loop(out, n, k, first, outliers, rows_by_channel);
}

widest! {
    fn scatter_loop(
        out: &mut [f32],
        n: usize,
        k: usize,
        first: u32,
        outliers: &[(u32, f32)],
        rows_by_channel: &[&[f32]],
    ) {
        for &(i, r) in outliers {
            let (row, c) = ((i - first) as usize / k, i as usize % k);
            for (o, &w) in out[row * n..(row + 1) * n].iter_mut().zip(rows_by_channel[c]) {
                *o += r * w;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeded::SeededRng;

    #[test]
    fn equals_dequantize_then_add_bit_for_bit() {
        for (m, n) in [(3, 576), (17, 100), (1, 7)] {
            let mut rng = SeededRng::new((m * n) as u64);
            let acc: Vec<i32> = rng.f32s(m * n).iter().map(|v| (v * 1e5) as i32).collect();
            let scales = rng.f32s(n);
            let shadow = rng.f32s(m * n);
            let mut two_passes = vec![0f32; m * n];
            crate::dequantize_i32_acc_fast(&acc, m, n, 0.013, &scales, &mut two_passes);
            for (y, s) in two_passes.iter_mut().zip(&shadow) {
                *y += s;
            }
            let mut fused = shadow.clone();
            dequantize_add_shadow(&acc, 0.013, &scales, &mut fused);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fused), bits(&two_passes), "[{m}, {n}]");
        }
    }

    #[test]
    fn scatter_adds_each_outlier_times_its_channel_row() {
        let (n, k) = (5, 3);
        let rows: Vec<Vec<f32>> = (0..k)
            .map(|c| (0..n).map(|j| (c * 10 + j) as f32).collect())
            .collect();
        let by_channel: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        // A block of 2 output rows starting at activation row 4 (flat index 12).
        let outliers = [(12, 2.0), (14, -1.0), (14 + 1, 0.5), (17, 3.0)];
        let mut out = vec![1f32; 2 * n];
        shadow_scatter(&mut out, n, k, 12, &outliers, &by_channel);
        let mut expected = vec![1f32; 2 * n];
        for &(i, r) in &outliers {
            let (row, c) = ((i - 12) as usize / k, i as usize % k);
            for j in 0..n {
                expected[row * n + j] += r * rows[c][j];
            }
        }
        assert_eq!(out, expected);
    }

    #[test]
    #[should_panic(expected = "after the block")]
    fn scatter_refuses_an_outlier_past_the_block() {
        let row = [1f32; 2];
        shadow_scatter(&mut [0.0; 2], 2, 1, 0, &[(1, 1.0)], &[&row]);
    }

    #[test]
    #[should_panic(expected = "whole rows")]
    fn a_ragged_accumulator_is_refused() {
        dequantize_add_shadow(&[1, 2, 3], 1.0, &[1.0, 1.0], &mut [0.0; 3]);
    }
}
