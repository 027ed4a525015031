//! Shipped scenes: they load, the graph counts match the paper, and the phone profiles
//! reproduce the facts of seed 000 they were calibrated to.

use std::path::Path;
use std::sync::Arc;

use hetsched::engine::simulate;
use hetsched::report::RunReport;
use hetsched::scene::{Scene, shipped_scenes};
use hetsched::systems::{DEFAULT_POLICY, Policy, PolicyRegistry};

#[test]
fn every_shipped_scene_loads_from_disk_and_from_the_binary_alike() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenes");
    assert!(shipped_scenes().len() >= 7);
    for name in shipped_scenes() {
        let from_disk = Scene::load(&dir.join(format!("{name}.toml"))).unwrap();
        let embedded = Scene::load(Path::new(name)).unwrap();
        assert_eq!(from_disk, embedded, "{name}");
        from_disk.plan().unwrap();
    }
}

#[test]
fn qwen_graph_counts_match_the_paper() {
    let scene = Scene::default_scene();
    let plan = scene.plan().unwrap();
    assert_eq!(plan.model.name, "Qwen1.5-1.8B");
    assert_eq!(
        (plan.workload.prompt_len, plan.workload.chunk_len),
        (1024, 256)
    );
    // The paper's counts are those of the graph without the outlier shadow.
    let mut bare = scene.clone();
    bare.model.shadow = None;
    let bare = bare.plan().unwrap();
    assert_eq!(bare.stages_per_chunk(), 144);
    assert_eq!(bare.shared_stages_per_chunk(), 120);
    assert_eq!(bare.instance_count(), 4 * 144 + 1);
    // The shipped scene keeps 15% of the 96 sites (14 down projections): each adds a
    // shadow stage and cuts its FFN stage at SiLU-mul and down (3 static subgraphs).
    assert_eq!(plan.stages_per_chunk(), 144 + 14 * 3);
    assert_eq!(plan.shared_stages_per_chunk(), 120 + 14 * 3);
    assert_eq!(plan.instance_count(), 4 * (144 + 14 * 3) + 1);
}

#[test]
fn xiaomi14_profile_reproduces_the_qwen_figures_of_seed_000() {
    let mut scene = Scene::load(Path::new("qwen1.5-1.8b-xiaomi14")).unwrap();
    scene.workload.prompt_len = 256;
    let plan = scene.plan().unwrap();
    let work = plan.work_per_processor();
    let (cpu, npu) = (work[0] as f64 / 1e6, work[1] as f64 / 1e6);
    // "with a prompt length of 256 ... NPU execution takes 315ms, about twice that of the CPU"
    assert!((npu - 315.0).abs() < 315.0 * 0.03, "NPU time {npu:.1} ms");
    assert!(
        (1.7..=2.3).contains(&(npu / cpu)),
        "NPU/CPU {:.2}",
        npu / cpu
    );
    // "NPU INT8 matmul 4.5-5.8x CPU INT8"; "FP16 on the NPU up to 159x slower than CPU INT8"
    let (cpu_rates, npu_rates) = (
        &plan.device.processors[0].cost.peak_gops,
        &plan.device.processors[1].cost.peak_gops,
    );
    assert!((4.5..=5.8).contains(&(npu_rates.int8 / cpu_rates.int8)));
    assert!(((cpu_rates.int8 / npu_rates.fp16) - 159.0).abs() < 2.0);
    assert_eq!(plan.device.processors[1].memory_gib, 4.0);
}

#[test]
fn out_of_order_cuts_prefill_latency_on_every_phone_scene() {
    for name in shipped_scenes()
        .into_iter()
        .filter(|n| !n.contains("desktop"))
    {
        // The scene's own policy (out of order) against in-order.
        let scene = Scene::load(Path::new(name)).unwrap();
        let run = |policy: &str| {
            let plan = scene.plan().unwrap();
            RunReport::new(name, &simulate(Arc::new(plan), builtin(policy)).unwrap())
        };
        let (ours, in_order) = (&run(&scene.policy), &run("inorder"));
        let gain = 1.0 - ours.makespan_ms / in_order.makespan_ms;
        assert!(
            gain > 0.1,
            "{name}: {} gains only {:.1}% over in-order",
            scene.policy,
            100.0 * gain
        );
        assert!(
            ours.ratio_to_lower_bound >= 1.0 && ours.ratio_to_lower_bound < 1.1,
            "{name}: {}",
            ours.ratio_to_lower_bound
        );
        assert!(
            in_order.npu_bubble_rate.unwrap() > ours.npu_bubble_rate.unwrap(),
            "{name}"
        );
    }
}

/// The schedule-quality goal: the default policy within 1.05x of the lower bound and an
/// NPU bubble rate of at most 5% on every shipped phone scene, at prompt 1024, chunk 256,
/// as the goal was set: without the outlier shadow. With the shadow (the scenes as
/// shipped: 15% of the sites keep a shadow stage beside their INT8 stage) the worst
/// measured is 1.053x (Qwen on the CPU + GPU + NPU Xiaomi 14; docs/outliers.md), held to
/// 1.06x here.
#[test]
fn the_default_policy_meets_the_goal_on_every_phone_scene() {
    for name in shipped_scenes()
        .into_iter()
        .filter(|n| !n.contains("desktop"))
    {
        let mut scene = Scene::load(Path::new(name)).unwrap();
        scene.workload.prompt_len = 1024;
        scene.workload.chunk_len = 256;
        scene.policy = DEFAULT_POLICY.to_string();
        assert!(scene.model.shadow.is_some(), "{name} ships a shadow");
        for (shadow, limit) in [(false, 1.05), (true, 1.06)] {
            let mut scene = scene.clone();
            if !shadow {
                scene.model.shadow = None;
            }
            let report = RunReport::new(
                name,
                &simulate(Arc::new(scene.plan().unwrap()), scene.new_policy().unwrap()).unwrap(),
            );
            assert!(
                report.ratio_to_lower_bound <= limit,
                "{name} (shadow: {shadow}): {} is {:.3}x the lower bound",
                report.policy,
                report.ratio_to_lower_bound
            );
            let bubble = report.npu_bubble_rate.unwrap();
            assert!(
                bubble <= 0.05,
                "{name} (shadow: {shadow}): NPU bubble rate {bubble:.3}"
            );
        }
    }
}

/// On the CPU + GPU + NPU scenes, letting the default policy choose where each stage runs
/// beats the same policy with every stage at its home processor.
#[test]
fn placement_choice_beats_fixed_placement_on_the_three_processor_scenes() {
    let flexible: Vec<&str> = shipped_scenes()
        .into_iter()
        .filter(|n| Scene::load(Path::new(n)).unwrap().has_flexible_placement())
        .collect();
    assert!(flexible.len() >= 2, "{flexible:?}");
    for name in flexible {
        let scene = Scene::load(Path::new(name)).unwrap();
        let makespan = |scene: &Scene| {
            simulate(Arc::new(scene.plan().unwrap()), scene.new_policy().unwrap())
                .unwrap()
                .makespan_ns
        };
        let (chosen, fixed) = (makespan(&scene), makespan(&scene.with_fixed_placement()));
        assert!(
            (chosen as f64) < 0.95 * fixed as f64,
            "{name}: {chosen} ns with placement choice, {fixed} ns fixed"
        );
    }
}

/// A fresh built-in policy.
fn builtin(name: &str) -> Box<dyn Policy> {
    PolicyRegistry::builtin().create(name).unwrap()
}
