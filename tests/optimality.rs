//! Heuristics against the exact optimum on small random instances: none may beat it (a
//! heuristic below the optimum would mean a broken simulator or a broken solver), and the
//! mean gap of each policy is printed (`cargo test --test optimality -- --nocapture`).

use std::sync::Arc;

use hetsched::engine::simulate;
use hetsched::systems::optimal::optimal_makespan_ns;
use hetsched::systems::testing::{processor, tiny_model};
use hetsched::systems::{
    DeviceProfile, PlacementConfig, PolicyRegistry, PrefillPlan, ProcessorKind, Workload,
};
use hetsched_kernels::seeded::SeededRng;

fn random_plan(rng: &mut SeededRng) -> PrefillPlan {
    let device = DeviceProfile {
        name: "random".into(),
        measured: None,
        processors: vec![
            processor(
                "cpu",
                ProcessorKind::Cpu,
                50.0,
                rng.uniform(2.0, 40.0),
                rng.uniform(0.0, 300.0),
            ),
            processor(
                "npu",
                ProcessorKind::Npu,
                rng.uniform(50.0, 800.0),
                1.0,
                rng.uniform(0.0, 300.0),
            ),
        ],
    };
    // One layer (6 stages) and 3 chunks, plus the head: 19 instances.
    let chunk_len = 16 * (1 + rng.next_u64() % 8) as u32;
    let workload = Workload {
        prompt_len: 3 * chunk_len,
        chunk_len,
        float_processor: None,
    };
    PrefillPlan::new(tiny_model(1), device, workload).unwrap()
}

/// A CPU + GPU + NPU device where INT8 linears may run on the NPU or the CPU and
/// attention on the GPU or the CPU: one layer and 2 chunks, plus the head (13 instances).
fn random_flexible_plan(rng: &mut SeededRng) -> PrefillPlan {
    let launch = rng.uniform(0.0, 300.0);
    let cpu_fp32 = rng.uniform(2.0, 40.0);
    let device = DeviceProfile {
        name: "random flexible".into(),
        measured: None,
        processors: vec![
            processor(
                "cpu",
                ProcessorKind::Cpu,
                rng.uniform(20.0, 200.0),
                cpu_fp32,
                launch,
            ),
            processor(
                "gpu",
                ProcessorKind::Gpu,
                0.0,
                cpu_fp32 * rng.uniform(0.5, 4.0),
                launch,
            ),
            processor(
                "npu",
                ProcessorKind::Npu,
                rng.uniform(50.0, 800.0),
                0.0,
                launch,
            ),
        ],
    };
    let chunk_len = 16 * (1 + rng.next_u64() % 8) as u32;
    let workload = Workload {
        prompt_len: 2 * chunk_len,
        chunk_len,
        float_processor: None,
    };
    let placement = PlacementConfig {
        int8_linear: Some(vec!["npu".into(), "cpu".into()]),
        attention: Some(vec!["gpu".into(), "cpu".into()]),
        float: None,
        shadow: None,
    };
    PrefillPlan::placed(tiny_model(1), device, workload, placement).unwrap()
}

/// Runs every policy on `plans` against the exact optimum and prints the mean gaps.
fn measure_gaps(label: &str, plans: impl Iterator<Item = PrefillPlan>) {
    let registry = PolicyRegistry::builtin();
    let names: Vec<&str> = registry.names().collect();
    let mut gaps = vec![Vec::new(); names.len()];
    for plan in plans {
        let optimum = optimal_makespan_ns(&plan, 20).expect("small instance");
        assert!(
            optimum >= plan.lower_bound().ns(),
            "optimum below the lower bound"
        );
        for (i, &policy) in names.iter().enumerate() {
            let policy_state = registry.create(policy).unwrap();
            let makespan = simulate(Arc::new(plan.clone()), policy_state)
                .unwrap()
                .makespan_ns;
            assert!(
                makespan >= optimum,
                "{policy}: {makespan} ns below the optimum {optimum} ns"
            );
            gaps[i].push(makespan as f64 / optimum as f64 - 1.0);
        }
    }
    for (policy, g) in names.iter().zip(&gaps) {
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        let worst = g.iter().copied().fold(0.0, f64::max);
        println!(
            "{label}: {policy:<10} mean gap to optimum {:.2}%  worst {:.2}%",
            100.0 * mean,
            100.0 * worst
        );
    }
}

#[test]
fn no_heuristic_beats_the_optimum_and_gaps_are_reported() {
    // Seeded, so the instances are the same on every run.
    let mut rng = SeededRng::new(0x5eed_1234_abcd_0001);
    measure_gaps("fixed", (0..40).map(|_| random_plan(&mut rng)));
}

#[test]
fn with_placement_choice_no_heuristic_beats_the_optimum() {
    let mut rng = SeededRng::new(0x5eed_1234_abcd_0002);
    let plans: Vec<PrefillPlan> = (0..30).map(|_| random_flexible_plan(&mut rng)).collect();
    for plan in &plans {
        assert!(plan.is_flexible());
        // Fixing every stage at home can only lose: the optimum with choice is no worse.
        let fixed_optimum = optimal_makespan_ns(&homes_only(plan), 20).unwrap();
        assert!(optimal_makespan_ns(plan, 20).unwrap() <= fixed_optimum);
    }
    measure_gaps("flexible", plans.into_iter());
}

/// `plan` with every stage fixed at its home processor.
fn homes_only(plan: &PrefillPlan) -> PrefillPlan {
    PrefillPlan::placed(
        plan.model.clone(),
        plan.device.clone(),
        plan.workload.clone(),
        plan.placement.homes_only(&plan.device),
    )
    .unwrap()
}

#[test]
fn the_solver_finds_the_known_optimum_of_a_chain() {
    // A single chunk is a chain: the optimum is its critical path.
    let plan = hetsched::systems::testing::tiny_plan(1, 32, 32);
    assert_eq!(
        optimal_makespan_ns(&plan, 16),
        Some(plan.lower_bound().critical_path_ns)
    );
    assert_eq!(optimal_makespan_ns(&plan, 3), None);
}
