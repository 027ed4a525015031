//! Memory planning: tensor lifetimes and offsets in per-processor regions.
//!
//! A pure, ECS-free offset planner. Each [`Buffer`] has a size and a lifetime, the
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

mod align;
mod bound;
mod budget;
mod buffer;
mod check;
mod error;
mod occupancy;
mod order;
mod parallel;
mod place;
mod profile;
mod region;
mod schedule;
mod sharing;
mod strategy;
mod sweep;
mod tensors;

pub use align::{align_up, validate_alignment};
pub use bound::{aligned_lower_bound, lower_bound};
pub use budget::fits;
pub use buffer::{Buffer, MemoryPlan, Placement};
pub use check::check_plan;
pub use error::MemoryError;
pub use parallel::plan_offsets_each;
pub use profile::{ChunkProfile, MemoryProfile};
pub use region::{DEFAULT_ALIGNMENT, MemoryConfig, Region};
pub use schedule::{RegionMemory, plan_schedule, schedule_buffers};
pub use sharing::{ChunkSharing, chunk_sharing};
pub use strategy::{
    PlanEffort, SWEEPS_MARGIN, SWEEPS_ONLY_ABOVE, Strategy, plan_offsets, plan_with,
};
pub use tensors::{KvCache, TensorKind, TensorTemplate, chunk_tensors};
