//! An [`Engine`] over exec's many-requests [`RequestEngine`]: every HTTP request is a
//! request of that engine, so requests run together (prefill chunks of the most urgent
//! request, one batched decode step across every decoding sample) and an interactive
//! request preempts a background prefill at the next chunk boundary.
//!
//! What this adapter adds to the engine, and nothing else:
//! * the server's request ([`EngineRequest`]) as a [`RequestSpec`], and the engine's typed
//!   [`SubmitError`]s as [`Refusal`]s: a full KV budget or request limit is a 503, a
//!   request that can never fit or that the engine finds invalid a 400;
//! * the engine's blocking event channels bridged to the server's async ones by **one**
//!   forwarding thread for all requests (a `crossbeam` select over their channels), which
//!   also counts each sample's tokens (the end-of-sequence token has no event of its own
//!   but counts, as `usage` expects);
//! * cancel on drop: the handle the server drops when a client leaves cancels the request
//!   in the engine, which ends its samples at its next turn and frees its KV memory;
//! * memory back to the operating system when the engine goes idle (the same forwarding
//!   thread, a second after the last request ended);
//! * the snapshot for `/metrics` from [`RequestEngine::metrics`] (requests waiting for
//!   memory are `queued`, those prefilling or decoding `running`; each lane's busy time
//!   as the engine counts it: its prefill subgraphs' run time, and on the CPU lane the
//!   decode steps'), and the CPU time of the engine's threads: its kernel pool's
//!   (`engine-pool`: the prefill chunks of both the CPU and the emulated-NPU lane, which
//!   compute on that one pool, and the batched decode steps) and its loop's
//!   (`engine-loop`: admission, sampling, text), read from the operating system
//!   (`thread_time`).
//!
//! The engine decodes on the CPU threads only: `hetsched serve` uses the
//! [`crate::session_engine::SessionEngine`] when a GPU lane is asked for.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Select, Sender};
use hetsched_exec::generate::FinishReason;
use hetsched_exec::generate::requests::{
    EngineLimits, LaneBusy, RequestEngine, RequestEvent, RequestHandle, RequestSpec, SubmitError,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::engine::{
    CancelOnDrop, Engine, EngineRequest, EngineSnapshot, Event, ProcessorBusy, Refusal, Submitted,
};
use crate::thread_time::cpu_time_by_prefix;

/// Names of the engine's threads, as exec's request engine gives them: its kernel pool's
/// workers (`hetsched-engine-{i}`) and its loop (`hetsched-requests`). A rename there
/// shows as no busy time here (the server's tests check there is some). Every engine
/// names its threads alike, so a process that runs two (tests do) counts both engines'
/// threads in each one's figures.
const ENGINE_THREADS: [(&str, &str); 2] = [
    ("engine-pool", "hetsched-engine-"),
    ("engine-loop", "hetsched-requests"),
];

/// What the forwarding thread is told.
enum Control {
    /// Forward this request's events.
    Forward(Forwarded),
    /// Cancel every request forwarded (shutdown).
    CancelAll,
}

/// A request whose events the forwarding thread bridges.
struct Forwarded {
    handle: Arc<RequestHandle>,
    events: mpsc::UnboundedSender<Event>,
    /// Tokens per sample so far.
    tokens: Vec<usize>,
}

/// Submission state: new requests are refused once stopping, and a request's `Forward`
/// is sent under the same lock as `CancelAll`, so none slips past a shutdown.
struct Gate {
    stopping: bool,
    control: Sender<Control>,
}

/// Many requests at once on a [`RequestEngine`] (see the module doc).
pub struct ConcurrentEngine {
    engine: RequestEngine,
    gate: Mutex<Gate>,
}

impl ConcurrentEngine {
    /// Serves through `engine`; starts the forwarding thread.
    ///
    /// # Errors
    /// The thread could not start.
    pub fn new(engine: RequestEngine) -> std::io::Result<Self> {
        let (control, inbox) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name("hetsched-serve-events".into())
            .spawn(move || forward(&inbox))?;
        Ok(Self {
            gate: Mutex::new(Gate {
                stopping: false,
                control,
            }),
            engine,
        })
    }

    /// The engine underneath.
    pub fn engine(&self) -> &RequestEngine {
        &self.engine
    }
}

/// The engine's limits for a server: a full KV budget refuses (503) rather than waits.
pub fn server_limits(kv_budget_bytes: usize, max_requests: usize) -> EngineLimits {
    EngineLimits {
        kv_budget_bytes,
        max_requests,
        admission: hetsched_exec::generate::requests::Admission::Refuse,
    }
}

impl Engine for ConcurrentEngine {
    fn submit(&self, request: EngineRequest) -> Result<Submitted, Refusal> {
        let gate = self.gate.lock();
        if gate.stopping {
            return Err(Refusal::ShuttingDown);
        }
        let n = request.n;
        let spec = RequestSpec {
            prompt: request.prompt,
            max_tokens: request.options.max_tokens,
            sampling: request.options.sampling,
            stop: request.options.stop,
            n,
            priority: request.priority,
            ignore_eos: request.options.ignore_eos,
        };
        let handle = Arc::new(self.engine.submit(spec).map_err(refusal)?);
        let (events, receiver) = mpsc::unbounded_channel();
        let forwarded = Forwarded {
            handle: handle.clone(),
            events,
            tokens: vec![0; n],
        };
        if gate.control.send(Control::Forward(forwarded)).is_err() {
            // The forwarding thread is gone (it panicked): nobody would see the events.
            let _ = handle.cancel();
            return Err(Refusal::ShuttingDown);
        }
        Ok(Submitted {
            events: receiver,
            cancel: CancelOnDrop::with(move || {
                // A request that already ended is not live: nothing to cancel.
                let _ = handle.cancel();
            }),
        })
    }

    fn snapshot(&self) -> EngineSnapshot {
        let m = self.engine.metrics();
        EngineSnapshot {
            queued: m.waiting,
            running: m.prefilling + m.decoding,
            kv_bytes_in_use: m.kv_bytes_in_use as u64,
            kv_budget_bytes: m.kv_budget_bytes as u64,
            processors: lane_busy(&m.lanes).chain(engine_busy()).collect(),
            // From the engine's own start, where its threads' CPU time counts from.
            uptime_seconds: self.engine.started().elapsed().as_secs_f64(),
        }
    }

    fn cancel_all(&self) {
        let mut gate = self.gate.lock();
        gate.stopping = true;
        let _ = gate.control.send(Control::CancelAll);
    }
}

/// The engine's lanes' busy time (one queue each: capacity 1).
fn lane_busy(lanes: &[LaneBusy]) -> impl Iterator<Item = ProcessorBusy> + '_ {
    lanes.iter().map(|lane| ProcessorBusy {
        name: lane.name.clone(),
        kind: lane.kind.clone(),
        busy_seconds: lane.busy_ns as f64 / 1e9,
        capacity: 1.0,
    })
}

/// The engine's threads' CPU time so far, per group of [`ENGINE_THREADS`] (none off Linux).
fn engine_busy() -> Vec<ProcessorBusy> {
    let prefixes = ENGINE_THREADS.map(|(_, prefix)| prefix);
    let Some(groups) = cpu_time_by_prefix(&prefixes) else {
        return Vec::new();
    };
    ENGINE_THREADS
        .iter()
        .zip(groups)
        .filter(|(_, group)| group.threads > 0)
        .map(|((name, _), group)| ProcessorBusy {
            name: (*name).to_string(),
            kind: "cpu".to_string(),
            busy_seconds: group.cpu_seconds,
            capacity: group.threads as f64,
        })
        .collect()
}

/// The server's refusal for the engine's `error`: 503 for what may pass later, 400 for
/// what never will.
fn refusal(error: SubmitError) -> Refusal {
    match error {
        SubmitError::KvBudgetFull {
            needed,
            in_use,
            budget,
        } => Refusal::KvBudget {
            needed: needed as u64,
            free: budget.saturating_sub(in_use) as u64,
        },
        SubmitError::TooManyRequests { limit } => Refusal::TooManyRequests { limit },
        SubmitError::Stopped => Refusal::ShuttingDown,
        invalid @ (SubmitError::Invalid(_)
        | SubmitError::TokenOutOfRange { .. }
        | SubmitError::KvNeverFits { .. }) => Refusal::Invalid {
            message: invalid.to_string(),
        },
    }
}

/// How long the engine stays without requests before the allocator's kept-back memory is
/// returned to the operating system: long enough for the engine thread to have dropped
/// the last request's session after its final event, short enough that an idle server's
/// resident memory is its idle size again within a second or two.
const IDLE_BEFORE_RELEASE: Duration = Duration::from_secs(1);

/// The forwarding thread: waits on the control channel and every forwarded request's
/// events at once, until the control channel closes and every request ended. Once no
/// request has been live for [`IDLE_BEFORE_RELEASE`], it releases the allocator's free
/// memory (exec keeps freed job buffers for the next job, which a server between
/// bursts would otherwise hold at its busiest size for good).
fn forward(inbox: &Receiver<Control>) {
    let mut live: Vec<Forwarded> = Vec::new();
    let mut open = true;
    // Whether requests ran since the memory was last released.
    let mut release_due = false;
    while open || !live.is_empty() {
        let mut select = Select::new();
        for f in &live {
            select.recv(f.handle.receiver());
        }
        let control = open.then(|| select.recv(inbox));
        let ready = match live.is_empty() && release_due {
            true => match select.select_timeout(IDLE_BEFORE_RELEASE) {
                Ok(ready) => ready,
                Err(_) => {
                    hetsched_exec::release_free_memory();
                    release_due = false;
                    continue;
                }
            },
            false => select.select(),
        };
        let index = ready.index();
        if Some(index) == control {
            match ready.recv(inbox) {
                Ok(Control::Forward(f)) => {
                    live.push(f);
                    release_due = true;
                }
                Ok(Control::CancelAll) => {
                    for f in &live {
                        let _ = f.handle.cancel();
                    }
                }
                Err(_) => open = false,
            }
            continue;
        }
        let event = ready.recv(live[index].handle.receiver());
        if !pass_on(&mut live[index], event) {
            live.swap_remove(index);
        }
    }
}

/// Sends the server's events for one engine event; false once the request ended.
fn pass_on(f: &mut Forwarded, event: Result<RequestEvent, crossbeam_channel::RecvError>) -> bool {
    // A send fails only when the client left; its cancel is already on its way, and the
    // events still come until the request ends.
    match event {
        Ok(RequestEvent::Token { sample, text, .. }) => {
            if let Some(count) = f.tokens.get_mut(sample) {
                *count += 1;
            }
            let _ = f.events.send(Event::Text { sample, text });
            true
        }
        Ok(RequestEvent::SampleFinished {
            sample,
            reason,
            text,
        }) => {
            if !text.is_empty() {
                let _ = f.events.send(Event::Text { sample, text });
            }
            let eos = usize::from(reason == FinishReason::Eos);
            let tokens = f.tokens.get(sample).copied().unwrap_or(0) + eos;
            let _ = f.events.send(Event::Finished {
                sample,
                reason,
                tokens,
            });
            true
        }
        Ok(RequestEvent::Finished(_)) => false,
        Ok(RequestEvent::Failed(message)) => {
            let _ = f.events.send(Event::Failed { message });
            false
        }
        Err(_) => {
            let _ = f.events.send(Event::Failed {
                message: "the request engine stopped".into(),
            });
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetsched_exec::generate::GenerateError;

    #[test]
    fn what_may_pass_later_is_a_503_and_what_never_will_a_400() {
        let full = refusal(SubmitError::KvBudgetFull {
            needed: 10,
            in_use: 95,
            budget: 100,
        });
        assert_eq!(
            full,
            Refusal::KvBudget {
                needed: 10,
                free: 5
            }
        );
        assert_eq!(
            refusal(SubmitError::TooManyRequests { limit: 3 }),
            Refusal::TooManyRequests { limit: 3 }
        );
        assert_eq!(refusal(SubmitError::Stopped), Refusal::ShuttingDown);
        for never in [
            SubmitError::KvNeverFits {
                needed: 200,
                budget: 100,
            },
            SubmitError::TokenOutOfRange { id: 9, vocab: 4 },
            SubmitError::Invalid(GenerateError::EmptyTurn),
        ] {
            let message = never.to_string();
            assert_eq!(refusal(never), Refusal::Invalid { message });
        }
    }
}
