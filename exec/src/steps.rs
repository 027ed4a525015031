//! The executor's view of a stage: each operator of a [`StageTemplate`] compiled once,
//! before the run, into a [`Step`] bound to its kernel. An operator without a kernel is
//! refused here rather than midway through a prefill.

use hetsched_systems::graph::StageTemplate;
use hetsched_systems::model::OpDecl;
use hetsched_systems::op::{Block, NormSite, OpRole, Projection};
use hetsched_systems::shadow::ShadowSite;

use super::error::ExecError;
use hetsched_import::LayerTensor;

/// The weight tensor of projection `p` in the model file.
pub fn projection_tensor(p: Projection) -> LayerTensor {
    match p {
        Projection::Q => LayerTensor::Q,
        Projection::K => LayerTensor::K,
        Projection::V => LayerTensor::V,
        Projection::O => LayerTensor::O,
        Projection::Gate => LayerTensor::Gate,
        Projection::Up => LayerTensor::Up,
        Projection::Down => LayerTensor::Down,
    }
}

/// One operator bound to its kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Token embedding rows into the residual stream.
    Embed,
    /// RMSNorm of the residual stream.
    Norm(NormSite),
    /// Quantize the normalised residual for the projections that read `site` (q/k/v
    /// after the attention norm, gate/up after the FFN norm).
    QuantizeNormed(ShadowSite),
    /// Quantize the attention output for the output projection.
    QuantizeAttention,
    /// A linear layer.
    Linear(Projection),
    /// Dequantize the queries (keys and values are dequantized where the KV cache is
    /// written).
    DequantizeQkv,
    /// RoPE on the queries; the chunk's keys go into the KV cache.
    Rope,
    /// Causal attention over the KV cache.
    Attention,
    /// Dequantize the attention output projection into the residual delta.
    DequantizeO,
    /// Dequantize the previous layer's FFN output into the residual delta.
    DequantizeDown,
    /// Add the residual delta.
    Residual,
    /// SiLU(gate) · up, quantized for the down projection (on the NPU side, or on the
    /// float side when the FFN has an outlier shadow).
    SiluMul,
    /// The float shadow of a site's outliers (seed 000, Eq. 1), beside its INT8 linears.
    Shadow(ShadowSite),
    /// Final projection of the last token.
    LmHead,
    /// One of a model family's optional steps (Gemma, Qwen2); the llama graph has none.
    Family(FamilyStep),
}

/// A model family's optional step (`import/src/family.rs`), bound from its role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FamilyStep {
    /// The embedded rows times √hidden.
    EmbedScale,
    /// The query bias (the key and value biases are added where the cache is written).
    QkvBias,
    /// The queries' per-head RMSNorm (the keys' where the cache is written).
    QkNorm,
    /// RMSNorm of a block's output (the residual delta) with its post-norm weight.
    PostNorm(Block),
    /// GELU(tanh)(gate) · up, quantized for the down projection: [`Step::SiluMul`] with
    /// Gemma's activation.
    GeluMul,
}

impl Step {
    /// Binds an operator of `stage` by its role; one without a role (a scene's own
    /// `layer_ops`), or a role this executor has no kernel for, is refused.
    pub fn compile(stage: &StageTemplate, op: &OpDecl) -> Result<Step, ExecError> {
        let unsupported = || ExecError::UnsupportedOp {
            op: op.name.clone(),
            stage: stage.name.clone(),
        };
        Ok(match op.role.ok_or_else(unsupported)? {
            OpRole::Embed => Step::Embed,
            OpRole::Norm(site) => Step::Norm(site),
            OpRole::Quantize(site @ (ShadowSite::Qkv | ShadowSite::GateUp)) => {
                Step::QuantizeNormed(site)
            }
            OpRole::Quantize(ShadowSite::O) => Step::QuantizeAttention,
            OpRole::Linear(p) => Step::Linear(p),
            OpRole::Dequantize(ShadowSite::Qkv) => Step::DequantizeQkv,
            OpRole::Dequantize(ShadowSite::O) => Step::DequantizeO,
            OpRole::Dequantize(ShadowSite::Down) => Step::DequantizeDown,
            OpRole::Rope => Step::Rope,
            // A part of attention cut by query heads (a simulated plan option) would run
            // every head here: refused rather than computed twice over.
            OpRole::Attention if op.heads.is_some() => return Err(unsupported()),
            OpRole::Attention => Step::Attention,
            OpRole::Residual => Step::Residual,
            OpRole::SiluMul => Step::SiluMul,
            OpRole::Shadow(site) => Step::Shadow(site),
            OpRole::LmHead => Step::LmHead,
            OpRole::EmbedScale => Step::Family(FamilyStep::EmbedScale),
            OpRole::QkvBias => Step::Family(FamilyStep::QkvBias),
            OpRole::QkNorm => Step::Family(FamilyStep::QkNorm),
            OpRole::PostNorm(block) => Step::Family(FamilyStep::PostNorm(block)),
            OpRole::GeluMul => Step::Family(FamilyStep::GeluMul),
            // SiLU-mul quantizes the down site and dequantizes gate/up.
            OpRole::Quantize(ShadowSite::Down) | OpRole::Dequantize(ShadowSite::GateUp) => {
                return Err(unsupported());
            }
        })
    }

    /// Compiles every stage of a plan.
    pub fn compile_stages(stages: &[StageTemplate]) -> Result<Vec<Vec<Step>>, ExecError> {
        stages
            .iter()
            .map(|stage| {
                stage
                    .ops
                    .iter()
                    .map(|op| Step::compile(stage, op))
                    .collect()
            })
            .collect()
    }
}

impl ExecError {
    /// `step` of chunk `chunk` found no `value` to read.
    pub fn missing(step: Step, chunk: usize, value: &'static str) -> Self {
        ExecError::MissingValue {
            op: format!("{step:?}"),
            chunk: chunk as u32,
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use hetsched_systems::graph::build_stages;
    use hetsched_systems::model::ModelConfig;
    use hetsched_systems::testing::tiny_model;

    use super::*;

    fn compile(model: &ModelConfig) -> Result<Vec<Vec<Step>>, ExecError> {
        Step::compile_stages(&build_stages(model).expect("a valid model"))
    }

    #[test]
    fn the_llama_layer_binds_every_projection() {
        let steps = compile(&tiny_model(2)).unwrap();
        for p in Projection::ALL {
            let count = steps
                .iter()
                .flatten()
                .filter(|&&s| s == Step::Linear(p))
                .count();
            assert_eq!(count, 2, "{p:?}");
        }
    }

    #[test]
    fn attention_cut_by_heads_is_refused() {
        let model = tiny_model(1);
        let stages = build_stages(&model).expect("a valid model");
        let groups = hetsched_systems::attention_split::head_groups(&model, 2);
        let cut = hetsched_systems::attention_split::split_attention_stages(stages, &groups);
        let err = Step::compile_stages(&cut).unwrap_err();
        assert!(
            matches!(&err, ExecError::UnsupportedOp { op, .. } if op.starts_with("attention[")),
            "{err}"
        );
    }

    #[test]
    fn layer_ops_bind_by_role_never_by_name() {
        let layer_ops = |toml: &str| ModelConfig {
            layer_ops: Some(
                toml::from_str::<std::collections::BTreeMap<String, Vec<OpDecl>>>(toml)
                    .expect("valid layer_ops")
                    .remove("layer_ops")
                    .expect("a layer_ops key"),
            ),
            ..tiny_model(1)
        };
        // A scene's own operator without a role simulates but has no kernel, whatever
        // its name.
        let unnamed = layer_ops(r#"layer_ops = [{ name = "q_proj", kind = "linear" }]"#);
        let err = compile(&unnamed).unwrap_err();
        assert!(
            matches!(&err, ExecError::UnsupportedOp { op, .. } if op == "q_proj"),
            "{err}"
        );
        let typed = layer_ops(
            r#"layer_ops = [{ name = "w", kind = "linear", role = { linear = "gate" } }]"#,
        );
        let steps = compile(&typed).unwrap();
        assert!(
            steps
                .iter()
                .flatten()
                .any(|&s| s == Step::Linear(Projection::Gate))
        );
    }
}
