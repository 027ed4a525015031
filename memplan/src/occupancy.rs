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
//!
//! The overhanging nodes of a window are the upper parts of the paths from its first
//! and last leaves to the root (a node that reaches outside the window has parents
//! that do too). Their `own` sets hold most of what is live across the window, split
//! over many levels, and each alone is fragmented (a subset of a packed arena), so the
//! index caches, per node, `path`: the union of `own` over the node and its ancestors,
//! one merged set that is about as short as the live set it covers. A cached `path` is
//! rebuilt from its parent's only when an `own` on its path has changed since it was
//! built (each node carries the time of its last `own` insertion; a `path` the latest
//! such time on its path when built), so the window reads two `path` sets in place of
//! the overhanging nodes' `own`.

use smallvec::SmallVec;

use super::address::{Addr, union_into};

/// Ranges an address set holds without a heap allocation: most nodes hold a few (the
/// low levels, which are most nodes), and allocating, growing and freeing their sets
/// one by one was about a sixth of the planner's time. 4 measured best at 1024/1
/// (process CPU, medians of 5, interleaved: 2.53 s with none, 2.52 with 2, 2.43-2.45
/// with 4, 2.57 with 8: larger nodes cost more to touch than they save).
const INLINE: usize = 4;

/// Sorted, disjoint, non-touching address ranges `[low, high)`.
#[derive(Clone, Debug)]
struct AddressSet<A>(SmallVec<[(A, A); INLINE]>);

impl<A: Addr> AddressSet<A> {
    /// Adds `[low, high)`, joining the ranges it overlaps or touches.
    fn insert(&mut self, low: A, high: A) {
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

    /// As [`AddressSet::insert`]; returns whether the set changed (false when it held
    /// every address of `[low, high)` already).
    fn insert_new(&mut self, low: A, high: A) -> bool {
        let v = &self.0;
        let a = v.partition_point(|r| r.1 < low);
        if a < v.len() && v[a].0 <= low && high <= v[a].1 {
            return false;
        }
        self.insert(low, high);
        true
    }
}

impl<A> Default for AddressSet<A> {
    fn default() -> Self {
        AddressSet(SmallVec::new())
    }
}

/// The segment tree over start times; see the module doc.
#[derive(Debug)]
pub(super) struct Occupancy<A> {
    /// Leaves, a power of two (at least the distinct starts).
    size: usize,
    /// Per node (1-based heap order): ranges stored at the node.
    own: Vec<AddressSet<A>>,
    /// Per node: ranges stored at the node or under it.
    below: Vec<AddressSet<A>>,
    /// Per node: the union of `own` over the node and its ancestors, as of `path_time`.
    path: Vec<Vec<(A, A)>>,
    /// Per node: the latest `own_time` on its path when its `path` was built.
    path_time: Vec<u64>,
    /// Per node: the insertion count at its last `own` insertion (0: none since reset).
    own_time: Vec<u64>,
    /// Insertions since the last reset.
    clock: u64,
    /// Scratch: the current window's tiling nodes, and the lowest overhanging node on
    /// the paths from its first and last leaves (the same node, or none, at times).
    tiles: Vec<usize>,
    overhang: Vec<usize>,
    /// Scratch: the nodes whose `path` sets cover the overhanging nodes' `own`.
    above: Vec<usize>,
}

impl<A> Default for Occupancy<A> {
    fn default() -> Self {
        Occupancy {
            size: 0,
            own: Vec::new(),
            below: Vec::new(),
            path: Vec::new(),
            path_time: Vec::new(),
            own_time: Vec::new(),
            clock: 0,
            tiles: Vec::new(),
            overhang: Vec::new(),
            above: Vec::new(),
        }
    }
}

impl<A: Addr> Occupancy<A> {
    /// An empty index over `leaves` leaves, reusing this one's allocations.
    pub(super) fn reset(&mut self, leaves: usize) {
        let size = leaves.next_power_of_two().max(1);
        self.size = size;
        for set in self.own.iter_mut().chain(self.below.iter_mut()) {
            set.0.clear();
        }
        for set in &mut self.path {
            set.clear();
        }
        self.own.resize(2 * size, AddressSet::default());
        self.below.resize(2 * size, AddressSet::default());
        self.path.resize(2 * size, Vec::new());
        self.path_time.clear();
        self.path_time.resize(2 * size, 0);
        self.own_time.clear();
        self.own_time.resize(2 * size, 0);
        self.clock = 0;
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
        // leaves to the root; of those, the ones whose leaves reach outside the window:
        // on each path, the lowest such node and every node above it.
        self.overhang.clear();
        for leaf in [lo, hi - 1] {
            let (mut node, mut level) = ((leaf + self.size) >> 1, 1);
            while node >= 1 {
                let first = (node << level) - self.size;
                if first < lo || first + (1usize << level) > hi {
                    if !self.overhang.contains(&node) {
                        self.overhang.push(node);
                    }
                    break;
                }
                node >>= 1;
                level += 1;
            }
        }
        self.above.clear();
        for k in 0..self.overhang.len() {
            if let Some(v) = self.refresh_path(self.overhang[k])
                && !self.above.contains(&v)
            {
                self.above.push(v);
            }
        }
    }

    /// Brings `path` up to date on the ancestors-or-self of `node` whose `own` is not
    /// empty (a node with an empty `own` would copy its parent's), root first; returns
    /// the lowest of them, whose `path` is then the union of `own` over `node` and its
    /// ancestors (none if all are empty). A `path` is rebuilt, from the one above it
    /// and its `own`, only if an `own` on its path changed after it was built.
    fn refresh_path(&mut self, node: usize) -> Option<usize> {
        let mut latest = 0;
        let mut above: Option<usize> = None;
        for depth in (0..=node.ilog2()).rev() {
            let v = node >> depth;
            if self.own_time[v] == 0 {
                continue;
            }
            latest = latest.max(self.own_time[v]);
            if self.path_time[v] != latest {
                let mut rebuilt = std::mem::take(&mut self.path[v]);
                match above {
                    Some(u) => union_into(&self.path[u], &self.own[v].0, &mut rebuilt),
                    None => {
                        rebuilt.clear();
                        rebuilt.extend_from_slice(&self.own[v].0);
                    }
                }
                self.path[v] = rebuilt;
                self.path_time[v] = latest;
            }
            above = Some(v);
        }
        above
    }

    /// The merged address sets whose union is every range taken during the selected
    /// window (each sorted by address; together they may overlap).
    pub(super) fn taken(&self) -> impl Iterator<Item = &[(A, A)]> + Clone {
        let below = self.tiles.iter().map(|&v| self.below[v].0.as_slice());
        let above = self.above.iter().map(|&v| self.path[v].as_slice());
        below.chain(above)
    }

    /// Records `[low, high)` as taken during the selected window.
    pub(super) fn insert(&mut self, low: A, high: A) {
        self.clock += 1;
        for &v in &self.tiles {
            // A leaf's `own` is never read: no leaf overhangs a window.
            if v < self.size {
                self.own[v].insert(low, high);
                self.own_time[v] = self.clock;
            }
            self.below[v].insert(low, high);
        }
        // Every ancestor of a tiling node: the overhanging nodes and all above them.
        for &v in &self.overhang {
            let mut node = v;
            while node >= 1 {
                let set = &mut self.below[node];
                // Two paths meet at a common ancestor: insert there once per path is
                // harmless (an address set absorbs a range it holds), but stop early.
                if !set.insert_new(low, high) {
                    break;
                }
                node >>= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{AddressSet, Occupancy};

    #[test]
    fn address_sets_join_touching_and_overlapping_ranges() {
        let mut set = AddressSet::<u64>::default();
        set.insert(10, 20);
        set.insert(30, 40);
        set.insert(50, 60);
        assert_eq!(set.0.as_slice(), [(10, 20), (30, 40), (50, 60)]);
        set.insert(20, 25); // touches the first
        assert_eq!(set.0.as_slice(), [(10, 25), (30, 40), (50, 60)]);
        set.insert(35, 50); // overlaps one, touches the next
        assert_eq!(set.0.as_slice(), [(10, 25), (30, 60)]);
        set.insert(0, 5);
        set.insert(12, 14); // inside
        assert_eq!(set.0.as_slice(), [(0, 5), (10, 25), (30, 60)]);
        set.insert(0, 100);
        assert_eq!(set.0.as_slice(), [(0, 100)]);
    }

    /// Every range inserted for a window that shares a leaf with the query window is
    /// in the union of `taken`, and no other.
    /// (Several leaf counts and many insertions, so that the cached `path` sets are
    /// rebuilt and reused at every level.)
    #[test]
    fn taken_is_the_union_over_intersecting_windows() {
        for leaves in [1, 2, 13, 64, 100] {
            taken_matches_the_definition(leaves, 7 + leaves as u64);
        }
    }

    fn taken_matches_the_definition(leaves: usize, seed: u64) {
        let mut x = seed;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % m) as usize
        };
        let mut index = Occupancy::default();
        index.reset(leaves);
        let mut stored: Vec<(usize, usize, u64)> = Vec::new();
        for k in 0..600u64 {
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
