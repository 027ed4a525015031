//! `stall`: seed 000's NPU-stall contribution heuristic (Eq. 6), exactly as written.

use std::collections::BTreeSet;

use super::{PickContext, Policy, pick_max_by, stall_contribution};

/// Picks the ready instance with the largest stall contribution C (Eq. 6): on a CPU/GPU
/// the one whose completion makes the most work ready, on the NPU the least; ties to the
/// earliest (chunk, stage).
#[derive(Clone, Copy, Debug, Default)]
pub struct Stall;

impl Policy for Stall {
    fn name(&self) -> &str {
        "stall"
    }

    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        pick_max_by(candidates, |id| {
            let key = ctx.plan.key(id as usize);
            Some(stall_contribution(ctx.plan, ctx.progress, key, ctx.kind))
        })
    }
}
