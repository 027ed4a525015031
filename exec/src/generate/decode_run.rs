//! A scheduled decode step's plan and the runner of its instances.
//!
//! The step's plan groups several consecutive decoder layers into one stage
//! ([`hetsched_systems::decode_plan`]): the scheduler resolves, dispatches and collects
//! one instance per group. The runner underneath is the per-layer one (one compiled stage
//! per layer, then the head, as without grouping): a grouped instance runs the per-layer
//! stages it holds one after another, so a step computes exactly what an ungrouped step
//! computes, in the same order, on the same kernels.

use std::ops::Range;
use std::sync::Arc;

use hetsched_systems::PrefillPlan;
use hetsched_systems::graph::StageTemplate;
use hetsched_systems::plan::InstanceKey;
use hetsched_systems::resources::Job;

use crate::{ExecError, JobError, JobRunner, StageRunner};

/// A decode step's plan, built once per session, and the runner kept across steps.
pub(super) struct DecodeRun {
    /// The step's plan: what the scheduler sees.
    pub(super) plan: Arc<PrefillPlan>,
    /// Runs the per-layer stages; its state moves the session's tokens and KV cache in
    /// and out each step ([`crate::PrefillState::restart`]).
    pub(super) runner: StageRunner,
    /// Per stage of `plan`: the runner's per-layer stages it holds, in order.
    parts: Vec<Range<u32>>,
}

impl DecodeRun {
    /// `plan` run by `runner`, whose compiled stages are `per_layer` (one stage per layer,
    /// then the head). Each stage of `plan` must hold the operators of the next
    /// [`StageTemplate::layer_span`] stages of `per_layer`, in order: checked here, so
    /// that a grouping that does not match the runner fails before any step.
    pub(super) fn new(
        plan: Arc<PrefillPlan>,
        per_layer: &[StageTemplate],
        runner: StageRunner,
    ) -> Result<Self, ExecError> {
        let mut parts = Vec::with_capacity(plan.stages.len());
        let mut next = 0u32;
        for stage in &plan.stages {
            let part = next..next + stage.layer_span;
            let held = per_layer.get(part.start as usize..part.end as usize);
            let ops = held.map(|s| s.iter().flat_map(StageTemplate::op_names).collect());
            if ops != Some(stage.op_names()) {
                return Err(ExecError::Kernel(format!(
                    "decode stage {} does not hold the operators of per-layer stages {part:?}",
                    stage.name
                )));
            }
            next = part.end;
            parts.push(part);
        }
        if next as usize != per_layer.len() {
            return Err(ExecError::Kernel(format!(
                "the decode plan's stages hold {next} of the {} per-layer stages",
                per_layer.len()
            )));
        }
        Ok(Self {
            plan,
            runner,
            parts,
        })
    }

    /// Subgraph instances a step runs.
    pub(super) fn instances(&self) -> usize {
        self.plan.instance_count()
    }
}

impl JobRunner for DecodeRun {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        let stage = job.key.stage;
        let part = self
            .parts
            .get(stage as usize)
            .ok_or_else(|| format!("no stage {stage} in this decode step's plan"))?;
        for stage in part.clone() {
            let key = InstanceKey {
                chunk: job.key.chunk,
                stage,
            };
            self.runner.run(key, job.processor)?;
        }
        Ok(())
    }
}
