//! `balance` (ours, the default): `lookahead` that front-loads only while it pays, and
//! lets an idle processor take another's job when that keeps the loads balanced.

use std::collections::BTreeSet;

use super::stall_index::StallIndex;
use super::{LaneTimes, PickContext, Policy, contribution_on, pick_max_by, stall_total};
use crate::plan::PrefillPlan;

/// `balance` front-loads float work freely while the NPU has at most this many times the
/// float processors' remaining work (measured on the shipped scenes: 1.5 to 2.5 meet the
/// goals on all of them; docs/policies.md).
pub const FRONT_LOAD_RATIO: u64 = 2;

/// `balance` lets a processor take another's job (beyond an earliest-finish win) only if
/// the home processor's ready backlog covers at least this share of the job's run here,
/// in percent (measured on the shipped CPU + GPU + NPU scenes: 60 to 80 meet the goals;
/// 100 leaves the CPU idle, 40 or less starves the NPU; docs/policies.md).
pub const STEAL_COVER_PERCENT: u64 = 70;

/// Whether the NPU lanes' remaining work is at most [`FRONT_LOAD_RATIO`] times the other
/// lanes' (by home lane; an NPU is a processor that runs no float work,
/// [`crate::ProcessorKind::runs_float_work`]): the float side then threatens the tail.
pub fn float_threatens_tail(plan: &PrefillPlan, remaining_ns: &[u64]) -> bool {
    let (mut npu, mut float) = (0u64, 0u64);
    for (spec, &work) in plan.device.processors.iter().zip(remaining_ns) {
        if !spec.kind.runs_float_work() {
            npu += work;
        } else {
            float += work;
        }
    }
    npu <= FRONT_LOAD_RATIO * float
}

/// Ours, `balance`: `lookahead` with two changes (docs/policies.md).
/// 1. While the other processors are idle, the NPU front-loads (runs the job whose float
///    successors S are the longest) freely only while the float side threatens the tail
///    ([`float_threatens_tail`]). Otherwise it front-loads only a job whose S the float
///    processors finish while the NPU works through the rest of its ready queue; if none
///    fits, Eq. 6's rule stands (shortest S first), so the NPU is never left waiting for
///    float work it did not need to wait for.
/// 2. Under flexible placement a processor runs its own (home) jobs first. It takes
///    another processor's job if it finishes it first ([`LaneTimes::finishes_first`]),
///    or if (a) the home processor's ready work covers most of the job's run here
///    ([`STEAL_COVER_PERCENT`]) and
///    (b) it finishes the job and all its own remaining work before the home processor
///    finishes the rest of its own: a steal that evens out the loads without starving
///    the home processor or extending its tail. Of those, the least urgent (smallest
///    bottom level) first: the home processor keeps the urgent ones.
///
/// The home jobs' Eq. 6 totals are kept in a [`StallIndex`] as jobs complete and arrive,
/// so a decision reads the best home job off an ordered set instead of scoring every one.
#[derive(Clone, Debug, Default)]
pub struct Balance {
    /// Modeled work not yet dispatched, by home processor (ns).
    remaining_ns: Vec<u64>,
    /// Every ready home job's Eq. 6 total, ordered per lane.
    index: StallIndex,
}

/// What `balance` knows about the processors beyond this lane's ready queue.
struct BalanceView<'a> {
    /// When each lane can start its next job.
    times: &'a LaneTimes,
    /// Modeled work not yet dispatched, by home lane (ns).
    remaining_ns: &'a [u64],
    /// Modeled work of the ready instances, by home lane (ns).
    ready_ns: &'a [u64],
    /// Whether no other processor has ready work of its own.
    others_idle: bool,
    /// Whether the float processors' remaining work is at least
    /// 1 / [`FRONT_LOAD_RATIO`] of the NPU's ([`float_threatens_tail`]).
    float_threatens_tail: bool,
}

impl Policy for Balance {
    fn name(&self) -> &str {
        "balance"
    }

    fn start(&mut self, plan: &PrefillPlan) {
        self.remaining_ns = plan.work_per_processor();
        self.index.reset(plan);
    }

    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        self.index.sync(ctx);
        let view = BalanceView {
            times: ctx.times,
            remaining_ns: &self.remaining_ns,
            ready_ns: &ctx.ready_work(),
            others_idle: ctx.others_idle(),
            float_threatens_tail: float_threatens_tail(ctx.plan, &self.remaining_ns),
        };
        pick_balance(ctx, candidates, view, &self.index)
    }

    fn launched(&mut self, plan: &PrefillPlan, id: u32, _lane: usize) {
        self.index.launched(plan, id);
        let key = plan.key(id as usize);
        self.remaining_ns[plan.processor(key)] -= plan.cost_ns(key);
    }

    fn abandoned(&mut self, plan: &PrefillPlan, id: u32, _lane: usize) {
        let key = plan.key(id as usize);
        self.remaining_ns[plan.processor(key)] += plan.cost_ns(key);
    }
}

/// The pick described on [`Balance`]. A home job outranks every other processor's, so
/// outside the NPU's feeding rule, with the whole queue admitted, the pick is the lane's
/// best home job in `index`; otherwise every candidate is scored (home jobs by their
/// kept totals).
fn pick_balance(
    ctx: &PickContext<'_>,
    ready: &BTreeSet<u32>,
    view: BalanceView<'_>,
    index: &StallIndex,
) -> Option<u32> {
    let (plan, progress, lane, kind) = (ctx.plan, ctx.progress, ctx.lane, ctx.kind);
    let feed_idle_cpu = !kind.runs_float_work() && view.others_idle;
    let whole_queue = ctx.ready.get(lane).is_some_and(|q| std::ptr::eq(q, ready));
    if !feed_idle_cpu
        && whole_queue
        && let Some(id) = index.best_home(lane)
    {
        return Some(id);
    }
    let times = view.times;
    let now = times.now_ns;
    pick_max_by(ready, |id| {
        let key = plan.key(id as usize);
        let home = plan.processor(key);
        let rank = plan.bottom_level_ns(key) as i64;
        if home != lane {
            let here = plan.cost_on(key, lane)?;
            let home_cost = plan.cost_ns(key);
            let home_free = times.free_at_ns[home].max(now);
            // While this lane runs the job, the float processors keep feeding the home
            // processor, so its ready backlog need only cover part of the run.
            let backlog = home_free - now + view.ready_ns[home] - home_cost;
            let home_stays_busy = backlog * 100 >= here * STEAL_COVER_PERCENT;
            let balanced = now + here + view.remaining_ns[lane]
                <= home_free + view.remaining_ns[home] - home_cost;
            let steal = (home_stays_busy && balanced) || times.finishes_first(plan, key, lane);
            return steal.then_some((false, false, 0, -rank));
        }
        let total = index
            .total(id)
            .unwrap_or_else(|| stall_total(plan, progress, key));
        let c = contribution_on(kind, total);
        if feed_idle_cpu {
            // -c is the time of S on the float processors. It "fits" when the NPU can
            // work through the rest of its ready queue meanwhile; when the float side's
            // remaining work threatens the tail, every S may be front-loaded.
            let backlog = view.ready_ns[lane] - plan.cost_ns(key);
            let fits = view.float_threatens_tail || (-c) as u64 <= backlog;
            return Some((true, fits, if fits { -c } else { c }, rank));
        }
        Some((true, false, c, rank))
    })
}
