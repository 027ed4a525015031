//! Where a llama model's tensors come from: a GGUF file or a Hugging Face safetensors
//! directory. The executor asks for tensors by role and gets row-major f32.

use super::error::{ImportError, Result};
use super::gguf::GgufFile;
use super::llama::{LlamaConfig, LlamaWeights};

/// A tensor of one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerTensor {
    /// RMSNorm before attention, `[hidden]`.
    AttnNorm,
    /// Query projection, `[q_dim, hidden]`.
    Q,
    /// Key projection, `[kv_dim, hidden]`.
    K,
    /// Value projection, `[kv_dim, hidden]`.
    V,
    /// Attention output projection, `[hidden, q_dim]`.
    O,
    /// RMSNorm before the FFN, `[hidden]`.
    FfnNorm,
    /// FFN gate, `[ffn, hidden]`.
    Gate,
    /// FFN up, `[ffn, hidden]`.
    Up,
    /// FFN down, `[hidden, ffn]`.
    Down,
}

impl LayerTensor {
    /// Every layer tensor.
    pub const ALL: [LayerTensor; 9] = [
        LayerTensor::AttnNorm,
        LayerTensor::Q,
        LayerTensor::K,
        LayerTensor::V,
        LayerTensor::O,
        LayerTensor::FfnNorm,
        LayerTensor::Gate,
        LayerTensor::Up,
        LayerTensor::Down,
    ];

    /// Shape (outermost first) under `c`.
    pub fn shape(self, c: &LlamaConfig) -> Vec<usize> {
        let (h, q, kv, f) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
        match self {
            LayerTensor::AttnNorm | LayerTensor::FfnNorm => vec![h],
            LayerTensor::Q => vec![q, h],
            LayerTensor::K | LayerTensor::V => vec![kv, h],
            LayerTensor::O => vec![h, q],
            LayerTensor::Gate | LayerTensor::Up => vec![f, h],
            LayerTensor::Down => vec![h, f],
        }
    }
}

/// A tensor of one decoder layer that only some families have (the optional steps of
/// [`crate::family::Family`]), `[len]` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FamilyTensor {
    /// Query bias, `[q_dim]` (families with QKV biases).
    QBias,
    /// Key bias, `[kv_dim]`.
    KBias,
    /// Value bias, `[kv_dim]`.
    VBias,
    /// Per-head query RMSNorm weight, `[head_dim]` (families with QK-norm).
    QNorm,
    /// Per-head key RMSNorm weight, `[head_dim]`.
    KNorm,
    /// RMSNorm of the attention block's output, `[hidden]` (families with post-norms).
    PostAttentionNorm,
    /// RMSNorm of the feed-forward block's output, `[hidden]`.
    PostFfnNorm,
}

impl FamilyTensor {
    /// Length under `c`.
    pub fn len(self, c: &LlamaConfig) -> usize {
        match self {
            FamilyTensor::QBias => c.q_dim(),
            FamilyTensor::KBias | FamilyTensor::VBias => c.kv_dim(),
            FamilyTensor::QNorm | FamilyTensor::KNorm => c.head_dim,
            FamilyTensor::PostAttentionNorm | FamilyTensor::PostFfnNorm => c.hidden,
        }
    }

    /// The llama.cpp name of this tensor of layer `layer` in a GGUF file.
    pub fn gguf_name(self, layer: usize) -> String {
        let name = match self {
            FamilyTensor::QBias => "attn_q.bias",
            FamilyTensor::KBias => "attn_k.bias",
            FamilyTensor::VBias => "attn_v.bias",
            FamilyTensor::QNorm => "attn_q_norm.weight",
            FamilyTensor::KNorm => "attn_k_norm.weight",
            FamilyTensor::PostAttentionNorm => "post_attention_norm.weight",
            FamilyTensor::PostFfnNorm => "post_ffw_norm.weight",
        };
        format!("blk.{layer}.{name}")
    }
}

/// A loaded model file (or directory) the executor can take weights from.
pub trait LlamaSource {
    /// Hyper-parameters.
    fn config(&self) -> &LlamaConfig;
    /// A human-readable model name.
    fn name(&self) -> String;
    /// `[vocab, hidden]` token embeddings.
    fn token_embd(&self) -> Result<Vec<f32>>;
    /// `[hidden]` final norm weight.
    fn output_norm(&self) -> Result<Vec<f32>>;
    /// `[vocab, hidden]` LM head, or `None` when tied to the embeddings.
    fn output(&self) -> Result<Option<Vec<f32>>>;
    /// Tensor `which` of layer `layer`, row-major, shaped as [`LayerTensor::shape`].
    fn layer(&self, layer: usize, which: LayerTensor) -> Result<Vec<f32>>;
    /// Tensor `which` of layer `layer`, for a family that has it; a source without such
    /// tensors (Hugging Face checkpoints are read as llama only) names it missing.
    fn family_tensor(&self, layer: usize, which: FamilyTensor) -> Result<Vec<f32>> {
        Err(ImportError::MissingTensor(which.gguf_name(layer)))
    }
    /// Llama-3's RoPE frequency factors (`[head_dim / 2]`), when the model has them
    /// ([`crate::LlamaWeights::rope_factors`]); `None` by default.
    fn rope_factors(&self) -> Result<Option<Vec<f32>>> {
        Ok(None)
    }
}

/// Reads one input channel of a layer's linear weights on demand, straight from the
/// model file (the outlier shadow's cold rows: a channel never seen hot in calibration).
pub trait ColumnSource: Send + Sync + std::fmt::Debug {
    /// Column `column` of tensor `which` of layer `layer` (shaped as
    /// [`LayerTensor::shape`]): `shape[0]` values, the weights every output gives input
    /// channel `column`, decoded exactly as [`LlamaSource::layer`] decodes them.
    fn layer_column(&self, layer: usize, which: LayerTensor, column: usize) -> Result<Vec<f32>>;
}

impl LayerTensor {
    /// The llama.cpp name of this tensor of layer `layer` in a GGUF file.
    pub fn gguf_name(self, layer: usize) -> String {
        let part = match self {
            LayerTensor::AttnNorm => "attn_norm",
            LayerTensor::Q => "attn_q",
            LayerTensor::K => "attn_k",
            LayerTensor::V => "attn_v",
            LayerTensor::O => "attn_output",
            LayerTensor::FfnNorm => "ffn_norm",
            LayerTensor::Gate => "ffn_gate",
            LayerTensor::Up => "ffn_up",
            LayerTensor::Down => "ffn_down",
        };
        format!("blk.{layer}.{part}.weight")
    }
}

impl ColumnSource for GgufFile {
    fn layer_column(&self, layer: usize, which: LayerTensor, column: usize) -> Result<Vec<f32>> {
        self.require_tensor(&which.gguf_name(layer))?
            .column_f32(column)
    }
}

/// A GGUF file as a [`LlamaSource`].
#[derive(Debug)]
pub struct GgufSource<'a> {
    file: &'a GgufFile,
    config: LlamaConfig,
    weights: LlamaWeights<'a>,
}

impl<'a> GgufSource<'a> {
    /// Reads the llama config of `file` and checks every tensor's presence and shape.
    pub fn new(file: &'a GgufFile) -> Result<Self> {
        let config = LlamaConfig::from_gguf(file)?;
        config.validate()?;
        let weights = LlamaWeights::from_gguf(file, &config)?;
        Ok(Self {
            file,
            config,
            weights,
        })
    }
}

impl LlamaSource for GgufSource<'_> {
    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn name(&self) -> String {
        self.file
            .metadata()
            .get("general.name")
            .and_then(|v| v.as_str())
            .unwrap_or("llama")
            .to_string()
    }

    fn token_embd(&self) -> Result<Vec<f32>> {
        self.weights.token_embd.to_f32()
    }

    fn output_norm(&self) -> Result<Vec<f32>> {
        self.weights.output_norm.to_f32()
    }

    fn output(&self) -> Result<Option<Vec<f32>>> {
        self.weights.output.map(|o| o.to_f32()).transpose()
    }

    fn layer(&self, layer: usize, which: LayerTensor) -> Result<Vec<f32>> {
        let l = self
            .weights
            .layers
            .get(layer)
            .ok_or_else(|| ImportError::MissingTensor(format!("blk.{layer}")))?;
        let t = match which {
            LayerTensor::AttnNorm => l.attn_norm,
            LayerTensor::Q => l.attn_q,
            LayerTensor::K => l.attn_k,
            LayerTensor::V => l.attn_v,
            LayerTensor::O => l.attn_output,
            LayerTensor::FfnNorm => l.ffn_norm,
            LayerTensor::Gate => l.ffn_gate,
            LayerTensor::Up => l.ffn_up,
            LayerTensor::Down => l.ffn_down,
        };
        t.to_f32()
    }

    fn rope_factors(&self) -> Result<Option<Vec<f32>>> {
        self.weights.rope_factors()
    }

    fn family_tensor(&self, layer: usize, which: FamilyTensor) -> Result<Vec<f32>> {
        let l = self
            .weights
            .layers
            .get(layer)
            .ok_or_else(|| ImportError::MissingTensor(format!("blk.{layer}")))?;
        let missing = || ImportError::MissingTensor(which.gguf_name(layer));
        let t = match which {
            FamilyTensor::QBias => l.qkv_bias.map(|b| b[0]),
            FamilyTensor::KBias => l.qkv_bias.map(|b| b[1]),
            FamilyTensor::VBias => l.qkv_bias.map(|b| b[2]),
            FamilyTensor::QNorm => l.qk_norm.map(|n| n[0]),
            FamilyTensor::KNorm => l.qk_norm.map(|n| n[1]),
            FamilyTensor::PostAttentionNorm => l.post_norms.map(|n| n[0]),
            FamilyTensor::PostFfnNorm => l.post_norms.map(|n| n[1]),
        };
        t.ok_or_else(missing)?.to_f32()
    }
}
