//! The memory-bandwidth limit of decoding: how fast this machine streams a buffer far
//! larger than its last-level cache, read once per pass by `threads` threads on disjoint
//! halves (as a decode step's linears stream disjoint weight columns), each requesting
//! its lines ahead as the decode kernels do ([`hetsched_kernels::stream_read_sum`]).
//!
//! A decode step reads every weight once, so its speed is bounded by
//! `bandwidth / weight bytes per token`; [`ReadBandwidth`] is that bandwidth, measured,
//! and `hetsched generate --json` divides a run's achieved bytes per second by it.

use std::hint::black_box;
use std::time::Instant;

use hetsched_kernels::stream_read_sum;

use crate::ExecError;

/// Bytes the probe streams per pass at least: 8× a 32 MiB last-level cache, so that
/// every pass reads from memory, not from the cache.
pub const DEFAULT_PROBE_BYTES: usize = 256 << 20;
/// The most threads a probe starts (each lives for the whole probe, and a thread the OS
/// cannot start would panic in its spawn, not return an error).
pub const MAX_PROBE_THREADS: usize = 1024;
/// The most passes a probe times (each a read of the whole buffer).
pub const MAX_PROBE_PASSES: usize = 1000;
/// The most bytes [`probe_bytes`] asks for, whatever the cache.
const MAX_PROBE_BYTES: usize = 2 << 30;

/// Bytes for a probe that reads memory on this machine: 4× the largest cache the kernel
/// reports (`/sys/devices/system/cpu/cpu0/cache`), at least [`DEFAULT_PROBE_BYTES`], at
/// most 2 GiB. Some 2-core machines this project runs on have a 480 MiB last-level cache,
/// which a 256 MiB buffer fits in.
pub fn probe_bytes() -> usize {
    let largest = largest_cache_bytes().unwrap_or(0);
    largest
        .saturating_mul(4)
        .clamp(DEFAULT_PROBE_BYTES, MAX_PROBE_BYTES)
}

/// The largest cache of CPU 0 that sysfs lists (`size` as `32768K`), if any.
fn largest_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|entry| {
        let size = std::fs::read_to_string(entry.ok()?.path().join("size")).ok()?;
        parse_cache_size(&size)
    })
    .max()
}

/// `32768K`, `480M` or `65536` (bytes) as bytes; `None` for anything else.
fn parse_cache_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().last()? {
        (i, 'K') => (&text[..i], 1 << 10),
        (i, 'M') => (&text[..i], 1 << 20),
        (i, 'G') => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

/// A measured streaming-read bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ReadBandwidth {
    /// Threads that read (disjoint parts of the buffer).
    pub threads: usize,
    /// Bytes of the buffer, read once per pass.
    pub bytes: usize,
    /// Passes timed (after one untimed pass that warms the threads).
    pub passes: usize,
    /// The median pass, bytes per second / 1e9.
    pub median_gb_s: f64,
    /// The fastest pass, bytes per second / 1e9.
    pub best_gb_s: f64,
}

/// Streams a `bytes`-byte buffer `passes` times with `threads` threads, each reading
/// its own contiguous part, and returns the bandwidth of the median and the fastest
/// pass. The buffer is written once before timing (its pages faulted in).
///
/// # Errors
/// [`ExecError::Kernel`] when `threads`, `passes` or `bytes` is 0, `threads` is above
/// [`MAX_PROBE_THREADS`] or `passes` above [`MAX_PROBE_PASSES`], `bytes` is less than 64
/// bytes a thread, or the buffer cannot be allocated.
pub fn measure_read_bandwidth(
    threads: usize,
    bytes: usize,
    passes: usize,
) -> Result<ReadBandwidth, ExecError> {
    let invalid = |what: String| Err(ExecError::Kernel(format!("bandwidth probe: {what}")));
    if threads == 0 || passes == 0 {
        return invalid(format!(
            "needs threads and passes (got {threads} and {passes})"
        ));
    }
    if threads > MAX_PROBE_THREADS || passes > MAX_PROBE_PASSES {
        return invalid(format!(
            "at most {MAX_PROBE_THREADS} threads and {MAX_PROBE_PASSES} passes (got {threads} and {passes})"
        ));
    }
    let words = bytes / 8;
    if words < 8 * threads {
        return invalid(format!("{bytes} bytes is too small for {threads} threads"));
    }
    let mut buffer: Vec<u64> = Vec::new();
    if buffer.try_reserve_exact(words).is_err() {
        return invalid(format!("cannot allocate {bytes} bytes"));
    }
    buffer.extend((0..words as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let part = words.div_ceil(threads);
    // The threads start once and meet at a barrier before and after each pass, so a pass
    // times the reads alone, not the threads' start (a thread spawned per pass read
    // 0.93-1.00x as much at 2 threads, 4 interleaved runs on the 2-core EPYC). As many
    // parties as parts: `chunks` may make fewer parts than threads.
    let parts: Vec<&[u64]> = buffer.chunks(part).collect();
    let barrier = std::sync::Barrier::new(parts.len());
    let mut seconds = Vec::with_capacity(passes);
    std::thread::scope(|scope| {
        let (first, rest) = parts
            .split_first()
            .map_or((&[][..], &[][..]), |(f, r)| (*f, r));
        for &chunk in rest {
            let barrier = &barrier;
            scope.spawn(move || {
                for _ in 0..=passes {
                    barrier.wait();
                    black_box(stream_read_sum(chunk));
                    barrier.wait();
                }
            });
        }
        // This thread reads the first part and keeps the time; the first pass faults
        // nothing in (the buffer was written) but warms the threads, and is not kept.
        for pass in 0..=passes {
            barrier.wait();
            let started = Instant::now();
            black_box(stream_read_sum(first));
            barrier.wait();
            if pass > 0 {
                seconds.push(started.elapsed().as_secs_f64());
            }
        }
    });
    seconds.sort_by(f64::total_cmp);
    let gb_s = |s: f64| (words * 8) as f64 / s.max(1e-9) / 1e9;
    Ok(ReadBandwidth {
        threads,
        bytes: words * 8,
        passes,
        median_gb_s: gb_s(seconds[seconds.len() / 2]),
        best_gb_s: gb_s(seconds[0]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("480M"), Some(480 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("65536"), Some(65536));
        for junk in ["", "K", "12Q", "-5K", "99999999999999999999G"] {
            assert_eq!(parse_cache_size(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn the_probe_outgrows_the_cache_within_bounds() {
        let bytes = probe_bytes();
        assert!(
            (DEFAULT_PROBE_BYTES..=MAX_PROBE_BYTES).contains(&bytes),
            "{bytes}"
        );
        if let Some(cache) = largest_cache_bytes() {
            assert!(
                bytes >= cache.saturating_mul(4).min(MAX_PROBE_BYTES),
                "{bytes} {cache}"
            );
        }
    }

    #[test]
    fn a_small_probe_reports_its_shape_and_a_positive_rate() {
        let b = measure_read_bandwidth(2, 1 << 16, 3).unwrap();
        assert_eq!((b.threads, b.bytes, b.passes), (2, 1 << 16, 3));
        assert!(b.best_gb_s >= b.median_gb_s && b.median_gb_s > 0.0, "{b:?}");
    }

    /// 129 words over 16 threads make 15 parts of 9 words: the passes meet as 15, not
    /// 16 (which would wait forever).
    #[test]
    fn fewer_parts_than_threads_still_finish() {
        let b = measure_read_bandwidth(16, 129 * 8, 2).unwrap();
        assert_eq!((b.threads, b.bytes, b.passes), (16, 129 * 8, 2));
        assert!(b.median_gb_s > 0.0, "{b:?}");
    }

    #[test]
    fn refuses_what_it_cannot_measure() {
        let too_many = [
            (MAX_PROBE_THREADS + 1, 1 << 30, 1),
            (usize::MAX, 1 << 16, 1),
            (2, 1 << 16, MAX_PROBE_PASSES + 1),
        ];
        for (threads, bytes, passes) in [(0, 1 << 16, 1), (2, 1 << 16, 0), (4, 64, 1)]
            .into_iter()
            .chain(too_many)
        {
            let error = measure_read_bandwidth(threads, bytes, passes).unwrap_err();
            assert!(error.to_string().contains("bandwidth probe"), "{error}");
        }
    }
}
