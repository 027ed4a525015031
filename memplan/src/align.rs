//! Alignment: validation and rounding up.

use super::error::MemoryError;

/// Checks that `alignment` is a power of two (1 included).
///
/// # Examples
/// ```
/// use hetsched_memplan::{MemoryError, validate_alignment};
/// assert!(validate_alignment(64).is_ok());
/// assert_eq!(validate_alignment(48), Err(MemoryError::BadAlignment(48)));
/// assert_eq!(validate_alignment(0), Err(MemoryError::BadAlignment(0)));
/// ```
pub fn validate_alignment(alignment: u64) -> Result<(), MemoryError> {
    if alignment.is_power_of_two() {
        Ok(())
    } else {
        Err(MemoryError::BadAlignment(alignment))
    }
}

/// Rounds `bytes` up to a multiple of `alignment` (a power of two); `None` on overflow.
///
/// # Examples
/// ```
/// use hetsched_memplan::align_up;
/// assert_eq!(align_up(100, 64), Some(128));
/// assert_eq!(align_up(128, 64), Some(128));
/// assert_eq!(align_up(0, 64), Some(0));
/// assert_eq!(align_up(u64::MAX, 2), None);
/// ```
pub fn align_up(bytes: u64, alignment: u64) -> Option<u64> {
    debug_assert!(alignment.is_power_of_two());
    let mask = alignment - 1;
    bytes.checked_add(mask).map(|b| b & !mask)
}

/// Validates `alignment` and every lifetime; returns each buffer's aligned size.
pub(super) fn aligned_sizes(
    buffers: &[super::Buffer],
    alignment: u64,
) -> Result<Vec<u64>, MemoryError> {
    validate_alignment(alignment)?;
    let mut total: u64 = 0;
    buffers
        .iter()
        .map(|b| {
            if b.end <= b.start {
                return Err(MemoryError::EmptyLifetime {
                    id: b.id,
                    start: b.start,
                    end: b.end,
                });
            }
            let size = align_up(b.bytes, alignment).ok_or(MemoryError::Overflow)?;
            total = total.checked_add(size).ok_or(MemoryError::Overflow)?;
            Ok(size)
        })
        .collect()
}
