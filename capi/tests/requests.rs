//! `hs_requests_*` on the test model, called as a C host calls them: bad requests refused
//! at submit with their statuses, a full engine answering `HS_ERR_BUSY`, a close from a
//! callback refused, and a close with a request still generating that cancels it, calls
//! its `on_finish` and leaves no handle. Skipped, with a note, without the test model
//! (`scripts/fetch-model.sh`).

// Calls the C ABI as a C host does: raw pointers and callbacks.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr;
use std::sync::Mutex;

mod common;
use common::test_model;

use hetsched_capi::error::hs_last_error;
use hetsched_capi::hs_live_handles;
use hetsched_capi::hs_status::{
    self, HS_ERR_BUSY, HS_ERR_CANCELLED, HS_ERR_INVALID_ARGUMENT, HS_ERR_STATE,
    HS_ERR_UNKNOWN_REQUEST, HS_OK,
};
use hetsched_capi::requests::{
    HS_PRIORITY_BACKGROUND, hs_request_options, hs_requests, hs_requests_cancel, hs_requests_close,
    hs_requests_limits, hs_requests_open, hs_requests_submit,
};

fn last_error() -> String {
    // SAFETY: the library's NUL-terminated message, valid until this thread's next
    // failing call.
    unsafe { CStr::from_ptr(hs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// What the callbacks saw of one request.
#[derive(Default)]
struct Seen {
    text: String,
    finish: Option<(hs_status, String)>,
    /// The status of `hs_requests_close` tried from inside `on_token`.
    close_in_callback: Option<hs_status>,
    engine: usize,
}

unsafe extern "C" fn on_token(user_data: *mut c_void, _id: u64, text: *const c_char, len: usize) {
    // SAFETY: `user_data` is the test's `Mutex<Seen>`, alive until the engine is closed;
    // `text` holds `len` bytes.
    let (seen, bytes) = unsafe {
        (
            &*(user_data as *const Mutex<Seen>),
            std::slice::from_raw_parts(text.cast::<u8>(), len),
        )
    };
    let mut seen = seen.lock().unwrap();
    seen.text
        .push_str(std::str::from_utf8(bytes).expect("UTF-8 text"));
    if seen.close_in_callback.is_none() {
        let engine = ptr::without_provenance_mut::<hs_requests>(seen.engine);
        seen.close_in_callback = Some(hs_requests_close(engine));
    }
}

unsafe extern "C" fn on_finish(
    user_data: *mut c_void,
    _id: u64,
    status: hs_status,
    json: *const c_char,
) {
    // SAFETY: as `on_token`; `json` is NUL-terminated.
    let (seen, json) = unsafe { (&*(user_data as *const Mutex<Seen>), CStr::from_ptr(json)) };
    seen.lock().unwrap().finish = Some((status, json.to_string_lossy().into_owned()));
}

fn options(max_tokens: u32, seen: &Mutex<Seen>) -> hs_request_options {
    hs_request_options {
        max_tokens,
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
        priority: HS_PRIORITY_BACKGROUND,
        on_token: Some(on_token),
        on_finish: Some(on_finish),
        user_data: (seen as *const Mutex<Seen>).cast_mut().cast(),
    }
}

fn submit(
    engine: *const hs_requests,
    prompt: &str,
    options: &hs_request_options,
) -> (hs_status, u64) {
    let prompt = CString::new(prompt).unwrap();
    let mut id = u64::MAX;
    // SAFETY: valid strings, options and out-pointer.
    let status = unsafe { hs_requests_submit(engine, prompt.as_ptr(), options, &mut id) };
    (status, id)
}

#[test]
fn bad_requests_busy_engines_and_closing_with_a_request_live() {
    let Some(model) = test_model() else {
        return;
    };
    let path = CString::new(model.to_str().unwrap()).unwrap();
    // One request at a time, refused when full, two threads, small chunks.
    let limits = hs_requests_limits {
        kv_budget_bytes: 64 << 20,
        max_requests: 1,
        refuse_when_full: 1,
        threads: 2,
        chunk_len: 8,
    };
    let mut engine = ptr::null_mut();
    // SAFETY: valid string, limits and out-pointer.
    assert_eq!(
        unsafe { hs_requests_open(path.as_ptr(), &limits, &mut engine) },
        HS_OK,
        "{}",
        last_error()
    );
    let seen = Mutex::new(Seen {
        engine: engine.addr(),
        ..Seen::default()
    });

    // Refused before anything runs.
    assert_eq!(
        submit(engine, "", &options(4, &seen)).0,
        HS_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        submit(engine, "Hi", &options(0, &seen)).0,
        HS_ERR_INVALID_ARGUMENT
    );
    let mut bad_sampling = options(4, &seen);
    bad_sampling.top_p = 0.0;
    assert_eq!(
        submit(engine, "Hi", &bad_sampling).0,
        HS_ERR_INVALID_ARGUMENT
    );
    // Its KV caches alone exceed the whole 64 MiB budget.
    let (status, _) = submit(engine, "Hi", &options(1_000_000, &seen));
    assert_eq!(status, HS_ERR_INVALID_ARGUMENT, "{}", last_error());
    assert_eq!(hs_requests_cancel(engine, 12345), HS_ERR_UNKNOWN_REQUEST);

    // One live request fills the engine: a second is busy.
    let (status, id) = submit(engine, "Once upon a time, there was", &options(1000, &seen));
    assert_eq!(status, HS_OK, "{}", last_error());
    let other = Mutex::new(Seen::default());
    let (status, _) = submit(engine, "Hello", &options(4, &other));
    assert_eq!(status, HS_ERR_BUSY, "{}", last_error());
    assert!(last_error().contains("retry later"), "{}", last_error());

    // Wait for the first token (its callback tries to close: refused).
    while seen.lock().unwrap().close_in_callback.is_none() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(seen.lock().unwrap().close_in_callback, Some(HS_ERR_STATE));
    // Closing with the request still generating cancels it and returns after its end.
    assert_eq!(hs_requests_close(engine), HS_OK);
    let seen = seen.into_inner().unwrap();
    let (status, json) = seen
        .finish
        .expect("on_finish was called before close returned");
    assert_eq!(status, HS_ERR_CANCELLED, "{json}");
    assert!(json.contains("\"cancelled\""), "{json}");
    assert!(!seen.text.is_empty());
    assert!(other.into_inner().unwrap().finish.is_none());
    assert_eq!(
        hs_requests_cancel(engine, id),
        hetsched_capi::hs_status::HS_ERR_INVALID_HANDLE
    );
    assert_eq!(hs_live_handles(), 0);
}
