//! The W4A8 products whose activations carry a float scale per row and span of inputs:
//! one kernel driver per instruction set for both spans ([`super::gemm_w4_grouped`]'s 32
//! inputs, `SPAN = 1` weight group; [`super::gemm_w4_g128`]'s 128, `SPAN = 4`).
//!
//! Every variant forms a weight group's exact i32 product `Σ_{p ∈ g} a[p] · q[p]` the
//! same way; what differs between the spans is how the products become floats:
//!
//! - `SPAN = 1`: the product is converted and fused-multiply-added with
//!   `s[n, g] · a_scale[m, g]` (the scale product rounded once);
//! - `SPAN > 1`: the products of a span's groups, each times its integer sub-scale, add
//!   up in i32 (exact: below 2²⁴, [`super::g128`]) and only their sum is converted and
//!   fused-multiply-added with the span's activation scale.
//!
//! In both, the row scale multiplies last. Every variant (scalar, AVX2, AVX-512 VNNI)
//! performs these float operations in this order, so all are bit-identical.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512vnni;
mod scalar;

use std::ops::Range;

use super::PackedW4Weights;
#[cfg(target_arch = "x86_64")]
use super::packed::GROUP_BYTES;
use super::quant::{GROUP_K, W4Rows};
use crate::cpu::I8Kernel;
use crate::tile_args::check_tile;
#[cfg(target_arch = "x86_64")]
use crate::tiling::BLOCK;

/// `out[m, cols]` (compact tile) of activations `a[m, k]` with one scale per row and
/// `SPAN · 32` inputs (`a_scales[m, ceil(k / (SPAN · 32))]`) through `w`, with `kernel`.
/// The activations' range is checked by the caller.
///
/// # Panics
/// If the running CPU does not support `kernel`, or on a shape mismatch.
#[track_caller]
pub(super) fn gemm_with<const SPAN: usize>(
    kernel: I8Kernel,
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &PackedW4Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    check_tile(a.len(), m, (w.k(), w.n()), &cols, out.len(), kernel);
    check_scales::<SPAN>(a_scales.len(), m, w.groups());
    match kernel {
        I8Kernel::Scalar => scalar::gemm::<SPAN>(a, a_scales, m, w, cols, out),
        #[cfg(target_arch = "x86_64")]
        I8Kernel::Avx2 => avx2::gemm::<SPAN>(a, a_scales, m, w, cols, out),
        #[cfg(target_arch = "x86_64")]
        I8Kernel::Avx512Vnni => avx512vnni::gemm::<SPAN>(a, a_scales, m, w, cols, out),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("x86 kernels are never available here"),
    }
}

/// Panics unless `a_scales` (of length `len`) holds one scale per row of `m` and span
/// of `SPAN` of the `groups` weight groups.
#[track_caller]
fn check_scales<const SPAN: usize>(len: usize, m: usize, groups: usize) {
    assert_eq!(
        len,
        m * spans_of::<SPAN>(groups),
        "a_scales must be [m, ceil(k / {})]",
        SPAN * GROUP_K
    );
}

/// Activation scales per row: one per `SPAN` weight groups.
fn spans_of<const SPAN: usize>(groups: usize) -> usize {
    groups.div_ceil(SPAN)
}

/// One weight group of a block's one-row product: its packed bytes, its 16 sub-scales,
/// the row's 32 activations of the group as 4-byte quads, and their `-8 Σ a`.
#[cfg(target_arch = "x86_64")]
type RowGroup<'a> = (
    &'a [u8; GROUP_BYTES],
    &'a [i8; BLOCK],
    &'a [[u8; 4]; 8],
    i32,
);

/// A block's packed groups, their sub-scales and an activation row's quads, group by
/// group ([`row_operands`]).
#[cfg(target_arch = "x86_64")]
type RowOperands<'a> = (
    &'a [[u8; GROUP_BYTES]],
    &'a [[i8; BLOCK]],
    &'a [[[u8; 4]; 8]],
);

/// The operands of block `b`'s product with one activation row (`a_row`: zero-padded,
/// `32 · groups` bytes; `neg_bias`: its `-8 Σ a` per group; `scales`: its scale per span
/// of `span` groups) that the walks below take group by group: the block's packed groups,
/// their sub-scales and the row's activations as quads (chunks, so the loops index
/// nothing).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn row_operands<'a>(
    w: &'a PackedW4Weights,
    b: usize,
    a_row: &'a [u8],
    neg_bias: &[i32],
    scales: &[f32],
    span: usize,
) -> RowOperands<'a> {
    let groups = w.groups();
    debug_assert_eq!(a_row.len(), GROUP_K * groups);
    debug_assert_eq!(scales.len(), groups.div_ceil(span));
    debug_assert_eq!(neg_bias.len(), groups);
    let weights = w.block(b).as_chunks::<GROUP_BYTES>().0;
    let subs = w.block_sub_scales(b).as_chunks::<BLOCK>().0;
    let acts = a_row.as_chunks::<4>().0.as_chunks::<8>().0;
    (weights, subs, acts)
}

/// [`row_operands`] span by span: the span's activation scale and its groups, as the
/// one-row kernels walk spans of several groups (`w4a8-g128`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn row_spans<'a, const SPAN: usize>(
    w: &'a PackedW4Weights,
    b: usize,
    a_row: &'a [u8],
    neg_bias: &'a [i32],
    scales: &'a [f32],
) -> impl Iterator<Item = (f32, impl Iterator<Item = RowGroup<'a>>)> {
    let (weights, subs, acts) = row_operands(w, b, a_row, neg_bias, scales, SPAN);
    weights
        .chunks(SPAN)
        .zip(subs.chunks(SPAN))
        .zip(acts.chunks(SPAN))
        .zip(neg_bias.chunks(SPAN))
        .zip(scales)
        .map(|((((weights, subs), acts), neg_bias), &a_scale)| {
            let each = weights.iter().zip(subs).zip(acts).zip(neg_bias);
            let groups = each.map(|(((group, sub), quads), &bias)| (group, sub, quads, bias));
            (a_scale, groups)
        })
}

/// [`row_operands`] for spans of one group (`w4a8-g32`): each group with its activation
/// scale, from one flat walk of the five arrays. The spans' nested chunks left the
/// compiler keeping the walk's pointers in vector registers, whose moves back to the
/// address registers delayed each group's loads.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn row_groups<'a>(
    w: &'a PackedW4Weights,
    b: usize,
    a_row: &'a [u8],
    neg_bias: &'a [i32],
    scales: &'a [f32],
) -> impl Iterator<Item = (f32, RowGroup<'a>)> {
    let (weights, subs, acts) = row_operands(w, b, a_row, neg_bias, scales, 1);
    weights
        .iter()
        .zip(subs)
        .zip(acts)
        .zip(neg_bias)
        .zip(scales)
        .map(|((((group, sub), quads), &bias), &a_scale)| (a_scale, (group, sub, quads, bias)))
}

/// Groups of activation biases kept on the stack (a row of up to 2048 values).
#[cfg(target_arch = "x86_64")]
const STACK_GROUPS: usize = 64;

/// Room for the `-8 Σ a` of every row and group of one call. A decode step's row (k up
/// to 2048) keeps its biases on the stack: a kernel call runs once per column task,
/// several per matrix-vector product, where an allocation each was measurable.
#[cfg(target_arch = "x86_64")]
struct BiasSlots {
    stack: [i32; STACK_GROUPS],
    heap: Vec<i32>,
}

#[cfg(target_arch = "x86_64")]
impl BiasSlots {
    fn new() -> Self {
        Self {
            stack: [0; STACK_GROUPS],
            heap: Vec::new(),
        }
    }

    /// `count` slots, for the caller to fill.
    fn take(&mut self, count: usize) -> &mut [i32] {
        if count <= STACK_GROUPS {
            &mut self.stack[..count]
        } else {
            self.heap.resize(count, 0);
            &mut self.heap[..]
        }
    }
}

/// `8 · Σ a` of every row and group of the zero-padded activation rows `padded`
/// (`[m, 32 · groups]`): what the unsigned `q + 8` weights add to a group's product.
pub(in crate::gemm_w4) fn group_bias(padded: &[u8]) -> Vec<i32> {
    padded
        .chunks_exact(GROUP_K)
        .map(|g| 8 * g.iter().map(|&b| i32::from(b as i8)).sum::<i32>())
        .collect()
}

/// The definition both spans share, in f64 over unpacked rows: `out[m, n] = d[n] ·
/// Σ_g a_scale[m, g / SPAN] · s[n, g] · Σ_{p ∈ g} a[m, p] · q[n, p]` (`a_scales` is
/// `[m, ceil(groups / SPAN)]`).
///
/// # Panics
/// If a slice length does not match its shape.
#[track_caller]
pub(super) fn reference<const SPAN: usize>(
    a: &[i8],
    a_scales: &[f32],
    m: usize,
    w: &W4Rows,
    out: &mut [f32],
) {
    let (n, k, groups) = (w.n, w.k, w.groups());
    let spans = spans_of::<SPAN>(groups);
    assert_eq!(a.len(), m * k, "a must be [m, k]");
    check_scales::<SPAN>(a_scales.len(), m, groups);
    assert_eq!(out.len(), m * n, "out must be [m, n]");
    for i in 0..m {
        for j in 0..n {
            let mut sum = 0f64;
            for g in 0..groups {
                let span = g * GROUP_K..((g + 1) * GROUP_K).min(k);
                let dot: i64 = span
                    .map(|p| i64::from(a[i * k + p]) * i64::from(w.q[j * k + p]))
                    .sum();
                let s = f64::from(w.sub_scales[j * groups + g]);
                sum += f64::from(a_scales[i * spans + g / SPAN]) * s * dot as f64;
            }
            out[i * n + j] = (sum * f64::from(w.row_scales[j])) as f32;
        }
    }
}
