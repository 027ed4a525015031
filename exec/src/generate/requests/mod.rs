//! A multi-request engine on the real queues: requests submitted at any time from any
//! thread, each streamed token by token, run together on one model.
//!
//! [`RequestEngine::start`] spawns the engine's thread, which owns every live request:
//! a generation [`Session`] per request (its prompt's KV cache, prefilled through the
//! scheduler on the CPU and emulated-NPU queues) and, once prefilled, a KV cache of its
//! own per sample. Each turn of the engine's loop
//! 1. takes new requests and cancels, admits waiting requests whose KV caches now fit;
//! 2. runs one prefill chunk (`chunk_len` tokens, a scheduled run) of the request in
//!    its prefill that the engine's request policy puts first among the requests with
//!    work (in their prefill or decoding; the policy objects a world's dispatch uses,
//!    [`hetsched_systems::request_policy`]), unless requests decoding ahead of it may
//!    not be delayed by the chunk ([`RequestPolicy::may_delay`](hetsched_systems::request_policy::RequestPolicy::may_delay)):
//!    their decode steps then have the turn alone. The default, `slack`: the highest
//!    priority class first, so an interactive request preempts a background prefill at
//!    the next chunk boundary (the background request resumes where it was: its cache
//!    keeps every chunk), and a background chunk runs between an interactive request's
//!    decode steps only while it fits in that request's slack (its whole work alone at
//!    the measured rates, stretched by
//!    [`SLACK_STRETCH`](hetsched_systems::request_policy::SLACK_STRETCH), from its
//!    admission); `priority` never delays a more urgent request's steps; `fcfs` runs one
//!    request at a time in arrival order;
//! 3. runs one batched decode step of every sequence that is decoding, across requests
//!    and samples ([`crate::generate::decode_batch`]: one small GEMM per linear, attention
//!    per sequence over its own cache; samples share their prompt's cache).
//!
//! A request's tokens do not depend on what else runs: its prefill chunks are the same
//! whatever preempts them, and a batched step gives each sequence the logits of its step
//! alone, so a greedy request's tokens are its tokens alone.
//!
//! Waiting requests are admitted to memory in the same policy's order.
//!
//! **Admission**: a request's KV bytes (prompt plus `n` × `max_tokens` positions, see
//! [`kv_bytes`]) are reserved against [`EngineLimits::kv_budget_bytes`] at submit; when
//! they do not fit, the request waits ([`Admission::Wait`]) or is refused
//! ([`SubmitError::KvBudgetFull`]; [`SubmitError::KvNeverFits`] if it could never fit).
//! At most [`EngineLimits::max_requests`] requests are live or waiting
//! ([`SubmitError::TooManyRequests`]). A finished or cancelled request frees its bytes.
//!
//! **Events** ([`RequestEvent`], on the handle's channel, in order): a `Token` per sample
//! token (id and final text piece; an end-of-sequence token has none), a
//! `SampleFinished` per sample with its [`FinishReason`](crate::generate::FinishReason), then `Finished` with the
//! request's [`RequestMetrics`] (or `Failed`). [`RequestHandle::cancel`] (or
//! [`RequestEngine::cancel`]) ends every sample with [`FinishReason::Cancelled`](crate::generate::FinishReason::Cancelled) at the
//! engine's next turn and frees the request's KV caches; cancelling a request that is
//! not live is [`CancelError::NotLive`]. Dropping the [`RequestEngine`] stops the thread;
//! requests still live then get `Failed`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use hetsched_exec::generate::requests::{EngineLimits, Priority, RequestEngine, RequestEvent, RequestSpec};
//! use hetsched_exec::{ExecModel, LinearPrecision, PrefillOptions};
//! use hetsched_import::{GgufFile, GgufTokenizer};
//!
//! let file = GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tokenizer = Arc::new(GgufTokenizer::from_gguf(&file)?);
//! let model = Arc::new(ExecModel::load(&file, LinearPrecision::W8a8)?);
//! let engine = RequestEngine::start(model, tokenizer.clone(), PrefillOptions::default(),
//!     EngineLimits::default())?;
//! let spec = RequestSpec {
//!     prompt: tokenizer.encode("The capital of France is")?,
//!     max_tokens: 16,
//!     priority: Priority::INTERACTIVE,
//!     ..RequestSpec::default()
//! };
//! let handle = engine.submit(spec)?;
//! for event in handle.events() {
//!     match event {
//!         RequestEvent::Token { text, .. } => print!("{text}"),
//!         RequestEvent::Finished(metrics) => println!("\nttft {:.1} ms", metrics.ttft_ms),
//!         _ => {}
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod admission;
mod report;
mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use hetsched_import::GgufTokenizer;
use parking_lot::Mutex;

pub use admission::{CancelError, SubmitError, kv_bytes};
pub use report::{EngineSnapshot, LaneBusy, RequestEvent, RequestMetrics};

use super::error::GenerateError;
use super::{Sampling, Session};
use crate::{ExecError, ExecModel, PrefillOptions};
use admission::Ledger;
use hetsched_systems::request_policy::create_request_policy;

pub use hetsched_systems::{Priority, RequestId};

/// The request policy [`RequestEngine::start`] orders prefill chunks and admission by:
/// the one default of every request path
/// ([`hetsched_systems::request_policy::DEFAULT_REQUEST_POLICY`]).
pub const DEFAULT_ENGINE_REQUEST_POLICY: &str =
    hetsched_systems::request_policy::DEFAULT_REQUEST_POLICY;

/// What to generate for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSpec {
    /// Prompt tokens (at least one).
    pub prompt: Vec<u32>,
    /// New tokens at most, per sample.
    pub max_tokens: usize,
    /// How each token is chosen; sample `i` uses seed `seed + i`.
    pub sampling: Sampling,
    /// Each sample stops before the first of these strings.
    pub stop: Vec<String>,
    /// Samples of the prompt, 1 to [`crate::generate::MAX_SAMPLES`].
    pub n: usize,
    /// Its priority class (larger is more urgent: [`Priority::INTERACTIVE`],
    /// [`Priority::BACKGROUND`], or any number).
    pub priority: Priority,
    /// Go on past the end-of-sequence token (benchmarks).
    pub ignore_eos: bool,
}

impl Default for RequestSpec {
    fn default() -> Self {
        Self {
            prompt: Vec::new(),
            max_tokens: 128,
            sampling: Sampling::greedy(),
            stop: Vec::new(),
            n: 1,
            priority: Priority::INTERACTIVE,
            ignore_eos: false,
        }
    }
}

/// When requests wait or are refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Admission {
    /// A request whose KV caches do not fit now waits until they do.
    #[default]
    Wait,
    /// A request whose KV caches do not fit now is refused
    /// ([`SubmitError::KvBudgetFull`]).
    Refuse,
}

/// The engine's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLimits {
    /// Bytes all live requests' KV caches may take together.
    pub kv_budget_bytes: usize,
    /// Requests live or waiting at most.
    pub max_requests: usize,
    /// Wait or refuse when the KV budget is full.
    pub admission: Admission,
}

impl Default for EngineLimits {
    /// 1 GiB of KV caches, 64 requests, waiting.
    fn default() -> Self {
        Self {
            kv_budget_bytes: 1 << 30,
            max_requests: 64,
            admission: Admission::Wait,
        }
    }
}

/// A submitted request: its id, its events, its cancel.
#[derive(Debug)]
pub struct RequestHandle {
    id: RequestId,
    events: Receiver<RequestEvent>,
    cancel: Arc<AtomicBool>,
    shared: Arc<Shared>,
}

impl RequestHandle {
    /// The request's id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The events, blocking for each; the iterator ends after `Finished` or `Failed`.
    pub fn events(&self) -> impl Iterator<Item = RequestEvent> + '_ {
        self.events.iter()
    }

    /// The event channel (for `select!` or a timeout).
    pub fn receiver(&self) -> &Receiver<RequestEvent> {
        &self.events
    }

    /// Cancels the request (the client went away): every sample ends with
    /// [`FinishReason::Cancelled`](crate::generate::FinishReason::Cancelled) at the engine's next turn and its KV caches are freed.
    pub fn cancel(&self) -> Result<(), CancelError> {
        self.shared.cancel(self.id, &self.cancel)
    }
}

/// What the engine thread and the callers share.
#[derive(Debug, Default)]
struct Shared {
    ledger: Mutex<Ledger>,
    /// Live (admitted or waiting) requests' cancel flags.
    live: Mutex<std::collections::HashMap<RequestId, Arc<AtomicBool>>>,
    snapshot: Mutex<EngineSnapshot>,
}

impl Shared {
    fn cancel(&self, id: RequestId, flag: &AtomicBool) -> Result<(), CancelError> {
        let live = self.live.lock();
        if !live.contains_key(&id) || flag.swap(true, Ordering::AcqRel) {
            return Err(CancelError::NotLive(id));
        }
        Ok(())
    }
}

/// A request on its way to the engine thread.
struct Submitted {
    id: RequestId,
    spec: RequestSpec,
    kv_bytes: usize,
    /// Whether its KV bytes are reserved (else it waits for them).
    admitted: bool,
    arrival: Instant,
    events: Sender<RequestEvent>,
    cancel: Arc<AtomicBool>,
}

/// The multi-request engine (see the module docs). `Send + Sync`: share it (an `Arc`)
/// between the threads that submit.
pub struct RequestEngine {
    submit: Option<Sender<Submitted>>,
    shared: Arc<Shared>,
    limits: EngineLimits,
    next_id: AtomicU64,
    /// What submit checks without the engine thread: vocabulary, context, cache shape.
    vocab: usize,
    context: usize,
    layers: usize,
    kv_dim: usize,
    started: Instant,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RequestEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestEngine")
            .field("limits", &self.limits)
            .finish()
    }
}

impl RequestEngine {
    /// Starts the engine's thread for `model`: prefills scheduled under `options` (its
    /// `chunk_len` is the preemption granularity), kernels on one pool of
    /// `options.threads` threads shared by every request; requests ordered by the
    /// [`DEFAULT_ENGINE_REQUEST_POLICY`].
    ///
    /// # Errors
    /// Bad options, a tokenizer without an end-of-sequence token, threads that cannot
    /// start.
    pub fn start(
        model: Arc<ExecModel>,
        tokenizer: Arc<GgufTokenizer>,
        options: PrefillOptions,
        limits: EngineLimits,
    ) -> Result<Self, GenerateError> {
        Self::start_with_policy(
            model,
            tokenizer,
            options,
            limits,
            DEFAULT_ENGINE_REQUEST_POLICY,
        )
    }

    /// [`RequestEngine::start`] with the request policy named `request_policy` (one of
    /// [`hetsched_systems::request_policy::REQUEST_POLICIES`]: `fcfs`, `priority`,
    /// `slack`) ordering the prefill chunks and admission.
    ///
    /// # Errors
    /// As [`RequestEngine::start`]; an unknown policy name is
    /// [`ExecError::InvalidOption`].
    pub fn start_with_policy(
        model: Arc<ExecModel>,
        tokenizer: Arc<GgufTokenizer>,
        options: PrefillOptions,
        limits: EngineLimits,
        request_policy: &str,
    ) -> Result<Self, GenerateError> {
        let policy =
            create_request_policy(request_policy).map_err(|e| ExecError::InvalidOption {
                option: "request_policy",
                message: e.to_string(),
            })?;
        options.validate()?;
        if options.gpu != crate::GpuUse::Off {
            return Err(ExecError::InvalidOption {
                option: "gpu",
                message: "the request engine decodes in batched direct steps on the CPU; \
                          run it without a GPU lane"
                    .into(),
            }
            .into());
        }
        let eos = tokenizer.eos_id().ok_or(GenerateError::NoEos)?;
        let threads = options.threads;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("hetsched-engine-{i}"))
            .build()
            .map_err(|e| ExecError::Threads {
                threads,
                reason: e.to_string(),
            })?;
        let (submit, inbox) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared::default());
        shared.snapshot.lock().kv_budget_bytes = limits.kv_budget_bytes;
        let c = &model.config;
        let (vocab, context, layers, kv_dim) = (
            c.vocab_size,
            c.context_length,
            model.layers.len(),
            c.kv_dim(),
        );
        let started = Instant::now();
        let worker = worker::Worker::new(
            model,
            tokenizer,
            eos,
            options,
            Arc::new(pool),
            limits,
            shared.clone(),
            started,
            policy,
        );
        let thread = std::thread::Builder::new()
            .name("hetsched-requests".into())
            .spawn(move || worker.run(inbox))
            .map_err(|e| ExecError::Threads {
                threads: 1,
                reason: e.to_string(),
            })?;
        Ok(Self {
            submit: Some(submit),
            shared,
            limits,
            next_id: AtomicU64::new(0),
            vocab,
            context,
            layers,
            kv_dim,
            started,
            thread: Some(thread),
        })
    }

    /// Submits a request (from any thread): checked, admitted against the limits, and
    /// handed to the engine thread. Returns its handle at once.
    ///
    /// # Errors
    /// [`SubmitError`]: invalid settings (before anything is reserved), the KV budget
    /// full (refusing mode) or never enough, too many requests, the engine stopped.
    pub fn submit(&self, spec: RequestSpec) -> Result<RequestHandle, SubmitError> {
        admission::validate(&spec, self.vocab, self.context)?;
        let sender = self.submit.as_ref().ok_or(SubmitError::Stopped)?;
        let needed = kv_bytes(&spec, self.layers, self.kv_dim);
        let admitted = self.shared.ledger.lock().admit(needed, &self.limits)?;
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let cancel = Arc::new(AtomicBool::new(false));
        self.shared.live.lock().insert(id, cancel.clone());
        let (events, receiver) = crossbeam_channel::unbounded();
        let submitted = Submitted {
            id,
            spec,
            kv_bytes: needed,
            admitted,
            arrival: Instant::now(),
            events,
            cancel: cancel.clone(),
        };
        if sender.send(submitted).is_err() {
            self.shared.live.lock().remove(&id);
            let held = if admitted { needed } else { 0 };
            self.shared.ledger.lock().release(held);
            return Err(SubmitError::Stopped);
        }
        Ok(RequestHandle {
            id,
            events: receiver,
            cancel,
            shared: self.shared.clone(),
        })
    }

    /// Cancels request `id` (as [`RequestHandle::cancel`]).
    pub fn cancel(&self, id: RequestId) -> Result<(), CancelError> {
        let flag = self.shared.live.lock().get(&id).cloned();
        match flag {
            Some(flag) => self.shared.cancel(id, &flag),
            None => Err(CancelError::NotLive(id)),
        }
    }

    /// Requests by state and KV bytes in use, as of the engine's last turn or the last
    /// request's end, whichever came later: once a request's `Finished` or `Failed` event
    /// is out, the snapshot no longer counts it live.
    pub fn metrics(&self) -> EngineSnapshot {
        let mut snapshot = self.shared.snapshot.lock().clone();
        snapshot.kv_bytes_in_use = self.shared.ledger.lock().kv_in_use;
        snapshot
    }

    /// The engine's limits.
    pub fn limits(&self) -> EngineLimits {
        self.limits
    }

    /// When the engine started (the origin of [`RequestMetrics::arrival_ms`]).
    pub fn started(&self) -> Instant {
        self.started
    }
}

impl Drop for RequestEngine {
    fn drop(&mut self) {
        // Closing the channel ends the engine thread's loop.
        self.submit = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A request session of the engine: prefills scheduled under `options` on `pool`.
///
/// Its decode path builds no head of its own: the engine's batched decode steps use the
/// engine's head, and the session only prefills. `DecodePath::Direct` would quantize a
/// private INT8 copy of the 49152 x 576 head for every admitted request (0.3-0.4 s on the
/// engine's one loop thread on a 2-core machine, nothing else scheduled meanwhile).
fn request_session(
    model: &Arc<ExecModel>,
    options: &PrefillOptions,
    pool: &Arc<rayon::ThreadPool>,
) -> Result<Session, GenerateError> {
    Session::with_pool(
        model.clone(),
        options.clone(),
        super::DecodePath::DirectF32Head,
        Some(pool.clone()),
    )
}
