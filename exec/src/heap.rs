//! The C allocator told to keep freed memory for the next job instead of returning it to
//! the operating system.
//!
//! A prefill's jobs allocate their outputs afresh (a chunk's gate and up accumulators are
//! 768 KiB each) and free them a stage later. glibc's defaults hand such blocks back to
//! the kernel (each above the adaptive mmap threshold is its own mapping, and the heap
//! top is trimmed beyond twice that): SmolLM2's pp512 took ~6,000 page faults per
//! prefill, every freed mapping a TLB shootdown of the other worker's core, and the next
//! job zeroing fresh pages. With the thresholds raised it takes ~750, and 1 thread ran
//! 3-4% faster, 2 threads within the noise of a shared machine (docs/real-execution.md,
//! "Thread scaling"). The cost: up to [`TRIM_THRESHOLD`] of freed memory
//! stays with the process.
//! Both thresholds must be set: setting one turns off glibc's adaptive rule for both,
//! and either alone faulted 5-7x *more*.
//!
//! A process that goes idle between bursts of work (a server between requests) gives
//! what was kept back with [`release_free_memory`]; otherwise its resident memory stays
//! at its busiest moment's for as long as it runs.

/// Blocks up to this size come from the heap, not from a mapping of their own (glibc's
/// largest accepted value on 64-bit targets: `HEAP_MAX_SIZE / 2`).
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// Free memory at the heap top kept before it is returned to the kernel.
pub const TRIM_THRESHOLD: usize = 256 << 20;

/// Applies [`MMAP_THRESHOLD`] and [`TRIM_THRESHOLD`] once per process; returns whether
/// the allocator took them (false where the C library is not glibc).
pub fn retain_freed_memory() -> bool {
    static APPLIED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *APPLIED.get_or_init(apply)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    let set = |param, value: usize| {
        let value = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
        // reason: an FFI call. SAFETY: `mallopt` only changes the allocator's tuning
        // parameters, under its own lock; it is safe to call from any thread at any time.
        #[allow(unsafe_code)]
        let accepted = unsafe { libc::mallopt(param, value) };
        accepted == 1
    };
    set(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) && set(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    false
}

/// Returns the allocator's free memory to the operating system now: every arena's free
/// pages, not only each heap's top (glibc's `malloc_trim(0)`), so what the thread
/// queues' allocator settings kept for the next job leaves the process. For a process
/// going idle; the next job's buffers fault their pages in again. Returns whether any
/// memory was released (false where the C library is not glibc).
pub fn release_free_memory() -> bool {
    trim()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // reason: an FFI call. SAFETY: `malloc_trim` only returns free pages to the kernel,
    // under each arena's own lock; live allocations are untouched and it is safe to call
    // from any thread at any time.
    #[allow(unsafe_code)]
    let released = unsafe { libc::malloc_trim(0) };
    released == 1
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_accepts_both_thresholds() {
        assert!(retain_freed_memory(), "mallopt refused a threshold");
        // Once per process: a second call reports the first one's result.
        assert!(retain_freed_memory());
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_memory_kept_back_is_released_on_request() {
        retain_freed_memory();
        // Blocks below the mmap threshold come from the heap and stay when freed.
        let blocks: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 1 << 20]).collect();
        drop(blocks);
        assert!(release_free_memory(), "64 MiB freed and nothing released");
    }
}
