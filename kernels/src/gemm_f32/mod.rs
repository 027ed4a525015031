//! f32 GEMM against `[n, k]` weights: `out[m, n] = a[m, k] · wᵀ`.
//!
//! Weights are packed once into [`PackedF32Weights`]; the dispatchers run
//! the fastest [`F32Kernel`] of the running CPU, or a forced one. Every
//! variant is tested against [`crate::reference::matmul_f32`] with relative
//! tolerance `1e-4` of `Σ_p |a[i,p] · w[j,p]|` (f32 accumulation order
//! differs between variants).
//!
//! Work splitting: for a row range, pass sub-slices of `a` and `out`; for a
//! column range use [`matmul_f32_packed_cols`], which writes a compact
//! `[m, cols.len()]` tile.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod packed;
mod scalar;

use std::ops::Range;

pub use packed::PackedF32Weights;

use crate::cpu::F32Kernel;
use crate::tile_args::{Variants, variants};

/// `out[m, n] = a[m, k] · b[n, k]ᵀ` with the fastest kernel of this CPU.
///
/// Same contract as [`crate::reference::matmul_f32`]. Packs `b` on every
/// call (O(n·k) extra work and memory); pack once with
/// [`PackedF32Weights::pack`] and call [`matmul_f32_packed`] when the
/// weights are reused.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn matmul_f32(a: &[f32], b: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    assert_eq!(a.len(), m * k, "a must be [m, k]");
    let packed = PackedF32Weights::pack(b, n, k);
    matmul_f32_packed(a, m, &packed, out);
}

/// `out[m, n] = a[m, k] · wᵀ` over packed weights, fastest kernel.
///
/// * `a`: row-major `[m, k]` (`k = w.k()`).
/// * `out`: row-major `[m, n]` (`n = w.n()`), overwritten.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn matmul_f32_packed(a: &[f32], m: usize, w: &PackedF32Weights, out: &mut [f32]) {
    matmul_f32_with(F32Kernel::best(), a, m, w, 0..w.n(), out);
}

/// Output columns `cols` (within `0..n`) of [`matmul_f32_packed`], written
/// to a compact row-major tile `out[m, cols.len()]` (tile column
/// `j - cols.start` holds output column `j`).
///
/// # Panics
/// If a slice length does not match its shape or `cols` exceeds `0..n`.
pub fn matmul_f32_packed_cols(
    a: &[f32],
    m: usize,
    w: &PackedF32Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    matmul_f32_with(F32Kernel::best(), a, m, w, cols, out);
}

/// [`matmul_f32_packed_cols`] with a chosen kernel variant (for tests and
/// benchmarks).
///
/// # Panics
/// If the running CPU does not support `kernel` (see
/// [`F32Kernel::is_available`]), or on a shape mismatch.
pub fn matmul_f32_with(
    kernel: F32Kernel,
    a: &[f32],
    m: usize,
    w: &PackedF32Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    VARIANTS.run(kernel, (a, m), (w, (w.k(), w.n())), cols, out);
}

/// The product of each [`F32Kernel`].
const VARIANTS: Variants<f32, PackedF32Weights, f32> =
    variants!(scalar::gemm, avx2::gemm, avx512::gemm);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::seeded::SeededRng;

    /// Asserts `|got - want| <= 1e-4 * Σ_p |a[i,p] b[j,p]|` elementwise.
    fn assert_close(got: &[f32], want: &[f32], a: &[f32], b: &[f32], dims: (usize, usize, usize)) {
        let (m, k, n) = dims;
        for i in 0..m {
            for j in 0..n {
                let mag: f32 = (0..k).map(|p| (a[i * k + p] * b[j * k + p]).abs()).sum();
                let (g, w) = (got[i * n + j], want[i * n + j]);
                assert!(
                    (g - w).abs() <= 1e-4 * mag + f32::MIN_POSITIVE,
                    "m={m} k={k} n={n} ({i},{j}): {g} vs {w} (mag {mag})"
                );
            }
        }
    }

    fn check_variant(kernel: F32Kernel) {
        if !kernel.is_available() {
            println!("SKIP: {} not supported by this CPU", kernel.name());
            return;
        }
        let mut seed = 100;
        for &m in &[1, 3, 6, 7, 8, 9, 17, 65, 70] {
            for &k in &[1, 2, 3, 7, 16, 17, 33, 64, 65, 127, 576] {
                for &n in &[1, 3, 16, 17, 31, 33, 65] {
                    seed += 1;
                    let a = SeededRng::new(seed).f32s(m * k);
                    let b = SeededRng::new(seed + 5000).f32s(n * k);
                    let mut want = vec![0f32; m * n];
                    reference::matmul_f32(&a, &b, &mut want, m, k, n);
                    let packed = PackedF32Weights::pack(&b, n, k);
                    let mut got = vec![f32::NAN; m * n];
                    matmul_f32_with(kernel, &a, m, &packed, 0..n, &mut got);
                    assert_close(&got, &want, &a, &b, (m, k, n));
                }
            }
        }
    }

    #[test]
    fn scalar_matches_reference() {
        check_variant(F32Kernel::Scalar);
    }

    #[test]
    fn avx2_fma_matches_reference() {
        check_variant(F32Kernel::Avx2Fma);
    }

    #[test]
    fn avx512f_matches_reference() {
        check_variant(F32Kernel::Avx512F);
    }

    #[test]
    fn exact_on_small_integers() {
        // Integer-valued inputs with small sums are exact in every variant.
        let (m, k, n) = (5, 9, 18);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut want = vec![0f32; m * n];
        reference::matmul_f32(&a, &b, &mut want, m, k, n);
        let packed = PackedF32Weights::pack(&b, n, k);
        for kernel in F32Kernel::ALL.into_iter().filter(|v| v.is_available()) {
            let mut got = vec![0f32; m * n];
            matmul_f32_with(kernel, &a, m, &packed, 0..n, &mut got);
            assert_eq!(got, want, "{}", kernel.name());
        }
    }

    #[test]
    fn degenerate_shapes() {
        for kernel in F32Kernel::ALL.into_iter().filter(|v| v.is_available()) {
            let packed = PackedF32Weights::pack(&[], 3, 0);
            let mut out = vec![7.0; 2 * 3];
            matmul_f32_with(kernel, &[], 2, &packed, 0..3, &mut out);
            assert_eq!(out, vec![0.0; 6], "{}", kernel.name());
            let packed = PackedF32Weights::pack(&[1.0, 2.0], 1, 2);
            matmul_f32_with(kernel, &[], 0, &packed, 0..1, &mut []);
        }
    }

    #[test]
    fn column_ranges_match_full_output() {
        let (m, k, n) = (9, 20, 50);
        let a = SeededRng::new(1).f32s(m * k);
        let b = SeededRng::new(2).f32s(n * k);
        let packed = PackedF32Weights::pack(&b, n, k);
        for kernel in F32Kernel::ALL.into_iter().filter(|v| v.is_available()) {
            let mut full = vec![0f32; m * n];
            matmul_f32_with(kernel, &a, m, &packed, 0..n, &mut full);
            for cols in [0..0, 3..4, 7..40, 16..48, 31..50] {
                let nc = cols.len();
                let mut got = vec![0f32; m * nc];
                matmul_f32_with(kernel, &a, m, &packed, cols.clone(), &mut got);
                for i in 0..m {
                    assert_eq!(
                        &got[i * nc..(i + 1) * nc],
                        &full[i * n + cols.start..i * n + cols.end],
                        "{} cols={cols:?}",
                        kernel.name()
                    );
                }
            }
        }
    }

    #[test]
    fn unpacked_entry_point_matches_reference() {
        let (m, k, n) = (13, 70, 29);
        let a = SeededRng::new(9).f32s(m * k);
        let b = SeededRng::new(10).f32s(n * k);
        let mut want = vec![0f32; m * n];
        reference::matmul_f32(&a, &b, &mut want, m, k, n);
        let mut got = vec![0f32; m * n];
        matmul_f32(&a, &b, &mut got, m, k, n);
        assert_close(&got, &want, &a, &b, (m, k, n));
    }
}
