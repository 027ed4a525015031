//! Best-fit placement of buffers in a given order.
//!
//! Each buffer goes into the smallest address gap, lowest on ties, among the buffers
//! already placed whose lifetimes intersect its own, that holds it; with no such gap,
//! just above the highest of them (at 0 with none).
//!
//! The gaps are those of the union of the conflicting buffers' address ranges, which
//! the [`Occupancy`] index gives as `O(log n)` merged address sets: no conflicting
//! buffer is visited one by one and nothing is sorted: the sets beside the largest are
//! folded into one merged union by linear merges. The placement is that of the
//! definition above, buffer for buffer (`reference` in the tests is the definition,
//! checked against this on random sets, at both address widths).

use super::address::{Addr, union_into};
use super::buffer::Buffer;
use super::occupancy::Occupancy;

/// What placing in one order needs beyond the buffers, shared by every strategy of a
/// plan: each buffer's window of leaves in the [`Occupancy`] index, and the index (at
/// the width the sizes need).
#[derive(Debug, Default)]
pub(super) struct Placer {
    /// Per buffer, its leaves `lo..hi` (distinct starts in `[start, end)`).
    windows: Vec<(u32, u32)>,
    leaves: usize,
    narrow: Fitter<u32>,
    wide: Fitter<u64>,
}

/// The index and the fold's scratch at one address width.
#[derive(Debug, Default)]
struct Fitter<A> {
    index: Occupancy<A>,
    /// Scratch: the union of the address sets beside the largest, and the buffer the
    /// next fold step writes into.
    union: Vec<(A, A)>,
    spare: Vec<(A, A)>,
}

impl Placer {
    /// Indexes the lifetimes of `buffers` (each `end > start`).
    pub(super) fn new(buffers: &[Buffer]) -> Self {
        let mut starts: Vec<u64> = buffers.iter().map(|b| b.start).collect();
        starts.sort_unstable();
        starts.dedup();
        let leaf = |t: u64| starts.partition_point(|&s| s < t) as u32;
        Placer {
            windows: buffers
                .iter()
                .map(|b| (leaf(b.start), leaf(b.end)))
                .collect(),
            leaves: starts.len(),
            ..Placer::default()
        }
    }

    /// Places `buffers` (aligned `sizes`, each a multiple of `unit`, a power of two) in
    /// `order`; returns each buffer's offset, or `None` as soon as the arena reaches
    /// `give_up_at` bytes, if given (a plan that can no longer beat one already made).
    ///
    /// Offsets are multiples of `unit`. Zero-byte buffers go at 0.
    pub(super) fn place(
        &mut self,
        sizes: &[u64],
        unit: u64,
        order: &[u32],
        give_up_at: Option<u64>,
    ) -> Option<Vec<u64>> {
        // No address is past the sum of the sizes (a buffer goes in a gap or on top
        // of the ones it conflicts with), and the caller's sizes sum within `u64`.
        let units: u64 = sizes.iter().map(|s| s / unit).sum();
        let job = Job {
            windows: &self.windows,
            leaves: self.leaves,
            sizes,
            unit,
        };
        if units <= u64::from(u32::MAX) {
            self.narrow.place(&job, order, give_up_at)
        } else {
            self.wide.place(&job, order, give_up_at)
        }
    }
}

/// One placement's inputs.
struct Job<'a> {
    windows: &'a [(u32, u32)],
    leaves: usize,
    sizes: &'a [u64],
    unit: u64,
}

impl<A: Addr> Fitter<A> {
    /// [`Placer::place`] at this width (every address in units must fit `A`).
    fn place(&mut self, job: &Job, order: &[u32], give_up_at: Option<u64>) -> Option<Vec<u64>> {
        self.index.reset(job.leaves);
        let mut offsets = vec![0u64; job.sizes.len()];
        let mut peak = 0u64;
        for &i in order {
            let i = i as usize;
            let size = job.sizes[i];
            if size == 0 {
                continue;
            }
            debug_assert!(size.is_multiple_of(job.unit));
            let units = A::from_u64(size / job.unit);
            let (lo, hi) = job.windows[i];
            self.index.select(lo as usize, hi as usize);
            let offset = self.best_fit(units);
            self.index.insert(offset, offset + units);
            offsets[i] = offset.to_u64() * job.unit;
            peak = peak.max(offsets[i] + size);
            if give_up_at.is_some_and(|limit| peak >= limit) {
                return None;
            }
        }
        Some(offsets)
    }

    /// The best-fit offset for `size` units (above 0) in the selected window: the union
    /// of the window's merged address sets, folded in one linear merge per set.
    ///
    /// The union has few ranges (neighbouring buffers merge), so each fold step costs
    /// about the length of the set it adds: no sort of the sets' ranges together.
    fn best_fit(&mut self, size: A) -> A {
        let sets = self.index.taken();
        let largest = sets
            .clone()
            .enumerate()
            .max_by_key(|(_, s)| s.len())
            .map_or(0, |(k, _)| k);
        let mut union = std::mem::take(&mut self.union);
        let mut spare = std::mem::take(&mut self.spare);
        union.clear();
        let mut base: &[(A, A)] = &[];
        for (k, set) in sets.enumerate() {
            if k == largest {
                base = set;
            } else if !set.is_empty() {
                if union.is_empty() {
                    union.extend_from_slice(set);
                } else {
                    union_into(&union, set, &mut spare);
                    std::mem::swap(&mut union, &mut spare);
                }
            }
        }
        let fit = best_fit_in(base, &union, size);
        self.union = union;
        self.spare = spare;
        fit
    }
}

/// The start of the smallest gap, among the address ranges of `a` and `b` (each
/// sorted by start), that holds `size` bytes, the lowest such on ties; else the end
/// of the highest range. One branch-free merge of the two.
fn best_fit_in<A: Addr>(a: &[(A, A)], b: &[(A, A)], size: A) -> A {
    let mut gaps = BestGap::new(size);
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        let take_a = x.0 <= y.0;
        i += usize::from(take_a);
        j += usize::from(!take_a);
        gaps.pass(if take_a { x } else { y });
    }
    for &range in a[i..].iter().chain(&b[j..]) {
        gaps.pass(range);
    }
    gaps.offset()
}

/// The best-fit scan over address ranges passed in start order.
struct BestGap<A> {
    size: A,
    /// The end of the ranges passed so far.
    cursor: A,
    /// The smallest gap that holds `size` so far (`found`), and where it starts.
    found: bool,
    gap: A,
    at: A,
}

impl<A: Addr> BestGap<A> {
    /// A scan for `size` (above 0: a zero gap must not count).
    fn new(size: A) -> Self {
        debug_assert!(size > A::default());
        BestGap {
            size,
            cursor: A::default(),
            found: false,
            gap: A::default(),
            at: A::default(),
        }
    }

    /// Passes the next range; branch-free (the gap test is a select).
    fn pass(&mut self, (low, high): (A, A)) {
        // Zero when the range starts at or below the cursor: no gap (`size > 0`).
        let gap = low.saturating_sub(self.cursor);
        let better = gap >= self.size && (!self.found || gap < self.gap);
        self.found |= better;
        self.gap = if better { gap } else { self.gap };
        self.at = if better { self.cursor } else { self.at };
        self.cursor = self.cursor.max(high);
    }

    /// The best gap's start, or the cursor when none held `size`.
    fn offset(&self) -> A {
        if self.found { self.at } else { self.cursor }
    }
}

/// The start of the smallest gap, among address ranges `taken` sorted by start, that
/// holds `size` bytes, the lowest such on ties; else the end of the highest range.
#[cfg(test)]
fn best_fit<A: Addr>(taken: impl Iterator<Item = (A, A)>, size: A) -> A {
    let mut gaps = BestGap::new(size);
    taken.for_each(|r| gaps.pass(r));
    gaps.offset()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Fitter, Job, Placer, best_fit};
    use crate::Buffer;
    use crate::order::{by_end, by_start};
    use crate::sweep::place_in_start_order;
    use crate::{Strategy as MemoryStrategy, plan_with};

    /// The definition, quadratic: each buffer in order against every placed buffer
    /// whose lifetime intersects its own.
    fn reference(buffers: &[Buffer], sizes: &[u64], order: &[u32]) -> Vec<u64> {
        let mut offsets = vec![0u64; buffers.len()];
        let mut placed: Vec<usize> = Vec::new();
        for &i in order {
            let i = i as usize;
            if sizes[i] == 0 {
                continue;
            }
            let mut taken: Vec<(u64, u64)> = placed
                .iter()
                .filter(|&&j| buffers[j].overlaps_in_time(&buffers[i]))
                .map(|&j| (offsets[j], offsets[j] + sizes[j]))
                .collect();
            taken.sort_unstable_by_key(|r| r.0);
            offsets[i] = best_fit(taken.into_iter(), sizes[i]);
            placed.push(i);
        }
        offsets
    }

    #[test]
    fn best_fit_takes_the_smallest_gap_that_holds() {
        let fit = |taken: &[(u64, u64)], size| best_fit(taken.iter().copied(), size);
        let taken = [(0, 10), (30, 40), (45, 50), (100, 110)];
        assert_eq!(fit(&taken, 5), 40);
        assert_eq!(fit(&taken, 20), 10);
        assert_eq!(fit(&taken, 30), 50);
        assert_eq!(fit(&taken, 60), 110);
        assert_eq!(fit(&[], 60), 0);
        assert_eq!(fit(&[(0, 30), (10, 20)], 5), 30);
        assert_eq!(fit(&[(0, 20), (5, 8), (10, 30), (35, 40)], 5), 30);
    }

    #[test]
    fn giving_up_stops_at_the_limit() {
        let buffers: Vec<Buffer> = (0..4)
            .map(|id| Buffer {
                id,
                bytes: 64,
                start: 0,
                end: 10,
            })
            .collect();
        let sizes = [64; 4];
        let mut placer = Placer::new(&buffers);
        let all = placer.place(&sizes, 64, &[0, 1, 2, 3], None).unwrap();
        assert_eq!(all, [0, 64, 128, 192]);
        assert!(placer.place(&sizes, 64, &[0, 1, 2, 3], Some(256)).is_none());
        assert!(placer.place(&sizes, 64, &[0, 1, 2, 3], Some(257)).is_some());
        // Without a limit, an arena of u64::MAX bytes is a plan, not a give-up.
        let huge = [Buffer {
            id: 0,
            bytes: u64::MAX,
            start: 0,
            end: 1,
        }];
        let placed = Placer::new(&huge).place(&[u64::MAX], 1, &[0], None);
        assert_eq!(placed, Some(vec![0]));
    }

    /// Buffers with few distinct times (many ties and touching lifetimes), sizes in
    /// few multiples of 64 (many equal gaps), some zero-byte.
    fn buffer_set() -> impl Strategy<Value = Vec<Buffer>> {
        prop::collection::vec((0u64..12, 0u64..40, 1u64..30, 0u64..40), 0..120).prop_map(|raw| {
            raw.into_iter()
                .enumerate()
                .map(|(id, (units, start, len, long))| Buffer {
                    id: id as u32,
                    bytes: 64 * units,
                    start,
                    end: start + if long == 0 { 200 } else { len },
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

        /// The index gives the definition's offsets, buffer for buffer, in any order.
        #[test]
        fn placement_equals_the_definition(buffers in buffer_set(), seed in any::<u64>()) {
            let sizes: Vec<u64> = buffers.iter().map(|b| b.bytes).collect();
            let mut order: Vec<u32> = (0..buffers.len() as u32).collect();
            // A seeded shuffle: any order must give the definition's placement.
            let mut x = seed;
            for k in (1..order.len()).rev() {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                order.swap(k, (x >> 33) as usize % (k + 1));
            }
            let mut placer = Placer::new(&buffers);
            let expected = reference(&buffers, &sizes, &order);
            // Sizes are multiples of 64: counted in bytes and in units of 64.
            for unit in [1, 64] {
                let fast = placer.place(&sizes, unit, &order, None).unwrap();
                prop_assert_eq!(&fast, &expected);
            }
            // The wide index (used past `u32::MAX` units) places the same.
            let job = Job { windows: &placer.windows, leaves: placer.leaves, sizes: &sizes, unit: 64 };
            let wide = Fitter::<u64>::default().place(&job, &order, None).unwrap();
            prop_assert_eq!(wide, expected);
        }

        /// The start-order sweep gives the definition's offsets, buffer for buffer.
        #[test]
        fn start_order_sweep_equals_the_definition(buffers in buffer_set()) {
            let sizes: Vec<u64> = buffers.iter().map(|b| b.bytes).collect();
            let spans: Vec<(u64, u64)> = buffers.iter().map(|b| (b.start, b.end)).collect();
            let order = by_start(&buffers, &sizes);
            let sweep = place_in_start_order(&spans, &sizes, &order, None).unwrap();
            prop_assert_eq!(sweep, reference(&buffers, &sizes, &order));
        }

        /// Greedy by end (the sweep on reversed time) gives the definition's offsets in
        /// its order.
        #[test]
        fn greedy_by_end_equals_the_definition(buffers in buffer_set()) {
            let sizes: Vec<u64> = buffers.iter().map(|b| b.bytes).collect();
            let plan = plan_with(&buffers, 64, MemoryStrategy::GreedyByEnd).unwrap();
            let offsets: Vec<u64> = (0..buffers.len()).map(|i| plan.offset(i)).collect();
            prop_assert_eq!(offsets, reference(&buffers, &sizes, &by_end(&buffers, &sizes)));
        }
    }
}
