//! W4A8 with per-group activation scales: INT8 activations with one scale per row and
//! group of 32 inputs (llama.cpp's Q8_0 blocks), the same packed 4-bit weights as
//! [`super::gemm_w4`]:
//!
//! ```text
//! out[m, n] = d[n] · Σ_g a_scale[m, g] · (s[n, g] · Σ_{p ∈ g} a[m, p] · q[n, p])
//! ```
//!
//! A group's `Σ a · q` is an exact i32 (at most 32 · 128 · 8 in magnitude, so exact in
//! f32 too); it is converted and fused-multiply-added into a float accumulator with
//! `s[n, g] · a_scale[m, g]` (one conversion and one FMA per 16 outputs and 32 inputs;
//! the scale product is off the accumulation chain). The result is the dequantized f32
//! output. This is the CPU lane's W4A8 (`--precision w4a8-g32`): the NPU needs one
//! activation scale per tensor, the CPU does not, and SmolLM2's massive activations
//! cost a per-tensor scale most of the INT8 resolution (docs/real-execution.md,
//! "W4A8").
//!
//! Every variant performs the same operations in the same order (the i32 group product,
//! its exact conversion, `s · a_scale` rounded once, one `mul_add` per group in group
//! order, the row scale last), so
//! all of them return bit-identical results; [`gemm_w4_grouped_reference`] computes the
//! definition in f64 and the kernels agree with it within f32 rounding.

pub(super) mod quantize;

use std::ops::Range;

pub use quantize::{quantize_groups, quantize_groups_into, quantize_groups_reference};

use super::PackedW4Weights;
use super::quant::W4Rows;
use crate::cpu::I8Kernel;

/// `out[m, n]` (f32, dequantized) of group-scaled INT8 activations `a[m, k]` with
/// scales `a_scales[m, groups]` through `w`, with the fastest kernel of this CPU.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn gemm_w4_grouped(a: &[i8], a_scales: &[f32], m: usize, w: &PackedW4Weights, out: &mut [f32]) {
    gemm_w4_grouped_with(I8Kernel::best(), a, a_scales, m, w, 0..w.n(), out);
}

/// Output columns `cols` (within `0..n`) of [`gemm_w4_grouped`], written to a compact
/// row-major tile `out[m, cols.len()]`.
///
/// # Panics
/// If a slice length does not match its shape or `cols` exceeds `0..n`.
pub fn gemm_w4_grouped_cols(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    gemm_w4_grouped_with(I8Kernel::best(), a, a_scales, m, w, cols, out);
}

/// [`gemm_w4_grouped_cols`] with a chosen kernel variant (for tests and benchmarks).
///
/// # Panics
/// If the running CPU does not support `kernel`, or on a shape mismatch.
pub fn gemm_w4_grouped_with(
    kernel: I8Kernel,
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    super::scaled::gemm_with::<1>(kernel, a, a_scales, m, w, cols, out);
}

/// The definition, in f64 over unpacked rows: `out[m, n] = d[n] · Σ_g a_scale[m, g] ·
/// s[n, g] · Σ_{p ∈ g} a[m, p] · q[n, p]`.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn gemm_w4_grouped_reference(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &W4Rows,
    out: &mut [f32],
) {
    super::scaled::reference::<1>(a, a_scales, m, w, out);
}

/// Linear layer in W4A8 with per-group activation scales: quantizes `x[m, k]` per row
/// and group of 32 ([`quantize_groups`]) and runs [`gemm_w4_grouped`] into `out[m, n]`.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn matmul_w4a8_grouped(x: &[f32], m: usize, w: &PackedW4Weights, out: &mut [f32]) {
    let (a, scales) = quantize_groups(x, m, w.k());
    gemm_w4_grouped(&a, &scales, m, w, out);
}

#[cfg(test)]
pub(super) mod tests;
