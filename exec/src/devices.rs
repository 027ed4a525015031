//! The device profiles a prefill runs on: the host's (from a shipped scene), with a GPU
//! lane added, or the one GPU lane of the resident path.

use std::path::Path;

use hetsched_runtime::scene::Scene;
use hetsched_systems::{DeviceProfile, ProcessorKind, ProcessorSpec};

/// The shipped scene whose device profile describes this kind of host: float work on
/// the CPU lane, INT8 linears on the emulated-NPU lane.
pub const HOST_SCENE: &str = "smollm2-135m-desktop";

/// The host's device profile (from [`HOST_SCENE`]).
pub fn host_device() -> DeviceProfile {
    Scene::load(Path::new(HOST_SCENE))
        .expect("the shipped host scene is valid")
        .device
}

/// `device` with a GPU lane added (costed like its CPU: the policies only need a guess),
/// which takes the float stages.
pub fn with_gpu_lane(mut device: DeviceProfile) -> DeviceProfile {
    if device.first_of(ProcessorKind::Gpu).is_none()
        && let Some(cpu) = device.first_of(ProcessorKind::Cpu)
    {
        let gpu = gpu_costed_like(&device.processors[cpu]);
        device.processors.push(gpu);
        device.name = format!("{} + Vulkan GPU", device.name);
    }
    device
}

/// A processor named `gpu` of kind GPU with `spec`'s cost model: the host's GPU lanes have
/// no calibrated profile, and the policies only need a guess.
fn gpu_costed_like(spec: &ProcessorSpec) -> ProcessorSpec {
    ProcessorSpec {
        name: "gpu".into(),
        kind: ProcessorKind::Gpu,
        ..spec.clone()
    }
}

/// The device profile of [`GpuUse::Resident`](crate::GpuUse::Resident): one GPU lane, costed like the host's CPU
/// (the policies only need a guess, and with one lane they only order chunks).
pub fn resident_gpu_device() -> DeviceProfile {
    let mut device = host_device();
    let cpu = device.first_of(ProcessorKind::Cpu).unwrap_or(0);
    device.processors = vec![gpu_costed_like(&device.processors[cpu])];
    device.name = "Vulkan GPU (every stage resident)".into();
    device
}
