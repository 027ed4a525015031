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
//! - [`plan_offsets`]: every strategy, keeping the lowest peak (deterministic).
//! - [`check_plan`]: verifies a plan; [`fits`]: checks it against a capacity.
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
mod order;
mod place;
mod strategy;

pub use align::{align_up, validate_alignment};
pub use bound::{aligned_lower_bound, lower_bound};
pub use budget::fits;
pub use buffer::{Buffer, MemoryPlan, Placement};
pub use check::check_plan;
pub use error::MemoryError;
pub use strategy::{Strategy, plan_offsets, plan_with};
