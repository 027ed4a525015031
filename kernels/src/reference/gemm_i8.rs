//! Scalar INT8 GEMM with i32 accumulation, and its dequantization.

/// Scalar reference W8A8 GEMM: `out[m, n] = a[m, k] · b[n, k]ᵀ` in i32.
///
/// * `a`: quantized activations, row-major `[m, k]`.
/// * `b`: quantized weights, row-major `[n, k]` (one row per output feature).
/// * `out`: i32 accumulators, row-major `[m, n]`, overwritten.
///
/// Accumulation wraps on i32 overflow (as the SIMD instructions do); with
/// values in `[-128, 127]` it cannot overflow for `k <= 131_072`.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn gemm_i8_reference(a: &[i8], b: &[i8], out: &mut [i32], m: usize, k: usize, n: usize) {
    assert_eq!(a.len(), m * k, "a must be [m, k]");
    assert_eq!(b.len(), n * k, "b must be [n, k]");
    assert_eq!(out.len(), m * n, "out must be [m, n]");
    for i in 0..m {
        let a_row = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let b_row = &b[j * k..(j + 1) * k];
            out[i * n + j] = a_row.iter().zip(b_row).fold(0i32, |acc, (&x, &y)| {
                acc.wrapping_add(i32::from(x) * i32::from(y))
            });
        }
    }
}

/// Dequantizes GEMM accumulators:
/// `out[i, j] = acc[i, j] as f32 * (a_scale * w_scales[j])`.
///
/// * `acc`, `out`: row-major `[m, n]`.
/// * `a_scale`: the per-tensor activation scale.
/// * `w_scales`: per-output-channel weight scales `[n]` (for a column range
///   `cols`, pass `&w_scales[cols]` and the tile's width as `n`).
///
/// # Panics
/// If a slice length does not match its shape.
pub fn dequantize_i32_acc(
    acc: &[i32],
    m: usize,
    n: usize,
    a_scale: f32,
    w_scales: &[f32],
    out: &mut [f32],
) {
    assert_eq!(acc.len(), m * n, "acc must be [m, n]");
    assert_eq!(out.len(), m * n, "out must be [m, n]");
    assert_eq!(w_scales.len(), n, "w_scales must be [n]");
    if n == 0 {
        return;
    }
    for (acc_row, out_row) in acc.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        for ((o, &v), &ws) in out_row.iter_mut().zip(acc_row).zip(w_scales) {
            *o = v as f32 * (a_scale * ws);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_small_case() {
        // a = [[1, -2, 3]], b = [[4, 5, 6], [-127, -127, -127]]
        let a = [1i8, -2, 3];
        let b = [4i8, 5, 6, -127, -127, -127];
        let mut out = [0i32; 2];
        gemm_i8_reference(&a, &b, &mut out, 1, 3, 2);
        assert_eq!(out, [4 - 10 + 18, -127 * 2]);
    }

    #[test]
    fn extreme_values_do_not_saturate() {
        let k = 1000;
        let a = vec![-128i8; k];
        let b = vec![-128i8; k];
        let mut out = [0i32; 1];
        gemm_i8_reference(&a, &b, &mut out, 1, k, 1);
        assert_eq!(out[0], 16384 * 1000);
    }

    #[test]
    fn dequantize_applies_both_scales() {
        let acc = [10, -20, 30, 40];
        let mut out = [0f32; 4];
        dequantize_i32_acc(&acc, 2, 2, 0.5, &[1.0, 0.25], &mut out);
        assert_eq!(out, [5.0, -2.5, 15.0, 5.0]);
    }
}
