//! What is particular to the host CPU: it runs every kind of work at any shape, and is
//! the first home of float work, of the outlier shadow (seed 000 runs it there, beside
//! float work on a GPU) and of decode steps (seed 000 decodes on its CPU backend); the
//! INT8 linears run on its INT8 path where the device has no NPU.

use super::{HomeWork, KindRules};

/// The CPU's rules.
pub(super) struct Cpu;

impl KindRules for Cpu {
    fn home_rank(&self, work: HomeWork) -> Option<u8> {
        match work {
            HomeWork::Float | HomeWork::Shadow | HomeWork::Decode => Some(0),
            HomeWork::Int8Linears => Some(1),
        }
    }
}
