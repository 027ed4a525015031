//! The LM head of direct decode steps, quantized: a decode step otherwise streams the f32
//! head, as many bytes as every INT8 layer together.
//!
//! A W8A8 model's head is an INT8 linear. A W4A8 model's head is 4-bit, as its layers
//! are, with its best candidates rescored ([`HeadRescore`]): the 4-bit product over the
//! whole vocabulary picks the [`RESCORED_CANDIDATES`] largest logits, and those are
//! computed again from INT8 rows with the f32 activation. On SmolLM2 a 4-bit head alone
//! reads 8% higher perplexity than the INT8 head and changes one greedy pick in five
//! (the rows of a tied embedding are less forgiving than the layers'); the logits that
//! decide a pick and carry nearly all of a token's probability are the candidates', so
//! rescoring them keeps the INT8 head's accuracy (docs/generation.md) while a step reads
//! the 4-bit head's bytes and a few rows.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hetsched_kernels::reference::quantize_weights_per_row;
use hetsched_kernels::{PackedI8Weights, PackedW4Weights};
use hetsched_kernels::{block_maxima, chosen_row_dots};

use crate::{ExecModel, LinearPrecision, LinearWeights, QuantRule};

/// How many of a 4-bit head's largest logits are computed again from INT8 rows.
pub const RESCORED_CANDIDATES: usize = 128;

/// The LM head quantized for direct decode steps, and how its input is quantized.
#[derive(Debug)]
pub struct QuantizedHead {
    /// The head's weights.
    pub weights: LinearWeights,
    /// The quantization of the final-normed hidden state it multiplies.
    pub rule: QuantRule,
    /// The candidates computed again after the product (4-bit heads).
    pub rescore: Option<HeadRescore>,
}

impl QuantizedHead {
    /// The head as a W8A8 linear (INT8 weights with a scale per vocabulary row, the
    /// activation quantized per tensor), the arithmetic the model's other linears use.
    pub fn int8(model: &ExecModel) -> Self {
        let (n, k) = (model.output.n(), model.output.k());
        let (q, scales) = quantize_weights_per_row(&model.output.to_rows(), n, k);
        Self {
            weights: LinearWeights::Int8 {
                packed: PackedI8Weights::pack(&q, n, k),
                scales,
                shadow: None,
            },
            rule: QuantRule::MaxAbs,
            rescore: None,
        }
    }

    /// The head at the model's own width: 4-bit for the W4A8 precisions (the weights
    /// quantized as every other W4 linear, the activation as the precision quantizes its
    /// linears' inputs: per group of 32, of 128, or per tensor) with its best candidates
    /// rescored, INT8 for W8A8 ones, `None` for f32 (whose head stays f32).
    pub fn own_width(model: &ExecModel) -> Option<Self> {
        let (n, k) = (model.output.n(), model.output.k());
        let rule = match model.precision {
            LinearPrecision::F32 => return None,
            LinearPrecision::W8a8 | LinearPrecision::W8a8Shadow => return Some(Self::int8(model)),
            LinearPrecision::W4a8G32 => QuantRule::Groups,
            LinearPrecision::W4a8G128 => QuantRule::Groups128 { width: k },
            LinearPrecision::W4a8 | LinearPrecision::W4a8Shadow => QuantRule::MaxAbs,
        };
        let rows = model.output.to_rows();
        let weights = LinearWeights::Int4 {
            packed: PackedW4Weights::quantize(&rows, n, k),
            shadow: None,
        };
        let (rows, scales) = quantize_weights_per_row(&rows, n, k);
        Some(Self {
            weights,
            rule,
            rescore: Some(HeadRescore { rows, scales, k }),
        })
    }

    /// Bytes of the weights a step of one sequence reads: the product's, and the
    /// rescored candidates' rows.
    pub fn bytes(&self) -> u64 {
        let rescored = self
            .rescore
            .as_ref()
            .map_or(0, HeadRescore::bytes_per_sequence);
        self.weights.bytes() + rescored
    }

    /// Rescores each sequence's candidates in `logits` (`[sequences, vocabulary]`, the
    /// product's output) from `normed` (`[sequences, k]`, the head's f32 input).
    pub fn finish(&self, normed: &[f32], logits: &mut [f32]) {
        let Some(rescore) = &self.rescore else {
            return;
        };
        let n = self.weights.n().max(1);
        for (x, row) in normed
            .chunks_exact(rescore.k.max(1))
            .zip(logits.chunks_exact_mut(n))
        {
            rescore.apply(x, row);
        }
    }
}

/// INT8 rows of the head (a scale per vocabulary row, row-major), from which a 4-bit
/// head's best candidates are computed again with the unquantized activation.
#[derive(Debug)]
pub struct HeadRescore {
    rows: Vec<i8>,
    scales: Vec<f32>,
    k: usize,
}

impl HeadRescore {
    /// Bytes one sequence's step reads from the rows: its candidates' values and scales.
    fn bytes_per_sequence(&self) -> u64 {
        (RESCORED_CANDIDATES.min(self.scales.len()) * (self.k + 4)) as u64
    }

    /// Replaces the [`RESCORED_CANDIDATES`] largest of `logits` with `x`'s products with
    /// their INT8 rows.
    fn apply(&self, x: &[f32], logits: &mut [f32]) {
        let ids = largest_unordered(logits, RESCORED_CANDIDATES);
        let mut dots = [0f32; RESCORED_CANDIDATES];
        let dots = &mut dots[..ids.len()];
        chosen_row_dots(&self.rows, self.k, &ids, x, dots);
        for (&id, dot) in ids.iter().zip(dots) {
            logits[id as usize] = *dot * self.scales[id as usize];
        }
    }
}

/// Values a block of [`largest_unordered`]'s first pass takes the maximum of.
const MAX_BLOCK: usize = 64;

/// The ids of the `count` largest values (the lower id on a tie; a NaN below every
/// number), in no particular order.
///
/// Where there are more than `count` blocks of [`MAX_BLOCK`] values, a floor first: the
/// `count`-th largest of the blocks' maxima ([`block_maxima`], in the widest vector
/// unit). `count` blocks hold a value at least that large, so every one of the `count`
/// largest reaches it; the values at or above it (in the blocks whose maximum does) are
/// then ranked. A vocabulary's heap of the `count` largest, each value compared with the
/// smallest kept, replaced the kept ones some `count · ln(n / count)` times: 28-30 µs of
/// a `w4a8-g32` decode step over SmolLM2's 49152 logits, against 18-20 µs with the floor
/// (timers in a probe build, 4 runs each, 2026-12-07).
pub fn largest_unordered(values: &[f32], count: usize) -> Vec<u32> {
    let count = count.min(values.len());
    if count == 0 {
        return Vec::new();
    }
    if values.len().div_ceil(MAX_BLOCK) > count
        && let Some(ids) = largest_above_block_floor(values, count)
    {
        return ids;
    }
    largest_by_heap(values, count)
}

/// [`largest_unordered`] through the blocks' maxima; `None` where the floor is minus
/// infinity (too few numbers: NaNs may then be among the largest, which the floor
/// cannot tell apart).
fn largest_above_block_floor(values: &[f32], count: usize) -> Option<Vec<u32>> {
    let mut maxima = vec![0f32; values.len().div_ceil(MAX_BLOCK)];
    block_maxima(values, MAX_BLOCK, &mut maxima);
    let mut keys: Vec<i32> = maxima.iter().map(|&m| order_key(m)).collect();
    let nth = keys.len() - count;
    let floor_key = *keys.select_nth_unstable(nth).1;
    if floor_key <= order_key(f32::NEG_INFINITY) {
        return None;
    }
    // A block is passed over by the float comparison, under which -0 and +0 are equal
    // (`max_f32` may return either where both are a block's largest).
    let floor = from_order_key(floor_key);
    let mut candidates: Vec<(i32, u32)> = Vec::with_capacity(2 * count);
    for (b, block) in values.chunks(MAX_BLOCK).enumerate() {
        if maxima[b] < floor {
            continue;
        }
        for (i, &v) in block.iter().enumerate() {
            // The float test first (most values fail it; a NaN always does), the exact
            // order (-0 below +0) after.
            if v < floor {
                continue;
            }
            let key = order_key(v);
            if key >= floor_key {
                candidates.push((key, (b * MAX_BLOCK + i) as u32));
            }
        }
    }
    // The `count` first by (largest first, the lower id first on a tie), unordered.
    if candidates.len() > count {
        candidates.select_nth_unstable_by_key(count - 1, |&(key, id)| (Reverse(key), id));
        candidates.truncate(count);
    }
    Some(candidates.into_iter().map(|(_, id)| id).collect())
}

/// [`largest_unordered`] in one pass with the kept ones in a min-heap: a value is
/// compared with the smallest kept one, and most are below it.
fn largest_by_heap(values: &[f32], count: usize) -> Vec<u32> {
    // Min-heap of (order key, the id reversed): its top is the kept value to drop first.
    let mut kept: BinaryHeap<Reverse<(i32, Reverse<u32>)>> = BinaryHeap::with_capacity(count);
    let mut floor = f32::NEG_INFINITY;
    const LANES: usize = 16;
    for (c, chunk) in values.chunks(LANES).enumerate() {
        // Once `count` are kept, most chunks hold nothing above the floor: a branch-free
        // test of the whole chunk first. Ids rise, so a value equal to the floor never
        // displaces it (at a floor of minus infinity, a NaN kept may be: no skipping).
        let full = kept.len() == count && floor > f32::NEG_INFINITY;
        if full && !chunk.iter().fold(false, |any, &v| any | (v > floor)) {
            continue;
        }
        for (i, &v) in chunk.iter().enumerate() {
            let key = Reverse((order_key(v), Reverse((c * LANES + i) as u32)));
            if kept.len() < count {
                kept.push(key);
            } else if key < *kept.peek().expect("count > 0 are kept") {
                *kept.peek_mut().expect("count > 0 are kept") = key;
            } else {
                continue;
            }
            if kept.len() == count {
                let Reverse((key, _)) = kept.peek().expect("count > 0 are kept");
                floor = from_order_key(*key);
            }
        }
    }
    kept.into_iter()
        .map(|Reverse((_, Reverse(id)))| id)
        .collect()
}

/// An integer that orders as the float does (every NaN below negative infinity).
fn order_key(v: f32) -> i32 {
    if v.is_nan() {
        return i32::MIN;
    }
    let bits = v.to_bits() as i32;
    // Negative floats order backwards as integers: flip all but the sign bit.
    if bits < 0 { bits ^ i32::MAX } else { bits }
}

/// The float of an [`order_key`] (a NaN's key: negative infinity).
fn from_order_key(key: i32) -> f32 {
    if key == i32::MIN {
        return f32::NEG_INFINITY;
    }
    f32::from_bits((if key < 0 { key ^ i32::MAX } else { key }) as u32)
}

#[cfg(test)]
mod tests {
    use hetsched_kernels::seeded::SeededRng;

    use super::*;

    /// The reference: sort every id by value, largest first (a NaN below every number, as
    /// `order_key` orders them), the lower id on a tie.
    fn largest_by_sorting(values: &[f32], count: usize) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..values.len() as u32).collect();
        ids.sort_by_key(|&id| (Reverse(order_key(values[id as usize])), id));
        ids.truncate(count);
        ids.sort_unstable();
        ids
    }

    #[test]
    fn the_largest_values_are_found_as_a_full_sort_finds_them() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for len in [0, 1, 5, 16, 17, 33, 100, 1000, 4099] {
            for count in [0, 1, 3, 32, 64] {
                let values: Vec<f32> = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        // Few distinct values, so that ties happen.
                        (state % 97) as f32 * 0.25 - 12.0
                    })
                    .collect();
                let mut got = largest_unordered(&values, count);
                got.sort_unstable();
                assert_eq!(
                    got,
                    largest_by_sorting(&values, count),
                    "len {len} count {count}"
                );
            }
        }
    }

    /// Through the blocks' floor (more blocks of 64 than kept values) and without, the
    /// same ids as the heap and as sorting by the order of `order_key` (the lower id on a
    /// tie): random values with ties, both zeros, infinities and NaNs, and vocabularies
    /// of NaNs and minus infinities where the floor cannot be used.
    #[test]
    fn the_blocks_floor_keeps_the_ids_the_heap_keeps() {
        let mut rng = SeededRng::new(0x2545_f491_4f6c_dd1d);
        let mut next = move || rng.next_u64();
        let specials = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        for len in [65, 200, 4096, 20_000, 49_152] {
            for count in [1, 3, 32, 128] {
                for special_share in [0, 5, 60] {
                    let values: Vec<f32> = (0..len)
                        .map(|_| match next() % 100 < special_share {
                            true => specials[(next() % 5) as usize],
                            false => (next() % 301) as f32 * 0.125 - 20.0,
                        })
                        .collect();
                    let mut got = largest_unordered(&values, count);
                    got.sort_unstable();
                    let mut heap = largest_by_heap(&values, count.min(len));
                    heap.sort_unstable();
                    let what = format!("len {len} count {count} specials {special_share}%");
                    assert_eq!(got, heap, "{what}");
                    assert_eq!(got, largest_by_sorting(&values, count), "{what}");
                }
            }
        }
        // Block 0's largest reads -0 (the first of -0 and +0 is kept), blocks 1 and 2
        // hold +0: the floor is +0, and block 0's +0 (the lowest id of the three) must
        // still be found.
        let mut zeros = vec![-5.0f32; 64 * 10];
        zeros[0] = -0.0;
        zeros[1] = 0.0;
        zeros[64] = 0.0;
        zeros[128] = 0.0;
        let mut got = largest_unordered(&zeros, 2);
        got.sort_unstable();
        assert_eq!(got, vec![1, 64]);
        for fill in [f32::NAN, f32::NEG_INFINITY] {
            let mut values = vec![fill; 10_000];
            values[7_777] = 1.0;
            let mut got = largest_unordered(&values, 5);
            got.sort_unstable();
            assert_eq!(got, largest_by_sorting(&values, 5), "fill {fill}");
        }
    }

    #[test]
    fn rising_values_replace_the_kept_ones_and_nan_is_never_kept_over_a_number() {
        let rising: Vec<f32> = (0..200).map(|i| i as f32).collect();
        let mut got = largest_unordered(&rising, 4);
        got.sort_unstable();
        assert_eq!(got, vec![196, 197, 198, 199]);
        let with_nan = [f32::NAN, 1.0, 2.0, f32::NAN, 0.5];
        let mut got = largest_unordered(&with_nan, 2);
        got.sort_unstable();
        assert_eq!(got, vec![1, 2]);
        let below = [f32::NAN, f32::NEG_INFINITY, -0.0, 0.0, -3.5];
        let mut got = largest_unordered(&below, 4);
        got.sort_unstable();
        assert_eq!(got, vec![1, 2, 3, 4]);
    }

    #[test]
    fn rescoring_writes_the_int8_products_of_the_candidates_only() {
        let (n, k) = (6, 4);
        let rows: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let (q, scales) = quantize_weights_per_row(&rows, n, k);
        let rescore = HeadRescore {
            rows: q.clone(),
            scales: scales.clone(),
            k,
        };
        let x = [0.5, -1.0, 2.0, 0.25];
        // Approximate logits whose largest RESCORED_CANDIDATES (all six here) are
        // recomputed; with more rows than candidates, the rest would stay.
        let mut logits = vec![0.0; n];
        rescore.apply(&x, &mut logits);
        for j in 0..n {
            let want: f32 = (0..k).map(|p| f32::from(q[j * k + p]) * x[p]).sum::<f32>() * scales[j];
            assert!(
                (logits[j] - want).abs() <= 1e-6 * want.abs().max(1.0),
                "row {j}"
            );
            let exact: f32 = (0..k).map(|p| rows[j * k + p] * x[p]).sum();
            assert!(
                (logits[j] - exact).abs() < 0.05,
                "row {j}: {} vs {exact}",
                logits[j]
            );
        }
        let many = 3 * RESCORED_CANDIDATES;
        let rescore = HeadRescore {
            rows: vec![1; many * 2],
            scales: vec![1.0; many],
            k: 2,
        };
        let mut logits: Vec<f32> = (0..many).map(|i| i as f32 + 10.0).collect();
        rescore.apply(&[1.0, 1.0], &mut logits);
        let (rest, candidates) = logits.split_at(many - RESCORED_CANDIDATES);
        assert!(candidates.iter().all(|&l| l == 2.0));
        assert!(rest.iter().enumerate().all(|(i, &l)| l == i as f32 + 10.0));
    }
}
