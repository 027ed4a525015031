//! The loaded model as the planner sees it: shapes for the cost model and the graph
//! builder's view of the family.

use hetsched_import::{Activation, EmbeddingScale, LlamaConfig};
use hetsched_systems::block::{BlockVariant, GluActivation, SlidingWindow};
use hetsched_systems::model::{ModelConfig, Precision};

use super::{ExecModel, LinearPrecision};

/// The graph builder's view of `config`'s family: the optional operators its layer has
/// and its sliding window (`None` for llama, whose graph stays the built-in one).
fn block_variant(config: &LlamaConfig) -> Option<BlockVariant> {
    let family = &config.family;
    if family.is_llama_like() {
        return None;
    }
    let count = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    Some(BlockVariant {
        family: family.arch.to_owned(),
        activation: match family.activation {
            Activation::SiluGlu => GluActivation::Silu,
            Activation::GeluTanhGlu => GluActivation::GeluTanh,
        },
        qkv_bias: family.qkv_bias,
        qk_norm: family.qk_norm,
        post_norms: family.post_norms,
        embedding_scale: family.embedding_scale == EmbeddingScale::SqrtHidden,
        sliding_window: (family.sliding_window_period > 0).then(|| SlidingWindow {
            keys: count(config.sliding_window),
            period: count(family.sliding_window_period),
        }),
    })
}

impl ExecModel {
    /// The model as the planner sees it: shapes for the cost model and the graph builder.
    pub fn model_config(&self) -> ModelConfig {
        let c = &self.config;
        let (weights, activations) = match self.precision {
            LinearPrecision::F32 => (Precision::Fp32, Precision::Fp32),
            // The planner has no 4-bit precision: W4A8 is planned as INT8 (its roofline
            // over-counts the weight bytes; real runs use measured stage costs).
            LinearPrecision::W8a8
            | LinearPrecision::W8a8Shadow
            | LinearPrecision::W4a8
            | LinearPrecision::W4a8Shadow
            | LinearPrecision::W4a8G32
            | LinearPrecision::W4a8G128 => (Precision::Int8, Precision::Int8),
        };
        let count = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        ModelConfig {
            name: self.name.clone(),
            layers: count(c.n_layers),
            hidden: count(c.hidden),
            heads: count(c.n_heads),
            kv_heads: count(c.n_kv_heads),
            head_dim: Some(count(c.head_dim)),
            ffn: count(c.ffn),
            vocab: count(c.vocab_size),
            context: count(c.context_length),
            weight_precision: weights,
            activation_precision: activations,
            float_precision: Precision::Fp32,
            layer_ops: None,
            shadow: self.shadow_config(),
            block: block_variant(c),
        }
    }
}
