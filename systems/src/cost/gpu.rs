//! What is particular to a GPU (a Vulkan queue): it runs every kind of work at any shape,
//! float work where the device has no CPU, and the INT8 linears only on a device without
//! an NPU or a CPU (every tensor resident there). It is never the outlier shadow's default
//! home: with no CPU the shadow runs on the float processor.

use super::{HomeWork, KindRules};

/// A GPU's rules.
pub(super) struct Gpu;

impl KindRules for Gpu {
    fn home_rank(&self, work: HomeWork) -> Option<u8> {
        match work {
            HomeWork::Float | HomeWork::Decode => Some(1),
            HomeWork::Int8Linears => Some(2),
            HomeWork::Shadow => None,
        }
    }
}
