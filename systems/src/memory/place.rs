//! Best-fit placement of buffers in a given order.
//!
//! Each buffer goes into the smallest address gap, lowest on ties, among the buffers
//! already placed whose lifetimes intersect its own, that holds it; with no such gap,
//! just above the highest of them (at 0 with none).
//!
//! The gaps are those of the union of the conflicting buffers' address ranges, which
//! the [`Occupancy`] index gives as `O(log n)` merged address sets: no conflicting
//! buffer is visited one by one and nothing is sorted: the sets beside the largest are
//! folded into one merged union by linear merges. The placement is that of the definition above, buffer for buffer
//! (`reference` in the tests is the definition, checked against this on random sets).

use super::buffer::Buffer;
use super::occupancy::Occupancy;

/// What placing in one order needs beyond the buffers, shared by every strategy of a
/// plan: each buffer's window of leaves in the [`Occupancy`] index, and the index.
#[derive(Debug, Default)]
pub(super) struct Placer {
    /// Per buffer, its leaves `lo..hi` (distinct starts in `[start, end)`).
    windows: Vec<(u32, u32)>,
    leaves: usize,
    index: Occupancy,
    /// Scratch: the union of the address sets beside the largest, and the buffer the
    /// next fold step writes into.
    union: Vec<(u64, u64)>,
    spare: Vec<(u64, u64)>,
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

    /// Places `buffers` (aligned `sizes`) in `order`; returns each buffer's offset,
    /// or `None` as soon as the arena reaches `give_up_at` bytes, if given (a plan that
    /// can no longer beat one already made).
    ///
    /// Sizes and hence offsets are multiples of the alignment. Zero-byte buffers go
    /// at 0.
    pub(super) fn place(
        &mut self,
        sizes: &[u64],
        order: &[u32],
        give_up_at: Option<u64>,
    ) -> Option<Vec<u64>> {
        self.index.reset(self.leaves);
        let mut offsets = vec![0u64; sizes.len()];
        let mut peak = 0u64;
        for &i in order {
            let i = i as usize;
            let size = sizes[i];
            if size == 0 {
                continue;
            }
            let (lo, hi) = self.windows[i];
            self.index.select(lo as usize, hi as usize);
            let offset = self.best_fit(size);
            offsets[i] = offset;
            self.index.insert(offset, offset + size);
            peak = peak.max(offset + size);
            if give_up_at.is_some_and(|limit| peak >= limit) {
                return None;
            }
        }
        Some(offsets)
    }

    /// The best-fit offset for `size` bytes in the selected window: the union of the
    /// window's merged address sets, folded in one linear merge per set.
    ///
    /// The union has few ranges (neighbouring buffers merge), so each fold step costs
    /// about the length of the set it adds: no sort of the sets' ranges together.
    fn best_fit(&mut self, size: u64) -> u64 {
        let sets = self.index.taken();
        let largest = sets
            .clone()
            .enumerate()
            .max_by_key(|(_, s)| s.len())
            .map_or(0, |(k, _)| k);
        let mut union = std::mem::take(&mut self.union);
        let mut spare = std::mem::take(&mut self.spare);
        union.clear();
        let mut base: &[(u64, u64)] = &[];
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
        let fit = best_fit(merge(base, &union), size);
        self.union = union;
        self.spare = spare;
        fit
    }
}

/// The union of two merged address sets (sorted, disjoint, touching ranges joined)
/// into `out`, itself merged: one linear merge. (Copying the longer set's runs in
/// bulk between binary searches was measured slower: 1.8x the chunk-1 run.)
pub(super) fn union_into(a: &[(u64, u64)], b: &[(u64, u64)], out: &mut Vec<(u64, u64)>) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    loop {
        let next = match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) => {
                if x.0 <= y.0 {
                    i += 1;
                    x
                } else {
                    j += 1;
                    y
                }
            }
            (Some(&x), None) => {
                i += 1;
                x
            }
            (None, Some(&y)) => {
                j += 1;
                y
            }
            (None, None) => return,
        };
        match out.last_mut() {
            Some(last) if next.0 <= last.1 => last.1 = last.1.max(next.1),
            _ => out.push(next),
        }
    }
}

/// Two sequences sorted by start, merged.
fn merge<'a>(a: &'a [(u64, u64)], b: &'a [(u64, u64)]) -> impl Iterator<Item = (u64, u64)> + 'a {
    let (mut i, mut j) = (0, 0);
    std::iter::from_fn(move || {
        let take_a = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) => x.0 <= y.0,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return None,
        };
        if take_a {
            i += 1;
            Some(a[i - 1])
        } else {
            j += 1;
            Some(b[j - 1])
        }
    })
}

/// The start of the smallest gap, among address ranges `taken` sorted by start, that
/// holds `size` bytes, the lowest such on ties; else the end of the highest range.
fn best_fit(taken: impl Iterator<Item = (u64, u64)>, size: u64) -> u64 {
    let mut cursor = 0;
    let mut best: Option<(u64, u64)> = None; // (gap, offset)
    for (low, high) in taken {
        if low > cursor {
            let gap = low - cursor;
            if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, cursor));
            }
        }
        cursor = cursor.max(high);
    }
    best.map_or(cursor, |(_, offset)| offset)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Placer, best_fit, merge, union_into};
    use crate::memory::Buffer;
    use crate::memory::order::by_start;
    use crate::memory::sweep::place_in_start_order;

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
    fn union_into_joins_overlapping_and_touching_ranges() {
        let mut out = Vec::new();
        union_into(
            &[(0, 10), (20, 30), (50, 60)],
            &[(5, 20), (40, 45), (60, 70)],
            &mut out,
        );
        assert_eq!(out, [(0, 30), (40, 45), (50, 70)]);
        union_into(&[], &[(1, 2)], &mut out);
        assert_eq!(out, [(1, 2)]);
        union_into(&[(0, 100)], &[(10, 20), (30, 40)], &mut out);
        assert_eq!(out, [(0, 100)]);
    }

    #[test]
    fn merge_keeps_start_order() {
        let a = [(0, 1), (5, 6), (9, 10)];
        let b = [(2, 3), (5, 7), (11, 12)];
        let merged: Vec<_> = merge(&a, &b).collect();
        assert_eq!(merged, [(0, 1), (2, 3), (5, 6), (5, 7), (9, 10), (11, 12)]);
        assert_eq!(merge(&[], &b).count(), 3);
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
        let all = placer.place(&sizes, &[0, 1, 2, 3], None).unwrap();
        assert_eq!(all, [0, 64, 128, 192]);
        assert!(placer.place(&sizes, &[0, 1, 2, 3], Some(256)).is_none());
        assert!(placer.place(&sizes, &[0, 1, 2, 3], Some(257)).is_some());
        // Without a limit, an arena of u64::MAX bytes is a plan, not a give-up.
        let huge = [Buffer {
            id: 0,
            bytes: u64::MAX,
            start: 0,
            end: 1,
        }];
        let placed = Placer::new(&huge).place(&[u64::MAX], &[0], None);
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

    /// A merged address set (sorted, disjoint, not touching) from random gaps and
    /// lengths, some gaps zero-length so neighbours would touch before merging.
    fn merged_set() -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec((1u64..6, 1u64..6), 0..30).prop_map(|raw| {
            let mut at = 0;
            raw.into_iter()
                .map(|(gap, len)| {
                    at += gap;
                    let range = (at, at + len);
                    at += len;
                    range
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
            let fast = placer.place(&sizes, &order, None).unwrap();
            prop_assert_eq!(fast, reference(&buffers, &sizes, &order));
        }

        /// The bulk union equals a sort and merge of both sets' ranges.
        #[test]
        fn union_into_equals_sort_and_merge(a in merged_set(), b in merged_set()) {
            let mut all: Vec<(u64, u64)> = a.iter().chain(&b).copied().collect();
            all.sort_unstable();
            let mut expected: Vec<(u64, u64)> = Vec::new();
            for r in all {
                match expected.last_mut() {
                    Some(last) if r.0 <= last.1 => last.1 = last.1.max(r.1),
                    _ => expected.push(r),
                }
            }
            let mut out = Vec::new();
            union_into(&a, &b, &mut out);
            prop_assert_eq!(out, expected);
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
    }
}
