//! `cpf`: critical-path-first list scheduling.

use std::collections::BTreeSet;

use super::{PickContext, Policy, pick_max_by};

/// The ready instance on the longest path through the graph (top level + bottom level)
/// first, ties to the larger bottom level.
#[derive(Clone, Copy, Debug, Default)]
pub struct CriticalPathFirst;

impl Policy for CriticalPathFirst {
    fn name(&self) -> &str {
        "cpf"
    }

    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        let plan = ctx.plan;
        pick_max_by(candidates, |id| {
            let key = plan.key(id as usize);
            Some((
                plan.top_level_ns(key) + plan.bottom_level_ns(key),
                plan.bottom_level_ns(key),
            ))
        })
    }
}
