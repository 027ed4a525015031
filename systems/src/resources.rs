//! Resources: the shared state of the scheduler world, and the backend contract.
//!
//! Backend contract: the engine puts [`Completion`]s into [`Inbox`] before a tick and
//! takes [`Job`]s out of [`Outbox`] after it. Systems never see a concrete queue.

use std::collections::BTreeSet;

use bevy_ecs::prelude::{Entity, Message, Resource};

use crate::plan::{InstanceKey, PrefillPlan};
use crate::policy::HomeBacklog;
use crate::request::RequestId;

/// Entity lookups by world id and by processor lane: kept for speed (a completion names
/// its instance by id; a query would scan), fed by arming and disarming requests.
#[derive(Resource, Debug, Clone)]
pub struct Index {
    /// Instance entity by world id (None where no instance exists, or no run holds it).
    pub instances: Vec<Option<Entity>>,
    /// Processor entity by lane.
    pub processors: Vec<Entity>,
    /// Id ranges (base, length) no armed run holds, for the next runs to reuse.
    pub(crate) free: Vec<(u32, u32)>,
}

/// Current time in ns: virtual in simulation, elapsed wall time with real queues. A test
/// may set it by hand.
#[derive(Resource, Debug, Clone, Copy, Default)]
pub struct Clock {
    /// Nanoseconds since the prefill started.
    pub now_ns: u64,
}

/// Ready instance ids (a run's own, not the world's) per processor lane, ordered by
/// (chunk, stage): an index kept for speed beside [`crate::components::RemainingDeps`],
/// which resolve feeds when an instance's count reaches 0 and dispatch drains. A ready
/// instance is in the queue of every processor it may run on (its home only when the
/// policy keeps fixed placement: see [`ReadyQueues::lanes_of`]) and leaves all of them
/// when one takes it.
#[derive(Debug, Clone)]
pub struct ReadyQueues {
    /// Ready ids, by lane.
    pub lanes: Vec<BTreeSet<u32>>,
    /// Whether an instance waits only in its home processor's queue.
    pub home_only: bool,
    /// Per lane, the ready instances whose home it is, kept as they come and go (a
    /// policy reads them at every decision; counting them there cost a pass over every
    /// queue).
    backlog: Vec<HomeBacklog>,
    /// Every id that entered the queues, in order (again after a retry): a policy that
    /// keeps the ready instances in its own order reads the ones past its last look.
    arrivals: Vec<u32>,
}

impl ReadyQueues {
    /// Empty queues for `lanes` processors.
    pub fn new(lanes: usize, home_only: bool) -> Self {
        ReadyQueues {
            lanes: vec![BTreeSet::new(); lanes],
            home_only,
            backlog: vec![HomeBacklog::default(); lanes],
            arrivals: Vec::new(),
        }
    }

    /// Every id that entered the queues so far, in order, repeats included (an id that
    /// left them since is no longer in [`ReadyQueues::lanes`]).
    pub fn arrivals(&self) -> &[u32] {
        &self.arrivals
    }

    /// Per lane, how many ready instances have it as their home and their modeled work.
    pub fn backlog(&self) -> &[HomeBacklog] {
        &self.backlog
    }

    /// The processors whose queues hold `key` while it is ready: every eligible one, or
    /// only its home.
    pub fn lanes_of<'p>(&self, plan: &'p PrefillPlan, key: InstanceKey) -> &'p [usize] {
        let lanes = plan.eligible(key);
        if self.home_only { &lanes[..1] } else { lanes }
    }

    /// `id` becomes ready.
    pub fn insert(&mut self, plan: &PrefillPlan, id: u32) {
        let key = plan.key(id as usize);
        let home = plan.processor(key);
        self.arrivals.push(id);
        for &lane in self.lanes_of(plan, key) {
            if self.lanes[lane].insert(id) && lane == home {
                self.backlog[home].count += 1;
                self.backlog[home].work_ns += plan.cost_ns(key);
            }
        }
    }

    /// `id` was taken by a processor: out of every queue.
    pub fn remove(&mut self, plan: &PrefillPlan, id: u32) {
        let key = plan.key(id as usize);
        let home = plan.processor(key);
        for &lane in self.lanes_of(plan, key) {
            if self.lanes[lane].remove(&id) && lane == home {
                self.backlog[home].count -= 1;
                self.backlog[home].work_ns -= plan.cost_ns(key);
            }
        }
    }
}

/// A job handed to a processor's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// Instance id in the world (the request's run holds a range of ids; a world of one
    /// request uses the plan's own ids).
    pub id: u32,
    /// The request whose run the instance belongs to: a runner finds that request's KV
    /// cache and tokens by it.
    pub request: RequestId,
    /// (chunk, stage) in the request's plan.
    pub key: InstanceKey,
    /// Processor lane.
    pub processor: usize,
    /// Modeled duration in ns (a simulated queue takes exactly this long).
    pub estimated_ns: u64,
    /// When it was dispatched.
    pub dispatched_ns: u64,
}

/// A finished job, as its queue reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Instance id in the world, as the [`Job`] named it.
    pub id: u32,
    /// Processor lane.
    pub processor: usize,
    /// When it started running.
    pub start_ns: u64,
    /// When it finished.
    pub end_ns: u64,
}

/// Completions waiting to be collected.
#[derive(Resource, Debug, Default)]
pub struct Inbox(pub Vec<Completion>);

/// Jobs dispatched this tick, waiting for the engine to hand them to queues.
#[derive(Resource, Debug, Default)]
pub struct Outbox(pub Vec<Job>);

/// Written when an instance completes.
#[derive(Message, Debug, Clone, Copy)]
pub struct SubgraphFinished {
    /// Instance id in the world.
    pub id: u32,
    /// The request entity whose run it belongs to.
    pub request: Entity,
}

/// One executed subgraph on the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceRecord {
    /// Instance id in its request's plan.
    pub id: u32,
    /// The request it ran for.
    pub request: RequestId,
    /// (chunk, stage).
    pub key: InstanceKey,
    /// Processor lane.
    pub processor: usize,
    /// Start in ns.
    pub start_ns: u64,
    /// End in ns.
    pub end_ns: u64,
    /// What the plan's cost model expected it to take on that processor, ns.
    pub estimated_ns: u64,
}

impl SliceRecord {
    /// How long it ran, ns (0 for a slice whose clock went backwards).
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// A sampled counter value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CounterSample {
    /// Time in ns.
    pub at_ns: u64,
    /// Value.
    pub value: f64,
}

/// Everything the run recorded for the timeline and the report.
#[derive(Resource, Debug, Default, Clone)]
pub struct TimelineLog {
    /// Executed subgraphs, in completion order.
    pub slices: Vec<SliceRecord>,
    /// Counter tracks: name and samples (a sample only where the value changed).
    pub counters: Vec<(String, Vec<CounterSample>)>,
}

impl TimelineLog {
    /// Busy time per processor lane, ns: the summed durations of the slices that ran on
    /// each of `lanes` lanes (a slice on a lane beyond them is not counted).
    pub fn busy_ns_by_lane(&self, lanes: usize) -> Vec<u64> {
        let mut busy = vec![0u64; lanes];
        for s in &self.slices {
            if let Some(total) = busy.get_mut(s.processor) {
                *total += s.duration_ns();
            }
        }
        busy
    }
}

/// Scheduler statistics.
#[derive(Resource, Debug, Default, Clone)]
pub struct RunStats {
    /// Ticks run.
    pub ticks: u64,
    /// Jobs dispatched.
    pub dispatched: u64,
    /// Dispatch decisions where a ready job had to wait for memory.
    pub held_for_memory: u64,
    /// Jobs that ran past their deadline and were requeued on another processor.
    pub retried: u64,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::ReadyQueues;
    use crate::policy::HomeBacklog;
    use crate::testing::tiny_plan;

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// The backlog kept as instances come and go (twice, or never, included) is the
        /// one counted afresh from the queues.
        #[test]
        fn kept_backlog_equals_a_fresh_count(
            ops in prop::collection::vec((any::<bool>(), 0usize..1000), 0..200),
            home_only in any::<bool>(),
        ) {
            let plan = tiny_plan(2, 64, 16);
            let ids: Vec<u32> = (0..plan.id_space())
                .filter(|&id| plan.exists(plan.key(id)))
                .map(|id| id as u32)
                .collect();
            let mut ready = ReadyQueues::new(plan.lanes(), home_only);
            for (insert, pick) in ops {
                let id = ids[pick % ids.len()];
                if insert {
                    ready.insert(&plan, id);
                } else {
                    ready.remove(&plan, id);
                }
                prop_assert_eq!(ready.backlog(), &HomeBacklog::of(&plan, &ready.lanes)[..]);
            }
        }
    }
}
