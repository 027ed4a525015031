//! The linears of one decode step as matrix-vector products: every projection that
//! reads the same activation (a layer's Q, K and V; gate and up) in one parallel region,
//! output columns split over the pool's threads, dequantized in place.
//!
//! A one-token product is bound by streaming the weights, so the work is split by
//! output columns (contiguous runs of weight blocks) rather than rows, a few tasks per
//! thread for work stealing on a shared machine; one region per activation instead of
//! one per projection saves the pool's fork-join per projection. The arithmetic is the
//! prefill's: exact INT32 accumulators, dequantized by `acc × (a_scale × w_scale)`
//! ([`dequantize_i32_acc_fast`], the reference's bit-exact twin), the outlier shadow added after, so that a direct step
//! continues a scheduled prefill bit for bit on an INT8 model.
//!
//! A batched step ([`Batch`], [`project_batch`]: one row per sequence) runs the same
//! columns as small GEMMs (M = the sequences), the weights streamed once for all of them.
//! Each row keeps its own activation scale (a sequence's quantize is its own, as in a
//! step alone), and INT32 accumulators are exact, so an INT8 row's output equals its
//! one-row product bit for bit; f32 rows differ from the matrix-vector kernel's only in
//! summation order.

use hetsched_kernels::gemm_w4::{
    GROUP_K, act_groups, quantize_groups_into, quantize_groups128_into,
};
use hetsched_kernels::{
    I8Vector, PackedF32Weights, dequantize_i32_acc_fast, gemm_i8_cols, gemm_w4_cols,
    gemm_w4_g128_cols, gemm_w4_grouped_cols, gemv_f32, gemv_i8, matmul_f32_packed_cols,
    quantize_per_tensor_fast, scale_for_max_abs_fast,
};
use rayon::prelude::*;

use crate::activation::{Act, Outliers};
use crate::shadow::ShadowCounters;
use crate::values::shadow_product;
use crate::{ExecError, KernelError, LinearWeights, QuantRule};

/// Tasks per pool thread of one region (work stealing evens out a descheduled thread).
pub(super) const TASKS_PER_THREAD: usize = 4;
/// Columns of INT8 accumulators a task keeps on its stack before dequantizing them.
const I32_TILE: usize = 256;

/// One activation row prepared for the matrix-vector kernels.
#[derive(Debug, Default)]
pub(super) struct Input {
    f32s: Vec<f32>,
    int8: I8Vector,
    /// `Some(scale)` when the row is INT8.
    scale: Option<f32>,
    /// Shadowed values beyond the INT8 range.
    outliers: Outliers,
    /// With an INT8 row scaled per group (`w4a8-g32`, `w4a8-g128`): one scale per group.
    group_scales: Option<GroupScales>,
    /// The INT8 values of [`Input::quantize_in_place`] before [`I8Vector::set`] takes
    /// them (kept across steps).
    scratch: Vec<i8>,
    /// The group scales of the previous row, kept for the next row's (across steps).
    spare_scales: Vec<f32>,
}

/// The scales of an INT8 row scaled per group.
#[derive(Debug)]
enum GroupScales {
    /// One per 32 inputs (`w4a8-g32`).
    Per32(Vec<f32>),
    /// One per 128 inputs (`w4a8-g128`).
    Per128(Vec<f32>),
}

impl Input {
    /// Quantizes `row` under `rule` into this input's own buffers, which keep their
    /// capacity across steps (a decode step quantizes four rows a layer; an [`Act`] of
    /// each allocated its values and scales). The values are [`crate::values::quantize_slice`]'s
    /// for the same rule: the same kernels on the same row (a per-tensor scale's max |x|
    /// is exact in any order). Returns `false`, leaving the input as it was, for the
    /// rules that also produce outliers or keep f32 (clipped, hot-max, pass-through):
    /// those go through [`Input::set`].
    pub(super) fn quantize_in_place(&mut self, row: &[f32], rule: &QuantRule) -> bool {
        let per_tensor = match *rule {
            QuantRule::MaxAbs => Some(scale_for_max_abs_fast(row)),
            QuantRule::Static { scale } => Some(scale),
            QuantRule::Groups => None,
            QuantRule::Groups128 { width } if width > 0 && row.len().is_multiple_of(width) => None,
            _ => return false,
        };
        if let Some(GroupScales::Per32(v) | GroupScales::Per128(v)) = self.group_scales.take() {
            self.spare_scales = v;
        }
        let (q, scales) = (&mut self.scratch, &mut self.spare_scales);
        q.resize(row.len(), 0);
        match (per_tensor, rule) {
            (Some(scale), _) => quantize_per_tensor_fast(row, scale, q),
            (None, &QuantRule::Groups128 { width }) => {
                let rows = row.len() / width;
                scales.resize(rows * act_groups(width), 0.0);
                quantize_groups128_into(row, rows, width, q, scales);
                self.group_scales = Some(GroupScales::Per128(std::mem::take(scales)));
            }
            (None, _) => {
                scales.resize(row.len().div_ceil(GROUP_K), 0.0);
                quantize_groups_into(row, 1, row.len(), q, scales);
                self.group_scales = Some(GroupScales::Per32(std::mem::take(scales)));
            }
        }
        self.int8.set(q);
        self.scale = per_tensor;
        self.outliers.clear();
        true
    }

    /// Takes a quantized activation (keeps this input's buffers).
    pub(super) fn set(&mut self, act: Act) {
        match act {
            Act::F32(x) => {
                self.f32s = x;
                self.scale = None;
                self.outliers.clear();
                self.group_scales = None;
            }
            Act::Int8 { q, scale, outliers } => {
                self.int8.set(&q);
                self.scale = Some(scale);
                self.outliers = outliers;
                self.group_scales = None;
            }
            Act::Int8Groups { q, scales } => {
                self.int8.set(&q);
                self.scale = None;
                self.outliers.clear();
                self.group_scales = Some(GroupScales::Per32(scales));
            }
            Act::Int8Groups128 { q, scales } => {
                self.int8.set(&q);
                self.scale = None;
                self.outliers.clear();
                self.group_scales = Some(GroupScales::Per128(scales));
            }
        }
    }
}

/// A weight matrix of a decode step: a layer's linear, or the model's f32 head.
#[derive(Clone, Copy, Debug)]
pub(super) enum Matrix<'a> {
    /// A linear in the model's precision.
    Linear(&'a LinearWeights),
    /// Packed f32 weights (the f32 head).
    F32(&'a PackedF32Weights),
}

impl Matrix<'_> {
    pub(super) fn n(self) -> usize {
        match self {
            Matrix::Linear(w) => w.n(),
            Matrix::F32(w) => w.n(),
        }
    }
}

/// One task: a matrix, its output columns `cols`, and where they go.
pub(super) struct Task<'a> {
    pub(super) weights: Matrix<'a>,
    pub(super) cols: std::ops::Range<usize>,
    pub(super) out: &'a mut [f32],
}

/// `outs[i] = weights[i] · input` (dequantized, shadow merged) for every `i`, in one
/// parallel region on the current pool.
pub(super) fn project(
    input: &Input,
    weights: &[Matrix<'_>],
    outs: &mut [&mut [f32]],
    counters: &ShadowCounters,
) -> Result<(), ExecError> {
    let total: usize = weights.iter().map(|w| w.n()).sum();
    let tasks = rayon::current_num_threads().max(1) * TASKS_PER_THREAD;
    let per_task = total.div_ceil(tasks).div_ceil(16).max(1) * 16;
    let mut work = Vec::with_capacity(tasks + weights.len());
    for (&w, out) in weights.iter().zip(outs.iter_mut()) {
        check(out.len(), w.n())?;
        let mut rest: &mut [f32] = out;
        let mut start = 0;
        while !rest.is_empty() {
            let width = per_task.min(rest.len());
            let (head, tail) = rest.split_at_mut(width);
            work.push(Task {
                weights: w,
                cols: start..start + width,
                out: head,
            });
            start += width;
            rest = tail;
        }
    }
    work.into_par_iter().try_for_each(|t| run(input, t))?;
    if !input.outliers.is_empty() {
        for (&w, out) in weights.iter().zip(outs.iter_mut()) {
            let Matrix::Linear(w) = w else { continue };
            let shadow = shadow_product(&input.outliers, 1, w, counters)?;
            for (y, s) in out.iter_mut().zip(&shadow) {
                *y += s;
            }
        }
    }
    Ok(())
}

/// One task's columns.
pub(super) fn run(input: &Input, t: Task<'_>) -> Result<(), KernelError> {
    let int8 = input.int8.values();
    match (t.weights, input.scale, input.group_scales.as_ref()) {
        (Matrix::Linear(LinearWeights::F32(w)) | Matrix::F32(w), None, None) => {
            check(input.f32s.len(), w.k())?;
            gemv_f32(&input.f32s, w, t.cols, t.out);
        }
        (Matrix::Linear(LinearWeights::Int8 { packed, scales, .. }), Some(a_scale), None) => {
            check(int8.len(), packed.k())?;
            dequantized_tiles(t, a_scale, scales, |cols, acc| {
                gemv_i8(&input.int8, packed, cols, acc);
            });
        }
        (Matrix::Linear(LinearWeights::Int4 { packed, .. }), Some(a_scale), None) => {
            check(int8.len(), packed.k())?;
            dequantized_tiles(t, a_scale, packed.row_scales(), |cols, acc| {
                gemm_w4_cols(int8, 1, packed, cols, acc);
            });
        }
        (
            Matrix::Linear(LinearWeights::Int4 { packed, .. }),
            None,
            Some(GroupScales::Per32(scales)),
        ) => {
            check(int8.len(), packed.k())?;
            check(scales.len(), packed.groups())?;
            gemm_w4_grouped_cols(int8, scales, 1, packed, t.cols, t.out);
        }
        (
            Matrix::Linear(LinearWeights::Int4 { packed, .. }),
            None,
            Some(GroupScales::Per128(scales)),
        ) => {
            check(int8.len(), packed.k())?;
            check(scales.len(), act_groups(packed.k()))?;
            gemm_w4_g128_cols(int8, scales, 1, packed, t.cols, t.out);
        }
        _ => return Err(KernelError::Precisions("activation and weight")),
    }
    Ok(())
}

/// A task's columns as INT32 accumulators, `I32_TILE` at a time on the stack (`product`
/// fills them for a column range), dequantized by the activation scale and each column's
/// row scale (`row_scales` over all `n` columns).
fn dequantized_tiles(
    t: Task<'_>,
    a_scale: f32,
    row_scales: &[f32],
    mut product: impl FnMut(std::ops::Range<usize>, &mut [i32]),
) {
    let mut acc = [0i32; I32_TILE];
    for (i, out) in t.out.chunks_mut(I32_TILE).enumerate() {
        let start = t.cols.start + i * I32_TILE;
        let (cols, acc) = (start..start + out.len(), &mut acc[..out.len()]);
        product(cols.clone(), acc);
        dequantize_i32_acc_fast(acc, 1, out.len(), a_scale, &row_scales[cols], out);
    }
}

/// Several activation rows, one per sequence of a batched decode step, all prepared under
/// the same rule (the same layer and site): stacked `[rows, k]` for the GEMM kernels, each
/// with its own per-tensor scale and outliers.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// The one row of a batch of one, for the matrix-vector kernels.
    single: Input,
    rows: usize,
    f32s: Vec<f32>,
    int8: Vec<i8>,
    /// Per row, with per-tensor INT8 rows.
    scales: Vec<f32>,
    /// Per row.
    outliers: Vec<Outliers>,
    /// `[rows, groups]` with INT8 rows scaled per group.
    group_scales: Option<GroupScales>,
}

impl Batch {
    /// The row of a batch of one without outliers (nothing to add to its products
    /// after the kernels), else `None`.
    pub(super) fn single_plain(&self) -> Option<&Input> {
        (self.rows == 1 && self.single.outliers.is_empty()).then_some(&self.single)
    }

    /// One row quantized under `rule` in place ([`Input::quantize_in_place`]); `false`,
    /// leaving the batch as it was, for a rule that goes through [`Batch::set`].
    pub(super) fn quantize_one(&mut self, row: &[f32], rule: &QuantRule) -> bool {
        let done = self.single.quantize_in_place(row, rule);
        if done {
            self.rows = 1;
        }
        done
    }

    /// The rows (one quantized activation per sequence, all of one rule).
    pub(super) fn set(&mut self, mut acts: Vec<Act>) {
        self.rows = acts.len();
        self.f32s.clear();
        self.int8.clear();
        self.scales.clear();
        self.outliers.clear();
        self.group_scales = None;
        if acts.len() == 1 {
            self.single.set(acts.pop().expect("one row"));
            return;
        }
        for act in acts {
            match act {
                Act::F32(x) => self.f32s.extend_from_slice(&x),
                Act::Int8 { q, scale, outliers } => {
                    self.int8.extend_from_slice(&q);
                    self.scales.push(scale);
                    self.outliers.push(outliers);
                }
                Act::Int8Groups { q, scales } => {
                    self.int8.extend_from_slice(&q);
                    match &mut self.group_scales {
                        Some(GroupScales::Per32(all)) => all.extend_from_slice(&scales),
                        _ => self.group_scales = Some(GroupScales::Per32(scales)),
                    }
                }
                Act::Int8Groups128 { q, scales } => {
                    self.int8.extend_from_slice(&q);
                    match &mut self.group_scales {
                        Some(GroupScales::Per128(all)) => all.extend_from_slice(&scales),
                        _ => self.group_scales = Some(GroupScales::Per128(scales)),
                    }
                }
            }
        }
    }
}

/// `outs[i] = rows · weights[i]ᵀ` (`outs[i]` is `[rows, n_i]`, dequantized per row, each
/// row's shadow merged) in one parallel region on the current pool: one row through
/// [`project`]'s matrix-vector kernels, several through the GEMM kernels, output columns
/// split over the pool.
pub(super) fn project_batch(
    batch: &Batch,
    weights: &[Matrix<'_>],
    outs: &mut [&mut [f32]],
    counters: &ShadowCounters,
) -> Result<(), ExecError> {
    let m = batch.rows;
    if m == 1 {
        return project(&batch.single, weights, outs, counters);
    }
    for (&w, out) in weights.iter().zip(outs.iter()) {
        check(out.len(), m * w.n())?;
    }
    let total: usize = weights.iter().map(|w| w.n()).sum();
    let tasks = rayon::current_num_threads().max(1) * TASKS_PER_THREAD;
    let per_task = total.div_ceil(tasks).div_ceil(16).max(1) * 16;
    let work: Vec<(usize, std::ops::Range<usize>)> = weights
        .iter()
        .enumerate()
        .flat_map(|(i, w)| {
            (0..w.n())
                .step_by(per_task)
                .map(move |start| (i, start..(start + per_task).min(w.n())))
        })
        .collect();
    let tiles = work
        .into_par_iter()
        .map(|(i, cols)| Ok((i, cols.clone(), run_rows(batch, weights[i], cols)?)))
        .collect::<Result<Vec<_>, KernelError>>()?;
    for (i, cols, tile) in tiles {
        let (n, width) = (weights[i].n(), cols.len());
        for (r, row) in tile.chunks_exact(width).enumerate() {
            outs[i][r * n + cols.start..r * n + cols.end].copy_from_slice(row);
        }
    }
    if batch.outliers.iter().any(|o| !o.is_empty()) {
        for (&w, out) in weights.iter().zip(outs.iter_mut()) {
            let Matrix::Linear(w) = w else { continue };
            for (outliers, row) in batch.outliers.iter().zip(out.chunks_exact_mut(w.n())) {
                if outliers.is_empty() {
                    continue;
                }
                let shadow = shadow_product(outliers, 1, w, counters)?;
                for (y, s) in row.iter_mut().zip(&shadow) {
                    *y += s;
                }
            }
        }
    }
    Ok(())
}

/// Columns `cols` of `weights` for every row of `batch`: a `[rows, cols.len()]` tile.
fn run_rows(
    batch: &Batch,
    weights: Matrix<'_>,
    cols: std::ops::Range<usize>,
) -> Result<Vec<f32>, KernelError> {
    let (m, width) = (batch.rows, cols.len());
    let mut tile = vec![0f32; m * width];
    let per_tensor = |row_scales: &[f32], product: &dyn Fn(&mut [i32])| {
        let mut acc = vec![0i32; m * width];
        product(&mut acc);
        let mut tile = vec![0f32; m * width];
        for ((acc, out), &a_scale) in acc
            .chunks_exact(width)
            .zip(tile.chunks_exact_mut(width))
            .zip(&batch.scales)
        {
            dequantize_i32_acc_fast(acc, 1, width, a_scale, &row_scales[cols.clone()], out);
        }
        tile
    };
    let int8 = &batch.int8;
    match (
        weights,
        batch.scales.is_empty(),
        batch.group_scales.as_ref(),
    ) {
        (Matrix::Linear(LinearWeights::F32(w)) | Matrix::F32(w), true, None) => {
            check(batch.f32s.len(), m * w.k())?;
            matmul_f32_packed_cols(&batch.f32s, m, w, cols, &mut tile);
        }
        (Matrix::Linear(LinearWeights::Int8 { packed, scales, .. }), false, None) => {
            check(int8.len(), m * packed.k())?;
            tile = per_tensor(scales, &|acc| {
                gemm_i8_cols(int8, m, packed, cols.clone(), acc)
            });
        }
        (Matrix::Linear(LinearWeights::Int4 { packed, .. }), false, None) => {
            check(int8.len(), m * packed.k())?;
            let product = |acc: &mut [i32]| gemm_w4_cols(int8, m, packed, cols.clone(), acc);
            tile = per_tensor(packed.row_scales(), &product);
        }
        (
            Matrix::Linear(LinearWeights::Int4 { packed, .. }),
            true,
            Some(GroupScales::Per32(scales)),
        ) => {
            check(int8.len(), m * packed.k())?;
            check(scales.len(), m * packed.groups())?;
            gemm_w4_grouped_cols(int8, scales, m, packed, cols, &mut tile);
        }
        (
            Matrix::Linear(LinearWeights::Int4 { packed, .. }),
            true,
            Some(GroupScales::Per128(scales)),
        ) => {
            check(int8.len(), m * packed.k())?;
            check(scales.len(), m * act_groups(packed.k()))?;
            gemm_w4_g128_cols(int8, scales, m, packed, cols, &mut tile);
        }
        _ => return Err(KernelError::Precisions("activation and weight")),
    }
    Ok(tile)
}

pub(super) fn check(found: usize, expected: usize) -> Result<(), KernelError> {
    if found == expected {
        Ok(())
    } else {
        Err(KernelError::Length { found, expected })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use hetsched_kernels::PackedW4Weights;

    use super::*;
    use crate::shadow::QuantRule;
    use crate::values::{dequantize, linear, quantize};

    /// A deterministic pseudo-random row in [-1, 1) with a few large entries (outliers).
    pub(in crate::generate) fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let h = (i ^ seed).wrapping_mul(2_654_435_761) >> 8;
                let v = (h % 2000) as f32 / 1000.0 - 1.0;
                if i % 97 == 5 { 12.0 * v } else { v }
            })
            .collect()
    }

    /// The one-row W4 products (per-tensor and per-group scaled) equal the prefill's
    /// linear and dequantize on the same activation.
    #[test]
    fn one_row_four_bit_products_equal_the_prefills() {
        let (k, n) = (256, 600);
        let w = LinearWeights::Int4 {
            packed: PackedW4Weights::quantize(&values(k * n, 7), n, k),
            shadow: None,
        };
        for (name, rule) in [
            ("per tensor", QuantRule::MaxAbs),
            ("groups", QuantRule::Groups),
            ("groups of 128", QuantRule::Groups128 { width: k }),
        ] {
            let act = quantize(values(k, 11), rule);
            let reference = dequantize(linear(&act, 1, &w).unwrap(), &w).unwrap();
            let mut input = Input::default();
            input.set(act);
            let mut out = vec![0f32; n];
            project(
                &input,
                &[Matrix::Linear(&w)],
                &mut [&mut out],
                &ShadowCounters::default(),
            )
            .unwrap();
            let largest = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in out.iter().zip(&reference) {
                assert!((a - b).abs() <= 1e-5 * largest, "{name}: {a} vs {b}");
            }
        }
    }

    /// A row quantized in place holds what [`Input::set`] of the same rule's
    /// [`crate::values::quantize_slice`] holds, value for value, also when one input
    /// passes from rule to rule (its buffers kept); the rules with outliers are left to
    /// `set`.
    #[test]
    fn quantizing_in_place_equals_setting_the_quantized_row() {
        let k = 256;
        let mut in_place = Input::default();
        let rules = [
            QuantRule::Groups,
            QuantRule::MaxAbs,
            QuantRule::Groups128 { width: k },
            QuantRule::Static { scale: 0.01 },
            QuantRule::Groups,
        ];
        for (seed, rule) in rules.into_iter().enumerate() {
            let row = values(k, seed as u32);
            assert!(in_place.quantize_in_place(&row, &rule), "{rule:?}");
            let mut set = Input::default();
            set.set(crate::values::quantize_slice(&row, rule.clone()));
            assert_eq!(in_place.int8.values(), set.int8.values(), "{rule:?}");
            assert_eq!(in_place.scale, set.scale, "{rule:?}");
            let scales = |i: &Input| match &i.group_scales {
                Some(GroupScales::Per32(v)) => Some((32, v.clone())),
                Some(GroupScales::Per128(v)) => Some((128, v.clone())),
                None => None,
            };
            assert_eq!(scales(&in_place), scales(&set), "{rule:?}");
            assert!(in_place.outliers.is_empty());
        }
        let row = values(k, 3);
        assert!(!in_place.quantize_in_place(&row, &QuantRule::Clip { rms: 3.0 }));
        assert!(!in_place.quantize_in_place(&row, &QuantRule::PassThrough));
        assert!(!in_place.quantize_in_place(&row, &QuantRule::Groups128 { width: 100 }));
    }
}
