//! The request engine behind an `hs_requests` handle (feature `models`): the model
//! loaded, the engine started, and the event thread that calls the host's callbacks.

use std::collections::HashSet;
use std::ffi::c_void;
use std::path::Path;
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};

use crossbeam_channel::{Receiver, Select, Sender};
use hetsched_exec::generate::Sampling;
use hetsched_exec::generate::requests::{
    Admission, CancelError, EngineLimits, Priority, RequestEngine, RequestEvent, RequestHandle,
    RequestId, RequestSpec, SubmitError,
};
use hetsched_exec::{LinearPrecision, PrefillOptions, load_models};
use hetsched_import::GgufTokenizer;
use hetsched_runtime::progress::Silent;
use parking_lot::Mutex;
use serde_json::json;

use super::{hs_finish_fn, hs_request_options, hs_requests, hs_requests_limits, hs_token_fn};
use crate::error::{CapiError, hs_status};
use crate::handles::HandleKind;

/// A request's callbacks, moved to the event thread.
#[derive(Clone, Copy)]
struct Callbacks {
    on_token: hs_token_fn,
    on_finish: hs_finish_fn,
    user_data: *mut c_void,
}

// SAFETY: the library never dereferences `user_data`; it only hands it back to the host's
// own callbacks on the event thread, as the host asked by submitting. The function
// pointers are plain code.
unsafe impl Send for Callbacks {}

/// What the event thread serves: a request's events and where they go.
struct Watched {
    handle: RequestHandle,
    callbacks: Callbacks,
    /// Each sample's finish reason once it ended (`"eos"`, `"stop"`, ...).
    reasons: Vec<Option<String>>,
}

/// The engine and its event thread while the handle is open.
struct Open {
    engine: RequestEngine,
    watch: Sender<Watched>,
    events: JoinHandle<()>,
}

/// An open request engine (`hs_requests`).
pub(crate) struct RequestsObject {
    tokenizer: Arc<GgufTokenizer>,
    open: Mutex<Option<Open>>,
    event_thread: ThreadId,
    /// Requests submitted whose `on_finish` was not called yet.
    unfinished: Arc<Mutex<HashSet<RequestId>>>,
}

impl HandleKind for RequestsObject {
    const KIND: &'static str = "requests";
    type C = hs_requests;
}

impl RequestsObject {
    /// Runs `call` on the open engine, under the lock `hs_requests_close` takes it with:
    /// a close waits for the calls in progress, and later calls find it closing.
    fn with_open<T>(
        &self,
        call: impl FnOnce(&Open) -> Result<T, CapiError>,
    ) -> Result<T, CapiError> {
        let open = self.open.lock();
        let open = open
            .as_ref()
            .ok_or_else(|| CapiError::State("the request engine is closing".into()))?;
        call(open)
    }

    /// Loads the model at `path` and starts the engine and its event thread.
    pub(super) fn open(path: &str, limits: hs_requests_limits) -> Result<Self, CapiError> {
        let defaults = EngineLimits::default();
        let engine_limits = EngineLimits {
            kv_budget_bytes: match limits.kv_budget_bytes {
                0 => defaults.kv_budget_bytes,
                bytes => usize::try_from(bytes).map_err(|_| {
                    CapiError::InvalidArgument(format!(
                        "kv_budget_bytes {bytes} does not fit this machine's address space"
                    ))
                })?,
            },
            max_requests: match limits.max_requests {
                0 => defaults.max_requests,
                n => n as usize,
            },
            admission: match limits.refuse_when_full {
                0 => Admission::Wait,
                1 => Admission::Refuse,
                other => {
                    return Err(CapiError::InvalidArgument(format!(
                        "refuse_when_full is {other}: give 0 (wait) or 1 (refuse)"
                    )));
                }
            },
        };
        let mut options = PrefillOptions::default();
        if limits.threads > 0 {
            options.threads = limits.threads as usize;
        }
        if limits.chunk_len > 0 {
            options.chunk_len = limits.chunk_len;
        }
        let loaded = load_models(
            Path::new(path),
            &[LinearPrecision::W8a8],
            None,
            0,
            &mut Silent,
        )
        .map_err(|e| CapiError::LoadModel(e.to_string()))?;
        let model = loaded
            .models
            .into_iter()
            .next()
            .ok_or_else(|| CapiError::Internal("the loader built no model".into()))?;
        let tokenizer = Arc::new(loaded.tokenizer);
        let engine =
            RequestEngine::start(Arc::new(model), tokenizer.clone(), options, engine_limits)
                .map_err(|e| CapiError::InvalidArgument(format!("the request engine: {e}")))?;
        let unfinished = Arc::new(Mutex::new(HashSet::new()));
        let (watch, watching) = crossbeam_channel::unbounded();
        let events = std::thread::Builder::new()
            .name("hetsched-capi-events".into())
            .spawn({
                let unfinished = unfinished.clone();
                move || serve_events(watching, unfinished)
            })
            .map_err(|e| CapiError::Internal(format!("the event thread: {e}")))?;
        Ok(Self {
            tokenizer,
            event_thread: events.thread().id(),
            open: Mutex::new(Some(Open {
                engine,
                watch,
                events,
            })),
            unfinished,
        })
    }

    /// Tokenizes `prompt`, submits it as `samples` samples stopping at `stop`, and hands
    /// its events to the event thread.
    pub(super) fn submit(
        &self,
        prompt: &str,
        options: hs_request_options,
        samples: usize,
        stop: Vec<String>,
    ) -> Result<u64, CapiError> {
        let tokens = self
            .tokenizer
            .encode(prompt)
            .map_err(|e| CapiError::InvalidArgument(format!("the prompt: {e}")))?;
        let spec = RequestSpec {
            prompt: tokens,
            max_tokens: options.max_tokens as usize,
            sampling: Sampling {
                temperature: options.temperature,
                top_k: (options.top_k > 0).then_some(options.top_k as usize),
                top_p: options.top_p,
                seed: options.seed,
            },
            priority: Priority(options.priority),
            n: samples,
            stop,
            ignore_eos: false,
        };
        let callbacks = Callbacks {
            on_token: options.on_token,
            on_finish: options.on_finish,
            user_data: options.user_data,
        };
        // Under the lock: a close cannot come between the submit and the watch.
        self.with_open(|open| {
            let handle = open.engine.submit(spec).map_err(submit_error)?;
            let id = handle.id();
            self.unfinished.lock().insert(id);
            open.watch
                .send(Watched {
                    handle,
                    callbacks,
                    reasons: vec![None; samples],
                })
                .map_err(|_| CapiError::Internal("the event thread has ended".into()))?;
            Ok(id.0)
        })
    }

    /// Cancels request `id`.
    pub(super) fn cancel(&self, id: u64) -> Result<(), CapiError> {
        self.with_open(|open| {
            open.engine
                .cancel(RequestId(id))
                .map_err(|error: CancelError| CapiError::UnknownRequest(error.to_string()))
        })
    }

    /// The engine's counters as JSON.
    pub(super) fn metrics_json(&self) -> Result<String, CapiError> {
        let metrics = self.with_open(|open| Ok(open.engine.metrics()))?;
        serde_json::to_string(&metrics).map_err(|e| CapiError::Internal(format!("metrics: {e}")))
    }

    /// Whether the calling thread is the event thread (a callback).
    pub(super) fn on_event_thread(&self) -> bool {
        std::thread::current().id() == self.event_thread
    }

    /// Cancels what is live, waits for every request's last callback, joins the threads.
    pub(super) fn close(&self) -> Result<(), CapiError> {
        let Some(open) = self.open.lock().take() else {
            // Another thread's close took it first.
            return Ok(());
        };
        let live: Vec<RequestId> = self.unfinished.lock().iter().copied().collect();
        for id in live {
            // A request may finish meanwhile: then there is nothing to cancel.
            let _ = open.engine.cancel(id);
        }
        // The event thread ends once every watched request had its last event.
        drop(open.watch);
        open.events
            .join()
            .map_err(|_| CapiError::Internal("a request callback panicked".into()))?;
        // Joins the engine's thread: every call that used it did so under the lock.
        drop(open.engine);
        Ok(())
    }
}

fn submit_error(error: SubmitError) -> CapiError {
    match error {
        SubmitError::KvBudgetFull { .. } | SubmitError::TooManyRequests { .. } => {
            CapiError::Busy(error.to_string())
        }
        SubmitError::Stopped => CapiError::State(error.to_string()),
        _ => CapiError::InvalidArgument(error.to_string()),
    }
}

/// Calls `on_token` with sample `sample`'s `text` (skipped when empty or without a
/// callback).
fn deliver_text(callbacks: &Callbacks, id: RequestId, sample: usize, text: &str) {
    let Some(on_token) = callbacks.on_token else {
        return;
    };
    if text.is_empty() {
        return;
    }
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.extend_from_slice(text.as_bytes());
    bytes.push(0);
    // SAFETY: the host's callback with its own pointer; `bytes` holds `text.len()` bytes
    // and a NUL and lives across the call.
    // `sample` < `HS_MAX_SAMPLES`, checked at submit: the cast keeps it.
    let sample = sample as u32;
    // SAFETY: as above.
    unsafe {
        on_token(
            callbacks.user_data,
            id.0,
            sample,
            bytes.as_ptr().cast(),
            text.len(),
        )
    };
}

/// Calls `on_finish` (if any) with `status` and `result`.
fn deliver_finish(callbacks: &Callbacks, id: RequestId, status: hs_status, result: String) {
    let Some(on_finish) = callbacks.on_finish else {
        return;
    };
    let text = std::ffi::CString::new(result.replace('\0', "\u{fffd}")).unwrap_or_default();
    // SAFETY: the host's callback with its own pointer; `text` is NUL-terminated and
    // lives across the call.
    unsafe { on_finish(callbacks.user_data, id.0, status, text.as_ptr()) };
}

/// Hands one event to the request's callbacks; `true` once it was the last.
fn deliver(watched: &mut Watched, event: RequestEvent) -> bool {
    let (id, callbacks) = (watched.handle.id(), &watched.callbacks);
    match event {
        RequestEvent::Token { sample, text, .. } => {
            deliver_text(callbacks, id, sample, &text);
            false
        }
        RequestEvent::SampleFinished {
            sample,
            reason,
            text,
        } => {
            deliver_text(callbacks, id, sample, &text);
            if let Some(slot) = watched.reasons.get_mut(sample) {
                *slot = serde_json::to_value(reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string));
            }
            false
        }
        RequestEvent::Finished(metrics) => {
            // A cancel ends every sample: any one cancelled is the request cancelled.
            let cancelled = watched
                .reasons
                .iter()
                .any(|r| r.as_deref() == Some("cancelled"));
            let status = if cancelled {
                hs_status::HS_ERR_CANCELLED
            } else {
                hs_status::HS_OK
            };
            let reason = if cancelled {
                Some("cancelled".to_string())
            } else {
                watched.reasons.first().cloned().flatten()
            };
            let result = json!({
                "finish_reason": reason,
                "finish_reasons": watched.reasons,
                "metrics": metrics,
            });
            deliver_finish(callbacks, id, status, result.to_string());
            true
        }
        RequestEvent::Failed(error) => {
            let result = json!({ "error": error });
            deliver_finish(
                callbacks,
                id,
                hs_status::HS_ERR_RUN_FAILED,
                result.to_string(),
            );
            true
        }
    }
}

/// The event thread: waits on every watched request's events and on new requests, and
/// calls their callbacks; ends once no new request can come (`watch` closed) and every
/// watched request has had its last event.
fn serve_events(watch: Receiver<Watched>, unfinished: Arc<Mutex<HashSet<RequestId>>>) {
    let mut watched: Vec<Watched> = Vec::new();
    let mut accepting = true;
    while accepting || !watched.is_empty() {
        let mut select = Select::new();
        for w in &watched {
            select.recv(w.handle.receiver());
        }
        let watch_index = accepting.then(|| select.recv(&watch));
        let ready = select.select();
        let index = ready.index();
        if Some(index) == watch_index {
            let received = ready.recv(&watch);
            drop(select);
            match received {
                Ok(w) => watched.push(w),
                Err(_) => accepting = false,
            }
            continue;
        }
        let received = ready.recv(watched[index].handle.receiver());
        drop(select);
        let w = &mut watched[index];
        let last = match received {
            Ok(event) => deliver(w, event),
            // The engine dropped the request's channel without a last event: report it.
            Err(_) => deliver(w, RequestEvent::Failed("the request engine stopped".into())),
        };
        if last {
            let w = watched.swap_remove(index);
            unfinished.lock().remove(&w.handle.id());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{HS_MAX_SAMPLES, HS_PRIORITY_BACKGROUND, HS_PRIORITY_INTERACTIVE};
    use super::*;

    #[test]
    fn the_header_priorities_are_the_engines() {
        assert_eq!(HS_PRIORITY_INTERACTIVE, Priority::INTERACTIVE.0);
        assert_eq!(HS_PRIORITY_BACKGROUND, Priority::BACKGROUND.0);
    }

    #[test]
    fn the_header_sample_limit_is_the_engines() {
        assert_eq!(
            HS_MAX_SAMPLES as usize,
            hetsched_exec::generate::MAX_SAMPLES
        );
    }
}
