//! `peer`: the paper repository's fixed two-chunk pipeline.

use std::collections::BTreeSet;

use super::{PickContext, Policy};
use crate::plan::{InstanceKey, PrefillPlan};
use crate::progress::StageProgress;

/// The peer implementation's fixed pipeline: two chunks in flight, the second lagging the
/// first by one subgraph, a barrier after every step; every instance on its home
/// processor.
#[derive(Clone, Copy, Debug, Default)]
pub struct Peer {
    pipeline: PeerPipeline,
}

impl Policy for Peer {
    fn name(&self) -> &str {
        "peer"
    }

    fn chooses_placement(&self) -> bool {
        false
    }

    fn start(&mut self, _plan: &PrefillPlan) {
        self.pipeline = PeerPipeline::default();
    }

    /// A member of the current step on this lane, if ready.
    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        self.pipeline
            .advance(ctx.plan, ctx.progress)
            .into_iter()
            .map(|k| ctx.plan.id(k) as u32)
            .find(|id| candidates.contains(id))
    }
}

/// State of the peer's fixed pipeline: which pair of chunks, which step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerPipeline {
    /// Chunks `2 * pair` and `2 * pair + 1` are in flight.
    pub pair: u32,
    /// Step within the pair: the first chunk runs stage `step`, the second `step - LAG`.
    pub step: u32,
}

impl PeerPipeline {
    /// How many subgraphs the second chunk of a pair lags the first.
    pub const LAG: u32 = 1;

    /// The instances of the current step.
    pub fn members(&self, plan: &PrefillPlan) -> Vec<InstanceKey> {
        let first = InstanceKey {
            chunk: 2 * self.pair,
            stage: self.step,
        };
        let second = self.step.checked_sub(Self::LAG).map(|stage| InstanceKey {
            chunk: 2 * self.pair + 1,
            stage,
        });
        [Some(first), second]
            .into_iter()
            .flatten()
            .filter(|k| plan.exists(*k))
            .collect()
    }

    /// Moves past every step whose instances are all done (the barrier); returns the
    /// members of the current step, empty when the prompt is finished.
    pub fn advance(&mut self, plan: &PrefillPlan, progress: &StageProgress) -> Vec<InstanceKey> {
        let steps = plan.stage_count() + Self::LAG;
        loop {
            if 2 * self.pair >= plan.chunks {
                return Vec::new();
            }
            if self.step >= steps {
                self.pair += 1;
                self.step = 0;
                continue;
            }
            let members = self.members(plan);
            if members.iter().any(|k| !progress.is_done(plan, *k)) {
                return members;
            }
            self.step += 1;
        }
    }
}
