//! A policy that decides with another plan's costs: the same instances, placed on the same
//! processors, priced by a different cost model.
//!
//! Why: a measured profile predicts durations better than the roofline model, but a
//! heuristic's decisions are not guaranteed to improve with better costs (Eq. 6 and the
//! balance rules were tuned on roofline-priced scenes). With both plans at hand, a run can
//! simulate the heuristic under each cost model, with the measured durations, and keep
//! the decisions predicted to finish first (`hetsched_runtime::profiling::decision_costs`).

use std::collections::BTreeSet;
use std::sync::Arc;

use thiserror::Error;

use super::{HomeBacklog, PickContext, Policy};
use crate::plan::PrefillPlan;

/// Why two plans cannot stand in for each other's decisions.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CostsMismatch {
    /// The plans have different instances (ids) or processors.
    #[error(
        "the decision plan has {theirs} instances on {their_lanes} lanes, the run {ours} on {our_lanes}"
    )]
    Shape {
        /// The run's instance-id space.
        ours: usize,
        /// The run's lanes.
        our_lanes: usize,
        /// The decision plan's instance-id space.
        theirs: usize,
        /// The decision plan's lanes.
        their_lanes: usize,
    },
    /// An instance lives on another processor, or may run on other ones, in the decision
    /// plan.
    #[error("instance {id} is placed differently in the decision plan")]
    Placement {
        /// The instance's id.
        id: usize,
    },
}

/// Runs `inner` as if the plan were `decisions`: every [`PickContext`] the scheduler
/// hands it, and every plan it is told of, is swapped for `decisions`, whose instances
/// and placement equal the run's (checked by [`CostsFrom::new`]), with each lane's ready
/// backlog recounted in its costs. The lane times stay the run's own (when each processor
/// frees is a fact of the run, not a decision).
pub struct CostsFrom {
    inner: Box<dyn Policy>,
    decisions: Arc<PrefillPlan>,
}

impl CostsFrom {
    /// `inner` deciding with `decisions`' costs on a run of `run`, or why it cannot.
    pub fn new(
        inner: Box<dyn Policy>,
        run: &PrefillPlan,
        decisions: Arc<PrefillPlan>,
    ) -> Result<Self, CostsMismatch> {
        same_shape(run, &decisions)?;
        Ok(CostsFrom { inner, decisions })
    }
}

/// Whether `b` has `a`'s instances, lanes and placement.
fn same_shape(a: &PrefillPlan, b: &PrefillPlan) -> Result<(), CostsMismatch> {
    if a.id_space() != b.id_space() || a.lanes() != b.lanes() {
        return Err(CostsMismatch::Shape {
            ours: a.id_space(),
            our_lanes: a.lanes(),
            theirs: b.id_space(),
            their_lanes: b.lanes(),
        });
    }
    for key in a.instances() {
        let id = a.id(key);
        let same = b.exists(key)
            && b.id(key) == id
            && b.processor(key) == a.processor(key)
            && b.eligible(key) == a.eligible(key);
        if !same {
            return Err(CostsMismatch::Placement { id });
        }
    }
    Ok(())
}

impl Policy for CostsFrom {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn chooses_placement(&self) -> bool {
        self.inner.chooses_placement()
    }

    fn strict_chunk_order(&self) -> bool {
        self.inner.strict_chunk_order()
    }

    fn start(&mut self, _plan: &PrefillPlan) {
        self.inner.start(&self.decisions);
    }

    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        // The backlog the scheduler keeps is priced by the run's costs: recounted with the
        // decision plan's (one pass over the ready queues, measured runs only).
        let backlog = HomeBacklog::of(&self.decisions, ctx.ready);
        let swapped = PickContext {
            plan: &self.decisions,
            backlog: &backlog,
            ..*ctx
        };
        self.inner.pick(&swapped, candidates)
    }

    fn launched(&mut self, _plan: &PrefillPlan, id: u32, lane: usize) {
        self.inner.launched(&self.decisions, id, lane);
    }

    fn abandoned(&mut self, _plan: &PrefillPlan, id: u32, lane: usize) {
        self.inner.abandoned(&self.decisions, id, lane);
    }
}
