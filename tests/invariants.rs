//! Scheduler invariants over random plans, for every policy: every dependency respected,
//! at most one job per processor at a time, every subgraph done exactly once, each job
//! taking its modeled time, and the makespan never below the lower bound; with and without
//! outlier shadow stages.

use std::sync::Arc;

use hetsched::engine::{RunOutcome, simulate};
use hetsched::systems::shadow::ShadowConfig;
use hetsched::systems::testing::{Timing, check_schedule, processor, tiny_model};
use hetsched::systems::{
    DeviceProfile, ModelConfig, PlacementConfig, Policy, PolicyRegistry, PrefillPlan,
    ProcessorKind, Workload,
};
use proptest::prelude::*;

/// Checks every invariant of a finished simulated run; returns the first violation.
fn check_run(run: &RunOutcome) -> Result<(), String> {
    let home_only = !builtin(&run.policy).chooses_placement();
    check_schedule(&run.plan, &run.timeline.slices, Timing::Modeled, home_only)
}

/// A fresh built-in policy.
fn builtin(name: &str) -> Box<dyn Policy> {
    PolicyRegistry::builtin().create(name).unwrap()
}

/// Every built-in policy's name.
fn names() -> Vec<String> {
    PolicyRegistry::builtin()
        .names()
        .map(String::from)
        .collect()
}

fn policy() -> impl Strategy<Value = String> {
    prop::sample::select(names())
}

/// No shadow, or a random share of the sites shadowed (stages running beside their INT8
/// stage, joined after: the one place the chunk's chain branches).
fn shadow() -> impl Strategy<Value = Option<ShadowConfig>> {
    prop::option::of(
        (0.0f64..=1.0, 0.0005f64..0.05).prop_map(|(keep, outliers)| ShadowConfig {
            keep,
            outlier_channels: outliers,
            ..ShadowConfig::default()
        }),
    )
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
        shadow in shadow(),
    ) {
        let mut processors = vec![processor("cpu", ProcessorKind::Cpu, 50.0, cpu_fp32, launch_us)];
        if with_gpu {
            processors.push(processor("gpu", ProcessorKind::Gpu, 100.0, cpu_fp32 * 3.0, launch_us));
        }
        if with_npu {
            processors.push(processor("npu", ProcessorKind::Npu, npu_int8, 1.0, launch_us));
        }
        let device = DeviceProfile { name: "random".into(), measured: None, processors };
        let float_processor = with_gpu.then(|| "gpu".to_string());
        let workload = Workload { prompt_len, chunk_len, float_processor };
        let model = ModelConfig { shadow, ..tiny_model(layers) };
        let plan = Arc::new(PrefillPlan::new(model, device, workload).unwrap());
        let run = simulate(plan, builtin(&policy)).unwrap();
        if let Err(violation) = check_run(&run) {
            return Err(TestCaseError::fail(violation));
        }
    }
}

/// A non-empty subset of `names` in a shuffled order, from the bits of `pick`.
fn rule(names: &[&str], pick: u32) -> Vec<String> {
    let mut chosen: Vec<String> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| pick & (1 << i) != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    if chosen.is_empty() {
        chosen.push(names[pick as usize % names.len()].to_string());
    }
    let len = chosen.len();
    chosen.rotate_left((pick as usize >> 4) % len);
    chosen
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Flexible placement: every kind of stage on a random set of processors (by name or
    /// kind), so instances compete for processors across queues. Besides the invariants
    /// above, each instance ran on a processor its rule allows (its home only under
    /// `inorder` and `peer`), for that processor's modeled cost.
    #[test]
    fn flexible_placement_keeps_the_invariants(
        layers in 1u32..4,
        prompt_len in 1u32..1200,
        chunk_len in 16u32..400,
        policy in policy(),
        npu_int8 in 20.0f64..2000.0,
        cpu_fp32 in 5.0f64..200.0,
        launch_us in 0.0f64..500.0,
        with_gpu in any::<bool>(),
        picks in prop::array::uniform4(0u32..64),
        by_kind in any::<bool>(),
        shadow in shadow(),
    ) {
        let mut processors = vec![
            processor("cpu0", ProcessorKind::Cpu, 50.0, cpu_fp32, launch_us),
            processor("npu0", ProcessorKind::Npu, npu_int8, 1.0, launch_us),
        ];
        if with_gpu {
            processors.push(processor("gpu0", ProcessorKind::Gpu, 100.0, cpu_fp32 * 3.0, launch_us));
        }
        let names: Vec<&str> = if by_kind {
            vec!["cpu", "npu", "gpu"][..processors.len()].to_vec()
        } else {
            processors.iter().map(|p| p.name.as_str()).collect()
        };
        let placement = PlacementConfig {
            int8_linear: Some(rule(&names, picks[0])),
            attention: Some(rule(&names, picks[1])),
            float: Some(rule(&names, picks[2])),
            shadow: Some(rule(&names, picks[3])),
        };
        let device = DeviceProfile { name: "random".into(), measured: None, processors };
        let workload = Workload { prompt_len, chunk_len, float_processor: None };
        let model = ModelConfig { shadow, ..tiny_model(layers) };
        let plan = PrefillPlan::placed(model, device, workload, placement).unwrap();
        let run = simulate(Arc::new(plan), builtin(&policy)).unwrap();
        if let Err(violation) = check_run(&run) {
            return Err(TestCaseError::fail(violation));
        }
    }
}

#[test]
fn a_single_chunk_on_two_processors_reaches_the_critical_path() {
    // One chunk is a pure chain: any work-conserving policy runs it back to back.
    for policy in names() {
        let plan = hetsched::systems::testing::tiny_plan(3, 64, 64);
        let run = simulate(Arc::new(plan.clone()), builtin(&policy)).unwrap();
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
        let plan = hetsched::systems::testing::tiny_plan(4, 1024, 128);
        simulate(Arc::new(plan), builtin(policy))
            .unwrap()
            .makespan_ns
    };
    let (stall, in_order) = (run("stall"), run("inorder"));
    assert!(
        stall < in_order,
        "stall {stall} ns should beat in-order {in_order} ns"
    );
}
