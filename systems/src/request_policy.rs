//! Policies across requests: which requests an idle processor is offered to, in which
//! order. Within the request that takes it, the request's own [`Policy`](crate::Policy)
//! (balance, stall, ...) picks the instance.
//!
//! Once a tick, the dispatch system lists every armed request whose run is not done
//! ([`LiveRequest`]) and asks the [`ActiveRequestPolicy`] to order the list (and drop
//! the requests that may not run now); then each idle processor, in lane order, is
//! offered to the requests in that order, and the first whose policy picks an instance
//! launches it. A request is preempted only at a subgraph boundary: a running job is
//! never taken back, so preemption loses no work.

use std::fmt;

use bevy_ecs::prelude::{Entity, Resource};
use thiserror::Error;

use crate::request::{Priority, Request, RequestId, RequestPhase, RequestRun, SloTargets};

/// One armed request whose run is not done, as a request policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveRequest {
    /// Its entity.
    pub entity: Entity,
    /// Caller's id.
    pub id: RequestId,
    /// Priority class.
    pub priority: Priority,
    /// Latency targets.
    pub targets: SloTargets,
    /// Arrival, ns.
    pub arrival_ns: u64,
    /// Phase of its armed run.
    pub phase: RequestPhase,
    /// Modeled work of its armed run not yet dispatched, ns (each instance at home).
    pub work_left_ns: u64,
    /// Modeled work of its whole armed run, ns (each instance at home).
    pub work_total_ns: u64,
    /// The run's lower bound alone on the device, ns (`PrefillPlan::lower_bound`).
    pub alone_bound_ns: u64,
    /// When the run was armed, ns.
    pub armed_ns: u64,
}

impl LiveRequest {
    /// The view of `request` (entity `entity`) with `run` armed on it.
    pub(crate) fn of(entity: Entity, request: &Request, run: &RequestRun) -> Self {
        LiveRequest {
            entity,
            id: request.id,
            priority: request.priority,
            targets: request.targets,
            arrival_ns: request.arrival_ns,
            phase: request.phase,
            work_left_ns: run.work_left_ns,
            work_total_ns: run.work_total_ns,
            alone_bound_ns: run.alone_bound_ns,
            armed_ns: run.armed_ns,
        }
    }

    /// The modeled time the run still needs alone: its lower bound scaled by the share
    /// of its work not yet dispatched.
    pub fn remaining_ns(&self) -> u64 {
        if self.work_total_ns == 0 {
            return 0;
        }
        (u128::from(self.alone_bound_ns) * u128::from(self.work_left_ns)
            / u128::from(self.work_total_ns)) as u64
    }
}

/// Orders the live requests for the processors idle this tick.
pub trait RequestPolicy: Send + Sync + 'static {
    /// The name written on the command line.
    fn name(&self) -> &str;

    /// Orders `live` (every armed request whose run is not done, in arming order) at
    /// `now_ns`: idle processors are offered to the requests in the order left, and a
    /// request removed gets none this tick.
    fn order(&mut self, now_ns: u64, live: &mut Vec<LiveRequest>);

    /// Whether `filler`, after `ahead` in the order, may take an idle processor with a job
    /// modeled to take `job_ns` (the requests ahead had nothing there to run). The
    /// default: always (work-conserving).
    fn may_fill(
        &self,
        now_ns: u64,
        ahead: &[LiveRequest],
        filler: &LiveRequest,
        job_ns: u64,
    ) -> bool {
        let _ = (now_ns, ahead, filler, job_ns);
        true
    }

    /// Whether `filler`, after `ahead` in the order, may run a job modeled to take
    /// `job_ns` on a slot it shares with them while they have work ready there, which the
    /// job then delays (a runner with one slot: the real engine's turn, where a prefill
    /// chunk and the decode steps share the CPU). The default: never; the slot follows
    /// the order.
    fn may_delay(
        &self,
        now_ns: u64,
        ahead: &[LiveRequest],
        filler: &LiveRequest,
        job_ns: u64,
    ) -> bool {
        let _ = (now_ns, ahead, filler, job_ns);
        false
    }

    /// Whether the decode step `step` (armed now, its alone bound that of the step run
    /// as a batch of its own) may ride another request's prefill chunks, its linears
    /// joining their jobs as extra rows ([`crate::ride`]), when it is then predicted to
    /// end at `ride_end_ns`. The default: never (each step runs as its own batch).
    fn may_ride(&self, step: &LiveRequest, ride_end_ns: u64) -> bool {
        let _ = (step, ride_end_ns);
        false
    }
}

/// The request that takes a single free slot at `now_ns`: `live` ordered by `policy`,
/// then the first left. For a runner with one slot whose every request has work ready
/// (the real request engine's next prefill chunk, the next request to admit), this is
/// the dispatch system's rule: the slot goes to the first request in the policy's order,
/// and [`RequestPolicy::may_fill`] never applies (no request ahead lacks work). `live` is
/// left in the policy's order (requests dropped by it removed).
pub fn pick_next(
    policy: &mut dyn RequestPolicy,
    now_ns: u64,
    live: &mut Vec<LiveRequest>,
) -> Option<LiveRequest> {
    policy.order(now_ns, live);
    live.first().copied()
}

/// The request policy a world dispatches with.
#[derive(Resource)]
pub struct ActiveRequestPolicy(pub Box<dyn RequestPolicy>);

/// One request at a time, in arrival order (ties by id): the next request's run starts
/// when the last one's is done, what a single llama.cpp context or mllm does on a
/// device. Each run is then scheduled exactly as it would be alone (shifted in time);
/// with one request it changes nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fcfs;

impl RequestPolicy for Fcfs {
    fn name(&self) -> &str {
        "fcfs"
    }

    fn order(&mut self, _now_ns: u64, live: &mut Vec<LiveRequest>) {
        if let Some(first) = live.iter().copied().min_by_key(|r| (r.arrival_ns, r.id)) {
            live.clear();
            live.push(first);
        }
    }
}

/// Strict priority: the most urgent class first; within a class a prefill before a
/// decode step, then arrival, then id. A less urgent request runs only on a processor
/// the more urgent ones have nothing ready for, and yields at its next subgraph
/// boundary.
#[derive(Clone, Copy, Debug, Default)]
pub struct StrictPriority;

/// The most urgent class first; within a class a prefill before a decode step (a
/// prompt's first token waits for no one else's next token, as continuous-batching
/// servers order them), then arrival, then id.
fn by_priority(live: &mut [LiveRequest]) {
    live.sort_by_key(|r| {
        let decoding = matches!(r.phase, RequestPhase::Decode { .. });
        (std::cmp::Reverse(r.priority), decoding, r.arrival_ns, r.id)
    });
}

impl RequestPolicy for StrictPriority {
    fn name(&self) -> &str {
        "priority"
    }

    fn order(&mut self, _now_ns: u64, live: &mut Vec<LiveRequest>) {
        by_priority(live);
    }
}

/// How far past its alone bound a more urgent run may be pushed by fill work when it has
/// no target of its own: its deadline is `armed + SLACK_STRETCH x bound`.
pub const SLACK_STRETCH: f64 = 1.2;

/// Slack-driven: the order of [`StrictPriority`], and a less urgent request fills an idle
/// processor only with a job that fits in the slack of every more urgent request ahead:
/// its deadline (arrival + its TTFT target while in its prefill, at most [`SLACK_STRETCH`]
/// x its alone bound: the first token is what a user waits through, so a looser target
/// caps the fill rather than budgeting it; the run's arming time +
/// its TPOT target for a decode step, at least [`SLACK_STRETCH`] x its alone bound; else
/// the arming time + [`SLACK_STRETCH`] x its alone bound) minus now minus the time it
/// still needs alone. A job that would end after the urgent request needs the processor waits; a
/// short one keeps the processor busy.
#[derive(Clone, Copy, Debug, Default)]
pub struct Slack;

impl Slack {
    /// `urgent`'s slack at `now_ns`, ns (negative: late).
    pub fn slack_ns(now_ns: u64, urgent: &LiveRequest) -> i128 {
        i128::from(Slack::deadline_ns(urgent))
            - i128::from(now_ns)
            - i128::from(urgent.remaining_ns())
    }

    /// `urgent`'s deadline, ns: its run should end by then (the type's doc).
    pub fn deadline_ns(urgent: &LiveRequest) -> u64 {
        let stretched = (urgent.alone_bound_ns as f64 * SLACK_STRETCH) as u64;
        match (urgent.phase, urgent.targets) {
            (
                RequestPhase::Prefill,
                SloTargets {
                    ttft_ns: Some(ttft),
                    ..
                },
            ) => urgent.arrival_ns.saturating_add(ttft.min(stretched)),
            // A step's target, never tighter than the stretch (a target below the
            // step's own time is missed whatever fills beside it).
            (
                RequestPhase::Decode { .. },
                SloTargets {
                    tpot_ns: Some(tpot),
                    ..
                },
            ) => urgent.armed_ns.saturating_add(tpot.max(stretched)),
            _ => urgent.armed_ns.saturating_add(stretched),
        }
    }

    /// Whether a job of `job_ns` fits in the slack of every request in `ahead` more
    /// urgent than `filler`.
    fn fits(now_ns: u64, ahead: &[LiveRequest], filler: &LiveRequest, job_ns: u64) -> bool {
        ahead
            .iter()
            .filter(|a| a.priority > filler.priority)
            .all(|a| i128::from(job_ns) <= Slack::slack_ns(now_ns, a))
    }
}

impl RequestPolicy for Slack {
    fn name(&self) -> &str {
        "slack"
    }

    fn order(&mut self, _now_ns: u64, live: &mut Vec<LiveRequest>) {
        by_priority(live);
    }

    fn may_fill(
        &self,
        now_ns: u64,
        ahead: &[LiveRequest],
        filler: &LiveRequest,
        job_ns: u64,
    ) -> bool {
        Slack::fits(now_ns, ahead, filler, job_ns)
    }

    /// As [`Slack::may_fill`]: a shared slot is lent within the same slack as an idle one.
    fn may_delay(
        &self,
        now_ns: u64,
        ahead: &[LiveRequest],
        filler: &LiveRequest,
        job_ns: u64,
    ) -> bool {
        Slack::fits(now_ns, ahead, filler, job_ns)
    }

    /// A step rides when it is predicted to end by its own deadline that way: riding
    /// gives the less urgent prefill the processors the step's chain of short jobs would
    /// hold, and costs the step nothing it was promised.
    fn may_ride(&self, step: &LiveRequest, ride_end_ns: u64) -> bool {
        ride_end_ns <= Slack::deadline_ns(step)
    }
}

/// The request policies by name, and the default.
pub const REQUEST_POLICIES: &[(&str, &str)] = &[
    (
        "fcfs",
        "one request at a time, in arrival order (the single-context baseline)",
    ),
    (
        "priority",
        "strict priority class, then arrival; preempting at subgraph boundaries",
    ),
    (
        "slack",
        "priority order; less urgent work fills idle processors within the urgent requests' slack",
    ),
];

/// The request policy used wherever none is named: a request world
/// ([`crate::spawn_request_world`]), the real request engine and
/// `hetsched simulate --requests`. `slack`, because it is the one built-in that meets
/// targets: an urgent request takes each processor at its next subgraph boundary, and
/// less urgent work still fills the processors it leaves idle within the urgent
/// requests' slack. It costs nothing where there is nothing to trade: with one live
/// request it schedules exactly as that request alone (as `fcfs` does), and a runner
/// with one slot (the real engine) lends that slot within the same slack
/// ([`RequestPolicy::may_delay`]).
pub const DEFAULT_REQUEST_POLICY: &str = "slack";

/// A fresh [`DEFAULT_REQUEST_POLICY`].
pub fn default_request_policy() -> Box<dyn RequestPolicy> {
    Box::new(Slack)
}

/// A request-policy name that does not exist.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub struct UnknownRequestPolicy(pub String);

impl fmt::Display for UnknownRequestPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let known: Vec<&str> = REQUEST_POLICIES.iter().map(|(n, _)| *n).collect();
        write!(
            f,
            "unknown request policy `{}`; choose one of: {}",
            self.0,
            known.join(", ")
        )
    }
}

/// A fresh request policy by name.
///
/// # Errors
/// [`UnknownRequestPolicy`] for a name not in [`REQUEST_POLICIES`].
pub fn create_request_policy(name: &str) -> Result<Box<dyn RequestPolicy>, UnknownRequestPolicy> {
    match name {
        "fcfs" => Ok(Box::new(Fcfs)),
        "priority" => Ok(Box::new(StrictPriority)),
        "slack" => Ok(Box::new(Slack)),
        other => Err(UnknownRequestPolicy(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_named_built_in() {
        assert_eq!(default_request_policy().name(), DEFAULT_REQUEST_POLICY);
        assert!(create_request_policy(DEFAULT_REQUEST_POLICY).is_ok());
        assert!(
            REQUEST_POLICIES
                .iter()
                .any(|(n, _)| *n == DEFAULT_REQUEST_POLICY)
        );
    }

    #[test]
    fn slack_measures_against_the_phase_target_and_at_least_the_stretch() {
        let ms = 1_000_000u64;
        let urgent = |phase, targets| LiveRequest {
            entity: Entity::from_raw_u32(1).unwrap(),
            id: RequestId(1),
            priority: Priority::INTERACTIVE,
            targets,
            arrival_ns: 0,
            phase,
            work_left_ns: 100 * ms,
            work_total_ns: 100 * ms,
            alone_bound_ns: 100 * ms,
            armed_ns: 10 * ms,
        };
        let decode = RequestPhase::Decode { step: 2 };
        let tpot = |t| SloTargets {
            tpot_ns: Some(t * ms),
            ..SloTargets::default()
        };
        let ttft = |t| SloTargets {
            ttft_ns: Some(t * ms),
            ..SloTargets::default()
        };
        let slack = |phase, targets| Slack::slack_ns(10 * ms, &urgent(phase, targets)) / ms as i128;
        // No target: 1.2x the bound after arming, less the bound still needed.
        assert_eq!(slack(decode, SloTargets::default()), 20);
        // A step's TPOT target above the stretch is its deadline; below, the stretch.
        assert_eq!(slack(decode, tpot(250)), 150);
        assert_eq!(slack(decode, tpot(50)), 20);
        // A prefill measures against its TTFT target from arrival, not its TPOT one, and
        // never past the stretch from arrival (1.2 x 100 ms - 10 ms now - 100 ms needed).
        assert_eq!(slack(RequestPhase::Prefill, ttft(500)), 10);
        assert_eq!(slack(RequestPhase::Prefill, ttft(115)), 5);
        assert_eq!(slack(RequestPhase::Prefill, tpot(250)), 20);
    }

    #[test]
    fn priority_orders_class_then_prefill_before_decode_then_arrival() {
        let live = |id: u64, priority, arrival_ns, phase| LiveRequest {
            entity: Entity::from_raw_u32(id as u32 + 1).unwrap(),
            id: RequestId(id),
            priority,
            targets: SloTargets::default(),
            arrival_ns,
            phase,
            work_left_ns: 1,
            work_total_ns: 1,
            alone_bound_ns: 1,
            armed_ns: 0,
        };
        let decode = RequestPhase::Decode { step: 3 };
        let mut requests = vec![
            live(0, Priority::INTERACTIVE, 0, decode),
            live(1, Priority::BACKGROUND, 0, RequestPhase::Prefill),
            live(2, Priority::INTERACTIVE, 9, RequestPhase::Prefill),
            live(3, Priority::INTERACTIVE, 5, RequestPhase::Prefill),
        ];
        for policy in ["priority", "slack"] {
            let mut order = requests.clone();
            create_request_policy(policy).unwrap().order(0, &mut order);
            let ids: Vec<u64> = order.iter().map(|r| r.id.0).collect();
            assert_eq!(ids, [3, 2, 0, 1], "{policy}");
        }
        Fcfs.order(0, &mut requests);
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].id, RequestId(0), "fcfs: the earliest arrival");
    }

    #[test]
    fn a_shared_slot_is_lent_within_the_urgent_slack_under_slack_only() {
        let ms = 1_000_000u64;
        let request = |id: u64, priority, phase| LiveRequest {
            entity: Entity::from_raw_u32(id as u32 + 1).unwrap(),
            id: RequestId(id),
            priority,
            targets: SloTargets::default(),
            arrival_ns: 0,
            phase,
            work_left_ns: 100 * ms,
            work_total_ns: 100 * ms,
            alone_bound_ns: 100 * ms,
            armed_ns: 10 * ms,
        };
        // Decoding, no target: 20 ms of slack at 10 ms (1.2x the bound, less the bound).
        let urgent = request(0, Priority::INTERACTIVE, RequestPhase::Decode { step: 1 });
        let filler = request(1, Priority::BACKGROUND, RequestPhase::Prefill);
        let lend = |policy: &str, job_ms: u64| {
            let policy = create_request_policy(policy).unwrap();
            policy.may_delay(10 * ms, &[urgent], &filler, job_ms * ms)
        };
        assert!(lend("slack", 20));
        assert!(!lend("slack", 21));
        for strict in ["priority", "fcfs"] {
            assert!(
                !lend(strict, 1),
                "{strict} lends no slot ahead of the order"
            );
        }
        // Requests ahead that are no more urgent than the filler cost no slack.
        let peer = request(2, Priority::BACKGROUND, RequestPhase::Decode { step: 1 });
        assert!(Slack.may_delay(10 * ms, &[peer], &filler, 500 * ms));
    }
}
