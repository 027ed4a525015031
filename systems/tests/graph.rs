//! Graph builder: stage cuts, sharing, dependencies and bad layer graphs.

use hetsched_systems::graph::{
    Sharing, StageDependency, build_stages, merge_for_one_chunk_one_processor,
    merge_for_one_processor,
};
use hetsched_systems::model::{ExecClass, OpDecl, OpKind};
use hetsched_systems::shadow::{KeptSite, ShadowConfig, ShadowSite};
use hetsched_systems::testing::tiny_model;
use hetsched_systems::{ModelConfig, PlanError, Precision};

fn qwen() -> ModelConfig {
    ModelConfig {
        name: "Qwen1.5-1.8B".into(),
        layers: 24,
        hidden: 2048,
        heads: 16,
        kv_heads: 16,
        head_dim: None,
        ffn: 5504,
        vocab: 151936,
        context: 32768,
        weight_precision: Precision::Int8,
        activation_precision: Precision::Int8,
        float_precision: Precision::Fp32,
        layer_ops: None,
        shadow: None,
        block: None,
    }
}

#[test]
fn qwen_has_144_subgraphs_per_chunk_of_which_120_shared() {
    let stages = build_stages(&qwen()).unwrap();
    let per_chunk: Vec<_> = stages.iter().filter(|s| !s.last_chunk_only).collect();
    assert_eq!(per_chunk.len(), 144);
    assert_eq!(
        per_chunk
            .iter()
            .filter(|s| s.sharing == Sharing::Static)
            .count(),
        120
    );
    // One more subgraph, the model head, runs for the last chunk only.
    assert_eq!(stages.len(), 145);
    assert!(stages[144].last_chunk_only);
    assert_eq!(
        stages[144].op_names(),
        ["ffn_dequant", "ffn_residual", "final_norm", "lm_head"]
    );
}

#[test]
fn a_layer_alternates_float_and_int8_and_attention_is_the_only_dynamic_cross_chunk_stage() {
    let stages = build_stages(&qwen()).unwrap();
    let layer1: Vec<_> = stages.iter().filter(|s| s.layer == Some(1)).collect();
    let names: Vec<Vec<&str>> = layer1.iter().map(|s| s.op_names()).collect();
    assert_eq!(
        names,
        vec![
            vec!["ffn_dequant", "ffn_residual", "attn_norm", "attn_quant"],
            vec!["q_proj", "k_proj", "v_proj"],
            vec!["qkv_dequant", "rope", "attention", "o_quant"],
            vec!["o_proj"],
            vec!["o_dequant", "attn_residual", "ffn_norm", "ffn_quant"],
            vec!["gate_proj", "up_proj", "silu_mul", "down_proj"],
        ]
    );
    let classes: Vec<ExecClass> = layer1.iter().map(|s| s.class).collect();
    use ExecClass::{Float, Int8};
    assert_eq!(classes, [Float, Int8, Float, Int8, Float, Int8]);
    for (i, s) in layer1.iter().enumerate() {
        let attention = i == 2;
        assert_eq!(s.sharing == Sharing::Dynamic, attention, "{}", s.name);
        assert_eq!(
            s.dependency == StageDependency::CrossChunk,
            attention,
            "{}",
            s.name
        );
    }
    assert_eq!(stages[0].op_names(), ["embed", "attn_norm", "attn_quant"]);
    assert_eq!(stages[0].dependency, StageDependency::None);
}

fn custom(ops: Vec<OpDecl>) -> ModelConfig {
    ModelConfig {
        layer_ops: Some(ops),
        ..tiny_model(2)
    }
}

fn op(name: &str, kind: OpKind, inputs: &[&str]) -> OpDecl {
    OpDecl {
        name: name.into(),
        kind,
        role: None,
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        in_features: None,
        out_features: Some(256),
        class: None,
        window: None,
        heads: None,
    }
}

#[test]
fn a_cyclic_layer_graph_is_rejected_naming_an_operator_in_the_cycle() {
    let model = custom(vec![
        op("norm", OpKind::RmsNorm, &["down"]),
        op("up", OpKind::Linear, &["norm"]),
        op("down", OpKind::Linear, &["up"]),
    ]);
    match build_stages(&model) {
        Err(PlanError::Cycle(name)) => assert!(["norm", "up", "down"].contains(&name.as_str())),
        other => panic!("expected a cycle error, got {other:?}"),
    }
}

#[test]
fn unknown_inputs_and_duplicate_names_are_rejected() {
    let unknown = custom(vec![op("norm", OpKind::RmsNorm, &["nowhere"])]);
    assert_eq!(
        build_stages(&unknown),
        Err(PlanError::UnknownInput {
            op: "norm".into(),
            input: "nowhere".into()
        })
    );
    let twice = custom(vec![
        op("a", OpKind::RmsNorm, &[]),
        op("a", OpKind::Quantize, &[]),
    ]);
    assert_eq!(
        build_stages(&twice),
        Err(PlanError::DuplicateOp("a".into()))
    );
}

#[test]
fn custom_layers_are_ordered_by_dependencies_not_declaration() {
    // Declared out of order: the quantize is listed before the norm it reads.
    let model = custom(vec![
        op("quant", OpKind::Quantize, &["norm"]),
        op("norm", OpKind::RmsNorm, &[]),
        op("proj", OpKind::Linear, &["quant"]),
        op("attn", OpKind::Attention, &["proj"]),
    ]);
    let stages = build_stages(&model).unwrap();
    assert_eq!(stages[0].op_names(), ["embed", "norm", "quant"]);
    assert_eq!(stages[1].op_names(), ["proj"]);
    assert_eq!(stages[2].op_names(), ["attn", "norm", "quant"]);
    assert_eq!(stages[2].sharing, Sharing::Dynamic);
}

#[test]
fn heads_must_divide_hidden() {
    let model = ModelConfig {
        heads: 7,
        kv_heads: 7,
        ..tiny_model(1)
    };
    let err = build_stages(&model).unwrap_err();
    assert!(
        err.to_string()
            .contains("heads (7) do not divide hidden (256)"),
        "{err}"
    );
}

#[test]
fn one_chunk_on_one_processor_makes_each_layer_one_stage() {
    let stages = build_stages(&qwen()).unwrap();
    let merged = merge_for_one_chunk_one_processor(stages.clone());
    assert_eq!(merged.iter().filter(|s| !s.last_chunk_only).count(), 24);
    assert!(merged.last().unwrap().last_chunk_only);
    assert!(
        merged
            .iter()
            .all(|s| s.dependency != StageDependency::CrossChunk)
    );
    for (j, stage) in merged.iter().enumerate() {
        let want: Vec<u32> = j.checked_sub(1).map(|p| p as u32).into_iter().collect();
        assert_eq!(stage.after, want, "stage {j} waits for the one before it");
    }
    let ops = |s: &[hetsched_systems::graph::StageTemplate]| -> Vec<String> {
        s.iter()
            .flat_map(|s| s.op_names().into_iter().map(String::from))
            .collect()
    };
    assert_eq!(ops(&merged), ops(&stages));
}

#[test]
fn one_processor_cuts_a_layer_only_at_its_cross_chunk_operator() {
    let stages = build_stages(&qwen()).unwrap();
    let merged = merge_for_one_processor(stages.clone());
    // Per layer: what leads up to attention, and attention with everything after it.
    assert_eq!(merged.iter().filter(|s| !s.last_chunk_only).count(), 2 * 24);
    // The head stays a stage of its own; the cross-chunk stages are all still there.
    assert!(merged.last().unwrap().last_chunk_only);
    let cross = |s: &[hetsched_systems::graph::StageTemplate]| {
        s.iter()
            .filter(|s| s.dependency == StageDependency::CrossChunk)
            .count()
    };
    assert_eq!(cross(&merged), cross(&stages));
    // Same operators in the same order, no stage spanning two layers.
    let ops = |s: &[hetsched_systems::graph::StageTemplate]| -> Vec<String> {
        s.iter()
            .flat_map(|s| s.op_names().into_iter().map(String::from))
            .collect()
    };
    assert_eq!(ops(&merged), ops(&stages));
    for stage in &merged {
        let dynamic = stage.ops.iter().any(|op| op.kind.is_dynamic());
        assert_eq!(stage.sharing == Sharing::Dynamic, dynamic, "{}", stage.name);
    }
}

#[test]
fn a_kept_site_adds_a_shadow_stage_beside_its_int8_stage_and_the_next_waits_for_both() {
    let kept = |site| KeptSite { layer: 1, site };
    let model = ModelConfig {
        shadow: Some(ShadowConfig::with_sites(vec![
            kept(ShadowSite::Qkv),
            kept(ShadowSite::Down),
        ])),
        ..tiny_model(2)
    };
    let stages = build_stages(&model).unwrap();
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap() as u32;

    // qkv: the shadow waits for what q/k/v wait for; attention waits for both, in every
    // earlier chunk too.
    let (qkv, shadow, attention) = (at("L1.q_proj"), at("L1.qkv_shadow"), at("L1.qkv_dequant"));
    assert_eq!(shadow, qkv + 1);
    assert!(stages[shadow as usize].is_shadow());
    assert_eq!(stages[shadow as usize].after, stages[qkv as usize].after);
    assert_eq!(stages[attention as usize].after, vec![qkv, shadow]);
    assert_eq!(
        stages[attention as usize].dependency,
        StageDependency::CrossChunk
    );
    assert!(
        stages[attention as usize].ops[0]
            .inputs
            .contains(&"qkv_shadow".to_string())
    );

    // down: SiLU-mul moves to float work (the shadow reads its float output), down is a
    // stage of its own, and the head's carry waits for down and its shadow.
    let silu = at("L1.silu_mul");
    assert_eq!(stages[silu as usize].class, ExecClass::Float);
    let (down, down_shadow) = (at("L1.down_proj"), at("L1.down_shadow"));
    assert_eq!(down, silu + 1);
    assert_eq!(stages[down_shadow as usize].after, vec![silu]);
    assert_eq!(
        stages[down_shadow as usize + 1].after,
        vec![down, down_shadow]
    );
    assert_eq!(stages[down_shadow as usize + 1].name, "head.ffn_dequant");

    // Layer 0 keeps the plain chain and its INT8 SiLU-mul.
    assert!(
        stages
            .iter()
            .filter(|s| s.layer == Some(0))
            .all(|s| !s.is_shadow())
    );
    assert!(
        stages
            .iter()
            .enumerate()
            .skip(1)
            .all(|(j, s)| { s.is_shadow() || s.after.contains(&(j as u32 - 1)) })
    );

    // On one processor the shadow folds into the stages around it.
    let merged = merge_for_one_processor(stages);
    assert!(
        merged
            .iter()
            .enumerate()
            .skip(1)
            .all(|(j, s)| s.after == vec![j as u32 - 1])
    );
    assert!(
        merged.iter().all(|s| !s.is_shadow()),
        "a merged stage runs in the chain"
    );
    assert!(merged.iter().any(|s| s.op_names().contains(&"qkv_shadow")));
}

#[test]
fn a_shadow_on_a_custom_layer_or_beyond_the_layers_is_refused() {
    let shadow = Some(ShadowConfig::default());
    let custom_layer = ModelConfig {
        shadow: shadow.clone(),
        ..custom(vec![op("a", OpKind::RmsNorm, &[])])
    };
    let err = build_stages(&custom_layer).unwrap_err().to_string();
    assert!(err.contains("llama layer"), "{err}");
    let beyond = ModelConfig {
        shadow: Some(ShadowConfig::with_sites(vec![KeptSite {
            layer: 5,
            site: ShadowSite::O,
        }])),
        ..tiny_model(2)
    };
    let err = build_stages(&beyond).unwrap_err().to_string();
    assert!(err.contains("layer 5"), "{err}");
}
