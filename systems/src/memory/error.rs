//! Errors of memory planning: each says what was wrong and what to do.

use thiserror::Error;

/// Why a memory plan could not be made or does not fit.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MemoryError {
    /// The plan needs more bytes than the region has.
    #[error(
        "memory plan needs {needed} bytes but the region has {available} bytes \
         ({} bytes short); use shorter chunks, keep fewer chunks in flight, or give the region more memory",
        needed - available
    )]
    BudgetExceeded {
        /// Bytes the plan needs (its peak).
        needed: u64,
        /// Bytes the region has.
        available: u64,
    },
    /// The alignment is 0 or not a power of two.
    #[error("alignment {0} is not a power of two; use a power of two such as 1, 16, 64 or 4096")]
    BadAlignment(u64),
    /// A buffer's lifetime `[start, end)` is empty.
    #[error(
        "buffer {id} has an empty lifetime [{start}, {end}); give it `end > start` or leave it out"
    )]
    EmptyLifetime {
        /// The buffer's id.
        id: u32,
        /// Its start.
        start: u64,
        /// Its end.
        end: u64,
    },
    /// The aligned sizes do not fit in `u64`.
    #[error("the buffers' aligned sizes add up to more than u64::MAX bytes; split the plan")]
    Overflow,
}
