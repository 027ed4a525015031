//! The lower bound of a run that already happened, from its measured durations rather
//! than the cost model's (the model's own bound is the plan's, [`crate::bound`]).

use crate::plan::{LowerBound, PrefillPlan};
use crate::resources::SliceRecord;

/// The lower bound of a run that already happened, from its own measured durations
/// (each slice's `end_ns - start_ns`) instead of the cost model's: the busiest lane's
/// measured work (a lane runs one job at a time, so its jobs' durations fit inside the
/// makespan one after another) and the longest dependency chain through the measured
/// durations (an instance starts only after its predecessors ended). A run whose slices
/// hold compute time only, waits excluded, can never end before this bound; instances
/// without a slice count as zero.
pub fn measured_lower_bound(plan: &PrefillPlan, slices: &[SliceRecord]) -> LowerBound {
    let mut lane_work = vec![0u64; plan.lanes()];
    let mut duration = vec![0u64; plan.id_space()];
    for s in slices {
        let ns = s.end_ns.saturating_sub(s.start_ns);
        if let Some(work) = lane_work.get_mut(s.processor) {
            *work += ns;
        }
        if let Some(d) = duration.get_mut(s.id as usize) {
            *d = ns;
        }
    }
    // Dense ids sort in (chunk, stage) order and every predecessor has an earlier chunk
    // or the same chunk and an earlier stage: one pass in id order is topological.
    let mut finish = vec![0u64; plan.id_space()];
    let mut critical_path_ns = 0;
    for key in plan.instances() {
        let id = plan.id(key);
        let ready = plan
            .predecessors(key)
            .into_iter()
            .map(|p| finish[plan.id(p)])
            .max()
            .unwrap_or(0);
        finish[id] = ready + duration[id];
        critical_path_ns = critical_path_ns.max(finish[id]);
    }
    LowerBound {
        busiest_processor_ns: lane_work.into_iter().max().unwrap_or(0),
        critical_path_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::InstanceKey;

    fn slice(plan: &PrefillPlan, key: InstanceKey, lane: usize, span: (u64, u64)) -> SliceRecord {
        SliceRecord {
            id: plan.id(key) as u32,
            request: Default::default(),
            key,
            processor: lane,
            start_ns: span.0,
            end_ns: span.1,
            estimated_ns: 0,
        }
    }

    #[test]
    fn the_measured_bound_is_the_busiest_lane_or_the_measured_chain() {
        // One layer, two chunks: every stage of a chunk in a chain.
        let plan = crate::testing::tiny_plan(1, 256, 128);
        let mut slices = Vec::new();
        let mut t = 0;
        // Serially in id order, on home lanes: chunk 0's instances 10 ns each, chunk 1's 1.
        for key in plan.instances().collect::<Vec<_>>() {
            let d = if key.chunk == 0 { 10 } else { 1 };
            slices.push(slice(&plan, key, plan.processor(key), (t, t + d)));
            t += d;
        }
        let bound = measured_lower_bound(&plan, &slices);
        // Chunk 0 is a chain of its stages; chunk 1 adds at most its own.
        let first = plan.instances().filter(|k| k.chunk == 0).count() as u64;
        assert!(bound.critical_path_ns >= 10 * first);
        assert!(bound.critical_path_ns <= t);
        let mut lanes = vec![0u64; plan.lanes()];
        for s in &slices {
            lanes[s.processor] += s.end_ns - s.start_ns;
        }
        assert_eq!(bound.busiest_processor_ns, *lanes.iter().max().unwrap());
        assert!(bound.ns() <= t);
    }
}
