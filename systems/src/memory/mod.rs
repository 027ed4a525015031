//! Memory planning: tensor lifetimes and offsets in per-processor regions.
//!
//! The offset planner itself is the `hetsched-memplan` crate (re-exported here), which
//! may run its strategies on threads: this crate starts none. A pure, ECS-free offset
//! planner. Each [`Buffer`] has a size and a lifetime, the
//! half-open time interval `[start, end)` (any `u64` unit; the scheduler uses ns).
//! Two buffers of one region *conflict* iff their lifetimes intersect; conflicting
//! buffers must not overlap in address. The planner gives every buffer an aligned
//! offset in one arena so that the arena (the plan's peak) is small.
//!
//! - [`lower_bound`]: the most bytes live at any one time; no plan needs less.
//! - [`plan_with`]: one greedy [`Strategy`] (an ordering plus best-fit gap placement).
//! - [`plan_offsets`]: every strategy, keeping the lowest peak (deterministic);
//!   [`plan_offsets_each`]: the same for several sets, their strategies over threads,
//!   every strategy or, above [`SWEEPS_ONLY_ABOVE`] buffers, the sweeps, the others kept
//!   only past [`SWEEPS_MARGIN`] under the default effort ([`PlanEffort`]).
//! - [`check_plan`]: verifies a plan; [`fits`]: checks it against a capacity.
//!
//! Wired into the scheduler through:
//! - [`chunk_tensors`] and [`KvCache`]: the tensors of a chunk (from the model's
//!   operators) and the preallocated KV cache, each in a [`Region`] of the device.
//! - [`MemoryProfile`]: what a chunk holds as it progresses; the least feasible budget.
//! - [`schedule_buffers`] / [`plan_schedule`]: lifetimes from the schedule that ran,
//!   planned per region after the run.
//! - [`chunk_sharing`]: graph memory of per-chunk vs chunk-sharing graphs.
//!
//! # Examples
//! ```
//! use hetsched_systems::memory::{Buffer, check_plan, fits, lower_bound, plan_offsets};
//! let buffers = [
//!     Buffer { id: 0, bytes: 1000, start: 0, end: 10 },
//!     Buffer { id: 1, bytes: 500, start: 5, end: 20 },
//!     Buffer { id: 2, bytes: 1000, start: 10, end: 30 }, // may reuse buffer 0's bytes
//! ];
//! let plan = plan_offsets(&buffers, 64).unwrap();
//! check_plan(&buffers, &plan, 64).unwrap();
//! assert_eq!(plan.peak_bytes, 1024 + 512);
//! assert_eq!(lower_bound(&buffers), 1500);
//! assert!(fits(&plan, 4096).is_ok());
//! assert!(fits(&plan, 1024).is_err());
//! ```

mod profile;
mod region;
mod schedule;
mod sharing;
mod tensors;

pub use hetsched_memplan::{
    Buffer, MemoryError, MemoryPlan, Placement, PlanEffort, SWEEPS_MARGIN, SWEEPS_ONLY_ABOVE,
    Strategy, align_up, aligned_lower_bound, check_plan, fits, lower_bound, plan_offsets,
    plan_offsets_each, plan_with, validate_alignment,
};
pub use profile::{ChunkProfile, MemoryProfile};
pub use region::{DEFAULT_ALIGNMENT, MemoryConfig, Region};
pub use schedule::{RegionMemory, plan_schedule, schedule_buffers};
pub use sharing::{ChunkSharing, chunk_sharing};
pub use tensors::{KvCache, TensorKind, TensorTemplate, chunk_tensors};
