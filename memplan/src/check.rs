//! Verifying a plan against its buffers.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::align::aligned_sizes;
use super::bound::lower_bound;
use super::buffer::{Buffer, MemoryPlan};

/// Checks `plan` for `buffers`: one placement per buffer with its id, every offset a
/// multiple of `alignment`, no two buffers with intersecting lifetimes overlapping in
/// their aligned address ranges, `peak_bytes` the largest `offset + aligned size`,
/// and the peak at least [`lower_bound`]. `O(n log n)`.
///
/// # Errors
/// A message naming the first violation found.
///
/// # Examples
/// ```
/// use hetsched_memplan::{Buffer, check_plan, plan_offsets};
/// let buffers = [
///     Buffer { id: 0, bytes: 100, start: 0, end: 10 },
///     Buffer { id: 1, bytes: 100, start: 5, end: 15 },
/// ];
/// let mut plan = plan_offsets(&buffers, 64).unwrap();
/// check_plan(&buffers, &plan, 64).unwrap();
/// plan.placements[1].offset = 64; // now overlaps buffer 0
/// assert!(check_plan(&buffers, &plan, 64).is_err());
/// ```
pub fn check_plan(buffers: &[Buffer], plan: &MemoryPlan, alignment: u64) -> Result<(), String> {
    let sizes = aligned_sizes(buffers, alignment).map_err(|e| e.to_string())?;
    if plan.placements.len() != buffers.len() {
        return Err(format!(
            "plan has {} placements for {} buffers",
            plan.placements.len(),
            buffers.len()
        ));
    }
    let peak = placements_peak(buffers, plan, &sizes, alignment)?;
    if plan.peak_bytes != peak {
        return Err(format!(
            "plan says peak {} bytes, placements reach {peak}",
            plan.peak_bytes
        ));
    }
    let bound = lower_bound(buffers);
    if peak < bound {
        return Err(format!("peak {peak} is below the lower bound {bound}"));
    }
    check_overlaps(buffers, plan, &sizes)
}

/// Checks each placement's id and alignment, and returns the highest aligned end among
/// them: the peak the plan must state.
fn placements_peak(
    buffers: &[Buffer],
    plan: &MemoryPlan,
    sizes: &[u64],
    alignment: u64,
) -> Result<u64, String> {
    let mut peak = 0u64;
    for (i, (b, p)) in buffers.iter().zip(&plan.placements).enumerate() {
        if p.id != b.id {
            return Err(format!(
                "placement {i} has id {}, buffer {i} has id {}",
                p.id, b.id
            ));
        }
        if p.offset % alignment != 0 {
            return Err(format!(
                "buffer {} at offset {} is not aligned to {alignment}",
                b.id, p.offset
            ));
        }
        let end = p
            .offset
            .checked_add(sizes[i])
            .ok_or_else(|| format!("buffer {} at offset {} overflows u64", b.id, p.offset))?;
        peak = peak.max(end);
    }
    Ok(peak)
}

/// Checks that no two buffers live at the same time overlap in their aligned ranges.
fn check_overlaps(buffers: &[Buffer], plan: &MemoryPlan, sizes: &[u64]) -> Result<(), String> {
    // Sweep by start; `live` holds the live non-empty ranges, disjoint if the plan is
    // valid, keyed by offset, so a new range need only be checked against its
    // neighbours.
    let mut order: Vec<usize> = (0..buffers.len()).filter(|&i| sizes[i] > 0).collect();
    order.sort_unstable_by_key(|&i| buffers[i].start);
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    let mut ends: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    for i in order {
        let b = &buffers[i];
        while let Some(&Reverse((end, j))) = ends.peek() {
            if end > b.start {
                break;
            }
            ends.pop();
            live.remove(&plan.placements[j].offset);
        }
        let (lo, hi) = (
            plan.placements[i].offset,
            plan.placements[i].offset + sizes[i],
        );
        let clash = |j: usize| {
            format!(
                "buffers {} and {} are live together and overlap in address: [{lo}, {hi}) and [{}, {})",
                b.id,
                buffers[j].id,
                plan.placements[j].offset,
                plan.placements[j].offset + sizes[j]
            )
        };
        if let Some((_, &j)) = live.range(..=lo).next_back()
            && plan.placements[j].offset + sizes[j] > lo
        {
            return Err(clash(j));
        }
        if let Some((_, &j)) = live.range(lo..).next()
            && plan.placements[j].offset < hi
        {
            return Err(clash(j));
        }
        live.insert(lo, i);
        ends.push(Reverse((b.end, i)));
    }
    Ok(())
}
