//! Checking a plan against the bytes a region has.

use super::buffer::MemoryPlan;
use super::error::MemoryError;

/// Whether `plan` fits in a region of `capacity` bytes.
///
/// # Errors
/// [`MemoryError::BudgetExceeded`] with the bytes needed and available.
///
/// # Examples
/// ```
/// use hetsched_memplan::{Buffer, MemoryError, fits, plan_offsets};
/// let plan = plan_offsets(&[Buffer { id: 0, bytes: 3000, start: 0, end: 1 }], 1024).unwrap();
/// assert!(fits(&plan, 3072).is_ok());
/// assert_eq!(
///     fits(&plan, 2048),
///     Err(MemoryError::BudgetExceeded { needed: 3072, available: 2048 })
/// );
/// ```
pub fn fits(plan: &MemoryPlan, capacity: u64) -> Result<(), MemoryError> {
    if plan.peak_bytes <= capacity {
        Ok(())
    } else {
        Err(MemoryError::BudgetExceeded {
            needed: plan.peak_bytes,
            available: capacity,
        })
    }
}
