//! Several requests' prefills simulated together in one world on a scene's device: each
//! request's prefill is armed at its arrival ([`hetsched_systems::arm_request`]) beside
//! the others, a request policy orders them, and every job takes its modeled time on a
//! virtual clock. The outcome per request: when its first token is ready (its prefill's
//! end), beside the same prefill alone on the same scene and policy.
//!
//! Decode steps are not simulated here yet: a request's time to first token is its
//! prefill's end, and `e2e` figures need decode runs in the same world.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use hetsched_systems::request_policy::{UnknownRequestPolicy, create_request_policy};
use hetsched_systems::resources::{Clock, Completion, Inbox, Outbox};
use hetsched_systems::{
    ActiveRequestPolicy, InstanceKey, LiveRuns, PlanError, PrefillPlan, Priority, Request,
    RequestError, RequestId, RequestPhase, SloTargets, Workload, arm_request, scheduler_schedule,
    spawn_request_entity, spawn_request_world,
};
use thiserror::Error;

use crate::engine::{self, EngineError};
use crate::scene::{Scene, SceneError};

/// At most this many requests in one simulation; more is refused
/// ([`RequestsError::TooMany`]).
pub const MAX_REQUESTS: usize = 1024;

/// One request to simulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpec {
    /// Caller's id.
    pub id: RequestId,
    /// Priority class.
    pub priority: Priority,
    /// Latency targets.
    pub targets: SloTargets,
    /// Arrival, ns from the start.
    pub arrival_ns: u64,
    /// Prompt length, tokens.
    pub prompt_len: u32,
}

/// What one request got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefillOutcome {
    /// Caller's id.
    pub id: RequestId,
    /// Priority class.
    pub priority: Priority,
    /// Arrival, ns.
    pub arrival_ns: u64,
    /// Time to first token (its prefill's end minus its arrival), ns.
    pub ttft_ns: u64,
    /// The same prefill alone on the same scene and policy, ns.
    pub alone_ttft_ns: u64,
}

/// One job of a simulated mix: which request's instance ran where and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestSlice {
    /// The request.
    pub request: RequestId,
    /// (chunk, stage) in the request's plan.
    pub key: InstanceKey,
    /// Processor lane.
    pub lane: usize,
    /// Start, ns.
    pub start_ns: u64,
    /// End, ns.
    pub end_ns: u64,
}

/// A simulated mix: per request its outcome (in the order given), every job run, and
/// each request's plan (for the jobs' templates).
#[derive(Clone, Debug)]
pub struct RequestsRun {
    /// Per request.
    pub outcomes: Vec<PrefillOutcome>,
    /// Every job, in dispatch order.
    pub slices: Vec<RequestSlice>,
    /// Per request, its prefill's plan.
    pub plans: Vec<Arc<PrefillPlan>>,
    /// When the last job ended, ns.
    pub makespan_ns: u64,
}

/// Why a simulation of requests could not run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RequestsError {
    /// No request given.
    #[error("no request to simulate")]
    Empty,
    /// More requests than [`MAX_REQUESTS`].
    #[error("{0} requests; at most {MAX_REQUESTS} are simulated together")]
    TooMany(usize),
    /// Arrivals must not go back in time.
    #[error("request {id} arrives at {arrival_ns} ns, before the request listed before it")]
    OutOfOrder {
        /// The request.
        id: RequestId,
        /// Its arrival.
        arrival_ns: u64,
    },
    /// A request's prefill cannot be planned (prompt 0 or beyond the context, ...).
    #[error("request {id}: {source}")]
    Plan {
        /// The request.
        id: RequestId,
        /// Why.
        source: PlanError,
    },
    /// The scene's policy.
    #[error(transparent)]
    Scene(#[from] SceneError),
    /// The request policy's name.
    #[error(transparent)]
    RequestPolicy(#[from] UnknownRequestPolicy),
    /// Arming a request.
    #[error(transparent)]
    Arm(#[from] RequestError),
    /// The alone run.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Nothing runs, nothing arrives, work is left.
    #[error("the simulation stalled with {0} instances outstanding")]
    Stalled(usize),
}

/// Simulates `specs` (in arrival order) on `scene`'s device, each request's prefill
/// decided within by the scene's policy, requests ordered by `request_policy`.
///
/// # Errors
/// [`RequestsError`]: bad requests (none, too many, out of order, an unplannable
/// prompt), an unknown policy, or a stall.
pub fn simulate_prefills(
    scene: &Scene,
    specs: &[RequestSpec],
    request_policy: &str,
) -> Result<Vec<PrefillOutcome>, RequestsError> {
    simulate_requests(scene, specs, request_policy).map(|run| run.outcomes)
}

/// [`simulate_prefills`], with every job's slice and the plans (for timelines).
///
/// # Errors
/// As [`simulate_prefills`].
pub fn simulate_requests(
    scene: &Scene,
    specs: &[RequestSpec],
    request_policy: &str,
) -> Result<RequestsRun, RequestsError> {
    if specs.is_empty() {
        return Err(RequestsError::Empty);
    }
    if specs.len() > MAX_REQUESTS {
        return Err(RequestsError::TooMany(specs.len()));
    }
    if let Some(w) = specs.windows(2).find(|w| w[1].arrival_ns < w[0].arrival_ns) {
        return Err(RequestsError::OutOfOrder {
            id: w[1].id,
            arrival_ns: w[1].arrival_ns,
        });
    }
    let plans = specs
        .iter()
        .map(|s| plan_for(scene, s).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let mut world = spawn_request_world(&scene.device);
    world.insert_resource(ActiveRequestPolicy(create_request_policy(request_policy)?));
    let mut schedule = scheduler_schedule();
    let mut entities = Vec::with_capacity(specs.len());
    let mut next_arrival = 0;
    // (end, lane, id, start): earliest end first, ties by lane.
    let mut in_flight: BinaryHeap<Reverse<(u64, usize, u32, u64)>> = BinaryHeap::new();
    let mut first_token_ns = vec![None; specs.len()];
    let mut slices = Vec::new();
    loop {
        let now = world.resource::<Clock>().now_ns;
        while next_arrival < specs.len() && specs[next_arrival].arrival_ns <= now {
            let s = &specs[next_arrival];
            let entity = spawn_request_entity(
                &mut world,
                Request::new(s.id, s.priority, s.targets, s.arrival_ns),
            );
            let plan = plans[next_arrival].clone();
            arm_request(
                &mut world,
                entity,
                plan,
                scene.new_policy()?,
                RequestPhase::Prefill,
            )?;
            entities.push(entity);
            next_arrival += 1;
        }
        schedule.run(&mut world);
        for job in std::mem::take(&mut world.resource_mut::<Outbox>().0) {
            slices.push(RequestSlice {
                request: job.request,
                key: job.key,
                lane: job.processor,
                start_ns: now,
                end_ns: now + job.estimated_ns,
            });
            in_flight.push(Reverse((
                now + job.estimated_ns,
                job.processor,
                job.id,
                now,
            )));
        }
        let finished = std::mem::take(&mut world.resource_mut::<LiveRuns>().finished);
        for entity in finished {
            if let Some(i) = entities.iter().position(|&e| e == entity) {
                first_token_ns[i].get_or_insert(now);
            }
        }
        let outstanding = world.resource::<LiveRuns>().outstanding;
        let arrival = specs.get(next_arrival).map(|s| s.arrival_ns);
        let end = in_flight.peek().map(|Reverse(j)| j.0);
        let next = match (end, arrival) {
            (None, None) if outstanding == 0 => break,
            (None, None) => return Err(RequestsError::Stalled(outstanding)),
            (Some(e), Some(a)) => e.min(a),
            (Some(e), None) => e,
            (None, Some(a)) => a,
        };
        world.resource_mut::<Clock>().now_ns = next;
        let mut inbox = world.resource_mut::<Inbox>();
        while let Some(&Reverse((end, processor, id, start))) = in_flight.peek() {
            if end != next {
                break;
            }
            in_flight.pop();
            inbox.0.push(Completion {
                id,
                processor,
                start_ns: start,
                end_ns: end,
            });
        }
    }
    let outcomes = specs
        .iter()
        .zip(&plans)
        .zip(first_token_ns)
        .map(|((s, plan), first)| {
            let alone = engine::simulate(plan.clone(), scene.new_policy()?)?;
            let first = first.ok_or(RequestsError::Stalled(0))?;
            Ok(PrefillOutcome {
                id: s.id,
                priority: s.priority,
                arrival_ns: s.arrival_ns,
                ttft_ns: first - s.arrival_ns,
                alone_ttft_ns: alone.makespan_ns,
            })
        })
        .collect::<Result<Vec<_>, RequestsError>>()?;
    Ok(RequestsRun {
        outcomes,
        makespan_ns: slices.iter().map(|s| s.end_ns).max().unwrap_or(0),
        slices,
        plans,
    })
}

/// The scene's plan for `spec`'s prompt (the scene's chunk length, placement and memory).
fn plan_for(scene: &Scene, spec: &RequestSpec) -> Result<PrefillPlan, RequestsError> {
    let mut scene = scene.clone();
    scene.workload = Workload {
        prompt_len: spec.prompt_len,
        ..scene.workload.clone()
    };
    scene.plan().map_err(|e| match e {
        SceneError::Plan(source) => RequestsError::Plan {
            id: spec.id,
            source,
        },
        other => RequestsError::Scene(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: u64, priority: Priority, arrival_ms: u64, prompt_len: u32) -> RequestSpec {
        RequestSpec {
            id: RequestId(id),
            priority,
            targets: SloTargets::default(),
            arrival_ns: arrival_ms * 1_000_000,
            prompt_len,
        }
    }

    #[test]
    fn a_lone_request_gets_its_alone_time_and_bad_input_is_refused() {
        let scene = Scene::default_scene();
        let one = [spec(1, Priority::INTERACTIVE, 5, 256)];
        let out = simulate_prefills(&scene, &one, "slack").unwrap();
        assert_eq!(out[0].ttft_ns, out[0].alone_ttft_ns);
        assert!(matches!(
            simulate_prefills(&scene, &[], "fcfs"),
            Err(RequestsError::Empty)
        ));
        let backwards = [
            spec(1, Priority::BACKGROUND, 5, 64),
            spec(2, Priority::BACKGROUND, 1, 64),
        ];
        assert!(matches!(
            simulate_prefills(&scene, &backwards, "fcfs"),
            Err(RequestsError::OutOfOrder { .. })
        ));
        let empty_prompt = [spec(1, Priority::BACKGROUND, 0, 0)];
        assert!(matches!(
            simulate_prefills(&scene, &empty_prompt, "fcfs"),
            Err(RequestsError::Plan { .. })
        ));
        assert!(matches!(
            simulate_prefills(&scene, &one, "nonesuch"),
            Err(RequestsError::RequestPolicy(_))
        ));
    }

    #[test]
    fn an_interactive_prompt_overtakes_a_background_prefill_except_under_fcfs() {
        let scene = Scene::default_scene();
        let burst = [
            spec(0, Priority::BACKGROUND, 0, 1024),
            spec(1, Priority::INTERACTIVE, 100, 64),
        ];
        let fcfs = simulate_prefills(&scene, &burst, "fcfs").unwrap();
        let slack = simulate_prefills(&scene, &burst, "slack").unwrap();
        // fcfs: the interactive prompt waits for the rest of the background prefill.
        assert!(fcfs[1].ttft_ns > 2 * fcfs[1].alone_ttft_ns);
        assert!(slack[1].ttft_ns < fcfs[1].ttft_ns);
        assert!(slack[0].ttft_ns >= slack[0].alone_ttft_ns);
    }
}
