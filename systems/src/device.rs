//! Device profiles: the processors of a phone or desktop and their cost models.

use serde::{Deserialize, Serialize};

use crate::cost::CostModel;
use crate::error::PlanError;

/// Kind of processor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum ProcessorKind {
    /// Host CPU cores (one queue).
    Cpu,
    /// GPU (Vulkan queue).
    Gpu,
    /// Neural processing unit (Hexagon queue).
    Npu,
}

impl ProcessorKind {
    /// Lower-case name, as written in scenes.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessorKind::Cpu => "cpu",
            ProcessorKind::Gpu => "gpu",
            ProcessorKind::Npu => "npu",
        }
    }
}

/// One processor of a device profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorSpec {
    /// Unique name, e.g. `hexagon`.
    pub name: String,
    /// Processor kind.
    pub kind: ProcessorKind,
    /// Memory this processor can address, in GiB.
    pub memory_gib: f64,
    /// Cost model.
    pub cost: CostModel,
}

/// A device profile: a named set of processors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Device name, e.g. `Xiaomi 14 (Snapdragon 8 Gen 3)`.
    pub name: String,
    /// Processors, in lane order.
    pub processors: Vec<ProcessorSpec>,
}

impl DeviceProfile {
    /// Checks names are unique and rates are usable.
    pub fn validate(&self) -> Result<(), PlanError> {
        let bad = |what: String| Err(PlanError::InvalidDevice(format!("{}: {what}", self.name)));
        if self.processors.is_empty() {
            return bad("no processors; add at least one [[processors]] entry".into());
        }
        for (i, p) in self.processors.iter().enumerate() {
            if self.processors[..i].iter().any(|q| q.name == p.name) {
                return bad(format!("processor name `{}` is used twice", p.name));
            }
            let c = &p.cost;
            let rates = [c.peak_gops.int8, c.peak_gops.fp16, c.peak_gops.fp32];
            if rates.iter().any(|r| !r.is_finite() || *r < 0.0) || rates.iter().all(|r| *r == 0.0) {
                return bad(format!(
                    "processor `{}` needs finite, non-negative peak rates, not all zero",
                    p.name
                ));
            }
            if !(c.bandwidth_gbps.is_finite() && c.bandwidth_gbps > 0.0) {
                return bad(format!(
                    "processor `{}` needs a positive bandwidth_gbps",
                    p.name
                ));
            }
            if [c.launch_us, c.op_overhead_us]
                .iter()
                .any(|v| !v.is_finite() || *v < 0.0)
                || c.measured.iter().any(|m| !m.us.is_finite() || m.us < 0.0)
            {
                return bad(format!(
                    "processor `{}` has a negative or non-finite latency",
                    p.name
                ));
            }
            if !(p.memory_gib.is_finite() && p.memory_gib > 0.0) {
                return bad(format!(
                    "processor `{}` needs a positive memory_gib",
                    p.name
                ));
            }
        }
        Ok(())
    }

    /// The processors' names, comma-separated (for error messages).
    pub fn processor_names(&self) -> String {
        self.processors
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Index of the first processor of `kind`.
    pub fn first_of(&self, kind: ProcessorKind) -> Option<usize> {
        self.processors.iter().position(|p| p.kind == kind)
    }
}
