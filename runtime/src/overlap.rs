//! How long the jobs of other lanes ran during each job of a timeline: what history
//! records as `overlapped_ns` (and whether a job ran alone), what the profile's pool
//! sharing fit reads and what the weight-reuse rule's measurement keeps out. Its own
//! module because those three read it and none of them owns the others.

use hetsched_systems::resources::SliceRecord;

/// For each slice, how long, in ns, slices of other lanes ran during it (summed per
/// lane, at most its own span: with three lanes and more, two others may run at once).
pub(crate) fn overlaps(slices: &[SliceRecord]) -> Vec<u64> {
    let lanes = slices.iter().map(|s| s.processor + 1).max().unwrap_or(0);
    let mut spans: Vec<Vec<(u64, u64)>> = vec![Vec::new(); lanes];
    for s in slices {
        spans[s.processor].push((s.start_ns, s.end_ns));
    }
    for lane in &mut spans {
        lane.sort_unstable();
    }
    slices
        .iter()
        .map(|slice| {
            let mut overlapped = 0;
            for (lane, spans) in spans.iter().enumerate() {
                if lane == slice.processor {
                    continue;
                }
                // Spans are disjoint and sorted, so their ends are sorted too.
                let first = spans.partition_point(|&(_, end)| end <= slice.start_ns);
                for &(start, end) in spans[first..]
                    .iter()
                    .take_while(|&&(start, _)| start < slice.end_ns)
                {
                    overlapped += end.min(slice.end_ns) - start.max(slice.start_ns);
                }
            }
            overlapped.min(slice.end_ns.saturating_sub(slice.start_ns))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetsched_systems::testing::slice_on as slice;

    #[test]
    fn overlap_is_summed_per_other_lane_and_capped_at_the_own_span() {
        // Lane 0 runs 0-100: lane 1 covers all of it, lane 2 its last 50 ns; 150 summed,
        // capped at its own 100 (as lane 1's first job: 60 + 10 against its 60). Lane 1's
        // two jobs do not count for each other.
        let slices = [
            slice(0, 0, 100),
            slice(1, 0, 60),
            slice(1, 60, 150),
            slice(2, 50, 300),
        ];
        assert_eq!(overlaps(&slices), [100, 60, 90, 150]);
    }

    #[test]
    fn no_slices_no_overlap() {
        assert!(overlaps(&[]).is_empty());
    }
}
