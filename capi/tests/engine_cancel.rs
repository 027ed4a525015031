//! `hs_engine_cancel` through the C ABI, called as a C host calls it: from a host queue's
//! own thread while a blocking `hs_engine_run` waits, between the steps of a host that
//! reports from its own event loop, and from inside a `submit` callback. Each run ends
//! with `HS_ERR_CANCELLED`: no job is dispatched once the driver has seen the cancel
//! (at most one tick's jobs, one per lane, after the call), every job dispatched is
//! reported and none is refused, a stepped engine never blocks on the jobs still
//! running, and the ended run has no result.

// Calls the C ABI as a C host does: raw pointers and callbacks.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_void};
use std::ptr;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread;

use hetsched_capi::engine::{
    HS_CLOCK_VIRTUAL, HS_CLOCK_WALL, hs_engine, hs_engine_cancel, hs_engine_complete,
    hs_engine_create, hs_engine_destroy, hs_engine_now_ns, hs_engine_result, hs_engine_run,
    hs_engine_set_queue, hs_engine_step, hs_job, hs_queue,
};
use hetsched_capi::error::hs_last_error;
use hetsched_capi::hs_status::{self, HS_ERR_CANCELLED, HS_ERR_STATE, HS_ERR_UNKNOWN_JOB, HS_OK};
use hetsched_capi::scene::{
    hs_plan, hs_plan_create, hs_plan_destroy, hs_plan_get_info, hs_plan_info, hs_scene_default,
    hs_scene_destroy,
};

fn last_error() -> String {
    let message = hs_last_error();
    assert!(!message.is_null(), "a failed call left no message");
    // SAFETY: the library's NUL-terminated message, valid on this thread until its next
    // failing call.
    unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned()
}

/// The default scene's plan and its sizes; the caller destroys the plan.
fn default_plan() -> (*mut hs_plan, hs_plan_info) {
    let (mut scene, mut plan, mut info) =
        (ptr::null_mut(), ptr::null_mut(), hs_plan_info::default());
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(hs_scene_default(&mut scene), HS_OK);
        assert_eq!(hs_plan_create(scene, &mut plan), HS_OK);
        assert_eq!(hs_plan_get_info(plan, &mut info), HS_OK);
        assert_eq!(hs_scene_destroy(scene), HS_OK);
    }
    (plan, info)
}

/// An engine on `plan` whose every lane's `submit` runs `submit` with `user_data`.
fn engine_with(
    plan: *const hs_plan,
    lanes: u32,
    clock: u32,
    submit: unsafe extern "C" fn(*const hs_job, *mut c_void) -> i32,
    user_data: *mut c_void,
) -> *mut hs_engine {
    let mut engine = ptr::null_mut();
    // SAFETY: valid out-pointer; the callback has the declared signature.
    unsafe {
        assert_eq!(
            hs_engine_create(plan, ptr::null(), clock, &mut engine),
            HS_OK
        );
        for lane in 0..lanes {
            let queue = hs_queue {
                submit: Some(submit),
                cancel: None,
                user_data,
            };
            assert_eq!(hs_engine_set_queue(engine, lane, &queue), HS_OK);
        }
    }
    engine
}

/// Asserts that the engine's run ended cancelled: no result, no second run. Returns the
/// cancel's message.
fn assert_ended_cancelled(engine: *mut hs_engine, status: hs_status) -> String {
    assert_eq!(status, HS_ERR_CANCELLED, "{}", last_error());
    let message = last_error();
    assert!(message.contains("cancelled with"), "{message}");
    let mut run = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { hs_engine_result(engine, &mut run) }, HS_ERR_STATE);
    assert!(run.is_null());
    assert_eq!(hs_engine_run(engine), HS_ERR_STATE);
    // A cancel of an ended run does nothing.
    assert_eq!(hs_engine_cancel(engine), HS_OK);
    message
}

/// `hs_submit_fn`: hands the job to the host thread behind `user_data` (a `Sender`).
unsafe extern "C" fn to_host_thread(job: *const hs_job, user_data: *mut c_void) -> i32 {
    // SAFETY: `user_data` is the test's `Sender`, alive for the run; the descriptor is
    // valid for the call.
    let (sender, job) = unsafe { (&*(user_data as *const Sender<hs_job>), *job) };
    i32::from(sender.send(job).is_err())
}

/// What a host thread did: jobs it reported, and of them the ones it got after its
/// cancel returned.
struct HostLog {
    reported: usize,
    after_cancel: usize,
}

/// A host queue thread: reports each job it gets from `jobs` (virtual or wall times) and
/// cancels the run after `cancel_after` reports.
fn spawn_host(
    engine: *mut hs_engine,
    clock: u32,
    jobs: Receiver<hs_job>,
    cancel_after: usize,
) -> thread::JoinHandle<HostLog> {
    // Handles are plain keys: passing one to another thread is what C hosts do.
    let engine = engine.addr();
    thread::spawn(move || {
        let engine = ptr::without_provenance::<hs_engine>(engine);
        let mut log = HostLog {
            reported: 0,
            after_cancel: 0,
        };
        for job in jobs {
            if log.reported >= cancel_after {
                log.after_cancel += 1;
            }
            let (start, end) = if clock == HS_CLOCK_WALL {
                let mut now = 0;
                // SAFETY: a valid out-pointer.
                assert_eq!(unsafe { hs_engine_now_ns(engine, &mut now) }, HS_OK);
                (now, now + 1_000)
            } else {
                (job.dispatched_ns, job.dispatched_ns + job.estimated_ns)
            };
            assert_eq!(hs_engine_complete(engine, job.id, start, end), HS_OK);
            log.reported += 1;
            if log.reported == cancel_after {
                assert_eq!(hs_engine_cancel(engine), HS_OK);
            }
        }
        log
    })
}

fn cancel_from_a_host_thread(clock: u32) {
    let (plan, info) = default_plan();
    let (sender, jobs) = channel::<hs_job>();
    let engine = engine_with(
        plan,
        info.processors,
        clock,
        to_host_thread,
        (&sender as *const Sender<hs_job>).cast_mut().cast(),
    );
    let cancel_after = 10;
    let host = spawn_host(engine, clock, jobs, cancel_after);
    let status = hs_engine_run(engine);
    assert_ended_cancelled(engine, status);
    drop(sender);
    let log = host.join().unwrap();
    assert!(log.reported >= cancel_after);
    assert!(
        log.after_cancel <= info.processors as usize,
        "{} jobs were dispatched after the cancel, more than one per lane",
        log.after_cancel
    );
    assert!(log.reported < info.instances as usize);
    // Every dispatched job's report was taken by the drain; a late one is refused.
    assert_eq!(hs_engine_complete(engine, 0, 0, 1), HS_ERR_UNKNOWN_JOB);
    assert_eq!(hs_engine_destroy(engine), HS_OK);
    assert_eq!(hs_plan_destroy(plan), HS_OK);
}

#[test]
fn a_host_thread_cancels_a_blocking_run_on_the_virtual_clock() {
    cancel_from_a_host_thread(HS_CLOCK_VIRTUAL);
}

#[test]
fn a_host_thread_cancels_a_blocking_run_on_the_wall_clock() {
    cancel_from_a_host_thread(HS_CLOCK_WALL);
}

/// A host that owns its event loop: `submit` only queues the job; the loop steps the
/// engine, then reports what was queued. The engine handle is set once created.
struct Looper {
    engine: *mut hs_engine,
    pending: Vec<hs_job>,
    submitted: usize,
    /// Cancel from inside `submit` once this many jobs were submitted.
    cancel_in_submit_at: Option<usize>,
}

/// `hs_submit_fn`: queues the job on the looper behind `user_data`.
unsafe extern "C" fn to_looper(job: *const hs_job, user_data: *mut c_void) -> i32 {
    // SAFETY: `user_data` is the test's `Looper`, alive for the run and only touched on
    // this thread (the loop steps the engine, which calls back here); the descriptor is
    // valid for the call.
    let (looper, job) = unsafe { (&mut *(user_data as *mut Looper), *job) };
    looper.pending.push(job);
    looper.submitted += 1;
    if looper.cancel_in_submit_at == Some(looper.submitted) {
        assert_eq!(hs_engine_cancel(looper.engine), HS_OK);
    }
    0
}

/// Steps `looper`'s engine, reporting between steps; cancels between steps once
/// `cancel_between_at` jobs were reported, with the jobs dispatched since still pending.
/// Returns the final status and, for a cancel between steps, the jobs submitted by then.
fn run_looper(looper: &mut Looper, cancel_between_at: Option<usize>) -> (hs_status, Option<usize>) {
    let mut reported = 0;
    let mut submitted_at_cancel = None;
    loop {
        let mut finished = 0;
        // SAFETY: a valid out-pointer.
        let status = unsafe { hs_engine_step(looper.engine, &mut finished) };
        if status != HS_OK {
            return (status, submitted_at_cancel);
        }
        assert_eq!(finished, 0, "the run finished although it was cancelled");
        if submitted_at_cancel.is_none()
            && cancel_between_at.is_some_and(|at| reported >= at)
            && !looper.pending.is_empty()
        {
            assert_eq!(hs_engine_cancel(looper.engine), HS_OK);
            submitted_at_cancel = Some(looper.submitted);
            // With jobs unreported, the step returns at once instead of draining them.
            let mut finished = 0;
            // SAFETY: a valid out-pointer.
            assert_eq!(
                unsafe { hs_engine_step(looper.engine, &mut finished) },
                HS_OK
            );
            assert_eq!(finished, 0);
        }
        assert!(
            !looper.pending.is_empty(),
            "a stepped run with nothing running: reported {reported}, submitted {}, cancel at {submitted_at_cancel:?}",
            looper.submitted
        );
        for job in std::mem::take(&mut looper.pending) {
            let end = job.dispatched_ns + job.estimated_ns;
            assert_eq!(
                hs_engine_complete(looper.engine, job.id, job.dispatched_ns, end),
                HS_OK
            );
            reported += 1;
        }
    }
}

/// A host event loop (boxed: the engine keeps its address as the queues' user data)
/// with an engine on `plan` in virtual time whose every queue hands jobs to it.
fn looper_on(
    plan: *mut hs_plan,
    processors: u32,
    cancel_in_submit_at: Option<usize>,
) -> Box<Looper> {
    let mut looper = Box::new(Looper {
        engine: ptr::null_mut(),
        pending: Vec::new(),
        submitted: 0,
        cancel_in_submit_at,
    });
    let user_data: *mut Looper = &mut *looper;
    looper.engine = engine_with(
        plan,
        processors,
        HS_CLOCK_VIRTUAL,
        to_looper,
        user_data.cast(),
    );
    looper
}

fn cancel_a_stepped_run(cancel_in_submit_at: Option<usize>, cancel_between_at: Option<usize>) {
    let (plan, info) = default_plan();
    let mut looper = looper_on(plan, info.processors, cancel_in_submit_at);
    let (status, submitted_at_between) = run_looper(&mut looper, cancel_between_at);
    assert_ended_cancelled(looper.engine, status);
    // A cancel made inside a callback lets the step it came in finish its tick's
    // dispatches (one per lane at most); one made between steps dispatches nothing.
    let (submitted_at_cancel, allowed) = match (cancel_in_submit_at, submitted_at_between) {
        (Some(at), _) => (at, info.processors as usize),
        (None, Some(at)) => (at, 0),
        (None, None) => panic!("the run was never cancelled"),
    };
    let after_cancel = looper.submitted - submitted_at_cancel;
    assert!(
        after_cancel <= allowed,
        "{after_cancel} jobs dispatched after the cancel"
    );
    assert!(looper.submitted < info.instances as usize);
    assert_eq!(hs_engine_destroy(looper.engine), HS_OK);
    assert_eq!(hs_plan_destroy(plan), HS_OK);
}

#[test]
fn a_stepped_run_cancelled_between_steps_waits_for_no_job() {
    cancel_a_stepped_run(None, Some(12));
}

#[test]
fn a_stepped_run_cancelled_inside_a_submit_callback_ends_at_the_next_step() {
    cancel_a_stepped_run(Some(7), None);
}

#[test]
fn a_run_cancelled_before_it_starts_dispatches_nothing() {
    let (plan, info) = default_plan();
    let looper = looper_on(plan, info.processors, None);
    assert_eq!(hs_engine_cancel(looper.engine), HS_OK);
    assert_eq!(hs_engine_cancel(looper.engine), HS_OK);
    let status = hs_engine_run(looper.engine);
    let message = assert_ended_cancelled(looper.engine, status);
    assert!(message.contains("cancelled with 0 of"), "{message}");
    assert_eq!(looper.submitted, 0);
    assert_eq!(hs_engine_destroy(looper.engine), HS_OK);
    assert_eq!(hs_plan_destroy(plan), HS_OK);
}
