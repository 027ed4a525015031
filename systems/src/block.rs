//! A model family's variant of the built-in decoder layer, as data: which optional
//! operators the graph builder adds (see [`crate::model::llama_layer`]). The importer's
//! family rows (`import/src/family.rs`) fill it for a real model; a scene's model file
//! writes it as a `[block]` table:
//!
//! ```toml
//! [block]
//! family = "gemma3"
//! activation = "gelu_tanh"
//! qk_norm = true
//! post_norms = true
//! embedding_scale = true
//!
//! [block.sliding_window]
//! keys = 512
//! period = 6
//! ```

use serde::{Deserialize, Serialize};

/// The gated feed-forward's activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GluActivation {
    /// SiLU (llama, Qwen2).
    #[default]
    Silu,
    /// GELU with the tanh approximation (Gemma).
    GeluTanh,
}

/// Which optional operators a family's decoder layer has. The default is the llama layer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockVariant {
    /// The family (GGUF `general.architecture`, e.g. `gemma3`): what a measured profile
    /// of the model is checked against.
    pub family: String,
    /// The feed-forward's activation.
    #[serde(default)]
    pub activation: GluActivation,
    /// Q, K and V biases (Qwen2).
    #[serde(default)]
    pub qkv_bias: bool,
    /// Per-head RMSNorm of queries and keys before RoPE (Gemma 3).
    #[serde(default)]
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before their residual adds
    /// (Gemma).
    #[serde(default)]
    pub post_norms: bool,
    /// Embeddings multiplied by √hidden (Gemma).
    #[serde(default)]
    pub embedding_scale: bool,
    /// Sliding-window (local) attention layers (Gemma 3); absent: every layer attends to
    /// every earlier key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<SlidingWindow>,
}

/// Which layers attend through a sliding window, and how wide it is: the importer's
/// `sliding_window_period` (the family row) and `attention.sliding_window` (the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlidingWindow {
    /// Keys a query of a local layer attends to at most, itself included: the query at
    /// position `x` sees keys `x + 1 - keys ..= x`.
    pub keys: u32,
    /// Layer `i` is global when `(i + 1) % period == 0`, local otherwise (Gemma 3: 6, five
    /// local layers for every global one).
    pub period: u32,
}

impl SlidingWindow {
    /// The window of layer `layer`: `Some(keys)` for a local layer, `None` for a global
    /// one.
    pub fn of_layer(&self, layer: u32) -> Option<u32> {
        let global = self.period == 0 || (layer + 1).is_multiple_of(self.period);
        (!global).then_some(self.keys)
    }
}

impl Default for BlockVariant {
    fn default() -> Self {
        Self {
            family: "llama".into(),
            activation: GluActivation::Silu,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            embedding_scale: false,
            sliding_window: None,
        }
    }
}
