//! The lower bound on any plan's peak: the most bytes live at one time.

use super::align::{align_up, validate_alignment};
use super::buffer::Buffer;
use super::error::MemoryError;

/// The most bytes live at any one time (raw sizes); no plan's peak is below it.
///
/// A sweep over the lifetimes' endpoints, `O(n log n)`. Buffers with an empty
/// lifetime are never live and count for nothing. Saturates at `u64::MAX`.
///
/// # Examples
/// ```
/// use hetsched_memplan::{Buffer, lower_bound};
/// let buffers = [
///     Buffer { id: 0, bytes: 10, start: 0, end: 5 },
///     Buffer { id: 1, bytes: 20, start: 4, end: 8 },
///     Buffer { id: 2, bytes: 40, start: 5, end: 6 }, // starts as buffer 0 ends
/// ];
/// assert_eq!(lower_bound(&buffers), 60);
/// assert_eq!(lower_bound(&[]), 0);
/// ```
pub fn lower_bound(buffers: &[Buffer]) -> u64 {
    sweep(buffers.iter().map(|b| (b.start, b.end, b.bytes)))
}

/// [`lower_bound`] with every size first rounded up to `alignment`: the bound for
/// plans that pack aligned sizes, as the planner's do.
///
/// # Examples
/// ```
/// use hetsched_memplan::{Buffer, aligned_lower_bound};
/// let buffers = [
///     Buffer { id: 0, bytes: 10, start: 0, end: 5 },
///     Buffer { id: 1, bytes: 20, start: 4, end: 8 },
/// ];
/// assert_eq!(aligned_lower_bound(&buffers, 16).unwrap(), 48);
/// assert!(aligned_lower_bound(&buffers, 3).is_err());
/// ```
pub fn aligned_lower_bound(buffers: &[Buffer], alignment: u64) -> Result<u64, MemoryError> {
    validate_alignment(alignment)?;
    let mut sizes = Vec::with_capacity(buffers.len());
    for b in buffers {
        sizes.push(align_up(b.bytes, alignment).ok_or(MemoryError::Overflow)?);
    }
    Ok(sweep(
        buffers.iter().zip(sizes).map(|(b, s)| (b.start, b.end, s)),
    ))
}

/// Max over time of the sum of `size` over live `[start, end)`; saturating.
fn sweep(intervals: impl Iterator<Item = (u64, u64, u64)>) -> u64 {
    // (time, is_start, size): at equal times ends (false) sort before starts.
    let mut events: Vec<(u64, bool, u64)> = Vec::new();
    for (start, end, size) in intervals {
        if end > start {
            events.push((start, true, size));
            events.push((end, false, size));
        }
    }
    events.sort_unstable();
    let (mut live, mut peak) = (0u128, 0u128);
    for (_, is_start, size) in events {
        if is_start {
            live += u128::from(size);
            peak = peak.max(live);
        } else {
            live -= u128::from(size);
        }
    }
    u64::try_from(peak).unwrap_or(u64::MAX)
}
