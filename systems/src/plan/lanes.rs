//! Where each stage of a plan may run: its eligible lanes, home first, from the
//! `[placement]` rules and the workload's float processor.

use super::Workload;
use crate::cost::HomeWork;
use crate::device::DeviceProfile;
use crate::error::PlanError;
use crate::graph::StageTemplate;
use crate::model::ExecClass;
use crate::placement::PlacementConfig;

/// The processor of float work: the workload's `float_processor` by name (of a kind that
/// runs float work: not an NPU), else the default home of float work (the first CPU, else
/// the first GPU).
fn float_processor(device: &DeviceProfile, workload: &Workload) -> Result<usize, PlanError> {
    match &workload.float_processor {
        Some(name) => {
            let index = device
                .processors
                .iter()
                .position(|p| &p.name == name)
                .ok_or_else(|| {
                    PlanError::InvalidWorkload(format!(
                        "float_processor `{name}` is not a processor of {}; use one of: {}",
                        device.name,
                        device.processor_names()
                    ))
                })?;
            if !device.processors[index].kind.runs_float_work() {
                return Err(PlanError::InvalidWorkload(format!(
                    "float_processor `{name}` is an NPU; float work needs a CPU or GPU"
                )));
            }
            Ok(index)
        }
        None => device
            .preferred_lane(HomeWork::Float)
            .ok_or_else(|| PlanError::NoProcessor("float (CPU or GPU)".into())),
    }
}

/// Each stage's eligible lanes, its home lane first: the `[placement]` rule for the stage,
/// else its default processor.
pub(super) fn stage_lanes(
    device: &DeviceProfile,
    workload: &Workload,
    stages: &[StageTemplate],
    placement: &PlacementConfig,
) -> Result<Vec<Vec<usize>>, PlanError> {
    let float_processor = float_processor(device, workload)?;
    // The NPU; without one the CPU, and on a GPU-only device (every tensor resident there)
    // the GPU.
    let int8_processor = device
        .preferred_lane(HomeWork::Int8Linears)
        .ok_or_else(|| PlanError::NoProcessor("linear (NPU, CPU or GPU)".into()))?;
    stages
        .iter()
        .map(|s| {
            let default = match s.class {
                // Seed 000 runs the shadow on the CPU, beside float work on the GPU.
                _ if s.is_shadow() => device
                    .preferred_lane(HomeWork::Shadow)
                    .unwrap_or(float_processor),
                ExecClass::Float => float_processor,
                ExecClass::Int8 => int8_processor,
            };
            placement.lanes(device, s, default)
        })
        .collect()
}
