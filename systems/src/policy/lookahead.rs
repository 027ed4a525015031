//! `lookahead` (ours): Eq. 6 that feeds an idle float processor and breaks ties by rank.

use std::collections::BTreeSet;

use super::{PickContext, Policy, pick_max_by, stall_contribution};

/// Eq. 6 with two changes, measured on the shipped scenes (docs/policies.md).
/// 1. When no other processor has ready work, the NPU runs the job whose float
///    successors are the *longest* (the opposite of Eq. 6's NPU rule): the idle CPU gets
///    the heavy attention of later chunks early instead of at the end, where it would
///    leave the NPU waiting.
/// 2. Ties in Eq. 6 (common: every chunk's copy of a static stage has the same cost) go
///    to the larger upward rank, the instance with the most work still behind it, instead
///    of the earliest (chunk, stage).
///
/// Under flexible placement, only instances this lane finishes first
/// ([`super::LaneTimes::finishes_first`]) are candidates.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lookahead;

impl Policy for Lookahead {
    fn name(&self) -> &str {
        "lookahead"
    }

    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        let plan = ctx.plan;
        let feed_idle_cpu = !ctx.kind.runs_float_work() && ctx.others_idle();
        pick_max_by(candidates, |id| {
            let key = plan.key(id as usize);
            if !ctx.times.finishes_first(plan, key, ctx.lane) {
                return None;
            }
            let c = stall_contribution(plan, ctx.progress, key, ctx.kind);
            let rank = plan.bottom_level_ns(key);
            Some((if feed_idle_cpu { -c } else { c }, rank))
        })
    }
}
