//! Best-fit placement of buffers in a given order.
//!
//! Each buffer goes into the smallest address gap, among the buffers already placed
//! whose lifetimes intersect its own, that holds it; with no such gap, just above the
//! highest of them.
//!
//! Finding those conflicting buffers uses two indexes over the placed ones: a segment
//! tree over start times, stabbed at the new buffer's start (placed buffers live at
//! that time), and all buffers sorted by start (placed buffers starting inside its
//! lifetime). Their address ranges are then sorted, `O(log n + k log k)` for `k`
//! conflicts. When `k` is a large part of the `m` placed buffers, as when most
//! lifetimes overlap, the placed buffers are instead scanned in address order from a
//! third index and filtered by lifetime, `O(m)`. Both paths find the same conflicts,
//! so the plan does not depend on which one runs.

use super::buffer::Buffer;

/// Which way to find conflicts: by the estimate (the default), or always one way
/// (for tests: the offsets must not change).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Path {
    Auto,
    #[cfg(test)]
    Sort,
    #[cfg(test)]
    Scan,
}

/// A placed buffer: address range `[low, high)` and lifetime `[start, end)`.
#[derive(Clone, Copy, Debug)]
struct Placed {
    low: u64,
    high: u64,
    start: u64,
    end: u64,
}

/// Places `buffers` (aligned `sizes`) in `order`; returns each buffer's offset.
///
/// Sizes and hence offsets are multiples of the alignment. Zero-byte buffers go at 0.
pub(super) fn place_in_order(
    buffers: &[Buffer],
    sizes: &[u64],
    order: &[u32],
    path: Path,
) -> Vec<u64> {
    let n = buffers.len();
    // Distinct start times: the segment tree's leaves.
    let mut starts: Vec<u64> = buffers.iter().map(|b| b.start).collect();
    starts.sort_unstable();
    starts.dedup();
    let leaf = |t: u64| starts.partition_point(|&s| s < t);
    let mut tree = Stabbing::new(starts.len());
    // All buffers by start, for "placed buffers starting inside (start, end)": their
    // starts, and the address ranges of those placed (empty while unplaced).
    let mut by_start: Vec<u32> = (0..n as u32).collect();
    by_start.sort_unstable_by_key(|&i| buffers[i as usize].start);
    let sorted_starts: Vec<u64> = by_start
        .iter()
        .map(|&i| buffers[i as usize].start)
        .collect();
    let mut position = vec![0usize; n];
    for (p, &i) in by_start.iter().enumerate() {
        position[i as usize] = p;
    }
    let mut ranges = vec![(0u64, 0u64); n];
    let mut by_offset = ByOffset::default();

    let mut offsets = vec![0u64; n];
    let mut conflicts: Vec<(u64, u64)> = Vec::new();
    for &i in order {
        let i = i as usize;
        let (b, size) = (&buffers[i], sizes[i]);
        if size == 0 {
            continue;
        }
        let at = leaf(b.start);
        let lo = sorted_starts.partition_point(|&s| s <= b.start);
        let hi = lo + sorted_starts[lo..].partition_point(|&s| s < b.end);
        // At most this many conflicts (unplaced buffers in lo..hi count too).
        let estimate = tree.count(at) + (hi - lo);
        let scan = match path {
            Path::Auto => estimate * (estimate.max(2).ilog2() as usize) > 4 * by_offset.len,
            #[cfg(test)]
            Path::Sort => false,
            #[cfg(test)]
            Path::Scan => true,
        };
        let offset = if scan {
            best_fit(
                by_offset
                    .iter()
                    .filter(|p| p.start < b.end && b.start < p.end)
                    .map(|p| (p.low, p.high)),
                size,
            )
        } else {
            conflicts.clear();
            // Placed buffers live at b.start: start <= b.start < end.
            tree.stab(at, |range| conflicts.push(range));
            // Placed buffers with b.start < start < b.end.
            conflicts.extend(ranges[lo..hi].iter().filter(|r| r.1 > 0));
            conflicts.sort_unstable_by_key(|r| r.0);
            best_fit(conflicts.iter().copied(), size)
        };
        let high = offset + size;
        offsets[i] = offset;
        ranges[position[i]] = (offset, high);
        tree.insert(at, leaf(b.end), (offset, high));
        by_offset.insert(Placed {
            low: offset,
            high,
            start: b.start,
            end: b.end,
        });
    }
    offsets
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

/// Intervals of leaf indexes, each stored at its canonical segment-tree nodes, so
/// that a point query visits one root-to-leaf path.
struct Stabbing {
    size: usize,
    nodes: Vec<Vec<(u64, u64)>>,
}

impl Stabbing {
    fn new(leaves: usize) -> Self {
        let size = leaves.next_power_of_two().max(1);
        Stabbing {
            size,
            nodes: vec![Vec::new(); 2 * size],
        }
    }

    /// Stores `item` for the leaves `lo..hi`.
    fn insert(&mut self, lo: usize, hi: usize, item: (u64, u64)) {
        let (mut l, mut r) = (lo + self.size, hi + self.size);
        while l < r {
            if l & 1 == 1 {
                self.nodes[l].push(item);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.nodes[r].push(item);
            }
            l >>= 1;
            r >>= 1;
        }
    }

    /// The indexes of the nodes on leaf `p`'s path to the root.
    fn path(&self, p: usize) -> impl Iterator<Item = usize> {
        std::iter::successors(Some(p + self.size), |&i| (i > 1).then_some(i / 2))
    }

    /// Calls `f` on every item stored for leaf `p`.
    fn stab(&self, p: usize, mut f: impl FnMut((u64, u64))) {
        for i in self.path(p) {
            self.nodes[i].iter().copied().for_each(&mut f);
        }
    }

    /// How many items are stored for leaf `p`.
    fn count(&self, p: usize) -> usize {
        self.path(p).map(|i| self.nodes[i].len()).sum()
    }
}

/// Placed buffers in address order: sorted blocks of bounded length, so that an
/// insertion moves at most a block.
#[derive(Default)]
struct ByOffset {
    blocks: Vec<Vec<Placed>>,
    len: usize,
}

impl ByOffset {
    const BLOCK: usize = 512;

    fn insert(&mut self, p: Placed) {
        self.len += 1;
        if self.blocks.is_empty() {
            self.blocks.push(vec![p]);
            return;
        }
        let b = self
            .blocks
            .partition_point(|block| block.last().is_some_and(|q| q.low < p.low))
            .min(self.blocks.len() - 1);
        let block = &mut self.blocks[b];
        let at = block.partition_point(|q| q.low < p.low);
        block.insert(at, p);
        if block.len() > Self::BLOCK {
            let tail = block.split_off(Self::BLOCK / 2);
            self.blocks.insert(b + 1, tail);
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Placed> {
        self.blocks.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::{ByOffset, Path, Placed, best_fit, place_in_order};
    use crate::memory::Buffer;

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
    fn by_offset_stays_sorted() {
        let mut index = ByOffset::default();
        let mut x = 12345u64;
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let low = (x >> 33) % 1000;
            index.insert(Placed {
                low,
                high: low + 1,
                start: 0,
                end: 1,
            });
        }
        assert_eq!(index.len, 5000);
        assert_eq!(index.iter().count(), 5000);
        assert!(
            index
                .iter()
                .zip(index.iter().skip(1))
                .all(|(a, b)| a.low <= b.low)
        );
    }

    #[test]
    fn both_conflict_paths_give_the_same_offsets() {
        let mut x = 99u64;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        for round in 0..20 {
            let horizon = if round % 2 == 0 { 100 } else { 10_000 };
            let buffers: Vec<Buffer> = (0..300)
                .map(|id| {
                    let start = next(horizon);
                    Buffer {
                        id,
                        bytes: 64 * (1 + next(50)),
                        start,
                        end: start + 1 + next(500),
                    }
                })
                .collect();
            let sizes: Vec<u64> = buffers.iter().map(|b| b.bytes).collect();
            let order: Vec<u32> = (0..300).rev().collect();
            let auto = place_in_order(&buffers, &sizes, &order, Path::Auto);
            assert_eq!(auto, place_in_order(&buffers, &sizes, &order, Path::Sort));
            assert_eq!(auto, place_in_order(&buffers, &sizes, &order, Path::Scan));
        }
    }
}
