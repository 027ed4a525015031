//! A callback job's overhead through the C ABI against the Rust `Backend`: the default
//! scene's whole run, once on the engine's own simulated queues (`engine::simulate`) and
//! once on a host queue behind the C ABI whose `submit` callback reports the job's
//! virtual end at once (`hs_engine_*`, the path of a C host). Both schedule the same
//! jobs; the difference per job (throughput is in jobs) is what the ABI costs a job:
//! registry look-ups, the callback, the shared record, the release in end-time order.
//!
//!   cargo bench -p hetsched-capi --bench callback_job

// Calls the C ABI as a C host does: raw pointers and callbacks.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hetsched_capi::engine::{
    HS_CLOCK_VIRTUAL, hs_engine, hs_engine_complete, hs_engine_create, hs_engine_destroy,
    hs_engine_result, hs_engine_run, hs_engine_set_queue, hs_job, hs_queue,
};
use hetsched_capi::hs_status;
use hetsched_capi::run::{hs_run_destroy, hs_run_makespan_ns};
use hetsched_capi::scene::{
    hs_plan, hs_plan_create, hs_plan_destroy, hs_plan_get_info, hs_plan_info, hs_scene_default,
    hs_scene_destroy,
};
use hetsched_runtime::engine;
use hetsched_runtime::scene::Scene;

/// `hs_submit_fn`: completes the job at its modeled end, on the driving thread.
unsafe extern "C" fn complete_at_once(job: *const hs_job, engine: *mut c_void) -> i32 {
    // SAFETY: the engine passes a descriptor valid for the call.
    let job = unsafe { &*job };
    let status = hs_engine_complete(
        engine as *const hs_engine,
        job.id,
        job.dispatched_ns,
        job.dispatched_ns + job.estimated_ns,
    );
    i32::from(status != hs_status::HS_OK)
}

fn hosted_run(plan: *const hs_plan, lanes: u32) -> u64 {
    let mut engine_handle = ptr::null_mut();
    let mut run = ptr::null_mut();
    let mut makespan = 0;
    // SAFETY: valid out-pointers and callbacks of the declared signatures.
    unsafe {
        assert_eq!(
            hs_engine_create(plan, ptr::null(), HS_CLOCK_VIRTUAL, &mut engine_handle),
            hs_status::HS_OK
        );
        for lane in 0..lanes {
            let queue = hs_queue {
                submit: Some(complete_at_once),
                cancel: None,
                user_data: engine_handle.cast(),
            };
            assert_eq!(
                hs_engine_set_queue(engine_handle, lane, &queue),
                hs_status::HS_OK
            );
        }
        assert_eq!(hs_engine_run(engine_handle), hs_status::HS_OK);
        assert_eq!(hs_engine_result(engine_handle, &mut run), hs_status::HS_OK);
        assert_eq!(hs_run_makespan_ns(run, &mut makespan), hs_status::HS_OK);
        hs_run_destroy(run);
        hs_engine_destroy(engine_handle);
    }
    makespan
}

fn bench(c: &mut Criterion) {
    let scene = Scene::default_scene();
    let plan = Arc::new(scene.plan().expect("default plan"));
    let jobs = plan.instance_count() as u64;
    let mut scene_handle = ptr::null_mut();
    let mut plan_handle = ptr::null_mut();
    let mut info = hs_plan_info::default();
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(hs_scene_default(&mut scene_handle), hs_status::HS_OK);
        assert_eq!(
            hs_plan_create(scene_handle, &mut plan_handle),
            hs_status::HS_OK
        );
        assert_eq!(hs_plan_get_info(plan_handle, &mut info), hs_status::HS_OK);
    }
    let simulated = engine::simulate(plan.clone(), scene.new_policy().unwrap()).unwrap();
    assert_eq!(
        hosted_run(plan_handle, info.processors),
        simulated.makespan_ns
    );

    let mut group = c.benchmark_group("callback_job");
    group.throughput(Throughput::Elements(jobs));
    group.sample_size(20);
    group.bench_function("rust_sim_backend", |b| {
        b.iter(|| {
            engine::simulate(plan.clone(), scene.new_policy().unwrap())
                .unwrap()
                .makespan_ns
        })
    });
    group.bench_function("c_abi_host_queue", |b| {
        b.iter(|| hosted_run(plan_handle, info.processors))
    });
    group.finish();
    hs_plan_destroy(plan_handle);
    hs_scene_destroy(scene_handle);
}

criterion_group!(benches, bench);
criterion_main!(benches);
