//! What the request engine reports: each request's events and figures, and snapshots of
//! the engine as a whole.

use serde::Serialize;

use super::{Priority, RequestId};
use crate::generate::FinishReason;

/// A request's figures, measured on the engine's clock.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RequestMetrics {
    /// The request.
    #[serde(serialize_with = "id_number")]
    pub id: RequestId,
    /// Its priority class (`interactive`, `background` or the number).
    #[serde(serialize_with = "priority_label")]
    pub priority: Priority,
    /// When it was submitted, ms after the engine started.
    pub arrival_ms: f64,
    /// From submit to the first token of its first sample, ms.
    pub ttft_ms: f64,
    /// Per token after the first, averaged over the samples, ms (0 with one token).
    pub tpot_ms: f64,
    /// From submit to its last sample's end, ms.
    pub e2e_ms: f64,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated, summed over the samples.
    pub generated_tokens: usize,
}

fn id_number<S: serde::Serializer>(id: &RequestId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(id.0)
}

fn priority_label<S: serde::Serializer>(p: &Priority, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.label())
}

/// What a request's handle receives, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestEvent {
    /// A sample's token and the text that became final with it (may be empty: a
    /// character split over tokens, or text held back as a possible stop string).
    Token {
        /// The sample, from 0.
        sample: usize,
        /// The token id.
        token: u32,
        /// Its text piece.
        text: String,
    },
    /// A sample ended; `text` is any text it held back until then.
    SampleFinished {
        /// The sample.
        sample: usize,
        /// Why.
        reason: FinishReason,
        /// Text released at the end.
        text: String,
    },
    /// Every sample ended: the request's figures. The last event.
    Finished(RequestMetrics),
    /// The request failed (a kernel error, or the engine stopped). The last event.
    Failed(String),
}

/// A snapshot of the engine ([`RequestEngine::metrics`](super::RequestEngine::metrics)).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EngineSnapshot {
    /// Requests waiting for KV memory.
    pub waiting: usize,
    /// Requests in their prefill.
    pub prefilling: usize,
    /// Requests decoding.
    pub decoding: usize,
    /// Requests finished (every sample ended, cancelled ones included).
    pub finished: u64,
    /// Of which cancelled.
    pub cancelled: u64,
    /// Requests failed.
    pub failed: u64,
    /// KV bytes reserved by live requests.
    pub kv_bytes_in_use: usize,
    /// The budget.
    pub kv_budget_bytes: usize,
    /// Per lane of the engine's device, its busy time since the engine started.
    pub lanes: Vec<LaneBusy>,
}

/// One lane's busy time: the run time of the prefill subgraphs it ran, and on the lane
/// that decodes (the CPU's) the batched decode steps' wall time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LaneBusy {
    /// The lane's processor name.
    pub name: String,
    /// Its kind (`cpu`, `npu`, `gpu`).
    pub kind: String,
    /// Busy time so far, ns.
    pub busy_ns: u64,
}
