//! A read of a buffer as fast as memory delivers it: the loop of the bandwidth probe
//! that says how fast a decode step could stream its weights.
//!
//! Why a kernel: a plain summing loop leaves the fetching to the hardware prefetcher,
//! which keeps too few lines in flight for one core to reach the memory's rate. The
//! decode products request their weight lines 12 KiB ahead (`gemm_w4`'s one-row kernel)
//! and so read faster than such a loop: on this project's 2-core AMD EPYC the INT8
//! matrix-vector product streamed 45 GiB/s from memory on one thread
//! (`cargo bench -p hetsched-kernels --bench w4a8 -- decode_gemv`) where the plain
//! loop read 29-31 GB/s. A probe slower than the kernels it bounds is no bound: this one
//! requests its lines as far ahead as they do (38-41 GB/s on one thread there).

use crate::prefetch::prefetch_lines;

/// Words (of 8 bytes) summed per step: four cache lines.
const STEP_WORDS: usize = 32;
/// How far ahead of the step summed its lines are requested, in words: 12 KiB, as the
/// one-row W4 kernel's `ROW_PREFETCH_GROUPS`.
const AHEAD_WORDS: usize = (12 << 10) / 8;

/// The wrapping sum of `words`, read once front to back with the lines 12 KiB ahead
/// requested. Equal to [`stream_read_sum_reference`] (wrapping addition does not depend
/// on the order).
pub fn stream_read_sum(words: &[u64]) -> u64 {
    let (steps, rest) = words.as_chunks::<STEP_WORDS>();
    // 16 lanes: 8 of the baseline's 16 vector registers (32 lanes spilled two to the
    // stack, a store and a load in every step).
    let mut lanes = [0u64; 16];
    for (i, step) in steps.iter().enumerate() {
        if let Some(ahead) = words.get((i * STEP_WORDS + AHEAD_WORDS)..) {
            prefetch_lines(&ahead[..ahead.len().min(STEP_WORDS)]);
        }
        for half in step.as_chunks::<16>().0 {
            for (lane, &w) in lanes.iter_mut().zip(half) {
                *lane = lane.wrapping_add(w);
            }
        }
    }
    let tail = rest.iter().fold(0u64, |s, &w| s.wrapping_add(w));
    lanes.iter().fold(tail, |s, &l| s.wrapping_add(l))
}

/// The definition: the wrapping sum of `words`, one after another.
pub fn stream_read_sum_reference(words: &[u64]) -> u64 {
    words.iter().fold(0u64, |s, &w| s.wrapping_add(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeded::SeededRng;

    /// Every length around the step and the prefetch distance, random words (sums that
    /// wrap) and words of one value.
    #[test]
    fn the_streamed_sum_equals_the_plain_sum() {
        let mut rng = SeededRng::new(11);
        let long = AHEAD_WORDS + 3 * STEP_WORDS + 5;
        let words: Vec<u64> = (0..long).map(|_| rng.next_u64()).collect();
        for len in [
            0,
            1,
            31,
            32,
            33,
            64,
            200,
            AHEAD_WORDS,
            AHEAD_WORDS + 1,
            long,
        ] {
            let w = &words[..len];
            assert_eq!(
                stream_read_sum(w),
                stream_read_sum_reference(w),
                "len {len}"
            );
        }
        assert_eq!(stream_read_sum(&[3; 1000]), 3000);
        assert_eq!(stream_read_sum(&[u64::MAX, 2]), 1);
    }
}
