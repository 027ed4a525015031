//! `layerwise`: one job at a time, every chunk through a layer before the next layer.
//!
//! No two jobs overlap, and each stage's jobs follow each other a layer's stages apart,
//! so a stage's weights are still cached when its next chunk runs, except for each
//! layer's first chunk, which reads them from memory. It is the slowest schedule (no
//! overlap at all): a baseline, and the run `hetsched profile` measures what cached
//! weights save with (its first chunks cold, the rest warm, each job alone, in one run).

use std::collections::BTreeSet;

use super::{PickContext, Policy};
use crate::plan::PrefillPlan;

/// Runs instances one at a time in (layer, chunk, stage) order, each on its home
/// processor. A stage without a layer (the head) counts as in the layer before it.
#[derive(Clone, Debug, Default)]
pub struct Layerwise {
    /// Every instance id in (layer, chunk, stage) order.
    sequence: Vec<u32>,
    /// Per id: whether it was launched.
    launched: Vec<bool>,
    /// The first position in `sequence` not yet launched.
    cursor: usize,
    /// Launched ids not yet seen done.
    running: Vec<u32>,
}

impl Layerwise {
    /// Each stage's layer for ordering: its own, else the last one before it (0 if none).
    fn stage_layers(plan: &PrefillPlan) -> Vec<u32> {
        let mut last = 0;
        plan.stages
            .iter()
            .map(|stage| {
                last = stage.layer.unwrap_or(last);
                last
            })
            .collect()
    }
}

impl Policy for Layerwise {
    fn name(&self) -> &str {
        "layerwise"
    }

    fn chooses_placement(&self) -> bool {
        false
    }

    fn start(&mut self, plan: &PrefillPlan) {
        let layers = Self::stage_layers(plan);
        let mut keys: Vec<_> = plan.instances().collect();
        keys.sort_by_key(|k| (layers[k.stage as usize], k.chunk, k.stage));
        self.sequence = keys.into_iter().map(|k| plan.id(k) as u32).collect();
        self.launched = vec![false; plan.id_space()];
        self.cursor = 0;
        self.running.clear();
    }

    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        let plan = ctx.plan;
        self.running
            .retain(|&id| !ctx.progress.is_done(plan, plan.key(id as usize)));
        if !self.running.is_empty() {
            return None;
        }
        let next = *self.sequence.get(self.cursor)?;
        if candidates.contains(&next) {
            return Some(next);
        }
        // Nothing runs and the next is not ready here: another lane's, or held back by
        // memory admission. Never wait on a job no lane can start (the sequence is a
        // topological order, so this only runs where admission reordered it).
        let anywhere = ctx.ready.iter().any(|ready| ready.contains(&next));
        if anywhere {
            None
        } else {
            candidates.first().copied()
        }
    }

    fn launched(&mut self, _plan: &PrefillPlan, id: u32, _lane: usize) {
        self.launched[id as usize] = true;
        self.running.push(id);
        while self
            .sequence
            .get(self.cursor)
            .is_some_and(|&next| self.launched[next as usize])
        {
            self.cursor += 1;
        }
    }

    fn abandoned(&mut self, _plan: &PrefillPlan, id: u32, _lane: usize) {
        self.launched[id as usize] = false;
        self.running.retain(|&r| r != id);
        if let Some(at) = self.sequence.iter().position(|&s| s == id) {
            self.cursor = self.cursor.min(at);
        }
    }
}
