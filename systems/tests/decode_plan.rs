//! A decode step's plan with its layers grouped several to a stage: instance counts, the
//! operators each grouped stage holds, its dependencies, its price, and bad groupings.

use hetsched_systems::decode_plan::group_layers;
use hetsched_systems::graph::{StageDependency, build_stages, merge_for_one_chunk_one_processor};
use hetsched_systems::shadow::{KeptSite, ShadowConfig, ShadowSite};
use hetsched_systems::testing::{tiny_device, tiny_model};
use hetsched_systems::{
    DeviceProfile, ModelConfig, PlacementConfig, PlanError, PrefillPlan, ProcessorKind,
};
use proptest::prelude::*;

/// The tiny device's CPU alone: the decode device of a session.
fn cpu_only() -> DeviceProfile {
    let mut device = tiny_device();
    device.processors.retain(|p| p.kind == ProcessorKind::Cpu);
    device
}

fn decode_plan(model: ModelConfig, layers_per_stage: u32) -> PrefillPlan {
    PrefillPlan::decode_step(
        model,
        cpu_only(),
        PlacementConfig::default(),
        layers_per_stage,
    )
    .expect("a decode plan")
}

fn op_names(plan: &PrefillPlan) -> Vec<String> {
    plan.stages
        .iter()
        .flat_map(|s| s.op_names().into_iter().map(String::from))
        .collect()
}

/// Every instance's modeled cost on its home processor, summed.
fn total_cost_ns(plan: &PrefillPlan) -> u64 {
    plan.instances().map(|k| plan.cost_ns(k)).sum()
}

#[test]
fn smollm2s_30_layers_in_groups_of_5_are_7_instances_a_step() {
    let model = ModelConfig {
        layers: 30,
        ..tiny_model(30)
    };
    assert_eq!(decode_plan(model.clone(), 1).instance_count(), 31);
    let plan = decode_plan(model, 5);
    assert_eq!(plan.instance_count(), 7);
    let spans: Vec<u32> = plan.stages.iter().map(|s| s.layer_span).collect();
    assert_eq!(spans, [5, 5, 5, 5, 5, 5, 1]);
    let names: Vec<&str> = plan.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names[0], "L0-4.embed");
    assert_eq!(names[1], "L5-9.ffn_dequant");
    assert_eq!(names[6], "head.ffn_dequant");
}

#[test]
fn one_layer_a_stage_is_the_plan_of_one_chunk_on_one_processor() {
    let model = tiny_model(6);
    let merged = merge_for_one_chunk_one_processor(build_stages(&model).unwrap());
    assert_eq!(decode_plan(model.clone(), 1).stages, merged);
    let prefill = PrefillPlan::new(
        model,
        cpu_only(),
        hetsched_systems::Workload {
            prompt_len: 1,
            chunk_len: 1,
            float_processor: None,
        },
    )
    .unwrap();
    assert_eq!(prefill.stages, merged);
}

#[test]
fn an_outlier_shadow_stays_inside_its_layers_group() {
    let mut model = tiny_model(4);
    model.shadow = Some(ShadowConfig {
        sites: Some(vec![
            KeptSite {
                layer: 2,
                site: ShadowSite::Down,
            },
            KeptSite {
                layer: 3,
                site: ShadowSite::Qkv,
            },
        ]),
        ..ShadowConfig::default()
    });
    let per_layer = decode_plan(model.clone(), 1);
    assert!(op_names(&per_layer).iter().any(|n| n.contains("shadow")));
    let grouped = decode_plan(model, 3);
    assert_eq!(grouped.instance_count(), 3);
    assert_eq!(op_names(&grouped), op_names(&per_layer));
    assert!(grouped.stages.iter().all(|s| !s.is_shadow()));
}

#[test]
fn a_device_of_two_processors_or_zero_layers_a_stage_is_refused() {
    let err = PrefillPlan::decode_step(tiny_model(2), tiny_device(), PlacementConfig::default(), 2)
        .unwrap_err();
    assert!(matches!(err, PlanError::InvalidDevice(_)), "{err}");
    assert!(err.to_string().contains("has 2"), "{err}");
    let err = PrefillPlan::decode_step(tiny_model(2), cpu_only(), PlacementConfig::default(), 0)
        .unwrap_err();
    assert!(matches!(err, PlanError::InvalidWorkload(_)), "{err}");
}

#[test]
fn stages_cut_inside_a_layer_are_not_grouped() {
    // A prefill chain cuts each layer at class changes: several stages a layer.
    let err = group_layers(build_stages(&tiny_model(2)).unwrap(), 2).unwrap_err();
    assert!(err.to_string().contains("layer 0 is cut"), "{err}");
}

proptest! {
    /// Any grouping: one instance per group of layers and the head, every operator once
    /// in the per-layer order, a chain (each stage waits for the one before), and the
    /// same price as the per-layer plan less the launches it no longer pays.
    #[test]
    fn grouping_keeps_the_operators_the_chain_and_the_work(
        layers in 1u32..40,
        per_stage in 1u32..45,
    ) {
        let per_layer = decode_plan(tiny_model(layers), 1);
        let grouped = decode_plan(tiny_model(layers), per_stage);
        let groups = layers.div_ceil(per_stage) as usize;
        prop_assert_eq!(grouped.instance_count(), groups + 1);
        prop_assert_eq!(op_names(&grouped), op_names(&per_layer));
        let span: u32 = grouped.stages.iter().map(|s| s.layer_span).sum();
        prop_assert_eq!(span, layers + 1);
        for (j, stage) in grouped.stages.iter().enumerate() {
            let want: Vec<u32> = j.checked_sub(1).map(|p| p as u32).into_iter().collect();
            prop_assert_eq!(&stage.after, &want);
            let dependency = match j {
                0 => StageDependency::None,
                _ => StageDependency::IntraChunk,
            };
            prop_assert_eq!(stage.dependency, dependency);
            prop_assert!(stage.layer_span <= per_stage.max(1));
        }
        prop_assert!(grouped.stages.last().unwrap().last_chunk_only);
        let launch_ns = (cpu_only().processors[0].cost.launch_us * 1e3) as u64;
        let saved = (per_layer.instance_count() - grouped.instance_count()) as u64 * launch_ns;
        let (fine, coarse) = (total_cost_ns(&per_layer), total_cost_ns(&grouped));
        // Each stage's price is rounded to whole ns: one ns a stage either way.
        let slack = per_layer.instance_count() as u64;
        prop_assert!(
            (fine - saved).abs_diff(coarse) <= slack,
            "per-layer {} ns less {} ns of launches against grouped {} ns", fine, saved, coarse
        );
    }
}
