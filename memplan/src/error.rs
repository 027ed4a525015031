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
    /// A region's budget cannot hold even one chunk next to the KV cache: the prefill
    /// could never finish, so it is refused before it starts.
    #[error(
        "memory budget of region `{region}` is {available} bytes but the prefill needs at least \
         {needed} bytes there (KV cache {kv_cache} + shadow weights {shadow_weights} + one \
         chunk's peak {chunk_peak}); raise the \
         budget to at least {needed} bytes, use shorter chunks, or shorten the prompt"
    )]
    NeverFits {
        /// The region (processor name).
        region: String,
        /// The least budget that works.
        needed: u64,
        /// The budget given.
        available: u64,
        /// KV cache bytes in the region.
        kv_cache: u64,
        /// Resident outlier-shadow weight rows in the region.
        shadow_weights: u64,
        /// The most one chunk holds in the region.
        chunk_peak: u64,
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
