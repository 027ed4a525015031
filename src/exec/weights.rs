//! A llama model's weights in the form the real kernels take: packed f32 for the float
//! path, per-row INT8 with scales for the W8A8 (emulated NPU) path.

use hetsched_kernels::reference::quantize_weights_per_row;
use hetsched_kernels::{PackedF32Weights, PackedI8Weights, RopeTable};
use hetsched_systems::model::{ModelConfig, Precision};
use serde::{Deserialize, Serialize};

use crate::import::{GgufFile, ImportError, LlamaConfig, LlamaWeights, TensorView};

/// Arithmetic of the linear layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LinearPrecision {
    /// f32 weights and activations: the accuracy reference.
    F32,
    /// INT8 weights (one scale per output row) and INT8 activations (one scale per tensor),
    /// INT32 accumulation: what the Hexagon NPU runs.
    W8a8,
}

impl LinearPrecision {
    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            LinearPrecision::F32 => "f32",
            LinearPrecision::W8a8 => "w8a8",
        }
    }
}

/// Weights of one linear layer, `[n, k]`.
#[derive(Debug)]
pub enum LinearWeights {
    /// Packed f32.
    F32(PackedF32Weights),
    /// Packed INT8 with one scale per output row.
    Int8 {
        /// Packed weights.
        packed: PackedI8Weights,
        /// `[n]` scales.
        scales: Vec<f32>,
    },
}

impl LinearWeights {
    fn load(t: TensorView<'_>, precision: LinearPrecision) -> Result<Self, ImportError> {
        let shape = t.shape();
        let (n, k) = (shape[0], shape[1]);
        let w = t.to_f32()?;
        Ok(match precision {
            LinearPrecision::F32 => LinearWeights::F32(PackedF32Weights::pack(&w, n, k)),
            LinearPrecision::W8a8 => {
                let (q, scales) = quantize_weights_per_row(&w, n, k);
                LinearWeights::Int8 {
                    packed: PackedI8Weights::pack(&q, n, k),
                    scales,
                }
            }
        })
    }

    /// Output features.
    pub fn n(&self) -> usize {
        match self {
            LinearWeights::F32(w) => w.n(),
            LinearWeights::Int8 { packed, .. } => packed.n(),
        }
    }

    /// Input features.
    pub fn k(&self) -> usize {
        match self {
            LinearWeights::F32(w) => w.k(),
            LinearWeights::Int8 { packed, .. } => packed.k(),
        }
    }
}

/// Weights of one decoder layer.
#[derive(Debug)]
pub struct LayerWeights {
    /// `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// Query projection.
    pub wq: LinearWeights,
    /// Key projection.
    pub wk: LinearWeights,
    /// Value projection.
    pub wv: LinearWeights,
    /// Attention output projection.
    pub wo: LinearWeights,
    /// `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// FFN gate.
    pub w_gate: LinearWeights,
    /// FFN up.
    pub w_up: LinearWeights,
    /// FFN down.
    pub w_down: LinearWeights,
}

/// A llama model ready for real prefill.
#[derive(Debug)]
pub struct ExecModel {
    /// Hyper-parameters from the file.
    pub config: LlamaConfig,
    /// Human-readable name (`general.name`, or the file's architecture).
    pub name: String,
    /// Arithmetic of the linears.
    pub precision: LinearPrecision,
    /// `[vocab, hidden]`.
    pub token_embd: Vec<f32>,
    /// Decoder layers.
    pub layers: Vec<LayerWeights>,
    /// `[hidden]`.
    pub output_norm: Vec<f32>,
    /// The LM head, f32 (it runs on the float processor for the last token only).
    pub output: PackedF32Weights,
    /// RoPE rotations for every position of the context.
    pub rope: RopeTable,
}

impl ExecModel {
    /// Loads every weight of `file` for `precision` (dequantizing GGUF blocks to f32 and,
    /// for W8A8, requantizing per output row).
    pub fn load(file: &GgufFile, precision: LinearPrecision) -> Result<Self, ImportError> {
        let config = LlamaConfig::from_gguf(file)?;
        config.validate()?;
        let w = LlamaWeights::from_gguf(file, &config)?;
        let token_embd = w.token_embd.to_f32()?;
        let output = match w.output {
            Some(o) => PackedF32Weights::pack(&o.to_f32()?, config.vocab_size, config.hidden),
            None => PackedF32Weights::pack(&token_embd, config.vocab_size, config.hidden),
        };
        let linear = |t| LinearWeights::load(t, precision);
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(LayerWeights {
                attn_norm: l.attn_norm.to_f32()?,
                wq: linear(l.attn_q)?,
                wk: linear(l.attn_k)?,
                wv: linear(l.attn_v)?,
                wo: linear(l.attn_output)?,
                ffn_norm: l.ffn_norm.to_f32()?,
                w_gate: linear(l.ffn_gate)?,
                w_up: linear(l.ffn_up)?,
                w_down: linear(l.ffn_down)?,
            });
        }
        let name = file
            .metadata()
            .get("general.name")
            .and_then(|v| v.as_str())
            .unwrap_or("llama")
            .to_string();
        let rope = RopeTable::new(
            config.head_dim,
            config.rope_base,
            config.rope_style,
            config.context_length,
        );
        Ok(Self {
            output_norm: w.output_norm.to_f32()?,
            name,
            precision,
            token_embd,
            layers,
            output,
            rope,
            config,
        })
    }

    /// The model as the planner sees it: shapes for the cost model and the graph builder.
    pub fn model_config(&self) -> ModelConfig {
        let c = &self.config;
        let (weights, activations) = match self.precision {
            LinearPrecision::F32 => (Precision::Fp32, Precision::Fp32),
            LinearPrecision::W8a8 => (Precision::Int8, Precision::Int8),
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
        }
    }
}
