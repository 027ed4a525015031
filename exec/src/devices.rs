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

/// The device profile of [`GpuUse::Resident`](crate::GpuUse::Resident) under `device`:
/// its GPU lane alone where it has one (a profile measured by `hetsched profile
/// --backends gpu`, whose stage costs the plan and `run --predict` then price with), else
/// [`resident_gpu_device`].
pub fn resident_gpu_device_of(device: &DeviceProfile) -> DeviceProfile {
    match device.first_of(ProcessorKind::Gpu) {
        Some(gpu) => DeviceProfile {
            name: device.name.clone(),
            measured: device.measured.clone(),
            processors: vec![device.processors[gpu].clone()],
        },
        None => resident_gpu_device(),
    }
}

/// The device profile of [`GpuUse::Resident`](crate::GpuUse::Resident) without a measured
/// one: one GPU lane, costed like the host's CPU (the policies only need a guess, and
/// with one lane they only order chunks).
pub fn resident_gpu_device() -> DeviceProfile {
    let mut device = host_device();
    let cpu = device.first_of(ProcessorKind::Cpu).unwrap_or(0);
    device.processors = vec![gpu_costed_like(&device.processors[cpu])];
    device.name = "Vulkan GPU (every stage resident)".into();
    device
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device with a GPU lane (a measured profile's) gives the resident path that lane
    /// and its costs; one without gives the host's guess.
    #[test]
    fn the_resident_device_is_the_measured_gpu_lane_where_there_is_one() {
        let mut measured = with_gpu_lane(host_device());
        let gpu = measured.first_of(ProcessorKind::Gpu).unwrap();
        measured.processors[gpu].cost.launch_us = 123.0;
        let resident = resident_gpu_device_of(&measured);
        assert_eq!(resident.processors.len(), 1);
        assert_eq!(resident.processors[0].kind, ProcessorKind::Gpu);
        assert_eq!(resident.processors[0].cost.launch_us, 123.0);
        assert_eq!(resident.name, measured.name);
        let guess = resident_gpu_device_of(&host_device());
        assert_eq!(guess, resident_gpu_device());
    }
}
