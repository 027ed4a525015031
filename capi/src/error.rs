//! Status codes, the calling thread's last error, and the wrapper every exported function
//! runs its body in: a panic never crosses the boundary, every error becomes a status and
//! a message.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use hetsched_runtime::engine::{EngineError, panic_message};
use thiserror::Error;

/// What a call did. `HS_OK` is 0; every other value comes with a message from
/// `hs_last_error()` on the same thread.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum hs_status {
    /// Success.
    HS_OK = 0,
    /// A pointer argument was NULL.
    HS_ERR_NULL_ARGUMENT = 1,
    /// A handle that was never created, or was destroyed.
    HS_ERR_INVALID_HANDLE = 2,
    /// A live handle of another kind (a plan where a scene was expected).
    HS_ERR_WRONG_HANDLE_KIND = 3,
    /// A string that is not UTF-8.
    HS_ERR_INVALID_UTF8 = 4,
    /// An argument out of range (a processor lane the plan lacks, an end before a start,
    /// an unknown clock).
    HS_ERR_INVALID_ARGUMENT = 5,
    /// A scene, device profile or model description that failed to load or parse.
    HS_ERR_LOAD = 6,
    /// A plan that cannot be built from its scene.
    HS_ERR_PLAN = 7,
    /// A policy name that is not built in.
    HS_ERR_UNKNOWN_POLICY = 8,
    /// A file that could not be written.
    HS_ERR_IO = 9,
    /// A run that failed: a host queue failed a job or broke the queue contract, the
    /// scheduler stalled, or a job ran past its deadline.
    HS_ERR_RUN_FAILED = 10,
    /// A completion or failure for a job that is not running (never submitted, already
    /// reported, or its run is over).
    HS_ERR_UNKNOWN_JOB = 11,
    /// A call the handle's state does not allow now (a run while one runs on another
    /// thread, a result before the run finished, a queue missing).
    HS_ERR_STATE = 12,
    /// A bug in the library, caught before it reached the caller.
    HS_ERR_INTERNAL = 13,
    /// A run the host cancelled (`hs_engine_cancel`): it stopped at a subgraph boundary
    /// after the jobs already on the host's queues were reported.
    HS_ERR_CANCELLED = 14,
    /// A request id that is not live (finished, cancelled before, or never submitted).
    HS_ERR_UNKNOWN_REQUEST = 15,
    /// The request engine is full (its KV budget, or its request limit): retry later.
    HS_ERR_BUSY = 16,
}

/// Why a call failed; its text becomes `hs_last_error()`.
#[derive(Debug, Error)]
pub(crate) enum CapiError {
    #[error("argument `{0}` is NULL")]
    Null(&'static str),
    #[error("argument `{name}` is not a live handle (never created, or destroyed)")]
    InvalidHandle { name: &'static str },
    #[error("argument `{name}` is a {found} handle, not a {expected} handle")]
    WrongKind {
        name: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    #[error("argument `{name}` is not UTF-8: {source}")]
    Utf8 {
        name: &'static str,
        source: std::str::Utf8Error,
    },
    #[error("{0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Load(hetsched_runtime::scene::SceneError),
    #[error(transparent)]
    Plan(hetsched_runtime::scene::SceneError),
    #[error(transparent)]
    UnknownPolicy(#[from] hetsched_systems::policy::UnknownPolicy),
    #[error("cannot write {path}: {message}")]
    Io { path: String, message: String },
    #[error("the run {verb}: {error}", verb = run_verb(.0), error = .0)]
    Run(#[from] EngineError),
    #[error("the simulation of a measured profile failed: {0}")]
    Predict(String),
    #[error("{0}")]
    UnknownJob(String),
    #[cfg(feature = "models")]
    #[error("the model could not be loaded: {0}")]
    LoadModel(String),
    #[cfg(feature = "models")]
    #[error("{0}")]
    UnknownRequest(String),
    #[cfg(feature = "models")]
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    State(String),
    #[error("internal error (a bug in hetsched): {0}")]
    Internal(String),
}

/// How a run that did not finish ended, for its message.
fn run_verb(error: &EngineError) -> &'static str {
    match error {
        EngineError::Cancelled { .. } => "was cancelled",
        _ => "failed",
    }
}

impl CapiError {
    fn status(&self) -> hs_status {
        use hs_status::*;
        match self {
            CapiError::Null(_) => HS_ERR_NULL_ARGUMENT,
            CapiError::InvalidHandle { .. } => HS_ERR_INVALID_HANDLE,
            CapiError::WrongKind { .. } => HS_ERR_WRONG_HANDLE_KIND,
            CapiError::Utf8 { .. } => HS_ERR_INVALID_UTF8,
            CapiError::InvalidArgument(_) => HS_ERR_INVALID_ARGUMENT,
            CapiError::Load(_) => HS_ERR_LOAD,
            #[cfg(feature = "models")]
            CapiError::LoadModel(_) => HS_ERR_LOAD,
            #[cfg(feature = "models")]
            CapiError::UnknownRequest(_) => HS_ERR_UNKNOWN_REQUEST,
            #[cfg(feature = "models")]
            CapiError::Busy(_) => HS_ERR_BUSY,
            CapiError::Plan(_) => HS_ERR_PLAN,
            CapiError::UnknownPolicy(_) => HS_ERR_UNKNOWN_POLICY,
            CapiError::Io { .. } => HS_ERR_IO,
            CapiError::Run(EngineError::Cancelled { .. }) => HS_ERR_CANCELLED,
            CapiError::Run(_) | CapiError::Predict(_) => HS_ERR_RUN_FAILED,
            CapiError::UnknownJob(_) => HS_ERR_UNKNOWN_JOB,
            CapiError::State(_) => HS_ERR_STATE,
            CapiError::Internal(_) => HS_ERR_INTERNAL,
        }
    }
}

thread_local! {
    /// The message of this thread's last failed call (NUL-terminated), or none.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_last_error(message: String) {
    // An interior NUL would end the C string early: shown as U+FFFD instead.
    let message = CString::new(message.replace('\0', "\u{fffd}"))
        .unwrap_or_else(|_| c"error message unavailable".to_owned());
    LAST_ERROR.with(|slot| *slot.borrow_mut() = Some(message));
}

/// Runs an exported function's body: `HS_OK` on success, else the error's status with its
/// message kept for `hs_last_error()`; a panic becomes `HS_ERR_INTERNAL`. A success
/// leaves the last error as it was (as `errno` does).
pub(crate) fn guarded(body: impl FnOnce() -> Result<(), CapiError>) -> hs_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => hs_status::HS_OK,
        Ok(Err(error)) => {
            let status = error.status();
            set_last_error(error.to_string());
            status
        }
        Err(panic) => {
            set_last_error(format!(
                "internal error (a bug in hetsched): {}",
                panic_message(&*panic)
            ));
            hs_status::HS_ERR_INTERNAL
        }
    }
}

/// The message of the calling thread's last failed call, or NULL if none failed yet.
///
/// Ownership: the string belongs to the library and stays valid on this thread until its
/// next failing call; copy it to keep it. Never free it.
#[unsafe(no_mangle)]
pub extern "C" fn hs_last_error() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR.with(|slot| {
            slot.borrow()
                .as_ref()
                .map_or(std::ptr::null(), |message| message.as_ptr())
        })
    })
    .unwrap_or(std::ptr::null())
}

/// A static name of `status` (`"HS_ERR_NULL_ARGUMENT"`), or `"HS_UNKNOWN_STATUS"` for a
/// value that is none. Ownership: static; never free it.
#[unsafe(no_mangle)]
pub extern "C" fn hs_status_name(status: i32) -> *const c_char {
    use hs_status::*;
    let all = [
        HS_OK,
        HS_ERR_NULL_ARGUMENT,
        HS_ERR_INVALID_HANDLE,
        HS_ERR_WRONG_HANDLE_KIND,
        HS_ERR_INVALID_UTF8,
        HS_ERR_INVALID_ARGUMENT,
        HS_ERR_LOAD,
        HS_ERR_PLAN,
        HS_ERR_UNKNOWN_POLICY,
        HS_ERR_IO,
        HS_ERR_RUN_FAILED,
        HS_ERR_UNKNOWN_JOB,
        HS_ERR_STATE,
        HS_ERR_INTERNAL,
        HS_ERR_CANCELLED,
        HS_ERR_UNKNOWN_REQUEST,
        HS_ERR_BUSY,
    ];
    let name: &'static std::ffi::CStr = match all.into_iter().find(|s| *s as i32 == status) {
        Some(HS_OK) => c"HS_OK",
        Some(HS_ERR_NULL_ARGUMENT) => c"HS_ERR_NULL_ARGUMENT",
        Some(HS_ERR_INVALID_HANDLE) => c"HS_ERR_INVALID_HANDLE",
        Some(HS_ERR_WRONG_HANDLE_KIND) => c"HS_ERR_WRONG_HANDLE_KIND",
        Some(HS_ERR_INVALID_UTF8) => c"HS_ERR_INVALID_UTF8",
        Some(HS_ERR_INVALID_ARGUMENT) => c"HS_ERR_INVALID_ARGUMENT",
        Some(HS_ERR_LOAD) => c"HS_ERR_LOAD",
        Some(HS_ERR_PLAN) => c"HS_ERR_PLAN",
        Some(HS_ERR_UNKNOWN_POLICY) => c"HS_ERR_UNKNOWN_POLICY",
        Some(HS_ERR_IO) => c"HS_ERR_IO",
        Some(HS_ERR_RUN_FAILED) => c"HS_ERR_RUN_FAILED",
        Some(HS_ERR_UNKNOWN_JOB) => c"HS_ERR_UNKNOWN_JOB",
        Some(HS_ERR_STATE) => c"HS_ERR_STATE",
        Some(HS_ERR_INTERNAL) => c"HS_ERR_INTERNAL",
        Some(HS_ERR_CANCELLED) => c"HS_ERR_CANCELLED",
        Some(HS_ERR_UNKNOWN_REQUEST) => c"HS_ERR_UNKNOWN_REQUEST",
        Some(HS_ERR_BUSY) => c"HS_ERR_BUSY",
        None => c"HS_UNKNOWN_STATUS",
    };
    name.as_ptr()
}
