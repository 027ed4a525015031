//! RMSNorm.

/// Scalar reference RMSNorm over each row:
/// `out[r, c] = x[r, c] / sqrt(mean_c(x[r, :]²) + eps) * weight[c]`.
///
/// * `x`, `out`: row-major `[rows, cols]`.
/// * `weight`: `[cols]`.
///
/// The mean of squares is accumulated in f64 (as llama.cpp does).
///
/// # Panics
/// If a slice length does not match its shape.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32], rows: usize, cols: usize) {
    assert_eq!(x.len(), rows * cols, "x must be [rows, cols]");
    assert_eq!(out.len(), rows * cols, "out must be [rows, cols]");
    assert_eq!(weight.len(), cols, "weight must be [cols]");
    if cols == 0 {
        return;
    }
    for (x_row, out_row) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let sum_sq: f64 = x_row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let mean = sum_sq / cols as f64;
        let inv = (1.0 / (mean + f64::from(eps)).sqrt()) as f32;
        for ((o, &v), &w) in out_row.iter_mut().zip(x_row).zip(weight) {
            *o = v * inv * w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // x = [3, 4]: mean of squares = 12.5, rms = sqrt(12.5) = 3.5355339.
        let x = [3.0, 4.0];
        let w = [1.0, 2.0];
        let mut out = [0.0; 2];
        rms_norm(&x, &w, 0.0, &mut out, 1, 2);
        let rms = 12.5f32.sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6, "{out:?}");
        assert!((out[1] - 2.0 * 4.0 / rms).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn eps_matters_for_small_inputs_and_rows_are_independent() {
        // Row 0 all zero stays zero (eps avoids division by zero).
        // Row 1 = [1, 1, 1, 1], eps = 1: 1 / sqrt(1 + 1).
        let x = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let w = [1.0; 4];
        let mut out = [9.0; 8];
        rms_norm(&x, &w, 1.0, &mut out, 2, 4);
        assert_eq!(&out[..4], &[0.0; 4]);
        for &v in &out[4..] {
            assert!((v - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        }
    }

    #[test]
    fn output_has_unit_rms_with_unit_weight() {
        let x: Vec<f32> = (0..576)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.1)
            .collect();
        let w = vec![1.0; 576];
        let mut out = vec![0.0; 576];
        rms_norm(&x, &w, 1e-5, &mut out, 1, 576);
        let ms: f32 = out.iter().map(|v| v * v).sum::<f32>() / 576.0;
        assert!((ms - 1.0).abs() < 1e-4, "{ms}");
    }
}
