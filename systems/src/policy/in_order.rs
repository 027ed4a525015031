//! `inorder`: the naive overlap of seed 000, Fig. 13a.

use std::collections::BTreeSet;

use super::{PickContext, Policy};
use crate::plan::PrefillPlan;

/// Each processor runs its own (home) instances in (chunk, stage) order and never skips
/// ahead: the next one runs only when it is ready.
#[derive(Clone, Debug, Default)]
pub struct InOrder {
    /// Per lane: its instances in (chunk, stage) order, and how many have started.
    sequences: Vec<(Vec<u32>, usize)>,
}

impl Policy for InOrder {
    fn name(&self) -> &str {
        "inorder"
    }

    fn chooses_placement(&self) -> bool {
        false
    }

    fn strict_chunk_order(&self) -> bool {
        true
    }

    fn start(&mut self, plan: &PrefillPlan) {
        self.sequences = vec![(Vec::new(), 0); plan.lanes()];
        for key in plan.instances() {
            self.sequences[plan.processor(key)]
                .0
                .push(plan.id(key) as u32);
        }
    }

    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        let (sequence, cursor) = &self.sequences[ctx.lane];
        let next = *sequence.get(*cursor)?;
        candidates.contains(&next).then_some(next)
    }

    fn launched(&mut self, _plan: &PrefillPlan, id: u32, lane: usize) {
        let (sequence, cursor) = &mut self.sequences[lane];
        debug_assert_eq!(
            sequence.get(*cursor),
            Some(&id),
            "in-order launch out of order"
        );
        *cursor += 1;
    }
}
