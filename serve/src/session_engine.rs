//! An [`Engine`] over a single-request [`Session`]: one worker thread serves the
//! accepted requests **one at a time**, the most urgent priority first, each sample in a fresh
//! session (its own KV cache, freed when the sample ends), the next one opened ahead while
//! the worker is idle. Decode steps run direct on the
//! CPU threads, or scheduled on the GPU lane when every stage is resident there.
//!
//! Its purpose: serving with a GPU lane (`--backends gpu` or `cpu,gpu,npu`), which the
//! many-requests engine ([`crate::concurrent_engine`]) does not drive (it decodes in
//! batched steps on the CPU only). Without a GPU lane the server uses that engine.
//!
//! What it is not: it does not batch decode steps of several requests, nor preempt a
//! running request for a newer interactive one; a queued request waits for the running
//! one to finish. Admission counts requests (queued plus running) against a limit; the KV
//! memory in use is the running sample's reserved cache
//! (`layers x 2 x kv_dim x (prompt + max_tokens) x 4` bytes).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use hetsched_exec::generate::{DecodePath, FinishReason, GenerateError, Session};
use hetsched_exec::{ExecError, ExecModel, GpuUse, PrefillOptions};
use hetsched_import::GgufTokenizer;
use hetsched_systems::ProcessorKind;
use hetsched_systems::resources::TimelineLog;
use parking_lot::{Condvar, Mutex};
use tokio::sync::mpsc;

use crate::engine::{
    CancelOnDrop, Engine, EngineRequest, EngineSnapshot, Event, ProcessorBusy, Refusal, Submitted,
};

/// A request waiting for the worker.
struct Queued {
    request: EngineRequest,
    events: mpsc::UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
}

/// What the worker and the submitters share.
#[derive(Default)]
struct Waiting {
    /// In arrival order; the most urgent is taken first.
    queue: VecDeque<Queued>,
    running: usize,
    kv_bytes: u64,
    /// The running request's cancel flag (for [`Engine::cancel_all`]).
    current: Option<Arc<AtomicBool>>,
    stopping: bool,
    /// Busy seconds per processor lane.
    busy: Vec<f64>,
}

impl Waiting {
    fn len(&self) -> usize {
        self.queue.len()
    }

    /// The earliest of the most urgent requests.
    fn take_next(&mut self) -> Option<Queued> {
        let most = self.queue.iter().map(|q| q.request.priority).max()?;
        let at = self.queue.iter().position(|q| q.request.priority == most)?;
        self.queue.remove(at)
    }
}

struct Shared {
    waiting: Mutex<Waiting>,
    wake: Condvar,
    max_requests: usize,
    started: Instant,
    /// Lane names and kinds, in the order the sessions' timelines number them.
    lanes: Vec<(String, String)>,
    /// The lane the decode steps run on: the resident GPU's, else the first CPU lane's
    /// (direct steps on the session's CPU threads).
    decode_lane: usize,
}

/// One request at a time on a [`Session`] (see the module doc).
pub struct SessionEngine {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl SessionEngine {
    /// Starts the worker for `model` (prefills under `options`; decode steps scheduled on
    /// the GPU when every stage is resident there, direct on the CPU threads otherwise),
    /// holding at most `max_requests` requests, queued and running.
    ///
    /// A first session is opened before the worker starts, so that what every request
    /// would fail on (no Vulkan device, f32 linears missing for the resident GPU, a model
    /// family the GPU kernels do not compute) fails here, once, with its reason, rather
    /// than each request with a 500; it serves the first sample.
    ///
    /// # Errors
    /// That first session's, or a worker thread that cannot start.
    pub fn start(
        model: Arc<ExecModel>,
        tokenizer: Arc<GgufTokenizer>,
        options: PrefillOptions,
        max_requests: usize,
    ) -> Result<Self, GenerateError> {
        let mut fresh = Fresh {
            model,
            options,
            spare: None,
        };
        fresh.spare = Some(fresh.open()?);
        let (lanes, decode_lane) = lanes(&fresh.options);
        let shared = Arc::new(Shared {
            waiting: Mutex::new(Waiting {
                busy: vec![0.0; lanes.len()],
                ..Waiting::default()
            }),
            wake: Condvar::new(),
            max_requests: max_requests.max(1),
            started: Instant::now(),
            lanes,
            decode_lane,
        });
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name("hetsched-serve-engine".into())
            .spawn(move || serve_requests(&worker_shared, fresh, &tokenizer))
            .map_err(|e| ExecError::Threads {
                threads: 1,
                reason: e.to_string(),
            })?;
        Ok(Self {
            shared,
            worker: Mutex::new(Some(worker)),
        })
    }
}

/// Fresh sessions for the samples, one opened ahead: a session cannot start over, and
/// opening one is not free (on the resident GPU it uploads the weights and builds the
/// kernels), so the worker opens the next one while it is idle and a request waits for
/// that only when requests come back to back.
struct Fresh {
    model: Arc<ExecModel>,
    options: PrefillOptions,
    spare: Option<Session>,
}

impl Fresh {
    fn open(&self) -> Result<Session, GenerateError> {
        Session::new(
            self.model.clone(),
            self.options.clone(),
            decode_path(&self.options),
        )
    }

    /// The spare, or a session opened now.
    fn take(&mut self) -> Result<Session, GenerateError> {
        match self.spare.take() {
            Some(session) => Ok(session),
            None => self.open(),
        }
    }

    /// Opens the spare if there is none. A failure leaves none: the next sample opens
    /// its own and reports why it could not.
    fn refill(&mut self) {
        if self.spare.is_none() {
            self.spare = self.open().ok();
        }
    }
}

/// With every stage resident on the GPU, decode steps are scheduled there (where the KV
/// cache lives); otherwise direct on the CPU threads.
fn decode_path(options: &PrefillOptions) -> DecodePath {
    match options.gpu {
        GpuUse::Resident => DecodePath::Scheduled,
        GpuUse::Off | GpuUse::FloatLane => DecodePath::Direct,
    }
}

/// The lanes (name, kind) of the sessions' runs under `options`, in their timelines'
/// order, and the one the decode steps run on.
fn lanes(options: &PrefillOptions) -> (Vec<(String, String)>, usize) {
    let device = hetsched_exec::run_device(options);
    let lanes = device
        .processors
        .iter()
        .map(|p| (p.name.clone(), p.kind.as_str().to_string()))
        .collect();
    let kind = match options.gpu {
        GpuUse::Resident => ProcessorKind::Gpu,
        GpuUse::Off | GpuUse::FloatLane => ProcessorKind::Cpu,
    };
    (lanes, device.first_of(kind).unwrap_or(0))
}

impl Drop for SessionEngine {
    fn drop(&mut self) {
        self.cancel_all();
        if let Some(worker) = self.worker.lock().take() {
            // The worker stops after the token in progress; a panic there is already
            // reported on stderr.
            let _ = worker.join();
        }
    }
}

impl Engine for SessionEngine {
    fn submit(&self, request: EngineRequest) -> Result<Submitted, Refusal> {
        let mut waiting = self.shared.waiting.lock();
        if waiting.stopping {
            return Err(Refusal::ShuttingDown);
        }
        if waiting.len() + waiting.running >= self.shared.max_requests {
            return Err(Refusal::TooManyRequests {
                limit: self.shared.max_requests,
            });
        }
        let (events, receiver) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        waiting.queue.push_back(Queued {
            request,
            events,
            cancel: cancel.clone(),
        });
        self.shared.wake.notify_one();
        Ok(Submitted {
            events: receiver,
            cancel: CancelOnDrop::new(cancel),
        })
    }

    fn snapshot(&self) -> EngineSnapshot {
        let waiting = self.shared.waiting.lock();
        EngineSnapshot {
            queued: waiting.len(),
            running: waiting.running,
            kv_bytes_in_use: waiting.kv_bytes,
            kv_budget_bytes: 0,
            processors: self
                .shared
                .lanes
                .iter()
                .zip(&waiting.busy)
                .map(|((name, kind), busy)| ProcessorBusy {
                    name: name.clone(),
                    kind: kind.clone(),
                    busy_seconds: *busy,
                    capacity: 1.0,
                })
                .collect(),
            uptime_seconds: self.shared.started.elapsed().as_secs_f64(),
        }
    }

    fn cancel_all(&self) {
        let mut waiting = self.shared.waiting.lock();
        waiting.stopping = true;
        for queued in waiting.queue.drain(..) {
            let _ = queued.events.send(Event::Failed {
                message: "the server is shutting down".into(),
            });
        }
        if let Some(current) = &waiting.current {
            current.store(true, Ordering::Relaxed);
        }
        self.shared.wake.notify_all();
    }
}

/// The worker: takes the next request (the most urgent first) until stopped, opening
/// the next sample's session ahead between requests.
fn serve_requests(shared: &Shared, mut fresh: Fresh, tokenizer: &GgufTokenizer) {
    loop {
        if shared.waiting.lock().stopping {
            return;
        }
        fresh.refill();
        let next = {
            let mut waiting = shared.waiting.lock();
            loop {
                if waiting.stopping {
                    return;
                }
                if let Some(next) = waiting.take_next() {
                    waiting.running += 1;
                    waiting.current = Some(next.cancel.clone());
                    break next;
                }
                shared.wake.wait(&mut waiting);
            }
        };
        run_request(shared, &mut fresh, tokenizer, &next);
        let mut waiting = shared.waiting.lock();
        waiting.running -= 1;
        waiting.current = None;
        waiting.kv_bytes = 0;
    }
}

/// Runs every sample of one request, sending its events.
fn run_request(shared: &Shared, fresh: &mut Fresh, tokenizer: &GgufTokenizer, queued: &Queued) {
    let request = &queued.request;
    for sample in 0..request.n {
        if queued.cancel.load(Ordering::Relaxed) {
            return;
        }
        shared.waiting.lock().kv_bytes = kv_bytes(&fresh.model, request);
        let mut sample_options = request.options.clone();
        sample_options.sampling.seed = request.options.sampling.seed.wrapping_add(sample as u64);
        // The session is dropped (its caches freed) once the sample ends.
        let generated = fresh.take().and_then(|mut session| {
            session.generate(
                &request.prompt,
                tokenizer,
                &sample_options,
                &queued.cancel,
                |text| {
                    // A receiver gone (the client left) is seen through the cancel flag.
                    let _ = queued.events.send(Event::Text {
                        sample,
                        text: text.to_string(),
                    });
                },
            )
        });
        shared.waiting.lock().kv_bytes = 0;
        match generated {
            Ok(generated) => {
                let busy = busy_by_lane(
                    &generated.prefill_run.timeline,
                    shared.lanes.len(),
                    (shared.decode_lane, generated.decode_ns),
                );
                let mut waiting = shared.waiting.lock();
                for (total, add) in waiting.busy.iter_mut().zip(busy) {
                    *total += add;
                }
                drop(waiting);
                let reason = generated.finish_reason;
                let _ = queued.events.send(Event::Finished {
                    sample,
                    reason,
                    tokens: generated.tokens.len(),
                });
                if reason == FinishReason::Cancelled {
                    return;
                }
            }
            Err(error) => {
                let _ = queued.events.send(Event::Failed {
                    message: error.to_string(),
                });
                return;
            }
        }
    }
}

/// Bytes of the KV cache one sample of `request` reserves: keys and values, f32, for the
/// prompt and every token it may generate.
fn kv_bytes(model: &ExecModel, request: &EngineRequest) -> u64 {
    let config = &model.config;
    let positions = request.prompt.len() + request.options.max_tokens;
    let per_position = config.n_layers * 2 * config.n_kv_heads * config.head_dim * 4;
    (positions as u64).saturating_mul(per_position as u64)
}

/// A sample's busy seconds per lane, of `lanes`: its prefill's subgraphs where they ran,
/// and its decode steps' wall time (ns) on their lane.
fn busy_by_lane(
    prefill: &TimelineLog,
    lanes: usize,
    (decode_lane, decode_ns): (usize, u64),
) -> Vec<f64> {
    let mut busy = prefill.busy_ns_by_lane(lanes);
    if let Some(total) = busy.get_mut(decode_lane) {
        *total += decode_ns;
    }
    busy.into_iter().map(|ns| ns as f64 / 1e9).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetsched_exec::generate::GenerateOptions;
    use hetsched_systems::Priority;

    fn queued(priority: Priority, first_token: u32) -> Queued {
        Queued {
            request: EngineRequest {
                prompt: vec![first_token],
                options: GenerateOptions::default(),
                n: 1,
                priority,
            },
            events: mpsc::unbounded_channel().0,
            cancel: Arc::new(AtomicBool::new(false)),
        }
    }

    #[test]
    fn the_most_urgent_request_goes_first_then_arrival_order() {
        let mut waiting = Waiting::default();
        for (priority, id) in [
            (Priority::BACKGROUND, 0),
            (Priority::INTERACTIVE, 1),
            (Priority::BACKGROUND, 2),
            (Priority::INTERACTIVE, 3),
            (Priority(255), 4),
        ] {
            waiting.queue.push_back(queued(priority, id));
        }
        let order: Vec<u32> = std::iter::from_fn(|| waiting.take_next())
            .map(|q| q.request.prompt[0])
            .collect();
        assert_eq!(order, [4, 1, 3, 0, 2]);
    }

    /// A request's known work: its prefill's subgraphs on the lanes where they ran, its
    /// decode steps on theirs; slices of a lane the engine does not list are not counted.
    #[test]
    fn busy_time_is_each_lanes_subgraphs_and_the_decode_steps_on_theirs() {
        use hetsched_systems::testing::slice_on as slice;
        let prefill = TimelineLog {
            slices: vec![
                slice(0, 0, 2_000_000_000),
                slice(1, 1_000_000_000, 1_500_000_000),
                slice(0, 2_000_000_000, 3_000_000_000),
                slice(7, 0, 1),
            ],
            counters: Vec::new(),
        };
        let busy = busy_by_lane(&prefill, 3, (2, 250_000_000));
        assert_eq!(busy, [3.0, 0.5, 0.25]);
        let busy = busy_by_lane(&prefill, 2, (0, 250_000_000));
        assert_eq!(busy, [3.25, 0.5]);
    }

    /// The lanes are those of the device the sessions run on, GPU lane included, and the
    /// decode steps go to the GPU only when every stage is resident there.
    #[test]
    fn lanes_follow_the_gpu_use() {
        let kinds = |gpu| {
            let options = PrefillOptions {
                gpu,
                ..PrefillOptions::default()
            };
            let (lanes, decode) = lanes(&options);
            let kinds: Vec<String> = lanes.into_iter().map(|(_, kind)| kind).collect();
            (kinds.join(","), decode)
        };
        assert_eq!(kinds(GpuUse::Off), ("cpu,npu".to_string(), 0));
        assert_eq!(kinds(GpuUse::FloatLane), ("cpu,npu,gpu".to_string(), 0));
        assert_eq!(kinds(GpuUse::Resident), ("gpu".to_string(), 0));
    }
}
