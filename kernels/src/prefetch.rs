//! The cache-line request the memory-bound loops share.

/// Requests the cache lines of `items` (a hint: it neither faults nor changes a value).
pub(crate) fn prefetch_lines<T>(items: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = std::mem::size_of_val(items);
        let start = items.as_ptr().cast::<i8>();
        for offset in (0..bytes).step_by(64) {
            // SAFETY: a prefetch reads nothing architecturally and cannot fault; SSE is
            // part of every x86_64 target; the address lies inside `items`.
            #[allow(unsafe_code)]
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    start.wrapping_add(offset),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = items;
}
