//! Best-fit placement in start order (greedy by start) by a sweep over time.
//!
//! When buffers are placed earliest start first, the placed buffers whose lifetimes
//! intersect the next one's `[start, end)` are exactly those still live at `start`:
//! every placed buffer starts at or before it, so it intersects iff it ends after
//! it. Buffers live at one time pairwise conflict, so the planner gave them disjoint
//! address ranges: the union the best fit looks at is the live set itself, with no
//! merging. The sweep keeps the live ranges by address and the gaps between them by
//! (size, address), so the smallest gap that holds a buffer, lowest on ties, is one
//! ordered look-up: `O(log n)` per buffer instead of a look at every live range.
//! The placement is [`super::place`]'s, buffer for buffer (its tests check both
//! against the quadratic definition).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// The live ranges of a sweep, by address, and the gaps between them.
#[derive(Debug, Default)]
struct LiveRanges {
    /// Live address ranges, `low -> high`, pairwise disjoint.
    ranges: BTreeMap<u64, u64>,
    /// The free gaps below and between live ranges, `(size, low)`, sizes above 0.
    gaps: BTreeSet<(u64, u64)>,
}

impl LiveRanges {
    /// The best-fit offset for `size` bytes: the start of the smallest gap that
    /// holds it, lowest on ties; else the end of the highest live range (0 if none).
    fn best_fit(&self, size: u64) -> u64 {
        match self.gaps.range((size, 0)..).next() {
            Some(&(_, low)) => low,
            None => self.ranges.last_key_value().map_or(0, |(_, &high)| high),
        }
    }

    /// The end of the live range below `low` (0 if none) and the start of the one
    /// above `high`, if any.
    fn neighbours(&self, low: u64, high: u64) -> (u64, Option<u64>) {
        let below = self.ranges.range(..low).next_back().map_or(0, |(_, &h)| h);
        let above = self.ranges.range(high..).next().map(|(&l, _)| l);
        (below, above)
    }

    /// Records `[low, high)` as live; it lies in a gap or above every live range.
    fn insert(&mut self, low: u64, high: u64) {
        let (below, above) = self.neighbours(low, high);
        if let Some(above) = above {
            self.gaps.remove(&(above - below, below));
            self.add_gap(high, above);
        }
        self.add_gap(below, low);
        self.ranges.insert(low, high);
    }

    /// Frees the live range starting at `low`.
    fn remove(&mut self, low: u64) {
        let high = self
            .ranges
            .remove(&low)
            .expect("only live ranges are freed");
        let (below, above) = self.neighbours(low, high);
        self.gaps.remove(&(low - below, below));
        if let Some(above) = above {
            self.gaps.remove(&(above - high, high));
            self.add_gap(below, above);
        }
    }

    fn add_gap(&mut self, low: u64, high: u64) {
        if high > low {
            self.gaps.insert((high - low, low));
        }
    }
}

/// Places buffers with lifetimes `spans` (`(start, end)`, `end > start`) and aligned
/// `sizes` in `order`, which must list them earliest start first; returns each
/// buffer's offset, or `None` as soon as the arena reaches `give_up_at` bytes, if
/// given. Zero-byte buffers go at 0.
pub(super) fn place_in_start_order(
    spans: &[(u64, u64)],
    sizes: &[u64],
    order: &[u32],
    give_up_at: Option<u64>,
) -> Option<Vec<u64>> {
    let mut offsets = vec![0u64; sizes.len()];
    let mut live = LiveRanges::default();
    // Live buffers by end: (end, low), earliest first.
    let mut ending: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut peak = 0u64;
    for &i in order {
        let i = i as usize;
        let (start, end) = spans[i];
        // A buffer ending at `start` no longer conflicts (lifetimes are half-open).
        while let Some(&Reverse((ends, low))) = ending.peek() {
            if ends > start {
                break;
            }
            ending.pop();
            live.remove(low);
        }
        let size = sizes[i];
        if size == 0 {
            continue;
        }
        let offset = live.best_fit(size);
        offsets[i] = offset;
        live.insert(offset, offset + size);
        ending.push(Reverse((end, offset)));
        peak = peak.max(offset + size);
        if give_up_at.is_some_and(|limit| peak >= limit) {
            return None;
        }
    }
    Some(offsets)
}
