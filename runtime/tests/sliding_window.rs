//! The cost model honours Gemma 3's sliding window: a local layer's attention is its own
//! stage kind, and its predicted cost (roofline or fitted) stops growing once the context
//! passes the window; a model without a window (SmolLM2) is priced as before.

use hetsched_runtime::scene::Scene;
use hetsched_systems::attention_span::{window_cuts, windowed_pairs};
use hetsched_systems::block::SlidingWindow;
use hetsched_systems::graph::{StageTemplate, build_stages};
use hetsched_systems::model::{ChunkShape, ModelConfig, OpKind};
use hetsched_systems::{
    InstanceKey, PrefillPlan, StageSample, attended_pairs, fit_stage_cost, has_attention,
    stage_kind,
};
use proptest::prelude::*;

/// A scene by name: shipped, or a file of scenes/ (the Gemma 3 one is not embedded).
fn scene(name: &str) -> Scene {
    let file = format!("{}/../scenes/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    Scene::load(file.as_ref()).unwrap()
}

/// The attention stage of layer `layer`.
fn attention_stage(stages: &[StageTemplate], layer: u32) -> &StageTemplate {
    stages
        .iter()
        .find(|s| s.layer == Some(layer) && has_attention(&s.ops))
        .unwrap()
}

/// Roofline time of `stage` on the scene's float (first CPU) processor.
fn roofline_ns(scene: &Scene, stage: &StageTemplate, shape: ChunkShape) -> u64 {
    scene.device.processors[0]
        .cost
        .subgraph_ns(&scene.model, &stage.ops, shape)
        .unwrap()
}

#[test]
fn local_layers_attention_is_a_windowed_stage_kind_and_global_ones_are_not() {
    let gemma = scene("gemma3-270m-desktop");
    let stages = build_stages(&gemma.model).unwrap();
    for layer in 0..gemma.model.layers {
        let kind = stage_kind(&attention_stage(&stages, layer).ops);
        let global = (layer + 1) % 6 == 0;
        assert_eq!(
            kind.contains("attention[window=512]"),
            !global,
            "L{layer}: {kind}"
        );
    }
    // Nothing but attention carries a window.
    assert!(
        stages
            .iter()
            .flat_map(|s| &s.ops)
            .all(|op| op.window.is_none() || op.kind == OpKind::Attention)
    );
}

proptest! {
    /// Past the window (every query of the chunk sees 512 keys), a local layer's roofline
    /// attention costs the same however long the context; a global layer's keeps
    /// growing. Before it, the local layer costs what the global one does.
    #[test]
    fn a_local_layers_attention_stops_growing_past_the_window(
        tokens in 1u64..=256,
        past in 511u64..8192,
        more in 512u64..8192,
        early in 0u64..=256,
    ) {
        let gemma = scene("gemma3-270m-desktop");
        let stages = build_stages(&gemma.model).unwrap();
        let (local, global) = (attention_stage(&stages, 0), attention_stage(&stages, 5));
        let at = |past| ChunkShape { tokens, past };
        prop_assert_eq!(roofline_ns(&gemma, local, at(past)), roofline_ns(&gemma, local, at(past + more)));
        prop_assert!(roofline_ns(&gemma, global, at(past + more)) > roofline_ns(&gemma, global, at(past)));
        prop_assert!(roofline_ns(&gemma, local, at(past)) < roofline_ns(&gemma, global, at(past)));
        // Inside the window (the last query at most at position 511): no difference.
        let inside = ChunkShape { tokens: tokens.min(256), past: early };
        prop_assert_eq!(roofline_ns(&gemma, local, inside), roofline_ns(&gemma, global, inside));
    }
}

#[test]
fn a_fitted_local_attention_cost_stops_growing_past_the_window() {
    // Synthetic samples of the local kind: 30 us + 0.4 us per token + 0.002 us per pair
    // scored through the window, 0.02 us per pair where the window cuts keys (the
    // executors' windowed kernel).
    let window = Some(512);
    let samples: Vec<StageSample> = [64u64, 128, 256]
        .into_iter()
        .flat_map(|tokens| (0..16u64).map(move |c| (tokens, c * tokens)))
        .map(|(tokens, past)| {
            let shape = ChunkShape { tokens, past };
            let pairs = windowed_pairs(shape, window);
            let per_pair = if window_cuts(shape, window) {
                0.02
            } else {
                0.002
            };
            StageSample {
                tokens,
                past,
                ns: 1e3 * (30.0 + 0.4 * tokens as f64 + per_pair * pairs),
            }
        })
        .collect();
    let fit = fit_stage_cost("attention[window=512]", "f32", true, window, &samples).unwrap();
    assert!((fit.per_pair_us - 0.002).abs() < 1e-9, "{fit:?}");
    assert!((fit.per_window_pair_us - 0.02).abs() < 1e-9, "{fit:?}");
    assert!(fit.fit_error < 1e-9, "{fit:?}");
    assert_eq!(fit.window, Some(512));
    let at = |past| ChunkShape { tokens: 128, past };
    assert_eq!(fit.ns(at(1024)), fit.ns(at(30_000)));
    assert!(fit.ns(at(384)) > fit.ns(at(0)));
    // The same samples fitted as causal attention (the model before windows) fit badly
    // and price a chunk at 30 000 past far above what it costs.
    let causal = fit_stage_cost("attention", "f32", true, None, &samples).unwrap();
    assert!(causal.fit_error > 0.1, "{causal:?}");
    assert!(
        causal.ns(at(30_000)) > 2.0 * fit.ns(at(30_000)),
        "{causal:?}"
    );
}

/// Every instance's cost on every lane of `plan`.
fn costs(plan: &PrefillPlan) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for chunk in 0..plan.chunks {
        for stage in 0..plan.stage_count() {
            for lane in 0..plan.lanes() {
                out.push(plan.cost_on(InstanceKey { chunk, stage }, lane));
            }
        }
    }
    out
}

#[test]
fn a_model_without_a_window_is_priced_as_before() {
    let smol = scene("smollm2-135m-desktop");
    let model = &smol.model;
    assert!(model.block.is_none());
    let stages = build_stages(model).unwrap();
    assert!(
        stages
            .iter()
            .all(|s| !stage_kind(&s.ops).contains("window"))
    );
    // Attention's work is the causal formula, written out independently.
    let attention = stages
        .iter()
        .flat_map(|s| &s.ops)
        .find(|op| op.kind == OpKind::Attention)
        .unwrap();
    let (hd, heads) = (f64::from(model.head_dim()), f64::from(model.heads));
    let kv_width = f64::from(model.kv_heads) * hd;
    for (tokens, past) in [(1u64, 0u64), (128, 0), (128, 384), (256, 4096)] {
        let shape = ChunkShape { tokens, past };
        let work = attention.work(model, shape);
        let (t, p) = (tokens as f64, past as f64);
        assert_eq!(
            work.ops,
            heads * (t * p + t * (t + 1.0) / 2.0) * (4.0 * hd + 5.0)
        );
        assert_eq!(attended_pairs(shape), t * p + t * (t + 1.0) / 2.0);
        let bytes = 4.0 * (2.0 * (p + t) * kv_width + 2.0 * t * heads * hd + 2.0 * t * kv_width);
        assert_eq!(work.bytes, bytes);
    }
    // A window no query reaches past prices every instance exactly as no window does.
    let mut wide = smol.clone();
    let block = wide.model.block.get_or_insert_with(Default::default);
    block.sliding_window = Some(SlidingWindow {
        keys: model.context,
        period: 2,
    });
    let (plain, windowed) = (smol.plan().unwrap(), wide.plan().unwrap());
    assert_eq!(costs(&plain), costs(&windowed));
}

#[test]
fn a_sliding_window_table_that_cannot_be_is_refused() {
    let mut gemma = scene("gemma3-270m-desktop").model;
    for (keys, period) in [(0, 6), (512, 1), (512, 0)] {
        let block = gemma.block.as_mut().unwrap();
        block.sliding_window = Some(SlidingWindow { keys, period });
        let err = ModelConfig::validate(&gemma).unwrap_err().to_string();
        assert!(err.contains("sliding_window"), "{err}");
    }
}
