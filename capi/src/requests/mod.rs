//! Many generation requests on one model from C: the request engine of
//! `hetsched_exec::generate::requests` behind an `hs_requests` handle.
//!
//! `hs_requests_open` loads a GGUF model and starts the engine (its scheduling thread and
//! a pool of compute threads, which the library owns: unlike the host queues of
//! [`crate::engine`], generation runs on the library's own CPU queues). Any thread
//! submits a prompt (`hs_requests_submit`: text, token limit, sampling, `n` samples,
//! stop strings, priority and two callbacks), cancels one (`hs_requests_cancel`) or reads the engine's counters as JSON
//! (`hs_requests_metrics_json`). `hs_requests_close` cancels what is still live and joins
//! every thread the handle started.
//!
//! **Callbacks come from the library's event thread**, one per `hs_requests` handle and
//! not a host thread: for each request, `on_token` for each token in order, then
//! `on_finish` once, the last call for that request. Calls for different requests
//! interleave; no two calls run at once. A callback may call `hs_requests_submit`,
//! `hs_requests_cancel` and `hs_requests_metrics_json`, but not `hs_requests_close`
//! (`HS_ERR_STATE`: the thread cannot join itself). A slow callback delays every other
//! request's callbacks, not its generation (events queue meanwhile).
//!
//! A library built without the `models` feature (a scheduling-only embedder) keeps every
//! `hs_requests_*` symbol of the header: `hs_requests_open` answers `HS_ERR_STATE`, and
//! no `hs_requests` handle can exist there.

use std::ffi::{c_char, c_void};
use std::slice;

use crate::error::{CapiError, guarded, hs_status};
use crate::handles;
use crate::strings::{out_arg, str_arg, string_out};

#[cfg(feature = "models")]
mod live;
#[cfg(feature = "models")]
use live::RequestsObject;
#[cfg(not(feature = "models"))]
mod unavailable;
#[cfg(not(feature = "models"))]
use unavailable::RequestsObject;

/// The priority class of a request a user waits on (its first token first): the
/// engine's `Priority::INTERACTIVE` (a literal, for the header; a test checks it).
pub const HS_PRIORITY_INTERACTIVE: u8 = 200;
/// The priority class of a request nobody watches token by token
/// (`Priority::BACKGROUND`).
pub const HS_PRIORITY_BACKGROUND: u8 = 50;

/// Stop strings one request may give at most (`hs_request_options.stop_count`).
pub const HS_MAX_STOP_STRINGS: usize = 16;
/// Bytes one stop string may hold at most.
pub const HS_MAX_STOP_BYTES: usize = 256;
/// Samples one request may ask for at most (`hs_request_options.n`): the engine's
/// `MAX_SAMPLES` (a literal, for the header; a test checks it).
pub const HS_MAX_SAMPLES: u32 = 64;

/// A request engine on one model. Opaque; from `hs_requests_open`, ended with
/// `hs_requests_close`. Usable from any thread.
pub struct hs_requests {
    _opaque: [u8; 0],
}

/// The engine's bounds and threads (`hs_requests_open`); a 0 field takes its default.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hs_requests_limits {
    /// Bytes all live requests' KV caches may take together (default 1 GiB).
    pub kv_budget_bytes: u64,
    /// Requests live or waiting at most (default 64).
    pub max_requests: u32,
    /// 0: a request whose KV caches do not fit now waits until they do; 1: it is refused
    /// with `HS_ERR_BUSY`.
    pub refuse_when_full: u32,
    /// Compute threads shared by every request (default: the machine's cores).
    pub threads: u32,
    /// Prompt tokens per prefill chunk: the granularity at which an interactive request
    /// preempts a background prefill (default 128).
    pub chunk_len: u32,
}

/// A piece of one sample's text: `len` bytes of UTF-8 at `text`, followed by a NUL (so
/// it may be printed as a C string), valid for the call only. `request` is the id
/// `hs_requests_submit` returned; `sample` the sample it belongs to, from 0 to `n - 1`
/// (always 0 for a request of one sample). Each sample's pieces come in order; pieces
/// of different samples interleave. Called on the library's event thread.
pub type hs_token_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        request: u64,
        sample: u32,
        text: *const c_char,
        len: usize,
    ),
>;

/// The end of a request, its last callback (after every sample ended): `status` `HS_OK`
/// (each sample ended by its end of sequence, a stop string or its token limit),
/// `HS_ERR_CANCELLED` (cancelled; what it generated was delivered) or
/// `HS_ERR_RUN_FAILED` (a kernel error, or the engine stopped). `result_json`
/// (NUL-terminated, valid for the call only): `{"finish_reason": R, "finish_reasons":
/// [R, ...], "metrics": {...}}` with R one of `"eos"`, `"stop"`, `"length"`,
/// `"cancelled"`: `finish_reasons` one per sample, `finish_reason` sample 0's (or
/// `"cancelled"` for a cancelled request), the metrics measured (ttft_ms, tpot_ms,
/// e2e_ms, tokens of every sample); or `{"error": "..."}` for a failure. Called on the
/// library's event thread.
pub type hs_finish_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        request: u64,
        status: hs_status,
        result_json: *const c_char,
    ),
>;

/// One request (`hs_requests_submit`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hs_request_options {
    /// New tokens at most (at least 1).
    pub max_tokens: u32,
    /// Softmax temperature; 0 is greedy (the most probable token each step).
    pub temperature: f32,
    /// Keep the `top_k` most probable tokens; 0 keeps all.
    pub top_k: u32,
    /// Keep the most probable tokens whose probabilities sum to at least this, in (0, 1];
    /// 1 keeps all.
    pub top_p: f32,
    /// Seed of the sampler.
    pub seed: u64,
    /// Priority class: `HS_PRIORITY_INTERACTIVE`, `HS_PRIORITY_BACKGROUND` or any
    /// number 0..=255 (larger is more urgent).
    pub priority: u8,
    /// Samples of the prompt, generated together (one prefill, a KV cache each): 0 or 1
    /// is one, at most `HS_MAX_SAMPLES`. Sample `i` samples with seed `seed + i` (so
    /// greedy samples are equal).
    pub n: u32,
    /// `stop_count` stop strings (UTF-8, NUL-terminated, the caller's, read during the
    /// call): each sample ends before the first of them it generates, which never
    /// reaches `on_token` (text that may begin one is held back until it cannot). NULL
    /// with `stop_count` 0 for none; at most `HS_MAX_STOP_STRINGS`, each 1 to
    /// `HS_MAX_STOP_BYTES` bytes.
    pub stop: *const *const c_char,
    /// How many strings `stop` holds.
    pub stop_count: usize,
    /// Called with each piece of generated text (optional).
    pub on_token: hs_token_fn,
    /// Called once at the end (optional).
    pub on_finish: hs_finish_fn,
    /// Passed back to both callbacks unchanged; the library never reads it. It must stay
    /// valid until `on_finish` was called (or `hs_requests_close` returned).
    pub user_data: *mut c_void,
}

/// Loads the GGUF model at `model_path` (UTF-8, the caller's, only read; its tokenizer
/// and weights, linears in 8-bit) and starts a request engine on it within `limits`
/// (NULL: every default). `*out`: a new engine the caller ends with `hs_requests_close`.
/// A file that is no model is `HS_ERR_LOAD`; a bad limit `HS_ERR_INVALID_ARGUMENT`; a
/// library built without the `models` feature `HS_ERR_STATE`.
///
/// # Safety
/// `model_path` is NULL or NUL-terminated; `limits` is NULL or readable; `out` is NULL or
/// valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_requests_open(
    model_path: *const c_char,
    limits: *const hs_requests_limits,
    out: *mut *mut hs_requests,
) -> hs_status {
    guarded(|| {
        // SAFETY: the contract above.
        let (path, limits, out) = unsafe {
            (
                str_arg(model_path, "model_path")?,
                limits.as_ref().copied().unwrap_or_default(),
                out_arg(out, "out")?,
            )
        };
        *out = handles::register(RequestsObject::open(path, limits)?);
        Ok(())
    })
}

/// Submits `prompt` (UTF-8 text, the caller's, only read; tokenized here) with
/// `options` (read during the call, its stop strings too). `*request_id`: the
/// request's id, also passed to its callbacks, which start on the event thread at once
/// (possibly before this call returns). Errors, nothing of the request having run:
/// `HS_ERR_NULL_ARGUMENT` (`stop` NULL with `stop_count` above 0, or a NULL stop
/// string), `HS_ERR_INVALID_UTF8` (a stop string), `HS_ERR_INVALID_ARGUMENT` (an empty
/// prompt, one longer than the model's context, a bad sampling setting, `max_tokens` 0,
/// `n` above `HS_MAX_SAMPLES`, an empty stop string or too many or too long ones, a
/// request whose KV caches exceed the whole budget), `HS_ERR_BUSY` (the KV budget is full with `refuse_when_full`, or
/// `max_requests` are live: retry later), `HS_ERR_STATE` (the engine is closing or
/// stopped).
///
/// # Safety
/// `prompt` is NULL or NUL-terminated; `options` is NULL or readable, its callbacks NULL
/// or functions of the declared signatures, its `stop` NULL or `stop_count` readable
/// pointers, each NULL or NUL-terminated; `request_id` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_requests_submit(
    requests: *const hs_requests,
    prompt: *const c_char,
    options: *const hs_request_options,
    request_id: *mut u64,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<RequestsObject>(requests, "requests")?;
        // SAFETY: the contract above.
        let (prompt, options, request_id) = unsafe {
            (
                str_arg(prompt, "prompt")?,
                options
                    .as_ref()
                    .copied()
                    .ok_or(CapiError::Null("options"))?,
                out_arg(request_id, "request_id")?,
            )
        };
        // SAFETY: `options.stop` as the contract above.
        let stop = unsafe { stop_strings(options.stop, options.stop_count) }?;
        let samples = match options.n {
            0 => 1,
            n if n > HS_MAX_SAMPLES => {
                return Err(CapiError::InvalidArgument(format!(
                    "n is {n} samples: at most {HS_MAX_SAMPLES}"
                )));
            }
            n => n as usize,
        };
        *request_id = object.submit(prompt, options, samples, stop)?;
        Ok(())
    })
}

/// Reads `count` stop strings at `strings`, their count and sizes checked before
/// anything is copied.
///
/// # Safety
/// `strings` is NULL or points to `count` readable pointers, each NULL or NUL-terminated.
unsafe fn stop_strings(
    strings: *const *const c_char,
    count: usize,
) -> Result<Vec<String>, CapiError> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if count > HS_MAX_STOP_STRINGS {
        return Err(CapiError::InvalidArgument(format!(
            "{count} stop strings: at most {HS_MAX_STOP_STRINGS}"
        )));
    }
    if strings.is_null() {
        return Err(CapiError::Null("options.stop"));
    }
    // SAFETY: non-null, and the caller promises `count` readable pointers.
    let pointers = unsafe { slice::from_raw_parts(strings, count) };
    pointers
        .iter()
        .enumerate()
        .map(|(i, &pointer)| {
            // SAFETY: each pointer NULL or NUL-terminated, as the contract says.
            let text = unsafe { str_arg(pointer, "options.stop[i]") }?;
            if text.is_empty() || text.len() > HS_MAX_STOP_BYTES {
                return Err(CapiError::InvalidArgument(format!(
                    "stop string {i} has {} bytes: give 1 to {HS_MAX_STOP_BYTES}",
                    text.len()
                )));
            }
            Ok(text.to_string())
        })
        .collect()
}

/// Cancels request `request_id` from any thread (also from its own callbacks): it ends
/// at the engine's next turn, its `on_finish` called with `HS_ERR_CANCELLED`, and its KV
/// caches are freed. A request that finished, was cancelled before, or was never
/// submitted is `HS_ERR_UNKNOWN_REQUEST`.
#[unsafe(no_mangle)]
pub extern "C" fn hs_requests_cancel(requests: *const hs_requests, request_id: u64) -> hs_status {
    guarded(|| handles::get::<RequestsObject>(requests, "requests")?.cancel(request_id))
}

/// The engine's counters as JSON (`{"waiting", "prefilling", "decoding", "finished",
/// "cancelled", "failed", "kv_bytes_in_use", "kv_budget_bytes"}`, as of its last turn).
/// `*out`: a new string the caller frees with `hs_string_free`.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_requests_metrics_json(
    requests: *const hs_requests,
    out: *mut *mut c_char,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<RequestsObject>(requests, "requests")?;
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        *out = string_out(object.metrics_json()?);
        Ok(())
    })
}

/// Ends the engine: cancels every request still live (each gets its `on_finish`, with
/// `HS_ERR_CANCELLED`), waits until every request's `on_finish` was called, stops the
/// engine's threads and joins them all; then the handle is gone. NULL is a no-op; from
/// inside a callback `HS_ERR_STATE` (the event thread cannot join itself).
#[unsafe(no_mangle)]
pub extern "C" fn hs_requests_close(requests: *mut hs_requests) -> hs_status {
    guarded(|| {
        if requests.is_null() {
            return Ok(());
        }
        let object = handles::get::<RequestsObject>(requests, "requests")?;
        if object.on_event_thread() {
            return Err(CapiError::State(
                "hs_requests_close from inside a request callback: the event thread cannot join itself".into(),
            ));
        }
        handles::destroy::<RequestsObject>(requests, "requests")?;
        object.close()
    })
}
