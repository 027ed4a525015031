//! A decode step's plan: one token, so one chunk, on one processor, with its decoder
//! layers grouped several to a stage.
//!
//! With one chunk on one processor every layer is already one stage
//! ([`crate::graph::merge_for_one_chunk_one_processor`]), and the step is a chain: each
//! instance waits for the one before. Each instance still costs the scheduler a tick of
//! the schedule (collect, resolve, dispatch, metrics), a re-arm of its entity, a guard
//! check and a job hand-off, a few microseconds, where one SmolLM2-135M W8A8 layer runs
//! for about 140 µs on two threads: at one instance per layer that was 2 to 3% of a step
//! (docs/generation.md). [`group_layers`] (a stage transform of the graph builder's,
//! re-exported here) joins runs of consecutive layer stages into one stage each; every
//! grouped instance is still an entity of the request's world, resolved and dispatched
//! by the same systems, and runs the same operators in the same order (an executor runs
//! a grouped stage as the per-layer stages it holds, one after another:
//! [`StageTemplate::layer_span`](crate::graph::StageTemplate::layer_span) says how
//! many). The head stays a stage of its own.
//!
//! Grouping changes what a step costs the scheduler, not what it computes or reads: the
//! roofline price of a grouped stage is the sum of its layers' operators plus one launch
//! (where the per-layer plan paid one launch a layer), and the simulated decode
//! ([`crate::estimate_decode`]) prices a whole step with one launch already.

use crate::device::DeviceProfile;
use crate::error::PlanError;
pub use crate::graph::group_layers;
use crate::model::ModelConfig;
use crate::placement::PlacementConfig;
use crate::plan::{PrefillPlan, Workload};

/// Decoder layers per stage of a decode step unless the caller says otherwise: SmolLM2's
/// 30 layers become 6 stages of 5, plus the head (7 instances a step instead of 31).
/// Measured on this project's 2-core desktop (docs/generation.md): the schedule's cost of
/// a step falls with the instances, and from about 5 layers a stage on it is under a
/// percent of a W8A8 step.
pub const DEFAULT_DECODE_LAYERS_PER_STAGE: u32 = 5;

impl PrefillPlan {
    /// The plan of one decode step of `model` on `device`'s one processor, its decoder
    /// layers grouped `layers_per_stage` to a stage ([`group_layers`]): one token, one
    /// chunk, priced and placed as [`PrefillPlan::placed`] prices and places any plan.
    ///
    /// # Errors
    /// As [`PrefillPlan::placed`]; [`PlanError::InvalidDevice`] for a device of more
    /// than one processor (its stages stay cut at class changes, one layer each);
    /// [`PlanError::InvalidWorkload`] for `layers_per_stage` 0.
    pub fn decode_step(
        model: ModelConfig,
        device: DeviceProfile,
        placement: PlacementConfig,
        layers_per_stage: u32,
    ) -> Result<Self, PlanError> {
        if device.processors.len() != 1 {
            return Err(PlanError::InvalidDevice(format!(
                "a decode step's layers group on one processor, and this device has {}; \
                 give the decode device one processor",
                device.processors.len()
            )));
        }
        let workload = Workload {
            prompt_len: 1,
            chunk_len: 1,
            float_processor: None,
        };
        Self::placed_grouped(model, device, workload, placement, layers_per_stage, None)
    }

    /// The plan of one decode step of `model` on processor `lane` of `device` (any
    /// number of processors): the stages of [`PrefillPlan::decode_step`] (layers grouped
    /// `layers_per_stage` to a stage), every one on `lane` alone. A world of several
    /// requests on the whole device arms it beside their prefills.
    ///
    /// # Errors
    /// As [`PrefillPlan::decode_step`]; [`PlanError::InvalidDevice`] for a lane the
    /// device does not have.
    pub fn decode_step_on(
        model: ModelConfig,
        device: DeviceProfile,
        lane: usize,
        layers_per_stage: u32,
    ) -> Result<Self, PlanError> {
        let workload = Workload {
            prompt_len: 1,
            chunk_len: 1,
            float_processor: None,
        };
        Self::placed_grouped(
            model,
            device,
            workload,
            PlacementConfig::default(),
            layers_per_stage,
            Some(lane),
        )
    }
}
