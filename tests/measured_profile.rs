//! Measured device profiles (`hetsched profile`): fitted stage costs written as TOML load
//! back through the scene loader unchanged, price the plan's stages, fall back to the
//! roofline (named) where a stage kind is missing, and are refused when out of range.

use std::sync::Arc;

use hetsched::engine;
use hetsched::prediction::{CostModelUse, Prediction};
use hetsched::scene::{Scene, toml_text};
use hetsched::systems::model::ChunkShape;
use hetsched::systems::{
    DeviceProfile, OneThreadCost, PolicyRegistry, ProfileOrigin, StageCost, StageSample,
    fit_stage_cost, has_attention, precision_label, stage_kind,
};

const SCENE: &str = "name = \"measured\"\ndevice = \"d.toml\"\nmodel = \"m.toml\"\n\
                     [workload]\nprompt_len = 512\nchunk_len = 128\npolicy = \"stall\"\n";

/// The desktop scene with every stage kind of its model priced by a fit to synthetic
/// samples of known coefficients (launch 20 us, 0.5 us per token, 0.001 us per pair).
fn measured_scene(skip: Option<usize>) -> (Scene, String) {
    let mut scene = Scene::load("smollm2-135m-desktop".as_ref()).unwrap();
    let plan = scene.plan().unwrap();
    let precision = precision_label(&scene.model);
    let mut kinds: Vec<(String, bool, usize)> = Vec::new();
    for (stage, &lane) in plan.stages.iter().zip(&plan.stage_processor) {
        let kind = stage_kind(&stage.ops);
        if !kinds.iter().any(|k| k.0 == kind) {
            kinds.push((kind, has_attention(&stage.ops), lane));
        }
    }
    for (i, (kind, attention, lane)) in kinds.iter().enumerate() {
        if Some(i) == skip {
            continue;
        }
        let samples: Vec<StageSample> = [(64u64, 0u64), (128, 128), (256, 512), (128, 1024)]
            .into_iter()
            .map(|(tokens, past)| {
                let pairs = tokens as f64 * past as f64 + (tokens * (tokens + 1) / 2) as f64;
                let us = 20.0 + 0.5 * tokens as f64 + if *attention { 0.001 * pairs } else { 0.0 };
                StageSample {
                    tokens,
                    past,
                    ns: us * 1e3,
                }
            })
            .collect();
        let cost = fit_stage_cost(kind, &precision, *attention, None, &samples).unwrap();
        scene.device.processors[*lane].cost.stages.push(cost);
    }
    // A one-thread pass: each stage 1.6x slower on one thread than on the profile's two.
    let one_thread = scene
        .device
        .processors
        .iter()
        .flat_map(|p| {
            p.cost.stages.iter().map(|c| OneThreadCost {
                processor: p.name.clone(),
                cost: StageCost {
                    launch_us: 1.6 * c.launch_us,
                    per_token_us: 1.6 * c.per_token_us,
                    per_pair_us: 1.6 * c.per_pair_us,
                    ..c.clone()
                },
            })
        })
        .collect();
    scene.device.measured = Some(ProfileOrigin {
        model: scene.model.name.clone(),
        model_shape: ProfileOrigin::shape_of(&scene.model),
        precisions: vec![precision],
        cpu: "test cpu".into(),
        cpu_features: vec!["avx2".into()],
        threads: 2,
        backends: "cpu,npu".into(),
        samples: "d.samples.csv".into(),
        job_gap_us: 30.0,
        job_gaps: Vec::new(),
        two_job_rate: 0.0,
        one_thread,
        adapted: Vec::new(),
        cache_bytes: 0,
        warm_weights: Vec::new(),
    });
    let device = toml_text(&scene.device).unwrap();
    (scene, device)
}

#[test]
fn a_written_profile_loads_in_simulate_and_round_trips() {
    let (scene, device_text) = measured_scene(None);
    let model_text = toml_text(&scene.model).unwrap();
    let loaded = Scene::from_texts(SCENE, &device_text, &model_text).unwrap();
    assert_eq!(loaded.device, scene.device);
    assert_eq!(loaded.model, scene.model);
    assert_eq!(toml_text(&loaded.device).unwrap(), device_text);
    let plan = Arc::new(loaded.plan().unwrap());
    assert_eq!(CostModelUse::of(&plan).model, "measured");
    // Every instance costs what its fitted formula says.
    for key in plan.instances() {
        let stage = &plan.stages[key.stage as usize];
        let shape = ChunkShape {
            tokens: 128,
            past: u64::from(key.chunk) * 128,
        };
        let cost: &StageCost = plan.device.processors[plan.processor(key)]
            .cost
            .stage_cost(&plan.model, &stage.ops)
            .unwrap();
        assert_eq!(plan.cost_ns(key), cost.ns(shape).round() as u64, "{key:?}");
    }
    let policy = PolicyRegistry::builtin().create("stall").unwrap();
    let run = engine::simulate(plan.clone(), policy).unwrap();
    let again = engine::simulate(plan, PolicyRegistry::builtin().create("stall").unwrap()).unwrap();
    assert_eq!(Prediction::compare(&run, &again).prediction_error, 0.0);
}

#[test]
fn a_missing_stage_kind_falls_back_to_the_roofline_by_name() {
    let (scene, _) = measured_scene(Some(2));
    let plan = scene.plan().unwrap();
    let used = CostModelUse::of(&plan);
    assert_eq!(used.model, "mixed");
    assert_eq!(used.roofline_stage_kinds.len(), 1, "{used:?}");
    // The shipped profile: roofline everywhere, and nothing new in its TOML.
    let shipped = Scene::load("smollm2-135m-desktop".as_ref()).unwrap();
    assert_eq!(CostModelUse::of(&shipped.plan().unwrap()).model, "roofline");
    let text = toml_text(&shipped.device).unwrap();
    assert!(
        !text.contains("stages") && !text.contains("model_shape"),
        "{text}"
    );
}

#[test]
fn negative_or_non_finite_stage_costs_are_refused() {
    let (mut scene, _) = measured_scene(None);
    scene.device.processors[0].cost.stages[0].per_token_us = -1.0;
    let err = scene.device.validate().unwrap_err().to_string();
    assert!(err.contains("stages"), "{err}");
    let (mut scene, _) = measured_scene(None);
    scene.device.processors[1].cost.stages[0].launch_us = f64::NAN;
    let text = toml_text(&scene.device).unwrap_or_default();
    let model = toml_text(&scene.model).unwrap();
    assert!(
        Scene::from_texts(SCENE, &text, &model)
            .and_then(|s| s.plan().map(|_| ()))
            .is_err()
    );
    let _: &DeviceProfile = &scene.device;
}

#[test]
fn a_negative_one_thread_cost_is_refused_by_name() {
    let (mut scene, _) = measured_scene(None);
    let measured = scene.device.measured.as_mut().unwrap();
    measured.one_thread[0].cost.per_token_us = -0.5;
    let err = scene.device.validate().unwrap_err().to_string();
    assert!(err.contains("measured.one_thread"), "{err}");
    // Every coefficient a stage cost has, the windowed one included.
    let (mut scene, _) = measured_scene(None);
    let measured = scene.device.measured.as_mut().unwrap();
    measured.one_thread[0].cost.per_window_pair_us = f64::NAN;
    let err = scene.device.validate().unwrap_err().to_string();
    assert!(err.contains("measured.one_thread"), "{err}");
}
