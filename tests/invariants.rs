//! Scheduler invariants over random plans, for every policy: every dependency respected,
//! at most one job per processor at a time, every subgraph done exactly once, each job
//! taking its modeled time, and the makespan never below the lower bound.

use std::sync::Arc;

use hetsched::engine::{RunOutcome, simulate};
use hetsched::systems::testing::{processor, tiny_model};
use hetsched::systems::{DeviceProfile, Policy, PrefillPlan, ProcessorKind, Workload};
use proptest::prelude::*;

/// Checks every invariant of a finished run; returns the first violation.
pub fn check_run(run: &RunOutcome) -> Result<(), String> {
    let plan = &run.plan;
    let mut slice_of = vec![None; plan.id_space()];
    for s in &run.timeline.slices {
        let id = plan.id(s.key);
        if slice_of[id].replace(s).is_some() {
            return Err(format!("{:?} ran twice", s.key));
        }
        if s.processor != plan.processor(s.key) {
            return Err(format!(
                "{:?} ran on lane {} instead of {}",
                s.key,
                s.processor,
                plan.processor(s.key)
            ));
        }
        if s.end_ns - s.start_ns != plan.cost_ns(s.key) {
            return Err(format!(
                "{:?} took {} ns, modeled {}",
                s.key,
                s.end_ns - s.start_ns,
                plan.cost_ns(s.key)
            ));
        }
    }
    for key in plan.instances() {
        let Some(s) = slice_of[plan.id(key)] else {
            return Err(format!("{key:?} never ran"));
        };
        for p in plan.predecessors(key) {
            let before = slice_of[plan.id(p)].ok_or(format!("{p:?} never ran"))?;
            if before.end_ns > s.start_ns {
                return Err(format!(
                    "{key:?} started at {} before {p:?} ended at {}",
                    s.start_ns, before.end_ns
                ));
            }
        }
    }
    if run.timeline.slices.len() != plan.instance_count() {
        return Err(format!(
            "{} slices for {} instances",
            run.timeline.slices.len(),
            plan.instance_count()
        ));
    }
    for lane in 0..plan.device.processors.len() {
        let mut spans: Vec<(u64, u64)> = run
            .timeline
            .slices
            .iter()
            .filter(|s| s.processor == lane)
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(format!(
                "lane {lane} ran two jobs at once: {:?} and {:?}",
                w[0], w[1]
            ));
        }
    }
    if run.makespan_ns < plan.lower_bound().ns() {
        return Err(format!(
            "makespan {} below the lower bound {}",
            run.makespan_ns,
            plan.lower_bound().ns()
        ));
    }
    Ok(())
}

fn policy() -> impl Strategy<Value = Policy> {
    prop::sample::select(Policy::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_schedule_respects_the_invariants(
        layers in 1u32..5,
        prompt_len in 1u32..1500,
        chunk_len in 8u32..400,
        policy in policy(),
        npu_int8 in 20.0f64..2000.0,
        cpu_fp32 in 5.0f64..200.0,
        launch_us in 0.0f64..500.0,
        with_npu in any::<bool>(),
        with_gpu in any::<bool>(),
    ) {
        let mut processors = vec![processor("cpu", ProcessorKind::Cpu, 50.0, cpu_fp32, launch_us)];
        if with_gpu {
            processors.push(processor("gpu", ProcessorKind::Gpu, 100.0, cpu_fp32 * 3.0, launch_us));
        }
        if with_npu {
            processors.push(processor("npu", ProcessorKind::Npu, npu_int8, 1.0, launch_us));
        }
        let device = DeviceProfile { name: "random".into(), processors };
        let float_processor = with_gpu.then(|| "gpu".to_string());
        let workload = Workload { prompt_len, chunk_len, policy, float_processor };
        let plan = Arc::new(PrefillPlan::new(tiny_model(layers), device, workload).unwrap());
        let run = simulate(plan).unwrap();
        if let Err(violation) = check_run(&run) {
            return Err(TestCaseError::fail(violation));
        }
    }
}

#[test]
fn a_single_chunk_on_two_processors_reaches_the_critical_path() {
    // One chunk is a pure chain: any work-conserving policy runs it back to back.
    for policy in Policy::ALL {
        let mut plan = hetsched::systems::testing::tiny_plan(3, 64, 64);
        plan.workload.policy = policy;
        let run = simulate(Arc::new(plan.clone())).unwrap();
        assert_eq!(
            run.makespan_ns,
            plan.lower_bound().critical_path_ns,
            "{policy}"
        );
    }
}

#[test]
fn out_of_order_beats_in_order_when_the_npu_dominates() {
    let run = |policy| {
        let mut plan = hetsched::systems::testing::tiny_plan(4, 1024, 128);
        plan.workload.policy = policy;
        simulate(Arc::new(plan)).unwrap().makespan_ns
    };
    let (stall, in_order) = (run(Policy::Stall), run(Policy::InOrder));
    assert!(
        stall < in_order,
        "stall {stall} ns should beat in-order {in_order} ns"
    );
}
