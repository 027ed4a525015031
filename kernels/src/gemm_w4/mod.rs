//! W4A8 GEMM: 4-bit weights with per-group integer sub-scales, INT8 activations,
//! INT32 accumulation: `out[m, n] (i32) = Σ_g s[n, g] · (a[m, g] · q[n, g]ᵀ)`.
//!
//! Weights are quantized ([`W4Rows`]) and packed once ([`PackedW4Weights`], half a
//! byte per weight); the kernels unpack nibbles in registers. The dispatchers run the
//! fastest [`I8Kernel`] variant of the running CPU, or a forced one; every variant
//! returns exactly the accumulators of [`gemm_w4_reference`]. The accumulators are
//! dequantized like W8A8's, with the activation scale and the per-row scales
//! ([`PackedW4Weights::row_scales`]).
//!
//! Work splitting as [`crate::gemm_i8()`]: a row range by sub-slices of `a` and `out`,
//! a column range by [`gemm_w4_cols`].

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_groups;
#[cfg(target_arch = "x86_64")]
mod avx512vnni;
mod g128;
mod grouped;
mod packed;
mod quant;
mod scalar;
mod scaled;

use std::ops::Range;

pub use g128::{
    ACT_GROUP_K, act_groups, gemm_w4_g128, gemm_w4_g128_cols, gemm_w4_g128_reference,
    gemm_w4_g128_with, matmul_w4a8_g128, quantize_groups128, quantize_groups128_into,
    quantize_groups128_reference,
};
pub use grouped::{
    gemm_w4_grouped, gemm_w4_grouped_cols, gemm_w4_grouped_reference, gemm_w4_grouped_with,
    matmul_w4a8_grouped, quantize_groups, quantize_groups_into, quantize_groups_reference,
};
pub use packed::PackedW4Weights;
pub use quant::{GROUP_K, W4Rows, gemm_w4_reference};

use crate::cpu::I8Kernel;
use crate::reference::dequantize_i32_acc;
use crate::tile_args::{Variants, variants};
use crate::vector::{quantize_per_tensor_fast, scale_for_max_abs_fast};

/// `out[m, n] = a[m, k] · wᵀ` (i32, before the row scales) with the fastest kernel of
/// this CPU.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn gemm_w4(a: &[i8], m: usize, w: &PackedW4Weights, out: &mut [i32]) {
    gemm_w4_with(I8Kernel::best(), a, m, w, 0..w.n(), out);
}

/// Output columns `cols` (within `0..n`) of [`gemm_w4`], written to a compact
/// row-major tile `out[m, cols.len()]`.
///
/// # Panics
/// If a slice length does not match its shape or `cols` exceeds `0..n`.
pub fn gemm_w4_cols(a: &[i8], m: usize, w: &PackedW4Weights, cols: Range<usize>, out: &mut [i32]) {
    gemm_w4_with(I8Kernel::best(), a, m, w, cols, out);
}

/// [`gemm_w4_cols`] with a chosen kernel variant (for tests and benchmarks).
///
/// # Panics
/// If the running CPU does not support `kernel`, or on a shape mismatch.
pub fn gemm_w4_with(
    kernel: I8Kernel,
    a: &[i8],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [i32],
) {
    VARIANTS.run(kernel, (a, m), (w, (w.k(), w.n())), cols, out);
}

/// The product of each [`I8Kernel`].
const VARIANTS: Variants<i8, PackedW4Weights, i32> =
    variants!(scalar::gemm, avx2::gemm, avx512vnni::gemm);

/// Linear layer in W4A8: quantizes `x[m, k]` per tensor (max |x| / 127), runs
/// [`gemm_w4`] and dequantizes with `a_scale · row_scale[j]` into `out[m, n]`.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn matmul_w4a8(x: &[f32], m: usize, w: &PackedW4Weights, out: &mut [f32]) {
    let (k, n) = (w.k(), w.n());
    assert_eq!(x.len(), m * k, "x must be [m, k]");
    assert_eq!(out.len(), m * n, "out must be [m, n]");
    let a_scale = scale_for_max_abs_fast(x);
    let mut a_q = vec![0i8; m * k];
    quantize_per_tensor_fast(x, a_scale, &mut a_q);
    let mut acc = vec![0i32; m * n];
    gemm_w4(&a_q, m, w, &mut acc);
    dequantize_i32_acc(&acc, m, n, a_scale, w.row_scales(), out);
}

#[cfg(test)]
mod tests;
