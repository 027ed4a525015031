//! Memory regions: one per processor, with a capacity from the device profile, a budget
//! (the scene's `[memory]` table, or the capacity) and an alignment.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::PlanEffort;
use super::validate_alignment;
use crate::device::DeviceProfile;
use crate::error::PlanError;

/// Alignment of every planned offset when a scene does not set one (a cache line).
pub const DEFAULT_ALIGNMENT: u64 = 64;

fn default_alignment() -> u64 {
    DEFAULT_ALIGNMENT
}

/// A scene's memory settings (its optional `[memory]` table).
///
/// # Examples
/// ```
/// use hetsched_systems::memory::MemoryConfig;
/// let mut config = MemoryConfig::default();
/// config.budget_bytes.insert("hexagon".into(), 1 << 30);
/// assert_eq!(config.alignment, 64);
/// assert_eq!(config.budget_bytes["hexagon"], 1 << 30);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Alignment of every offset and size in bytes (a power of two); 64 by default.
    #[serde(default = "default_alignment")]
    pub alignment: u64,
    /// Budget in bytes per region, by processor name. A region left out may use its
    /// processor's whole `memory_gib`.
    #[serde(default)]
    pub budget_bytes: BTreeMap<String, u64>,
    /// Budget in bytes for all regions together: on a phone the CPU and NPU windows are
    /// views of one DRAM, so a user's limit is often on the sum. None: no such limit.
    #[serde(default)]
    pub device_budget_bytes: Option<u64>,
    /// How many offset strategies a finished run's plan tries per region.
    #[serde(default)]
    pub plan_effort: PlanEffort,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            alignment: DEFAULT_ALIGNMENT,
            budget_bytes: BTreeMap::new(),
            device_budget_bytes: None,
            plan_effort: PlanEffort::default(),
        }
    }
}

impl MemoryConfig {
    /// Checks the alignment and that every budget names a processor of `device`.
    pub fn validate(&self, device: &DeviceProfile) -> Result<(), PlanError> {
        validate_alignment(self.alignment).map_err(|e| PlanError::InvalidMemory(e.to_string()))?;
        if self.device_budget_bytes == Some(0) {
            return Err(PlanError::InvalidMemory(
                "device memory budget is 0 bytes; give a positive budget or leave it out".into(),
            ));
        }
        for (name, &bytes) in &self.budget_bytes {
            if !device.processors.iter().any(|p| &p.name == name) {
                let names: Vec<&str> = device.processors.iter().map(|p| p.name.as_str()).collect();
                return Err(PlanError::InvalidMemory(format!(
                    "memory budget for `{name}`, which is not a processor of {}; use one of: {}",
                    device.name,
                    names.join(", ")
                )));
            }
            if bytes == 0 {
                return Err(PlanError::InvalidMemory(format!(
                    "memory budget for `{name}` is 0 bytes; give a positive budget or leave it out"
                )));
            }
        }
        Ok(())
    }

    /// The regions of `device` under this configuration, in lane order.
    pub fn regions(&self, device: &DeviceProfile) -> Vec<Region> {
        device
            .processors
            .iter()
            .enumerate()
            .map(|(lane, p)| {
                let capacity_bytes = (p.memory_gib * (1u64 << 30) as f64) as u64;
                Region {
                    name: p.name.clone(),
                    lane,
                    capacity_bytes,
                    budget_bytes: self
                        .budget_bytes
                        .get(&p.name)
                        .copied()
                        .unwrap_or(capacity_bytes),
                    alignment: self.alignment,
                }
            })
            .collect()
    }
}

/// One memory region: what a processor can address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Region {
    /// The processor's name.
    pub name: String,
    /// The processor's lane.
    pub lane: usize,
    /// Bytes the processor can address (`memory_gib`).
    pub capacity_bytes: u64,
    /// Bytes the scheduler may keep live in it at once (activations and KV cache).
    pub budget_bytes: u64,
    /// Alignment of offsets and sizes.
    pub alignment: u64,
}
