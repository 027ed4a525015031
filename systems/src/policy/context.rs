//! What a policy sees when it picks: the plan, what is done, every ready queue, and when
//! each processor frees.

use std::collections::BTreeSet;

use crate::device::ProcessorKind;
use crate::plan::{InstanceKey, PrefillPlan};
use crate::progress::StageProgress;
use crate::request::Request;

/// When each processor could start a new job: now if idle, else when its running job is
/// modeled to end (ns, by lane).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneTimes {
    /// The current time.
    pub now_ns: u64,
    /// Earliest start per lane.
    pub free_at_ns: Vec<u64>,
}

impl LaneTimes {
    /// Whether `lane` finishes `key` no later than any other processor `key` may run on
    /// would (earliest finish time, HEFT's processor rule): the guard that keeps a slow
    /// processor from taking a job a faster one would finish sooner even after its
    /// current job. Always true for an instance with one eligible processor.
    pub fn finishes_first(&self, plan: &PrefillPlan, key: InstanceKey, lane: usize) -> bool {
        let lanes = plan.eligible(key);
        if lanes.len() == 1 {
            return true;
        }
        let Some(here) = plan.cost_on(key, lane) else {
            return false;
        };
        let finish_here = self.free_at_ns[lane].max(self.now_ns) + here;
        lanes.iter().filter(|&&l| l != lane).all(|&l| {
            plan.cost_on(key, l)
                .is_none_or(|c| finish_here <= self.free_at_ns[l].max(self.now_ns) + c)
        })
    }
}

/// Everything a policy may read when it picks for one idle processor.
#[derive(Clone, Copy, Debug)]
pub struct PickContext<'a> {
    /// The plan being scheduled.
    pub plan: &'a PrefillPlan,
    /// Which instances are done.
    pub progress: &'a StageProgress,
    /// Every processor's ready queue (ids), by lane; the candidates are this lane's,
    /// filtered by memory admission.
    pub ready: &'a [BTreeSet<u32>],
    /// Per lane, the ready instances whose home it is ([`HomeBacklog::of`] the queues
    /// above; the scheduler keeps it as instances come and go).
    pub backlog: &'a [HomeBacklog],
    /// Every id that entered the ready queues so far, in order ([`ReadyQueues::arrivals`]
    /// of the scheduler; empty where a caller builds queues by hand).
    ///
    /// [`ReadyQueues::arrivals`]: crate::resources::ReadyQueues::arrivals
    pub arrivals: &'a [u32],
    /// When each processor frees.
    pub times: &'a LaneTimes,
    /// The idle processor picking.
    pub lane: usize,
    /// Its kind.
    pub kind: ProcessorKind,
    /// The request whose instances the candidates are (every candidate belongs to one
    /// request's run; `None` where a caller builds a context by hand).
    pub request: Option<&'a Request>,
}

impl PickContext<'_> {
    /// Modeled work of the ready instances by home lane (ns): each lane's own backlog.
    pub fn ready_work(&self) -> Vec<u64> {
        self.backlog.iter().map(|b| b.work_ns).collect()
    }

    /// Whether no processor other than this one has ready work of its own (instances
    /// whose home it is; under flexible placement a queue also holds other processors'
    /// instances).
    pub fn others_idle(&self) -> bool {
        let lane = self.lane;
        self.backlog
            .iter()
            .enumerate()
            .all(|(l, b)| l == lane || b.count == 0)
    }
}

/// The ready instances whose home a processor is: in its own queue, as opposed to the
/// other processors' instances it may also run under flexible placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HomeBacklog {
    /// How many.
    pub count: usize,
    /// Their modeled work at home (ns).
    pub work_ns: u64,
}

impl HomeBacklog {
    /// Each lane's backlog, counted from the ready queues `ready` (by lane).
    pub fn of(plan: &PrefillPlan, ready: &[BTreeSet<u32>]) -> Vec<HomeBacklog> {
        ready
            .iter()
            .enumerate()
            .map(|(lane, queue)| {
                let own = queue
                    .iter()
                    .map(|&id| plan.key(id as usize))
                    .filter(|&key| plan.processor(key) == lane);
                own.fold(HomeBacklog::default(), |b, key| HomeBacklog {
                    count: b.count + 1,
                    work_ns: b.work_ns + plan.cost_ns(key),
                })
            })
            .collect()
    }
}
