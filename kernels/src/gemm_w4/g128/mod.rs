//! W4A8 with one activation scale per row and 128 inputs: INT8 activations scaled per
//! row and group of [`ACT_GROUP_K`] = 128 inputs (four weight groups; a row's last group
//! may be shorter), the same packed 4-bit weights as [`super::gemm_w4`]:
//!
//! ```text
//! out[m, n] = d[n] · Σ_G a_scale[m, G] · Σ_{g ∈ G} s[n, g] · Σ_{p ∈ g} a[m, p] · q[n, p]
//! ```
//!
//! Why 128 and not 32 ([`super::gemm_w4_grouped`], `w4a8-g32`): with one activation
//! scale per four weight groups the four groups' products, each scaled by its integer
//! sub-scale, add up in i32 and only their sum is converted and fused-multiply-added in
//! float: one integer step per group (`vpdpwssd` on VNNI) and one float step per four,
//! where `w4a8-g32` pays a conversion, a scale product and an FMA per group (its
//! kernel's 10-15%, docs/real-execution.md). The price is resolution: one scale per 128
//! activations instead of per 32 (perplexity on SmolLM2-135M in the docs).
//!
//! Exactness: with activations in −127..=127 a group's `Σ a · q` is at most
//! 32 · 127 · 8 = 32 512 in magnitude (it fits an i16, which the VNNI kernel relies on:
//! `vpdpwssd` multiplies its low half by the sub-scale), times a sub-scale of at most
//! 127 and four groups: below 2²⁴, so the i32 sum is also exact in f32. Every variant
//! then performs the same float operations in the same order (one `mul_add` per
//! activation group, the row scale last): all are bit-identical, and
//! [`gemm_w4_g128_reference`] computes the definition in f64.

mod quantize;

use std::ops::Range;

pub use quantize::{quantize_groups128, quantize_groups128_into, quantize_groups128_reference};

use super::PackedW4Weights;
use super::quant::{GROUP_K, W4Rows};
use crate::cpu::I8Kernel;

/// Inputs per activation scale.
pub const ACT_GROUP_K: usize = 128;
/// Weight groups per activation group.
const SPAN: usize = ACT_GROUP_K / GROUP_K;

/// Activation groups (scales) per row of `k` inputs.
pub fn act_groups(k: usize) -> usize {
    k.div_ceil(ACT_GROUP_K)
}

/// `out[m, n]` (f32, dequantized) of activations `a[m, k]` (each in −127..=127, as
/// [`quantize_groups128`] writes them) with scales `a_scales[m, ceil(k / 128)]` through
/// `w`, with the fastest kernel of this CPU.
///
/// # Panics
/// If a slice length does not match its shape or an activation is −128.
pub fn gemm_w4_g128(a: &[i8], a_scales: &[f32], m: usize, w: &PackedW4Weights, out: &mut [f32]) {
    gemm_w4_g128_with(I8Kernel::best(), a, a_scales, m, w, 0..w.n(), out);
}

/// Output columns `cols` (within `0..n`) of [`gemm_w4_g128`], written to a compact
/// row-major tile `out[m, cols.len()]`.
///
/// # Panics
/// If a slice length does not match its shape, `cols` exceeds `0..n` or an activation
/// is −128.
pub fn gemm_w4_g128_cols(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    gemm_w4_g128_with(I8Kernel::best(), a, a_scales, m, w, cols, out);
}

/// [`gemm_w4_g128_cols`] with a chosen kernel variant (for tests and benchmarks).
///
/// # Panics
/// If the running CPU does not support `kernel`, on a shape mismatch, or if an
/// activation is −128 (its group product could leave the i16 range the VNNI kernel
/// needs; the quantizer never writes it).
pub fn gemm_w4_g128_with(
    kernel: I8Kernel,
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    assert!(
        !has_minus_128(a),
        "activations must be in -127..=127 (w4a8-g128 never quantizes to -128)"
    );
    super::scaled::gemm_with::<SPAN>(kernel, a, a_scales, m, w, cols, out);
}

/// Whether any value is −128: a fold without early exit, which vectorizes (compare and
/// or, 16 bytes per instruction on the baseline; `slice::contains` is a word-at-a-time
/// search that took 3% of the GEMM's time in a prefill profile).
fn has_minus_128(a: &[i8]) -> bool {
    a.iter().fold(false, |any, &v| any | (v == i8::MIN))
}

/// The definition, in f64 over unpacked rows: `out[m, n] = d[n] · Σ_G a_scale[m, G] ·
/// Σ_{g ∈ G} s[n, g] · Σ_{p ∈ g} a[m, p] · q[n, p]`.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn gemm_w4_g128_reference(a: &[i8], a_scales: &[f32], m: usize, w: &W4Rows, out: &mut [f32]) {
    super::scaled::reference::<SPAN>(a, a_scales, m, w, out);
}

/// Linear layer in W4A8 with an activation scale per row and 128 inputs: quantizes
/// `x[m, k]` ([`quantize_groups128`]) and runs [`gemm_w4_g128`] into `out[m, n]`.
///
/// # Panics
/// If a slice length does not match its shape.
pub fn matmul_w4a8_g128(x: &[f32], m: usize, w: &PackedW4Weights, out: &mut [f32]) {
    let (a, scales) = quantize_groups128(x, m, w.k());
    gemm_w4_g128(&a, &scales, m, w, out);
}

#[cfg(test)]
mod tests;
