//! The planner's data: buffers in, placements and a plan out.

use serde::{Deserialize, Serialize};

use super::strategy::Strategy;

/// A buffer to place: its size and its lifetime, the half-open interval `[start, end)`.
///
/// Times are in any `u64` unit (the scheduler uses ns of its schedule). The buffer is
/// live at every time `t` with `start <= t < end`, so a buffer ending at `t` and one
/// starting at `t` do not conflict and may share bytes. Planning needs `end > start`.
///
/// # Examples
/// ```
/// use hetsched_memplan::Buffer;
/// let a = Buffer { id: 0, bytes: 4096, start: 0, end: 100 };
/// let b = Buffer { id: 1, bytes: 4096, start: 100, end: 200 };
/// assert!(!a.overlaps_in_time(&b));
/// assert_eq!(a.lifetime(), 100);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Buffer {
    /// Caller's id; carried into the plan, need not be unique or dense.
    pub id: u32,
    /// Size in bytes.
    pub bytes: u64,
    /// First time the buffer is live (inclusive).
    pub start: u64,
    /// First time after `start` the buffer is no longer live (exclusive).
    pub end: u64,
}

impl Buffer {
    /// Whether the two lifetimes intersect (both taken as half-open intervals).
    ///
    /// # Examples
    /// ```
    /// use hetsched_memplan::Buffer;
    /// let a = Buffer { id: 0, bytes: 1, start: 0, end: 10 };
    /// assert!(a.overlaps_in_time(&Buffer { id: 1, bytes: 1, start: 9, end: 20 }));
    /// assert!(!a.overlaps_in_time(&Buffer { id: 2, bytes: 1, start: 10, end: 20 }));
    /// ```
    pub fn overlaps_in_time(&self, other: &Buffer) -> bool {
        self.start < other.end
            && other.start < self.end
            && self.start < self.end
            && other.start < other.end
    }

    /// Length of the lifetime, `end - start` (0 when empty).
    ///
    /// # Examples
    /// ```
    /// use hetsched_memplan::Buffer;
    /// assert_eq!(Buffer { id: 0, bytes: 1, start: 5, end: 8 }.lifetime(), 3);
    /// ```
    pub fn lifetime(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// Where one buffer goes: its byte offset from the start of the region's arena.
///
/// # Examples
/// ```
/// use hetsched_memplan::{Buffer, plan_offsets};
/// let plan = plan_offsets(&[Buffer { id: 7, bytes: 10, start: 0, end: 1 }], 16).unwrap();
/// assert_eq!(plan.placements[0].id, 7);
/// assert_eq!(plan.placements[0].offset, 0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// The buffer's id.
    pub id: u32,
    /// Byte offset; a multiple of the plan's alignment.
    pub offset: u64,
}

/// An offset for every buffer, and the arena size that needs.
///
/// `placements[i]` belongs to the `i`-th buffer given to the planner.
///
/// # Examples
/// ```
/// use hetsched_memplan::{Buffer, Strategy, plan_with};
/// let buffers = [
///     Buffer { id: 0, bytes: 100, start: 0, end: 2 },
///     Buffer { id: 1, bytes: 100, start: 1, end: 3 },
/// ];
/// let plan = plan_with(&buffers, 64, Strategy::GreedyBySize).unwrap();
/// assert_eq!(plan.peak_bytes, 256); // two live at once, each rounded up to 128
/// assert_eq!(plan.offset(1), 128);
/// assert_eq!(plan.strategy, Strategy::GreedyBySize);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// One placement per buffer, in the order the buffers were given.
    pub placements: Vec<Placement>,
    /// Arena size: the largest `offset + aligned size` (0 with no buffers).
    pub peak_bytes: u64,
    /// The strategy that made the plan.
    pub strategy: Strategy,
    /// The alignment of every offset and of every size when packed.
    pub alignment: u64,
}

impl MemoryPlan {
    /// Offset of the `index`-th buffer given to the planner.
    ///
    /// # Panics
    /// If `index` is out of range.
    ///
    /// # Examples
    /// ```
    /// use hetsched_memplan::{Buffer, plan_offsets};
    /// let plan = plan_offsets(&[Buffer { id: 3, bytes: 1, start: 0, end: 1 }], 1).unwrap();
    /// assert_eq!(plan.offset(0), 0);
    /// ```
    pub fn offset(&self, index: usize) -> u64 {
        self.placements[index].offset
    }
}
