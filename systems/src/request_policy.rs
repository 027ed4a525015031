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

use crate::request::{Priority, RequestId, RequestPhase, SloTargets};

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
}

/// Orders the live requests for the processors idle this tick.
pub trait RequestPolicy: Send + Sync + 'static {
    /// The name written on the command line.
    fn name(&self) -> &str;

    /// Orders `live` (every armed request whose run is not done, in arming order) at
    /// `now_ns`: idle processors are offered to the requests in the order left, and a
    /// request removed gets none this tick.
    fn order(&mut self, now_ns: u64, live: &mut Vec<LiveRequest>);
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

/// The request policies by name, and the default.
pub const REQUEST_POLICIES: &[(&str, &str)] = &[(
    "fcfs",
    "one request at a time, in arrival order (the single-context baseline)",
)];

/// The request policy used when none is named.
pub const DEFAULT_REQUEST_POLICY: &str = "fcfs";

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
        other => Err(UnknownRequestPolicy(other.to_string())),
    }
}
