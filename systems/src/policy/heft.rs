//! `heft`: HEFT as online list scheduling.

use std::collections::BTreeSet;

use super::{PickContext, Policy, pick_max_by};

/// Among the ready instances this lane would finish first (earliest finish time over
/// their eligible processors), the largest upward rank (mean-cost bottom level).
/// Higher-ranked instances another processor finishes sooner are left for it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Heft;

impl Policy for Heft {
    fn name(&self) -> &str {
        "heft"
    }

    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        let plan = ctx.plan;
        pick_max_by(candidates, |id| {
            let key = plan.key(id as usize);
            ctx.times
                .finishes_first(plan, key, ctx.lane)
                .then(|| plan.upward_rank_ns(key))
        })
    }
}
