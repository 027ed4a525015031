//! Scheduling policies: which ready subgraph an idle processor runs next.
//!
//! A policy is a [`Policy`] trait object with its own state; the dispatch system asks it
//! once per idle processor per tick, through a [`PickContext`]. The built-in policies live
//! one per file and are found by name in a [`PolicyRegistry`]; a user's own policy is one
//! more `register` call (see the crate example `custom_policy`).
//!
//! Adding a built-in policy: a new file here with a type that implements [`Policy`], and
//! one line in [`PolicyRegistry::builtin`].
//!
//! # Examples
//! ```
//! use std::collections::BTreeSet;
//! use hetsched_systems::policy::{PickContext, Policy, PolicyRegistry};
//!
//! /// Runs the ready instance with the smallest id (earliest chunk, then stage).
//! struct Earliest;
//!
//! impl Policy for Earliest {
//!     fn name(&self) -> &str {
//!         "earliest"
//!     }
//!     fn pick(&mut self, _ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
//!         candidates.first().copied()
//!     }
//! }
//!
//! let mut registry = PolicyRegistry::builtin();
//! registry.register("earliest", "smallest ready id first", || Box::new(Earliest));
//! assert_eq!(registry.create("earliest").unwrap().name(), "earliest");
//! assert!(registry.create("nonesuch").is_err());
//! ```

mod balance;
mod context;
mod costs_from;
mod cpf;
mod eq6;
mod heft;
mod in_order;
mod layerwise;
mod lookahead;
mod peer;
mod registry;
mod stall;
mod stall_index;

use std::collections::BTreeSet;

use crate::plan::PrefillPlan;

pub use balance::{Balance, FRONT_LOAD_RATIO, STEAL_COVER_PERCENT, float_threatens_tail};
pub use context::{HomeBacklog, LaneTimes, PickContext};
pub use costs_from::{CostsFrom, CostsMismatch};
pub use cpf::CriticalPathFirst;
pub use eq6::{contribution_on, newly_enabled, stall_contribution, stall_total};
pub use heft::Heft;
pub use in_order::InOrder;
pub use layerwise::Layerwise;
pub use lookahead::Lookahead;
pub use peer::{Peer, PeerPipeline};
pub use registry::{DEFAULT_POLICY, PolicyFactory, PolicyRegistry, UnknownPolicy};
pub use stall::Stall;
pub use stall_index::{HomeScore, StallIndex};

/// A scheduling policy: given an idle processor and the ready instances it may run,
/// which one it runs now.
///
/// The dispatch system calls [`Policy::pick`] for each idle processor in lane order; the
/// instance picked is launched on that processor at once and leaves every ready queue.
/// A policy keeps whatever state it needs in `self`; [`Policy::start`] resets it for a
/// plan and [`Policy::launched`] tells it of every launch (its own picks and the memory
/// liveness fallback's).
pub trait Policy: Send + Sync + 'static {
    /// The name written on the command line and in scenes.
    fn name(&self) -> &str;

    /// Whether an instance may run on any of its eligible processors (`true`), or only on
    /// its home processor (`false`: fixed pipelines such as `inorder` and `peer`). Decides
    /// which ready queues hold a ready instance.
    fn chooses_placement(&self) -> bool {
        true
    }

    /// Whether every processor runs its instances strictly in (chunk, stage) order and
    /// never skips one. The memory ledger then judges safety by finishing chunks in order
    /// only, and the liveness fallback starts a job only if [`Policy::pick`] agrees.
    fn strict_chunk_order(&self) -> bool {
        false
    }

    /// Called once before the first tick of `plan`: set up per-plan state.
    fn start(&mut self, plan: &PrefillPlan) {
        let _ = plan;
    }

    /// The instance (by id) to run on `ctx.lane` now, out of `candidates` (ready, admitted
    /// by memory, never empty), or `None` to leave the processor idle this tick.
    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32>;

    /// Called when instance `id` starts on `lane`, whoever chose it.
    fn launched(&mut self, plan: &PrefillPlan, id: u32, lane: usize) {
        let _ = (plan, id, lane);
    }

    /// Called when instance `id`, launched on `lane`, was given up (it ran past its
    /// deadline) and is ready again, to be launched on another processor: undo what
    /// [`Policy::launched`] counted for it.
    fn abandoned(&mut self, plan: &PrefillPlan, id: u32, lane: usize) {
        let _ = (plan, id, lane);
    }
}

/// The ready id with the largest score; ties go to the earliest (chunk, stage), which is
/// the smallest id because ready sets iterate in id order. A score of `None` means "not
/// a candidate on this lane".
pub fn pick_max_by<S: PartialOrd>(
    ready: &BTreeSet<u32>,
    mut score: impl FnMut(u32) -> Option<S>,
) -> Option<u32> {
    let mut best: Option<(S, u32)> = None;
    for &id in ready {
        let Some(s) = score(id) else { continue };
        if best.as_ref().is_none_or(|(b, _)| s > *b) {
            best = Some((s, id));
        }
    }
    best.map(|(_, id)| id)
}
