//! A plan's layout without its costs: the workload, the stages of a chunk, each stage's
//! home processor and memory step, and which instances exist. Memory accounting
//! (`crate::memory`) reads this and nothing priced, so the plan can hold the memory
//! profile built from its own layout.

use serde::{Deserialize, Serialize};

use crate::device::DeviceProfile;
use crate::error::PlanError;
use crate::graph::StageTemplate;
use crate::model::ModelConfig;

/// A workload: how long the prompt is and how it is cut and scheduled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Prompt length in tokens.
    pub prompt_len: u32,
    /// Chunk length in tokens (the fixed length of the pre-built graphs).
    pub chunk_len: u32,
    /// Processor (by name) for float work; the first CPU, else the first GPU, by default.
    #[serde(default)]
    pub float_processor: Option<String>,
}

/// Identifies one subgraph instance: stage `stage` of chunk `chunk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct InstanceKey {
    /// Chunk index.
    pub chunk: u32,
    /// Stage index in the per-chunk chain.
    pub stage: u32,
}

/// The layout of a [`crate::PrefillPlan`], borrowed from it
/// ([`crate::PrefillPlan::layout`]).
#[derive(Clone, Copy, Debug)]
pub struct PlanLayout<'a> {
    /// The model.
    pub model: &'a ModelConfig,
    /// The device.
    pub device: &'a DeviceProfile,
    /// The workload.
    pub workload: &'a Workload,
    /// Per-chunk stage chain.
    pub stages: &'a [StageTemplate],
    /// Home processor of each stage.
    pub stage_processor: &'a [usize],
    /// For each stage, its memory step (see [`PlanLayout::memory_step`]).
    pub memory_steps: &'a [u32],
    /// Number of chunks.
    pub chunks: u32,
}

impl PlanLayout<'_> {
    /// Stages per chunk, including the last-chunk-only head.
    pub fn stage_count(&self) -> u32 {
        self.stages.len() as u32
    }

    /// Whether the instance exists (the head runs for the last chunk only).
    pub fn exists(&self, key: InstanceKey) -> bool {
        key.chunk < self.chunks
            && (key.stage as usize) < self.stages.len()
            && (!self.stages[key.stage as usize].last_chunk_only || key.chunk + 1 == self.chunks)
    }

    /// Home processor of an instance: its only one under fixed placement.
    pub fn processor(&self, key: InstanceKey) -> usize {
        self.stage_processor[key.stage as usize]
    }

    /// The memory step of `stage`: stages in chain order, except that a shadow shares the
    /// step of the INT8 stage it runs beside, and the parts of split attention share one. A chunk's steps run one after another (the
    /// stages of one step may overlap), which is what memory accounting relies on.
    pub fn memory_step(&self, stage: u32) -> u32 {
        self.memory_steps[stage as usize]
    }
}

/// For each stage, its memory step: a shadow, or a part of split attention after the
/// first, joins the step of the stage before it.
pub(super) fn memory_steps(stages: &[StageTemplate]) -> Vec<u32> {
    let mut steps = Vec::with_capacity(stages.len());
    let mut next = 0u32;
    for stage in stages {
        if stage.runs_beside_previous() && next > 0 {
            steps.push(next - 1);
        } else {
            steps.push(next);
            next += 1;
        }
    }
    steps
}

/// For each stage, the stages whose `after` lists it.
pub(super) fn successor_stages(stages: &[StageTemplate]) -> Vec<Vec<u32>> {
    let mut successors = vec![Vec::new(); stages.len()];
    for (j, stage) in stages.iter().enumerate() {
        for &before in &stage.after {
            successors[before as usize].push(j as u32);
        }
    }
    successors
}

/// Refuses an empty prompt or chunk, and a prompt longer than the model's context.
pub(super) fn check_workload(model: &ModelConfig, workload: &Workload) -> Result<(), PlanError> {
    if workload.prompt_len == 0 {
        return Err(PlanError::InvalidWorkload(
            "prompt length is 0; give at least one token".into(),
        ));
    }
    if workload.chunk_len == 0 {
        return Err(PlanError::InvalidWorkload(
            "chunk length is 0; give at least one token".into(),
        ));
    }
    if workload.prompt_len > model.context {
        return Err(PlanError::InvalidWorkload(format!(
            "prompt of {} tokens is longer than {}'s context of {} tokens; shorten the prompt",
            workload.prompt_len, model.name, model.context
        )));
    }
    Ok(())
}
