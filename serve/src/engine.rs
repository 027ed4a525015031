//! The seam between HTTP and generation: what the server asks of an engine.
//!
//! An [`Engine`] accepts a request ([`EngineRequest`]: prompt tokens, generation options,
//! `n` samples, a [`Priority`]) from any thread and answers at once: either a
//! [`Submitted`] handle whose channel carries the request's [`Event`]s (text pieces per
//! sample, then each sample's finish), or a [`Refusal`] the server turns into
//! `503 Service Unavailable` with `Retry-After` (or 400 for a request that can never run). Dropping the handle cancels the request:
//! the engine stops it after the token in progress and frees its KV memory. The server
//! never looks inside an engine beyond this trait and its [`EngineSnapshot`].
//!
//! Contract an engine keeps:
//! * every accepted request ends with one [`Event::Finished`] per sample, in sample order
//!   of finishing, or with one [`Event::Failed`] (after which nothing more comes);
//! * [`Event::Text`] pieces of one sample arrive in order; each is final (UTF-8 complete,
//!   stop strings held back and never sent);
//! * a cancelled request stops sending; its KV memory is back in the snapshot's
//!   `kv_bytes_in_use` once its last event is sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hetsched_exec::generate::{FinishReason, GenerateOptions};
pub use hetsched_systems::Priority;
use thiserror::Error;
use tokio::sync::mpsc;

/// One request for the engine: checked by the server already (ranges, context).
#[derive(Clone, Debug)]
pub struct EngineRequest {
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Tokens at most per sample, sampling, stop strings. Sample `i` uses seed
    /// `options.sampling.seed + i`.
    pub options: GenerateOptions,
    /// Independent samples of the prompt, at least 1.
    pub n: usize,
    /// Scheduling class: larger is more urgent ([`Priority::INTERACTIVE`] by default,
    /// [`Priority::BACKGROUND`]).
    pub priority: Priority,
}

/// What an engine sends about an accepted request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Text of sample `sample` became final: one event per generated token (the text may be
    /// empty while a UTF-8 character or a possible stop string is incomplete), and one at
    /// the end with what was held back.
    Text {
        /// Which sample, from 0.
        sample: usize,
        /// Text now final.
        text: String,
    },
    /// Sample `sample` ended.
    Finished {
        /// Which sample.
        sample: usize,
        /// Why.
        reason: FinishReason,
        /// Tokens it generated (an end-of-sequence token included).
        tokens: usize,
    },
    /// The request failed; no more events follow.
    Failed {
        /// What went wrong.
        message: String,
    },
}

/// Cancels a request when dropped: the HTTP side drops it when the client goes.
pub struct CancelOnDrop(Option<Box<dyn FnOnce() + Send + Sync>>);

impl CancelOnDrop {
    /// A guard that sets `flag`.
    pub fn new(flag: Arc<AtomicBool>) -> Self {
        Self::with(move || flag.store(true, Ordering::Relaxed))
    }

    /// A guard that runs `cancel` once, when dropped.
    pub fn with(cancel: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self(Some(Box::new(cancel)))
    }
}

impl std::fmt::Debug for CancelOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CancelOnDrop")
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            cancel();
        }
    }
}

/// An accepted request: its events, and the guard that cancels it when dropped.
#[derive(Debug)]
pub struct Submitted {
    /// The request's events (see the module's contract).
    pub events: mpsc::UnboundedReceiver<Event>,
    /// Cancels the request when dropped.
    pub cancel: CancelOnDrop,
}

/// Why an engine would not take a request: now (the server answers 503 with
/// `Retry-After`), or ever as asked ([`Refusal::Invalid`]: 400).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    /// The engine holds as many requests (queued and running) as it may.
    #[error("the server holds {limit} requests already (queued and running): retry later")]
    TooManyRequests {
        /// The limit.
        limit: usize,
    },
    /// The request's KV memory does not fit in what is free now.
    #[error(
        "the request needs {needed} bytes of KV memory and {free} are free: retry later, or \
         ask for fewer tokens"
    )]
    KvBudget {
        /// Bytes the request needs.
        needed: u64,
        /// Bytes free.
        free: u64,
    },
    /// The engine is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The request can never run as asked (its KV memory exceeds the whole budget, a
    /// setting the engine refuses): a client error, retrying does not help.
    #[error("{message}")]
    Invalid {
        /// What is wrong and what to change.
        message: String,
    },
}

/// A processor's busy time so far.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessorBusy {
    /// Its name (lane).
    pub name: String,
    /// Its kind: `cpu`, `gpu` or `npu`.
    pub kind: String,
    /// Time it ran work since the engine started, seconds (summed over its threads
    /// where it has several).
    pub busy_seconds: f64,
    /// Busy seconds per second when fully used: its threads (1 for a queue lane, which
    /// runs one piece of work at a time).
    pub capacity: f64,
}

/// The engine's state at one moment, for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineSnapshot {
    /// Requests accepted and not started.
    pub queued: usize,
    /// Requests generating.
    pub running: usize,
    /// KV cache bytes held by running requests.
    pub kv_bytes_in_use: u64,
    /// KV cache bytes running requests may hold together (0: no budget).
    pub kv_budget_bytes: u64,
    /// Per processor.
    pub processors: Vec<ProcessorBusy>,
    /// Seconds since the engine started.
    pub uptime_seconds: f64,
}

/// A generation engine the server drives (see the module doc for the contract).
pub trait Engine: Send + Sync {
    /// Accepts `request` or refuses it now; never blocks on generation.
    fn submit(&self, request: EngineRequest) -> Result<Submitted, Refusal>;

    /// Counts and gauges now.
    fn snapshot(&self) -> EngineSnapshot;

    /// Refuses new requests and cancels every accepted one (shutdown after the grace
    /// period).
    fn cancel_all(&self);
}
