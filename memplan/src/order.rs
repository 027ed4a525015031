//! The orders in which the greedy strategies place buffers.
//!
//! Every order is total (ties end on the id, then the input index), so plans are
//! deterministic.

use std::cmp::Reverse;

use super::buffer::Buffer;

/// Indexes sorted by `key`, ties by id then index.
fn sorted_by<K: Ord>(buffers: &[Buffer], key: impl Fn(usize) -> K) -> Vec<u32> {
    let mut order: Vec<u32> = (0..buffers.len() as u32).collect();
    order.sort_by_cached_key(|&i| (key(i as usize), buffers[i as usize].id, i));
    order
}

/// Largest (aligned) first; ties: longer lifetime first.
pub(super) fn by_size(buffers: &[Buffer], sizes: &[u64]) -> Vec<u32> {
    sorted_by(buffers, |i| {
        (Reverse(sizes[i]), Reverse(buffers[i].lifetime()))
    })
}

/// Earliest start first; ties: larger first.
pub(super) fn by_start(buffers: &[Buffer], sizes: &[u64]) -> Vec<u32> {
    sorted_by(buffers, |i| (buffers[i].start, Reverse(sizes[i])))
}

/// Latest end first; ties: larger first.
pub(super) fn by_end(buffers: &[Buffer], sizes: &[u64]) -> Vec<u32> {
    sorted_by(buffers, |i| (Reverse(buffers[i].end), Reverse(sizes[i])))
}

/// Largest `size x lifetime` first; ties: larger first.
pub(super) fn by_area(buffers: &[Buffer], sizes: &[u64]) -> Vec<u32> {
    sorted_by(buffers, |i| {
        let area = u128::from(sizes[i]) * u128::from(buffers[i].lifetime());
        (Reverse(area), Reverse(sizes[i]))
    })
}

/// TFLite's greedy by breadth: time steps (the intervals between consecutive
/// lifetime endpoints) in order of their live bytes, most first, earliest on ties;
/// within a step, its not yet ordered buffers largest first.
///
/// A buffer is first met at the widest step of its lifetime (earliest on ties), so
/// this sorts buffers by (that step's breadth desc, the step, size desc), with a
/// range-maximum query per buffer.
pub(super) fn by_breadth(buffers: &[Buffer], sizes: &[u64]) -> Vec<u32> {
    let mut points: Vec<u64> = buffers.iter().flat_map(|b| [b.start, b.end]).collect();
    points.sort_unstable();
    points.dedup();
    let index = |t: u64| points.partition_point(|&p| p < t);
    // Step k is [points[k], points[k + 1]); breadth from a difference array.
    let steps = points.len().saturating_sub(1);
    let mut delta = vec![0i128; steps + 1];
    for (b, &s) in buffers.iter().zip(sizes) {
        delta[index(b.start)] += i128::from(s);
        delta[index(b.end)] -= i128::from(s);
    }
    let mut live = 0i128;
    let keys: Vec<(i128, Reverse<usize>)> = (0..steps)
        .map(|k| {
            live += delta[k];
            (live, Reverse(k))
        })
        .collect();
    let widest = RangeMax::new(keys);
    sorted_by(buffers, |i| {
        let (breadth, Reverse(step)) = widest.query(index(buffers[i].start), index(buffers[i].end));
        (Reverse(breadth), step, Reverse(sizes[i]))
    })
}

/// Range maximum over a fixed array (iterative segment tree).
struct RangeMax<T> {
    size: usize,
    nodes: Vec<T>,
}

impl<T: Ord + Copy + Default> RangeMax<T> {
    fn new(values: Vec<T>) -> Self {
        let size = values.len().next_power_of_two().max(1);
        let mut nodes = vec![T::default(); 2 * size];
        nodes[size..size + values.len()].copy_from_slice(&values);
        for i in (1..size).rev() {
            nodes[i] = nodes[2 * i].max(nodes[2 * i + 1]);
        }
        RangeMax { size, nodes }
    }

    /// The maximum over `lo..hi` (non-empty).
    fn query(&self, lo: usize, hi: usize) -> T {
        debug_assert!(lo < hi);
        let (mut l, mut r) = (lo + self.size, hi + self.size);
        let mut best = self.nodes[l];
        while l < r {
            if l & 1 == 1 {
                best = best.max(self.nodes[l]);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                best = best.max(self.nodes[r]);
            }
            l >>= 1;
            r >>= 1;
        }
        best
    }
}

/// Largest (aligned) first; ties: earliest start, then longer lifetime.
pub(super) fn by_size_then_start(buffers: &[Buffer], sizes: &[u64]) -> Vec<u32> {
    sorted_by(buffers, |i| {
        (
            Reverse(sizes[i]),
            buffers[i].start,
            Reverse(buffers[i].lifetime()),
        )
    })
}
