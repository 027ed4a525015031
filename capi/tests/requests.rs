//! `hs_requests_*` on the test model, called as a C host calls them: bad requests refused
//! at submit with their statuses, a full engine answering `HS_ERR_BUSY`, a close from a
//! callback refused, and a close with a request still generating that cancels it, calls
//! its `on_finish` and leaves no handle; `n` samples and stop strings, and their bad
//! input. Skipped, with a note, without the test model
//! (`scripts/fetch-model.sh`).

// Calls the C ABI as a C host does: raw pointers and callbacks.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr;
use std::sync::{Mutex, MutexGuard};

mod common;
use common::test_model;

use hetsched_capi::error::hs_last_error;
use hetsched_capi::hs_live_handles;
use hetsched_capi::hs_status::{
    self, HS_ERR_BUSY, HS_ERR_CANCELLED, HS_ERR_INVALID_ARGUMENT, HS_ERR_INVALID_UTF8,
    HS_ERR_NULL_ARGUMENT, HS_ERR_STATE, HS_ERR_UNKNOWN_REQUEST, HS_OK,
};
use hetsched_capi::requests::{
    HS_MAX_SAMPLES, HS_MAX_STOP_BYTES, HS_MAX_STOP_STRINGS, HS_PRIORITY_BACKGROUND,
    hs_request_options, hs_requests, hs_requests_cancel, hs_requests_close, hs_requests_limits,
    hs_requests_open, hs_requests_submit,
};

/// The tests take turns: each loads the model, and each checks that no handle is left
/// alive (a count over the whole process).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

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
    /// Each sample's text, by its index.
    samples: Vec<String>,
    finish: Option<(hs_status, String)>,
    /// The status of `hs_requests_close` tried from inside `on_token`.
    close_in_callback: Option<hs_status>,
    engine: usize,
}

unsafe extern "C" fn on_token(
    user_data: *mut c_void,
    _id: u64,
    sample: u32,
    text: *const c_char,
    len: usize,
) {
    // SAFETY: `user_data` is the test's `Mutex<Seen>`, alive until the engine is closed;
    // `text` holds `len` bytes.
    let (seen, bytes) = unsafe {
        (
            &*(user_data as *const Mutex<Seen>),
            std::slice::from_raw_parts(text.cast::<u8>(), len),
        )
    };
    let mut seen = seen.lock().unwrap();
    let piece = std::str::from_utf8(bytes).expect("UTF-8 text");
    seen.text.push_str(piece);
    let sample = sample as usize;
    if seen.samples.len() <= sample {
        seen.samples.resize(sample + 1, String::new());
    }
    seen.samples[sample].push_str(piece);
    if seen.engine != 0 && seen.close_in_callback.is_none() {
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
        n: 1,
        stop: ptr::null(),
        stop_count: 0,
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

/// The test model opened within `limits`, and this test's turn (held until it ends);
/// `None`, with a note, without the model.
fn open_test_model(
    limits: &hs_requests_limits,
) -> Option<(MutexGuard<'static, ()>, *mut hs_requests)> {
    let model = test_model()?;
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = CString::new(model.to_str().unwrap()).unwrap();
    let mut engine = ptr::null_mut();
    // SAFETY: valid string, limits and out-pointer.
    assert_eq!(
        unsafe { hs_requests_open(path.as_ptr(), limits, &mut engine) },
        HS_OK,
        "{}",
        last_error()
    );
    Some((turn, engine))
}

#[test]
fn bad_requests_busy_engines_and_closing_with_a_request_live() {
    // One request at a time, refused when full, two threads, small chunks.
    let limits = hs_requests_limits {
        kv_budget_bytes: 64 << 20,
        max_requests: 1,
        refuse_when_full: 1,
        threads: 2,
        chunk_len: 8,
    };
    let Some((_turn, engine)) = open_test_model(&limits) else {
        return;
    };
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

/// Waits (at most two minutes) until `seen`'s request called `on_finish`.
fn finished(seen: &Mutex<Seen>) -> (hs_status, serde_json::Value) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        if let Some((status, json)) = seen.lock().unwrap().finish.clone() {
            return (status, serde_json::from_str(&json).expect("result JSON"));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no on_finish in two minutes"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn samples_and_stop_strings_through_c() {
    let limits = hs_requests_limits {
        threads: 2,
        ..hs_requests_limits::default()
    };
    let Some((_turn, engine)) = open_test_model(&limits) else {
        return;
    };
    let prompt = "The capital of France is";

    // One greedy sample: the reference text.
    let one = Mutex::new(Seen::default());
    assert_eq!(submit(engine, prompt, &options(12, &one)).0, HS_OK);
    let (status, result) = finished(&one);
    assert_eq!(status, HS_OK, "{result}");
    let reference = one.lock().unwrap().text.clone();
    assert!(reference.contains("Paris"), "{reference}");
    assert_eq!(result["finish_reasons"], serde_json::json!(["length"]));

    // Three greedy samples: one prefill, each sample the same greedy text (sample i
    // seeds with seed + i, which greedy ignores), each delivered under its own index.
    let three = Mutex::new(Seen::default());
    let mut samples = options(12, &three);
    samples.n = 3;
    assert_eq!(submit(engine, prompt, &samples).0, HS_OK);
    let (status, result) = finished(&three);
    assert_eq!(status, HS_OK, "{result}");
    assert_eq!(three.lock().unwrap().samples, vec![reference.clone(); 3]);
    assert_eq!(result["finish_reasons"].as_array().map(Vec::len), Some(3));
    assert_eq!(result["metrics"]["generated_tokens"], 36, "{result}");

    // A stop string: the text ends before it, and it never reaches on_token.
    let cut = reference
        .find("French")
        .expect("the reference goes on to `French`");
    let stop_strings = [c"French".as_ptr(), c"no such text".as_ptr()];
    let stopped = Mutex::new(Seen::default());
    let mut with_stop = options(12, &stopped);
    with_stop.stop = stop_strings.as_ptr();
    with_stop.stop_count = stop_strings.len();
    assert_eq!(submit(engine, prompt, &with_stop).0, HS_OK);
    let (status, result) = finished(&stopped);
    assert_eq!(status, HS_OK, "{result}");
    assert_eq!(result["finish_reason"], "stop", "{result}");
    assert_eq!(stopped.lock().unwrap().text, reference[..cut]);

    // Bad samples and stop strings: refused at submit, each with its status.
    let unused = Mutex::new(Seen::default());
    let mut bad = options(4, &unused);
    bad.n = HS_MAX_SAMPLES + 1;
    assert_eq!(submit(engine, prompt, &bad).0, HS_ERR_INVALID_ARGUMENT);
    let mut bad = options(4, &unused);
    bad.stop_count = 1;
    assert_eq!(submit(engine, prompt, &bad).0, HS_ERR_NULL_ARGUMENT);
    let with_null = [c"x".as_ptr(), ptr::null()];
    bad.stop = with_null.as_ptr();
    bad.stop_count = 2;
    assert_eq!(submit(engine, prompt, &bad).0, HS_ERR_NULL_ARGUMENT);
    let not_utf8 = [c"\xff\xfe".as_ptr()];
    bad.stop = not_utf8.as_ptr();
    bad.stop_count = 1;
    assert_eq!(submit(engine, prompt, &bad).0, HS_ERR_INVALID_UTF8);
    let empty = [c"".as_ptr()];
    bad.stop = empty.as_ptr();
    assert_eq!(submit(engine, prompt, &bad).0, HS_ERR_INVALID_ARGUMENT);
    let long = CString::new("a".repeat(HS_MAX_STOP_BYTES + 1)).unwrap();
    let too_long = [long.as_ptr()];
    bad.stop = too_long.as_ptr();
    assert_eq!(submit(engine, prompt, &bad).0, HS_ERR_INVALID_ARGUMENT);
    let too_many = [c"x".as_ptr(); HS_MAX_STOP_STRINGS + 1];
    bad.stop = too_many.as_ptr();
    bad.stop_count = too_many.len();
    assert_eq!(submit(engine, prompt, &bad).0, HS_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("stop strings"), "{}", last_error());
    assert!(unused.lock().unwrap().finish.is_none());

    assert_eq!(hs_requests_close(engine), HS_OK);
    assert_eq!(hs_live_handles(), 0);
}
