//! Which instances are done, with a per-stage done prefix so cross-chunk dependencies
//! (seed 000, Eq. 2) resolve in amortised O(1) instead of scanning earlier chunks.

use crate::plan::{InstanceKey, PrefillPlan};

/// Done flags by instance id, and for each stage the number of leading chunks done.
#[derive(Debug, Clone)]
pub struct StageProgress {
    done: Vec<bool>,
    prefix: Vec<u32>,
    done_count: usize,
    /// Ids in the order they were marked done (a policy that keeps scores follows it).
    completed: Vec<u32>,
}

impl StageProgress {
    /// Nothing done yet.
    pub fn new(plan: &PrefillPlan) -> Self {
        StageProgress {
            done: vec![false; plan.id_space()],
            prefix: vec![0; plan.stages.len()],
            done_count: 0,
            completed: Vec::new(),
        }
    }

    /// Whether `key` is done.
    pub fn is_done(&self, plan: &PrefillPlan, key: InstanceKey) -> bool {
        self.done[plan.id(key)]
    }

    /// Chunks 0..prefix of `stage` are all done.
    pub fn done_prefix(&self, stage: u32) -> u32 {
        self.prefix[stage as usize]
    }

    /// Instances done so far.
    pub fn done_count(&self) -> usize {
        self.done_count
    }

    /// The ids marked done so far, in the order they were: a policy that keeps state
    /// derived from what is done reads the ones past its last look instead of rescanning.
    pub fn completed(&self) -> &[u32] {
        &self.completed
    }

    /// Marks `key` done and returns the chunk range by which its stage's done prefix grew.
    pub fn mark_done(&mut self, plan: &PrefillPlan, key: InstanceKey) -> std::ops::Range<u32> {
        let id = plan.id(key);
        debug_assert!(!self.done[id], "instance {key:?} completed twice");
        self.done[id] = true;
        self.done_count += 1;
        self.completed.push(id as u32);
        let stage = key.stage as usize;
        let old = self.prefix[stage];
        let mut new = old;
        while new < plan.chunks
            && self.done[plan.id(InstanceKey {
                chunk: new,
                stage: key.stage,
            })]
        {
            new += 1;
        }
        self.prefix[stage] = new;
        old..new
    }
}
