//! The memory-bandwidth limit of decoding: how fast this machine streams a buffer far
//! larger than its last-level cache, read once per pass by `threads` threads on disjoint
//! halves (as a decode step's linears stream disjoint weight columns).
//!
//! A decode step reads every weight once, so its speed is bounded by
//! `bandwidth / weight bytes per token`; [`ReadBandwidth`] is that bandwidth, measured,
//! and `hetsched generate --json` divides a run's achieved bytes per second by it.

use std::hint::black_box;
use std::time::Instant;

use crate::ExecError;

/// Bytes the probe streams per pass by default: 8× a 32 MiB last-level cache, so that
/// every pass reads from memory, not from the cache.
pub const DEFAULT_PROBE_BYTES: usize = 256 << 20;

/// A measured streaming-read bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ReadBandwidth {
    /// Threads that read (disjoint parts of the buffer).
    pub threads: usize,
    /// Bytes of the buffer, read once per pass.
    pub bytes: usize,
    /// Passes timed (after one untimed pass that faults the pages in).
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
/// [`ExecError::Kernel`] when `threads`, `passes` or `bytes` is 0, or `bytes` is less
/// than 64 bytes a thread, or the buffer cannot be allocated.
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
    let pass = || {
        let started = Instant::now();
        std::thread::scope(|scope| {
            for chunk in buffer.chunks(part) {
                scope.spawn(move || black_box(read_sum(chunk)));
            }
        });
        started.elapsed().as_secs_f64()
    };
    pass();
    let mut seconds: Vec<f64> = (0..passes).map(|_| pass()).collect();
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

/// The wrapping sum of `words` in eight independent lanes (vectorized by the compiler:
/// the loop is bound by the loads, not by one add chain).
fn read_sum(words: &[u64]) -> u64 {
    let (chunks, rest) = words.as_chunks::<8>();
    let mut lanes = [0u64; 8];
    for chunk in chunks {
        for (l, w) in lanes.iter_mut().zip(chunk) {
            *l = l.wrapping_add(*w);
        }
    }
    let tail = rest.iter().fold(0u64, |s, w| s.wrapping_add(*w));
    lanes.iter().fold(tail, |s, l| s.wrapping_add(*l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_reads_every_word() {
        let words: Vec<u64> = (1..=21).collect();
        assert_eq!(read_sum(&words), 21 * 22 / 2);
        assert_eq!(read_sum(&[u64::MAX, 2]), 1);
    }

    #[test]
    fn a_small_probe_reports_its_shape_and_a_positive_rate() {
        let b = measure_read_bandwidth(2, 1 << 16, 3).unwrap();
        assert_eq!((b.threads, b.bytes, b.passes), (2, 1 << 16, 3));
        assert!(b.best_gb_s >= b.median_gb_s && b.median_gb_s > 0.0, "{b:?}");
    }

    #[test]
    fn refuses_what_it_cannot_measure() {
        for (threads, bytes, passes) in [(0, 1 << 16, 1), (2, 1 << 16, 0), (4, 64, 1)] {
            let error = measure_read_bandwidth(threads, bytes, passes).unwrap_err();
            assert!(error.to_string().contains("bandwidth probe"), "{error}");
        }
    }
}
