//! W8A8 INT8 GEMM: `out[m, n] (i32) = a[m, k] (i8) · w[n, k]ᵀ (i8)`.
//!
//! Weights are packed once into [`PackedI8Weights`]; the dispatchers run the
//! fastest [`I8Kernel`] of the running CPU, or a forced one. Every variant
//! returns exactly the accumulators of
//! [`crate::reference::gemm_i8_reference`].
//!
//! Work splitting: for a row range, pass sub-slices of `a` and `out`; for a
//! column range use [`gemm_i8_cols`], which writes a compact
//! `[m, cols.len()]` tile.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512vnni;
mod packed;
mod scalar;

use std::ops::Range;

pub use packed::PackedI8Weights;

use crate::cpu::I8Kernel;
use crate::reference::{dequantize_i32_acc, quantize_per_tensor, scale_for_max_abs};
use crate::tile_args::{Variants, variants};

/// `out[m, n] = a[m, k] · wᵀ` with the fastest kernel of this CPU.
///
/// * `a`: row-major `[m, k]` activations (`k = w.k()`).
/// * `out`: row-major `[m, n]` i32 accumulators (`n = w.n()`), overwritten.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn gemm_i8(a: &[i8], m: usize, w: &PackedI8Weights, out: &mut [i32]) {
    gemm_i8_with(I8Kernel::best(), a, m, w, 0..w.n(), out);
}

/// Output columns `cols` (within `0..n`) of [`gemm_i8`], written to a
/// compact row-major tile `out[m, cols.len()]` (tile column `j - cols.start`
/// holds output column `j`).
///
/// # Panics
/// If a slice length does not match its shape or `cols` exceeds `0..n`.
pub fn gemm_i8_cols(a: &[i8], m: usize, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    gemm_i8_with(I8Kernel::best(), a, m, w, cols, out);
}

/// [`gemm_i8_cols`] with a chosen kernel variant (for tests and benchmarks).
///
/// # Panics
/// If the running CPU does not support `kernel` (see
/// [`I8Kernel::is_available`]), or on a shape mismatch as [`gemm_i8_cols`].
pub fn gemm_i8_with(
    kernel: I8Kernel,
    a: &[i8],
    m: usize,
    w: &PackedI8Weights,
    cols: Range<usize>,
    out: &mut [i32],
) {
    VARIANTS.run(kernel, (a, m), (w, (w.k(), w.n())), cols, out);
}

/// The product of each [`I8Kernel`].
const VARIANTS: Variants<i8, PackedI8Weights, i32> =
    variants!(scalar::gemm, avx2::gemm, avx512vnni::gemm);

/// Linear layer in W8A8: quantizes `x` per tensor (dynamic
/// [`scale_for_max_abs`]), runs [`gemm_i8`], and dequantizes with
/// `a_scale * w_scales[j]`.
///
/// * `x`: row-major `[m, k]` f32 activations.
/// * `w`, `w_scales`: packed weights and their `n` per-row scales (from
///   [`crate::reference::quantize_weights_per_row`]).
/// * `out`: row-major `[m, n]` f32, overwritten.
///
/// Allocates an `[m, k]` i8 and an `[m, n]` i32 scratch buffer.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn matmul_w8a8(x: &[f32], m: usize, w: &PackedI8Weights, w_scales: &[f32], out: &mut [f32]) {
    let (k, n) = (w.k(), w.n());
    assert_eq!(x.len(), m * k, "x must be [m, k]");
    assert_eq!(w_scales.len(), n, "w_scales must be [n]");
    assert_eq!(out.len(), m * n, "out must be [m, n]");
    let a_scale = scale_for_max_abs(x);
    let mut a_q = vec![0i8; m * k];
    quantize_per_tensor(x, a_scale, &mut a_q);
    let mut acc = vec![0i32; m * n];
    gemm_i8(&a_q, m, w, &mut acc);
    dequantize_i32_acc(&acc, m, n, a_scale, w_scales, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{gemm_i8_reference, matmul_f32, quantize_weights_per_row};
    use crate::seeded::SeededRng;

    fn check_variant(kernel: I8Kernel) {
        if !kernel.is_available() {
            println!("SKIP: {} not supported by this CPU", kernel.name());
            return;
        }
        let dims = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127];
        let mut seed = 1;
        for &m in &[1, 2, 3, 4, 5, 8, 9, 17, 65, 70] {
            for &k in &dims {
                for &n in &[1, 3, 16, 17, 33, 65] {
                    seed += 1;
                    // Activations take every i8 value; the weights once as drawn (with
                    // -128 in most matrices) and once clamped to the symmetric range
                    // the quantizers produce, so that AVX2 runs both of its forms.
                    let a = SeededRng::new(seed).i8s(m * k);
                    let drawn = SeededRng::new(seed + 1000).i8s(n * k);
                    let clamped: Vec<i8> = drawn.iter().map(|&v| v.max(-127)).collect();
                    for b in [drawn, clamped] {
                        let mut want = vec![0i32; m * n];
                        gemm_i8_reference(&a, &b, &mut want, m, k, n);
                        let packed = PackedI8Weights::pack(&b, n, k);
                        let mut got = vec![-1i32; m * n];
                        gemm_i8_with(kernel, &a, m, &packed, 0..n, &mut got);
                        assert_eq!(
                            got,
                            want,
                            "{} m={m} k={k} n={n} symmetric={}",
                            kernel.name(),
                            packed.is_symmetric()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn scalar_matches_reference_exactly() {
        check_variant(I8Kernel::Scalar);
    }

    #[test]
    fn avx2_matches_reference_exactly() {
        check_variant(I8Kernel::Avx2);
    }

    #[test]
    fn avx512_vnni_matches_reference_exactly() {
        check_variant(I8Kernel::Avx512Vnni);
    }

    #[test]
    fn extreme_values_are_exact_in_every_variant() {
        // -128 activations stress the +128 bias (biased value 0) and
        // all-(-128) weights the column correction. With weights of ±127 AVX2's
        // signed-pairs form meets its largest pair sums, ±2 · 128 · 127 with
        // -128 activations and ±2 · 127² with ±127 ones (i16 holds 32767); with
        // -128 weights it must take its widened form.
        let (m, k, n) = (5, 129, 19);
        for (av, wv) in [
            (-128i8, -128i8),
            (127, -128),
            (-128, 127),
            (127, 127),
            (-128, -127),
            (-127, -127),
            (-127, 127),
            (127, -127),
            (-128, 0),
            (0, -128),
            (-1, -128),
            (-127, -128),
        ] {
            let a = vec![av; m * k];
            let b = vec![wv; n * k];
            let mut want = vec![0i32; m * n];
            gemm_i8_reference(&a, &b, &mut want, m, k, n);
            assert_eq!(want[0], i32::from(av) * i32::from(wv) * k as i32);
            let packed = PackedI8Weights::pack(&b, n, k);
            for kernel in I8Kernel::ALL.into_iter().filter(|v| v.is_available()) {
                let mut got = vec![0i32; m * n];
                gemm_i8_with(kernel, &a, m, &packed, 0..n, &mut got);
                assert_eq!(got, want, "{} a={av} w={wv}", kernel.name());
            }
        }
    }

    #[test]
    fn column_ranges_match_full_output() {
        let (m, k, n) = (11, 37, 70);
        let a = SeededRng::new(7).i8s(m * k);
        let b = SeededRng::new(8).i8s(n * k);
        let packed = PackedI8Weights::pack(&b, n, k);
        let mut full = vec![0i32; m * n];
        gemm_i8_reference(&a, &b, &mut full, m, k, n);
        for kernel in I8Kernel::ALL.into_iter().filter(|v| v.is_available()) {
            for cols in [0..0, 0..1, 5..21, 16..32, 15..17, 33..70, 69..70, 0..70] {
                let nc = cols.len();
                let mut got = vec![0i32; m * nc];
                gemm_i8_with(kernel, &a, m, &packed, cols.clone(), &mut got);
                for i in 0..m {
                    assert_eq!(
                        &got[i * nc..(i + 1) * nc],
                        &full[i * n + cols.start..i * n + cols.end],
                        "{} cols={cols:?} row {i}",
                        kernel.name()
                    );
                }
            }
        }
    }

    #[test]
    fn row_split_by_slicing_matches_full_output() {
        let (m, k, n) = (10, 40, 20);
        let a = SeededRng::new(3).i8s(m * k);
        let b = SeededRng::new(4).i8s(n * k);
        let packed = PackedI8Weights::pack(&b, n, k);
        let mut full = vec![0i32; m * n];
        gemm_i8(&a, m, &packed, &mut full);
        let mut halves = vec![0i32; m * n];
        let (top, bottom) = halves.split_at_mut(4 * n);
        gemm_i8(&a[..4 * k], 4, &packed, top);
        gemm_i8(&a[4 * k..], 6, &packed, bottom);
        assert_eq!(halves, full);
    }

    #[test]
    fn degenerate_shapes() {
        // k = 0: all accumulators are 0; m = 0 / n = 0: nothing to write.
        for kernel in I8Kernel::ALL.into_iter().filter(|v| v.is_available()) {
            let packed = PackedI8Weights::pack(&[], 3, 0);
            let mut out = vec![7i32; 2 * 3];
            gemm_i8_with(kernel, &[], 2, &packed, 0..3, &mut out);
            assert_eq!(out, vec![0; 6], "{}", kernel.name());
            let packed = PackedI8Weights::pack(&[1, 2], 1, 2);
            gemm_i8_with(kernel, &[], 0, &packed, 0..1, &mut []);
            let packed = PackedI8Weights::pack(&[], 0, 2);
            gemm_i8_with(kernel, &[1, 2], 1, &packed, 0..0, &mut []);
        }
    }

    #[test]
    #[should_panic(expected = "out must be [m, cols.len()]")]
    fn rejects_wrong_output_length() {
        let packed = PackedI8Weights::pack(&[1, 2, 3, 4], 2, 2);
        gemm_i8(&[1, 1], 1, &packed, &mut [0; 3]);
    }

    #[test]
    fn w8a8_linear_approximates_f32() {
        let (m, k, n) = (4, 64, 24);
        let x: Vec<f32> = SeededRng::new(11)
            .i8s(m * k)
            .iter()
            .map(|&v| f32::from(v) / 37.0)
            .collect();
        let wf: Vec<f32> = SeededRng::new(12)
            .i8s(n * k)
            .iter()
            .map(|&v| f32::from(v) / 91.0)
            .collect();
        let (wq, ws) = quantize_weights_per_row(&wf, n, k);
        let packed = PackedI8Weights::pack(&wq, n, k);
        let mut got = vec![0f32; m * n];
        matmul_w8a8(&x, m, &packed, &ws, &mut got);
        let mut want = vec![0f32; m * n];
        matmul_f32(&x, &wf, &mut want, m, k, n);
        // Error bound: per term |x|·(w step/2) + |w|·(x step/2), summed.
        let x_step = scale_for_max_abs(&x);
        for i in 0..m {
            for j in 0..n {
                let bound: f32 = (0..k)
                    .map(|p| {
                        x[i * k + p].abs() * ws[j] * 0.5
                            + wf[j * k + p].abs() * x_step * 0.5
                            + x_step * ws[j] * 0.25
                    })
                    .sum();
                let (g, w) = (got[i * n + j], want[i * n + j]);
                assert!(
                    (g - w).abs() <= bound * 1.001 + 1e-6,
                    "({i},{j}) {g} vs {w}"
                );
            }
        }
    }
}
