//! Scalar f32 matrix multiply against `[n, k]` weights: `out = a · bᵀ`.

use std::ops::Range;

/// Scalar reference linear layer: `out[m, n] = a[m, k] · b[n, k]ᵀ`.
///
/// * `a`: activations, row-major `[m, k]`.
/// * `b`: weights, row-major `[n, k]` (one row per output feature, the
///   GGUF/llama layout).
/// * `out`: row-major `[m, n]`, overwritten.
///
/// Each dot product is accumulated in f64 and rounded once to f32, so this is
/// the "truth" that fast paths are compared with.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn matmul_f32(a: &[f32], b: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    matmul_f32_cols(a, b, out, m, k, n, 0..n);
}

/// Like [`matmul_f32`] but computes only output columns `cols` (a sub-range
/// of `0..n`) into a compact tile `out[m, cols.len()]`, where tile column
/// `j - cols.start` holds output column `j`.
///
/// # Panics
/// If a slice length does not match its shape or `cols` is not within `0..n`.
pub fn matmul_f32_cols(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    cols: Range<usize>,
) {
    assert_eq!(a.len(), m * k, "a must be [m, k]");
    assert_eq!(b.len(), n * k, "b must be [n, k]");
    assert!(
        cols.start <= cols.end && cols.end <= n,
        "cols must be within 0..n"
    );
    let nc = cols.len();
    assert_eq!(out.len(), m * nc, "out must be [m, cols.len()]");
    for i in 0..m {
        let a_row = &a[i * k..(i + 1) * k];
        for (t, j) in cols.clone().enumerate() {
            let b_row = &b[j * k..(j + 1) * k];
            let dot: f64 = a_row
                .iter()
                .zip(b_row)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
            out[i * nc + t] = dot as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_2x3_times_2x3t() {
        // a = [[1, 2, 3], [4, 5, 6]], b = [[1, 0, -1], [0.5, 0.5, 0.5]]
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [1.0, 0.0, -1.0, 0.5, 0.5, 0.5];
        let mut out = [0.0; 4];
        matmul_f32(&a, &b, &mut out, 2, 3, 2);
        assert_eq!(out, [-2.0, 3.0, -2.0, 7.5]);
    }

    #[test]
    fn column_range_matches_full() {
        let (m, k, n) = (3, 4, 5);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 - 3.0).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 * 0.5).collect();
        let mut full = vec![0.0; m * n];
        matmul_f32(&a, &b, &mut full, m, k, n);
        let mut part = vec![0.0; m * 2];
        matmul_f32_cols(&a, &b, &mut part, m, k, n, 2..4);
        for i in 0..m {
            assert_eq!(part[i * 2], full[i * n + 2]);
            assert_eq!(part[i * 2 + 1], full[i * n + 3]);
        }
    }

    #[test]
    #[should_panic(expected = "b must be [n, k]")]
    fn rejects_wrong_weight_shape() {
        let mut out = [0.0; 1];
        matmul_f32(&[1.0, 2.0], &[1.0], &mut out, 1, 2, 1);
    }
}
