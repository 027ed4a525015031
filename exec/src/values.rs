//! Activations between operators, and the linear layer in both precisions.
//!
//! The W8A8 path follows the NPU's semantics: one scale per activation tensor (the
//! tensor's max |x| / 127), activations saturated to ±127, INT32 accumulation, the
//! per-row weight scales applied only when the accumulators are dequantized. No
//! per-group scales: the NPU cannot do them. The CPU lane's W4A8 (`w4a8-g32`) is the
//! exception: its activations carry a scale per row and group of 32
//! ([`Act::Int8Groups`]; or of 128 for `w4a8-g128`, [`Act::Int8Groups128`]) and its
//! product returns dequantized f32.

use hetsched_kernels::gemm_w4::act_groups;
use hetsched_kernels::{
    I8Vector, PackedF32Weights, PackedI8Weights, PackedW4Weights, dequantize_add_shadow,
    dequantize_i32_acc_fast, gemm_i8_cols, gemm_w4_cols, gemm_w4_g128_cols, gemm_w4_grouped_cols,
    gemv_f32, gemv_i8, matmul_f32_packed, matmul_f32_packed_cols, max_abs, quantize_groups,
    quantize_groups128, quantize_per_tensor_fast, scale_for_max_abs_fast, sum_squares_within,
};

use super::activation::Act;
use super::blocks::{ELEMENTS_PER_BLOCK, for_each_block};
use super::error::KernelError;
use super::shadow::{QuantRule, ShadowCounters, cold_mask, quantize_clipped};
use super::weights::LinearWeights;

/// An output of a linear layer before dequantization.
#[derive(Debug, Clone)]
pub enum LinearOut {
    /// f32 rows.
    F32(Vec<f32>),
    /// INT32 accumulators and the activation scale they were computed with.
    Int32 {
        /// `[rows, n]` accumulators.
        acc: Vec<i32>,
        /// The input's per-tensor scale.
        a_scale: f32,
        /// The float shadow of the outliers, `[rows, n]`, added at dequantization.
        shadow: Option<Vec<f32>>,
    },
}

/// Rows handed to one worker: small enough that two threads share a chunk's GEMM,
/// large enough that every task streams the weights efficiently.
const ROWS_PER_TASK: usize = 16;

/// The quantize operator under `rule`: a pass-through for f32; per-tensor INT8 with the
/// scale from max |x| or a static one; or, for outlier shadowing, from [`clip_limit`] (for
/// a hot-max site, also no more than the max |x| of the other channels), with the excess
/// of each value beyond it kept as an outlier.
pub fn quantize(x: Vec<f32>, rule: QuantRule) -> Act {
    match rule {
        QuantRule::PassThrough => Act::F32(x),
        QuantRule::Clip { rms: clip } => quantize_clipped(x, clip, None),
        QuantRule::HotMax { hot, clip } => quantize_clipped(x, clip, Some(&cold_mask(&hot))),
        rule => quantize_slice(&x, rule),
    }
}

/// [`quantize`] of a borrowed row: the rules that only read `x` (per-tensor, per-group
/// and static scales) do not copy it first (a decode step quantizes four rows a layer).
pub fn quantize_slice(x: &[f32], rule: QuantRule) -> Act {
    match rule {
        QuantRule::PassThrough | QuantRule::Clip { .. } | QuantRule::HotMax { .. } => {
            quantize(x.to_vec(), rule)
        }
        QuantRule::MaxAbs => {
            let scale = scale_for_max_abs_blocks(x);
            let mut q = vec![0i8; x.len()];
            quantize_blocks(x, scale, &mut q);
            Act::Int8 {
                q,
                scale,
                outliers: Vec::new(),
            }
        }
        QuantRule::Groups => {
            // Groups of 32 over the flat buffer are groups of each row: the loader
            // refuses w4a8-g32 for inputs whose width is not a multiple of 32.
            let (q, scales) = quantize_groups(x, 1, x.len());
            Act::Int8Groups { q, scales }
        }
        QuantRule::Groups128 { width } => {
            // `x` is `[rows, width]`: the site's activation, as its linears read it.
            let rows = x.len().checked_div(width).unwrap_or(0);
            let (q, scales) = quantize_groups128(x, rows, width);
            Act::Int8Groups128 { q, scales }
        }
        QuantRule::Static { scale } => {
            let mut q = vec![0i8; x.len()];
            quantize_blocks(x, scale, &mut q);
            Act::Int8 {
                q,
                scale,
                outliers: Vec::new(),
            }
        }
    }
}

/// [`scale_for_max_abs_fast`] of `x`, its max |x| taken over blocks of `x` in parallel:
/// the max of the blocks' maxima is the same value, so the scale is too.
fn scale_for_max_abs_blocks(x: &[f32]) -> f32 {
    let mut maxima = vec![0f32; x.len().div_ceil(ELEMENTS_PER_BLOCK)];
    let blocks = maxima
        .iter_mut()
        .zip(x.chunks(ELEMENTS_PER_BLOCK))
        .collect();
    for_each_block(blocks, |(m, x)| *m = max_abs(x));
    scale_for_max_abs_fast(&maxima)
}

/// [`quantize_per_tensor_fast`] over blocks of `x` in parallel (element by element: the
/// same values).
fn quantize_blocks(x: &[f32], scale: f32, q: &mut [i8]) {
    let blocks = x
        .chunks(ELEMENTS_PER_BLOCK)
        .zip(q.chunks_mut(ELEMENTS_PER_BLOCK))
        .collect();
    for_each_block(blocks, |(x, q)| quantize_per_tensor_fast(x, scale, q));
}

/// The clipped range of `x`: min(max |x|, `clip` × the RMS of its bulk), where the bulk is
/// the values within `clip` × rms(x). Values beyond it are the shadow's outliers
/// (calibration counts them with the same rule).
///
/// Why the bulk: a few massive activations (SmolLM2's attention-sink channels reach
/// hundreds of RMS) dominate the plain RMS, which then puts the clip far above the values
/// that matter and costs them resolution; one pass without the values beyond the first
/// clip brings the RMS back to the bulk's.
pub fn clip_limit(x: &[f32], clip: f32) -> f32 {
    let rms = (sum_squares_within(x, f32::INFINITY).0 / x.len().max(1) as f32).sqrt();
    let (bulk_squares, bulk) = sum_squares_within(x, clip * rms);
    let bulk_rms = (bulk_squares / bulk.max(1) as f32).sqrt();
    max_abs(x).min(clip * bulk_rms)
}

/// Tasks per thread of a product with fewer rows than [`ROWS_PER_TASK`] (a decode step's
/// one token): such a product is bound by streaming the weights, so its columns (weight
/// rows) are split over the threads instead, a few tasks each for work stealing.
const COLUMN_TASKS_PER_THREAD: usize = 4;

/// Columns per task of [`by_columns`] for `n` columns: a multiple of 16 (the kernels'
/// column block).
fn columns_per_task(n: usize) -> usize {
    let tasks = rayon::current_num_threads().max(1) * COLUMN_TASKS_PER_THREAD;
    n.div_ceil(tasks).div_ceil(16).max(1) * 16
}

/// Column tiles of `out[rows, n]` for a product with few rows: each task computes
/// `tile(cols, tile_out)` for its columns, then the tiles are placed in `out`.
fn by_columns<T: Copy + Default + Send + Sync>(
    rows: usize,
    n: usize,
    tile: impl Fn(std::ops::Range<usize>, &mut [T]) + Sync,
) -> Vec<T> {
    let per_task = columns_per_task(n);
    let mut tiles: Vec<Vec<T>> = vec![Vec::new(); n.div_ceil(per_task)];
    for_each_block(tiles.iter_mut().enumerate().collect(), |(t, out)| {
        let cols = t * per_task..((t + 1) * per_task).min(n);
        *out = vec![T::default(); rows * cols.len()];
        tile(cols, out);
    });
    if rows == 1 {
        return tiles.concat();
    }
    let mut out = vec![T::default(); rows * n];
    for (t, tile) in tiles.iter().enumerate() {
        let (start, width) = (t * per_task, tile.len() / rows);
        for r in 0..rows {
            out[r * n + start..r * n + start + width]
                .copy_from_slice(&tile[r * width..(r + 1) * width]);
        }
    }
    out
}

/// `a[rows, k] · wᵀ` in INT8 with INT32 accumulators, split like [`matmul_rows`].
fn gemm_i8_rows(q: &[i8], rows: usize, w: &PackedI8Weights) -> Vec<i32> {
    if rows == 1 {
        let x = I8Vector::new(q);
        return by_columns(rows, w.n(), |cols, out| gemv_i8(&x, w, cols, out));
    }
    int_rows(q, rows, (w.k(), w.n()), |a, m, cols, out| {
        gemm_i8_cols(a, m, w, cols, out);
    })
}

/// `a[rows, k] · wᵀ` in W4A8 with INT32 accumulators, split like [`matmul_rows`].
fn gemm_w4_rows(q: &[i8], rows: usize, w: &PackedW4Weights) -> Vec<i32> {
    int_rows(q, rows, (w.k(), w.n()), |a, m, cols, out| {
        gemm_w4_cols(a, m, w, cols, out);
    })
}

/// `a[rows, k] · wᵀ` in W4A8 with activation scales per row and group (`per_row` scales
/// per row), dequantized (f32) by `gemm(a, scales, m, cols, out)`, split like
/// [`matmul_rows`].
fn gemm_w4_scaled_rows(
    (q, scales, per_row): (&[i8], &[f32], usize),
    rows: usize,
    w: &PackedW4Weights,
    gemm: impl Fn(&[i8], &[f32], usize, std::ops::Range<usize>, &mut [f32]) + Sync,
) -> Vec<f32> {
    let (k, n) = (w.k(), w.n());
    if rows < ROWS_PER_TASK {
        return by_columns(rows, n, |cols, out| gemm(q, scales, rows, cols, out));
    }
    let mut out = vec![0f32; rows * n];
    let inputs = q
        .chunks(ROWS_PER_TASK * k)
        .zip(scales.chunks(ROWS_PER_TASK * per_row));
    let blocks = out.chunks_mut(ROWS_PER_TASK * n).zip(inputs).collect();
    for_each_block(blocks, |(o, (a, s))| gemm(a, s, a.len() / k, 0..n, o));
    out
}

/// An integer product `q[rows, k] · wᵀ` (`[rows, n]` i32) through `gemm(a, m, cols,
/// out)`, split like [`matmul_rows`]: blocks of rows over the pool, or columns for few
/// rows.
fn int_rows(
    q: &[i8],
    rows: usize,
    (k, n): (usize, usize),
    gemm: impl Fn(&[i8], usize, std::ops::Range<usize>, &mut [i32]) + Sync,
) -> Vec<i32> {
    if rows < ROWS_PER_TASK {
        return by_columns(rows, n, |cols, out| gemm(q, rows, cols, out));
    }
    let mut acc = vec![0i32; rows * n];
    let blocks = acc
        .chunks_mut(ROWS_PER_TASK * n)
        .zip(q.chunks(ROWS_PER_TASK * k))
        .collect();
    for_each_block(blocks, |(o, a)| gemm(a, a.len() / k, 0..n, o));
    acc
}

/// `a[rows, k] · wᵀ` in f32, blocks of rows spread over the current thread pool (each
/// block streams the weights once); fewer rows than a block (decode) split the columns.
pub fn matmul_rows(a: &[f32], w: &PackedF32Weights) -> Vec<f32> {
    let (k, n) = (w.k(), w.n());
    let rows = a.len() / k.max(1);
    if rows == 1 {
        return by_columns(rows, n, |cols, out| gemv_f32(a, w, cols, out));
    }
    if rows < ROWS_PER_TASK {
        return by_columns(rows, n, |cols, out| {
            matmul_f32_packed_cols(a, rows, w, cols, out);
        });
    }
    let mut out = vec![0f32; a.len() / k.max(1) * n];
    let blocks = out
        .chunks_mut(ROWS_PER_TASK * n)
        .zip(a.chunks(ROWS_PER_TASK * k))
        .collect();
    for_each_block(blocks, |(o, a)| matmul_f32_packed(a, a.len() / k, w, o));
    out
}

/// `x[rows, k] · wᵀ`, split by rows over the current thread pool. An INT8 activation
/// must come without outliers (the shadow stage multiplies those: [`shadow_product`]).
pub fn linear(x: &Act, rows: usize, w: &LinearWeights) -> Result<LinearOut, KernelError> {
    let k = w.k();
    match (x, w) {
        (Act::F32(a), LinearWeights::F32(packed)) => {
            check_len(a.len(), rows * k)?;
            Ok(LinearOut::F32(matmul_rows(a, packed)))
        }
        (Act::Int8 { q, scale, outliers }, _) => {
            check_len(q.len(), rows * k)?;
            let acc = match w {
                LinearWeights::Int8 { packed, .. } => gemm_i8_rows(q, rows, packed),
                LinearWeights::Int4 { packed, .. } => gemm_w4_rows(q, rows, packed),
                LinearWeights::F32(_) => {
                    return Err(KernelError::Precisions("activation and weight"));
                }
            };
            // Outliers belong to the shadow stage; the quantize step hands them over.
            if !outliers.is_empty() {
                return Err(KernelError::OutliersLeft);
            }
            Ok(LinearOut::Int32 {
                acc,
                a_scale: *scale,
                shadow: None,
            })
        }
        (Act::Int8Groups { q, scales }, LinearWeights::Int4 { packed, .. }) => {
            check_len(q.len(), rows * k)?;
            check_len(scales.len(), rows * packed.groups())?;
            let input = (q.as_slice(), scales.as_slice(), packed.groups());
            Ok(LinearOut::F32(gemm_w4_scaled_rows(
                input,
                rows,
                packed,
                |a, s, m, cols, out| gemm_w4_grouped_cols(a, s, m, packed, cols, out),
            )))
        }
        (Act::Int8Groups128 { q, scales }, LinearWeights::Int4 { packed, .. }) => {
            check_len(q.len(), rows * k)?;
            let per_row = act_groups(k);
            check_len(scales.len(), rows * per_row)?;
            let input = (q.as_slice(), scales.as_slice(), per_row);
            Ok(LinearOut::F32(gemm_w4_scaled_rows(
                input,
                rows,
                packed,
                |a, s, m, cols, out| gemm_w4_g128_cols(a, s, m, packed, cols, out),
            )))
        }
        _ => Err(KernelError::Precisions("activation and weight")),
    }
}

/// The float shadow `[rows, n]` of `outliers` through `w`'s float rows (seed 000, Eq. 1),
/// counted in `counters`.
pub fn shadow_product(
    outliers: &[(u32, f32)],
    rows: usize,
    w: &LinearWeights,
    counters: &ShadowCounters,
) -> Result<Vec<f32>, KernelError> {
    match w.shadow() {
        Some(table) => table.multiply(outliers, rows, counters),
        None => Err(KernelError::NoShadowWeights),
    }
}

/// The dequantize operator: INT32 accumulators × activation scale × row scale, plus the
/// float shadow the merge attached, if any.
pub fn dequantize(out: LinearOut, w: &LinearWeights) -> Result<Vec<f32>, KernelError> {
    match (out, w) {
        // The grouped W4A8 product is dequantized by the kernel itself.
        (LinearOut::F32(y), LinearWeights::F32(_) | LinearWeights::Int4 { .. }) => Ok(y),
        (
            LinearOut::Int32 {
                acc,
                a_scale,
                shadow,
            },
            w,
        ) => match w.row_scales() {
            Some(scales) => dequantize_int(&acc, a_scale, scales, shadow),
            None => Err(KernelError::Precisions("accumulator and weight")),
        },
        _ => Err(KernelError::Precisions("accumulator and weight")),
    }
}

/// INT32 accumulators `[rows, n]` × activation scale × the `n` row scales, plus the
/// float shadow, if any.
fn dequantize_int(
    acc: &[i32],
    a_scale: f32,
    scales: &[f32],
    shadow: Option<Vec<f32>>,
) -> Result<Vec<f32>, KernelError> {
    let n = scales.len();
    check_len(acc.len() % n.max(1), 0)?;
    if let Some(mut y) = shadow {
        // The shadow's buffer becomes the output: one pass instead of two.
        check_len(y.len(), acc.len())?;
        dequantize_add_shadow(acc, a_scale, scales, &mut y);
        return Ok(y);
    }
    let mut y = vec![0f32; acc.len()];
    // Whole rows per block, element by element: the same values as one pass.
    let block = (ELEMENTS_PER_BLOCK / n.max(1)).max(1) * n.max(1);
    let blocks = acc.chunks(block).zip(y.chunks_mut(block)).collect();
    for_each_block(blocks, |(acc, y)| {
        dequantize_i32_acc_fast(acc, acc.len() / n.max(1), n, a_scale, scales, y);
    });
    Ok(y)
}

fn check_len(found: usize, expected: usize) -> Result<(), KernelError> {
    if found == expected {
        Ok(())
    } else {
        Err(KernelError::Length { found, expected })
    }
}

#[cfg(test)]
mod tests {
    use hetsched_kernels::gemm_i8;
    use hetsched_kernels::seeded::SeededRng;

    use super::*;
    use crate::shadow::{PRUNED_CLIP_RMS, SHADOW_CLIP_RMS};

    #[test]
    fn few_rows_split_by_columns_equal_the_row_split() {
        use hetsched_kernels::reference::quantize_weights_per_row;
        let (n, k) = (200, 96);
        let w = SeededRng::new(11).f32s(n * k);
        let (wq, _) = quantize_weights_per_row(&w, n, k);
        let packed_i8 = PackedI8Weights::pack(&wq, n, k);
        let packed_f32 = PackedF32Weights::pack(&w, n, k);
        for rows in [1, 3, 40] {
            let a = SeededRng::new(rows as u64).f32s(rows * k);
            let q = SeededRng::new(rows as u64 + 7).i8s(rows * k);
            let mut want_i8 = vec![0i32; rows * n];
            gemm_i8(&q, rows, &packed_i8, &mut want_i8);
            assert_eq!(gemm_i8_rows(&q, rows, &packed_i8), want_i8, "{rows} rows");
            let packed_w4 = PackedW4Weights::quantize(&w, n, k);
            let mut want_w4 = vec![0i32; rows * n];
            hetsched_kernels::gemm_w4(&q, rows, &packed_w4, &mut want_w4);
            assert_eq!(gemm_w4_rows(&q, rows, &packed_w4), want_w4, "{rows} rows");
            let mut want = vec![0f32; rows * n];
            matmul_f32_packed(&a, rows, &packed_f32, &mut want);
            let got = matmul_rows(&a, &packed_f32);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
            }
        }
    }

    #[test]
    fn shadow_quantize_keeps_what_saturation_drops() {
        let mut x = SeededRng::new(3).f32s(4096);
        // A few massive activations, as SmolLM2's hot channels have.
        for (i, v) in [(7, 300.0), (1000, -150.0), (4095, 80.0)] {
            x[i] = v;
        }
        let Act::Int8 { q, scale, outliers } = quantize(
            x.clone(),
            QuantRule::Clip {
                rms: SHADOW_CLIP_RMS,
            },
        ) else {
            panic!("shadowing quantizes to INT8");
        };
        let plain = scale_for_max_abs_fast(&x);
        assert!(
            scale < plain / 10.0,
            "the clipped scale {scale} keeps the bulk's resolution"
        );
        let indices: Vec<usize> = outliers.iter().map(|&(i, _)| i as usize).collect();
        for i in [7, 1000, 4095] {
            assert!(indices.contains(&i), "outlier {i} kept");
        }
        for &(i, r) in &outliers {
            let i = i as usize;
            assert_eq!(q[i].unsigned_abs(), 127, "an outlier saturates");
            assert!((f32::from(q[i]) * scale + r - x[i]).abs() <= 1e-4 * x[i].abs());
        }
        for (i, &v) in x.iter().enumerate() {
            if !indices.contains(&i) {
                assert!((f32::from(q[i]) * scale - v).abs() <= 0.5 * scale * 1.0001);
            }
        }
    }

    #[test]
    fn the_clip_follows_the_bulk_not_its_massive_values() {
        let mut x = SeededRng::new(5).f32s(4096);
        // Four massive activations (as SmolLM2's attention-sink channels have) make the
        // plain RMS 50 times the bulk's.
        let massive = [0, 1000, 2000, 3000];
        for &i in &massive {
            x[i] = 1000.0;
        }
        let bulk: Vec<f32> = (0..x.len())
            .filter(|i| !massive.contains(i))
            .map(|i| x[i])
            .collect();
        let rms = |v: &[f32]| (v.iter().map(|v| v * v).sum::<f32>() / v.len() as f32).sqrt();
        assert!(rms(&x) > 50.0 * rms(&bulk));
        let limit = clip_limit(&x, 1.0);
        assert!(
            (limit / rms(&bulk) - 1.0).abs() < 0.01,
            "limit {limit}, bulk rms {}",
            rms(&bulk)
        );
        // Below the clip nothing changes: the range is the tensor's own max.
        assert_eq!(clip_limit(&bulk, 4.0), max_abs(&bulk));
    }

    #[test]
    fn hot_max_caps_the_range_and_shadows_a_cold_spike() {
        let channels = 64;
        let mut x = SeededRng::new(9).f32s(channels * 32);
        let (hot_massive, cold_spike) = (3, 7 * channels + 10);
        x[hot_massive] = 500.0;
        x[cold_spike] = 100.0;
        let mut hot = vec![false; channels];
        hot[hot_massive % channels] = true;
        let quantized = |clip: f32| {
            let rule = QuantRule::HotMax {
                hot: hot.clone().into(),
                clip,
            };
            let Act::Int8 { q, scale, outliers } = quantize(x.clone(), rule) else {
                panic!("hot-max quantizes to INT8");
            };
            for &(i, r) in &outliers {
                let i = i as usize;
                assert!((f32::from(q[i]) * scale + r - x[i]).abs() <= 1e-4 * x[i].abs());
            }
            let indices: Vec<usize> = outliers.iter().map(|&(i, _)| i as usize).collect();
            (scale * 127.0, indices)
        };
        // The cap (6 × the bulk's RMS of about 0.58) sends the cold spike to the shadow.
        let (limit, indices) = quantized(PRUNED_CLIP_RMS);
        assert!(limit < PRUNED_CLIP_RMS * 0.6, "limit {limit}");
        assert_eq!(indices, [hot_massive, cold_spike]);
        // Without it the cold spike sets the range and only the hot channel is shadowed.
        let (limit, indices) = quantized(f32::INFINITY);
        assert_eq!((limit, indices), (100.0, vec![hot_massive]));
    }

    #[test]
    fn grouped_w4a8_linear_is_the_kernel_product_split_over_rows() {
        // k = 160: five groups of 32, two of 128 (the second short).
        let (n, k) = (40, 160);
        let w = SeededRng::new(21).f32s(n * k);
        let int4 = LinearWeights::Int4 {
            packed: PackedW4Weights::quantize(&w, n, k),
            shadow: None,
        };
        let LinearWeights::Int4 { packed, .. } = &int4 else {
            unreachable!()
        };
        type Matmul = fn(&[f32], usize, &PackedW4Weights, &mut [f32]);
        let rules: [(QuantRule, usize, Matmul); 2] = [
            (QuantRule::Groups, 5, hetsched_kernels::matmul_w4a8_grouped),
            (
                QuantRule::Groups128 { width: k },
                2,
                hetsched_kernels::matmul_w4a8_g128,
            ),
        ];
        for (rule, per_row, matmul) in rules {
            for rows in [1, 5, 40] {
                let mut x = SeededRng::new(rows as u64).f32s(rows * k);
                x[1] = 400.0; // a massive activation only coarsens its own group
                let act = quantize(x.clone(), rule.clone());
                let (Act::Int8Groups { q, scales } | Act::Int8Groups128 { q, scales }) = &act
                else {
                    panic!("groups quantize to group-scaled INT8");
                };
                assert_eq!((q.len(), scales.len()), (rows * k, rows * per_row));
                let mut want = vec![0f32; rows * n];
                matmul(&x, rows, packed, &mut want);
                let out = linear(&act, rows, &int4).unwrap();
                assert_eq!(
                    dequantize(out, &int4).unwrap(),
                    want,
                    "{rule:?} {rows} rows"
                );
            }
        }
    }

    #[test]
    fn grouped_activations_need_four_bit_weights() {
        let (n, k) = (16, 64);
        let (q, scales) = quantize_weights_per_row_pair(n, k);
        let int8 = LinearWeights::Int8 {
            packed: PackedI8Weights::pack(&q, n, k),
            scales,
            shadow: None,
        };
        let act = quantize(SeededRng::new(3).f32s(2 * k), QuantRule::Groups);
        assert!(matches!(
            linear(&act, 2, &int8),
            Err(KernelError::Precisions(_))
        ));
        let int4 = LinearWeights::Int4 {
            packed: PackedW4Weights::quantize(&SeededRng::new(4).f32s(n * k), n, k),
            shadow: None,
        };
        assert!(matches!(
            linear(&act, 3, &int4),
            Err(KernelError::Length { .. })
        ));
    }

    fn quantize_weights_per_row_pair(n: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
        hetsched_kernels::reference::quantize_weights_per_row(&SeededRng::new(5).f32s(n * k), n, k)
    }

    #[test]
    fn element_wise_passes_in_blocks_equal_one_call_bit_for_bit() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        // A chunk's FFN activation: 12 blocks; a massive value in the last block sets
        // the per-tensor scale.
        let (rows, n) = (128, 1536);
        let mut x = SeededRng::new(9).f32s(rows * n);
        x[rows * n - 5] = 40.0;
        let scale = scale_for_max_abs_fast(&x);
        let mut want = vec![0i8; x.len()];
        quantize_per_tensor_fast(&x, scale, &mut want);
        let Act::Int8 { q, scale: got, .. } = pool.install(|| quantize(x, QuantRule::MaxAbs))
        else {
            panic!("max-abs quantizes to INT8");
        };
        assert_eq!((got, &q), (scale, &want));
        let acc: Vec<i32> = q.iter().map(|&v| i32::from(v) * 977).collect();
        let w_scales = SeededRng::new(10).f32s(n);
        let mut want = vec![0f32; acc.len()];
        dequantize_i32_acc_fast(&acc, rows, n, 0.003, &w_scales, &mut want);
        let got = pool
            .install(|| dequantize_int(&acc, 0.003, &w_scales, None))
            .unwrap();
        assert_eq!(got, want);
    }
}
