//! A request as an entity of the world: who it is ([`RequestId`]), how urgent
//! ([`Priority`]), its latency targets ([`SloTargets`]), where it stands
//! ([`RequestPhase`]), all on its [`Request`] component. It names no plan, run or
//! policy, so that the request world ([`crate::request`]), the request policies and the
//! shared resources all read it from below.

use std::fmt;
use std::str::FromStr;

use bevy_ecs::prelude::Component;
use thiserror::Error;

/// A request's id, as its caller names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A request's priority class: larger is more urgent. The two named classes are
/// [`Priority::INTERACTIVE`] (a user waits for the first token) and
/// [`Priority::BACKGROUND`]; any number 0..=255 is a class too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(pub u8);

impl Priority {
    /// A request a user waits on.
    pub const INTERACTIVE: Priority = Priority(200);
    /// A request nobody watches token by token (summaries, indexing, agents' side work).
    pub const BACKGROUND: Priority = Priority(50);

    /// `interactive`, `background`, or the number otherwise.
    pub fn label(self) -> String {
        match self {
            Priority::INTERACTIVE => "interactive".to_string(),
            Priority::BACKGROUND => "background".to_string(),
            Priority(n) => n.to_string(),
        }
    }
}

impl Default for Priority {
    fn default() -> Self {
        Priority::INTERACTIVE
    }
}

/// A priority that is neither a class name nor a number 0..=255.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("unknown priority `{0}`; give `interactive`, `background` or a number 0..=255")]
pub struct UnknownPriority(pub String);

impl FromStr for Priority {
    type Err = UnknownPriority;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "interactive" => Ok(Priority::INTERACTIVE),
            "background" => Ok(Priority::BACKGROUND),
            other => other
                .parse::<u8>()
                .map(Priority)
                .map_err(|_| UnknownPriority(s.to_string())),
        }
    }
}

/// Latency targets of a request (service-level objectives), each optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SloTargets {
    /// Time to first token from arrival, ns.
    pub ttft_ns: Option<u64>,
    /// Time per output token after the first, ns.
    pub tpot_ns: Option<u64>,
}

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestPhase {
    /// Arrived, nothing run yet (or waiting for memory).
    Waiting,
    /// A prefill (the prompt, or a later turn's new tokens) is running.
    Prefill,
    /// Decoding: `step` is the decode step running (0-based, over the request's life).
    Decode {
        /// Decode steps started so far, minus one.
        step: u64,
    },
    /// Every token generated; nothing armed.
    Finished,
    /// Cancelled by its caller; nothing armed.
    Cancelled,
}

/// A generation request: who it is, how urgent, its targets, when it arrived, where it
/// stands, and the tokens in its KV cache.
#[derive(Component, Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Caller's id.
    pub id: RequestId,
    /// Priority class.
    pub priority: Priority,
    /// Latency targets.
    pub targets: SloTargets,
    /// When it arrived, ns on the world's [`Clock`](crate::resources::Clock).
    pub arrival_ns: u64,
    /// Phase of the run in progress (or the last one).
    pub phase: RequestPhase,
    /// Tokens whose keys and values are in the request's cache.
    pub cached_tokens: usize,
}

impl Request {
    /// A request that arrived at `arrival_ns`, waiting.
    pub fn new(id: RequestId, priority: Priority, targets: SloTargets, arrival_ns: u64) -> Self {
        Request {
            id,
            priority,
            targets,
            arrival_ns,
            phase: RequestPhase::Waiting,
            cached_tokens: 0,
        }
    }
}
