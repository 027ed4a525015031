//! Which addresses placed buffers take, by time: the conflict index of the planner.
//!
//! Time is cut at the buffers' distinct start times (the leaves). Two lifetimes
//! intersect iff they share a leaf: the later of the two starts lies in both. A buffer
//! covers the leaves `lo..hi` of the starts in `[start, end)`; a segment tree over the
//! leaves stores its address range at the `O(log n)` nodes that tile `lo..hi`.
//!
//! Each node keeps two *merged* address sets (sorted, disjoint, touching ranges
//! joined): `own`, the ranges of the buffers stored at the node, and `below`, those of
//! every buffer stored at the node or under it. The buffers whose lifetimes intersect
//! a window `lo..hi` are those stored under one of the window's tiling nodes, or at a
//! node above one (a node whose leaves reach outside the window), so the union of
//! their address ranges is the union of the tiling nodes' `below` and the overhanging
//! nodes' `own`: `O(log n)` sets, each already merged, in place of every conflicting
//! buffer. Address sets stay short because neighbouring buffers merge.

/// Sorted, disjoint, non-touching address ranges `[low, high)`.
#[derive(Clone, Debug, Default)]
struct AddressSet(Vec<(u64, u64)>);

impl AddressSet {
    /// Adds `[low, high)`, joining the ranges it overlaps or touches.
    fn insert(&mut self, low: u64, high: u64) {
        let v = &mut self.0;
        // The first range that ends at or after `low`: it may touch or overlap.
        let a = v.partition_point(|r| r.1 < low);
        if a == v.len() || v[a].0 > high {
            v.insert(a, (low, high));
            return;
        }
        let b = a + v[a..].partition_point(|r| r.0 <= high);
        v[a] = (v[a].0.min(low), v[b - 1].1.max(high));
        v.drain(a + 1..b);
    }
}

/// The segment tree over start times; see the module doc.
#[derive(Debug, Default)]
pub(super) struct Occupancy {
    /// Leaves, a power of two (at least the distinct starts).
    size: usize,
    /// Per node (1-based heap order): ranges stored at the node.
    own: Vec<AddressSet>,
    /// Per node: ranges stored at the node or under it.
    below: Vec<AddressSet>,
    /// Scratch: the current window's tiling nodes and overhanging nodes.
    tiles: Vec<usize>,
    overhang: Vec<usize>,
}

impl Occupancy {
    /// An empty index over `leaves` leaves, reusing this one's allocations.
    pub(super) fn reset(&mut self, leaves: usize) {
        let size = leaves.next_power_of_two().max(1);
        self.size = size;
        for set in self.own.iter_mut().chain(self.below.iter_mut()) {
            set.0.clear();
        }
        self.own.resize(2 * size, AddressSet::default());
        self.below.resize(2 * size, AddressSet::default());
    }

    /// Selects the window of leaves `lo..hi` (non-empty) for [`Occupancy::taken`] and
    /// [`Occupancy::insert`].
    pub(super) fn select(&mut self, lo: usize, hi: usize) {
        debug_assert!(lo < hi && hi <= self.size);
        self.tiles.clear();
        let (mut l, mut r) = (lo + self.size, hi + self.size);
        while l < r {
            if l & 1 == 1 {
                self.tiles.push(l);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.tiles.push(r);
            }
            l >>= 1;
            r >>= 1;
        }
        // Nodes above a tiling node lie on the paths from the window's first and last
        // leaves to the root; of those, the ones whose leaves reach outside the window.
        self.overhang.clear();
        let (mut a, mut b) = ((lo + self.size) >> 1, (hi - 1 + self.size) >> 1);
        let mut level = 1;
        while a >= 1 {
            let span = 1usize << level;
            for node in [a, b] {
                let first = (node << level) - self.size;
                if (first < lo || first + span > hi) && self.overhang.last() != Some(&node) {
                    self.overhang.push(node);
                }
            }
            a >>= 1;
            b >>= 1;
            level += 1;
        }
    }

    /// The merged address sets whose union is every range taken during the selected
    /// window (each sorted by address; together they may overlap).
    pub(super) fn taken(&self) -> impl Iterator<Item = &[(u64, u64)]> + Clone {
        let below = self.tiles.iter().map(|&v| self.below[v].0.as_slice());
        let own = self.overhang.iter().map(|&v| self.own[v].0.as_slice());
        below.chain(own)
    }

    /// Records `[low, high)` as taken during the selected window.
    pub(super) fn insert(&mut self, low: u64, high: u64) {
        for &v in &self.tiles {
            // A leaf's `own` is never read: no leaf overhangs a window.
            if v < self.size {
                self.own[v].insert(low, high);
            }
            self.below[v].insert(low, high);
        }
        for &v in &self.overhang {
            self.below[v].insert(low, high);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{AddressSet, Occupancy};

    #[test]
    fn address_sets_join_touching_and_overlapping_ranges() {
        let mut set = AddressSet::default();
        set.insert(10, 20);
        set.insert(30, 40);
        set.insert(50, 60);
        assert_eq!(set.0, [(10, 20), (30, 40), (50, 60)]);
        set.insert(20, 25); // touches the first
        assert_eq!(set.0, [(10, 25), (30, 40), (50, 60)]);
        set.insert(35, 50); // overlaps one, touches the next
        assert_eq!(set.0, [(10, 25), (30, 60)]);
        set.insert(0, 5);
        set.insert(12, 14); // inside
        assert_eq!(set.0, [(0, 5), (10, 25), (30, 60)]);
        set.insert(0, 100);
        assert_eq!(set.0, [(0, 100)]);
    }

    /// Every range inserted for a window that shares a leaf with the query window is
    /// in the union of `taken`, and no other.
    #[test]
    fn taken_is_the_union_over_intersecting_windows() {
        let leaves = 13;
        let mut x = 7u64;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % m) as usize
        };
        let mut index = Occupancy::default();
        index.reset(leaves);
        let mut stored: Vec<(usize, usize, u64)> = Vec::new();
        for k in 0..200u64 {
            let lo = next(leaves as u64);
            let hi = lo + 1 + next((leaves - lo) as u64);
            // Disjoint addresses, so the union tells exactly which ranges are in it.
            index.select(lo, hi);
            let mut covered: Vec<u64> = index
                .taken()
                .flat_map(|s| s.iter().flat_map(|&(a, b)| (a..b).step_by(10)))
                .collect();
            covered.sort_unstable();
            covered.dedup();
            let mut expected: Vec<u64> = stored
                .iter()
                .filter(|&&(l, h, _)| l < hi && lo < h)
                .map(|&(_, _, a)| a)
                .collect();
            expected.sort_unstable();
            assert_eq!(covered, expected, "window {lo}..{hi}");
            index.insert(10 * k, 10 * k + 10);
            stored.push((lo, hi, 10 * k));
        }
    }
}
