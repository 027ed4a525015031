//! Offset planning: each [`Buffer`] has a size and a lifetime (the half-open interval
//! `[start, end)`, any `u64` unit); two buffers conflict iff their lifetimes intersect,
//! and conflicting buffers must not overlap in address. The planner gives every buffer
//! an aligned offset in one arena so that the arena (the plan's peak) is small.
//!
//! - [`lower_bound`]: the most bytes live at any one time; no plan needs less.
//! - [`plan_with`]: one greedy [`Strategy`] (an ordering plus best-fit gap placement).
//! - [`plan_offsets`]: every strategy, keeping the lowest peak (deterministic);
//!   [`plan_offsets_each`]: the same for several sets, their strategies spread over
//!   threads (the same plans on any number of threads).
//! - [`check_plan`]: verifies a plan; [`fits`]: checks it against a capacity.
//!
//! A crate of its own so that the scheduler's crate (`hetsched-systems`, which
//! re-exports this one as `hetsched_systems::memory`) starts no thread: this one may.

mod address;
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
mod strategy;
mod sweep;

pub use align::{align_up, validate_alignment};
pub use bound::{aligned_lower_bound, lower_bound};
pub use budget::fits;
pub use buffer::{Buffer, MemoryPlan, Placement, Strategy};
pub use check::check_plan;
pub use error::MemoryError;
pub use parallel::plan_offsets_each;
pub use strategy::{PlanEffort, SWEEPS_MARGIN, SWEEPS_ONLY_ABOVE, plan_offsets, plan_with};
