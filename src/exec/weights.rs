//! A llama model's weights in the form the real kernels take: packed f32 for the float
//! path, per-row INT8 with scales for the W8A8 (emulated NPU) path.

use hetsched_kernels::reference::quantize_weights_per_row;
use hetsched_kernels::{PackedF32Weights, PackedI8Weights, RopeTable};
use hetsched_systems::model::{ModelConfig, Precision};
use serde::{Deserialize, Serialize};

use crate::import::{GgufFile, GgufSource, ImportError, LayerTensor, LlamaConfig, LlamaSource};

/// Arithmetic of the linear layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LinearPrecision {
    /// f32 weights and activations: the accuracy reference.
    F32,
    /// INT8 weights (one scale per output row) and INT8 activations (one scale per tensor),
    /// INT32 accumulation: what the Hexagon NPU runs.
    W8a8,
    /// W8A8 with outlier shadowing (seed 000 section 3.3): the activation scale is clipped
    /// below the few outliers, which are multiplied in float with the float weights and
    /// added to the INT8 result.
    #[value(name = "w8a8-shadow")]
    #[serde(rename = "w8a8-shadow")]
    W8a8Shadow,
}

impl LinearPrecision {
    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            LinearPrecision::F32 => "f32",
            LinearPrecision::W8a8 => "w8a8",
            LinearPrecision::W8a8Shadow => "w8a8-shadow",
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
        /// For outlier shadowing: the float weights transposed, `[k, n]` (row `c` holds
        /// every output's weight of input channel `c`).
        shadow: Option<Vec<f32>>,
    },
}

impl LinearWeights {
    fn new(w: &[f32], n: usize, k: usize, precision: LinearPrecision) -> Self {
        match precision {
            LinearPrecision::F32 => LinearWeights::F32(PackedF32Weights::pack(w, n, k)),
            LinearPrecision::W8a8 | LinearPrecision::W8a8Shadow => {
                let (q, scales) = quantize_weights_per_row(w, n, k);
                let shadow = (precision == LinearPrecision::W8a8Shadow).then(|| {
                    let mut t = vec![0f32; k * n];
                    for (j, row) in w.chunks_exact(k).enumerate() {
                        for (c, &v) in row.iter().enumerate() {
                            t[c * n + j] = v;
                        }
                    }
                    t
                });
                LinearWeights::Int8 {
                    packed: PackedI8Weights::pack(&q, n, k),
                    scales,
                    shadow,
                }
            }
        }
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
    /// Loads every weight of a GGUF `file` for `precision` (dequantizing GGUF blocks to
    /// f32 and, for W8A8, requantizing per output row).
    pub fn load(file: &GgufFile, precision: LinearPrecision) -> Result<Self, ImportError> {
        Self::from_source(&GgufSource::new(file)?, precision)
    }

    /// Loads every weight of `source` (a GGUF file or a Hugging Face directory).
    pub fn from_source(
        source: &dyn LlamaSource,
        precision: LinearPrecision,
    ) -> Result<Self, ImportError> {
        let config = source.config().clone();
        config.validate()?;
        let (vocab, h) = (config.vocab_size, config.hidden);
        let token_embd = checked("token_embd", source.token_embd()?, &[vocab, h])?;
        let output = match source.output()? {
            Some(o) => PackedF32Weights::pack(&checked("output", o, &[vocab, h])?, vocab, h),
            None => PackedF32Weights::pack(&token_embd, vocab, h),
        };
        let mut layers = Vec::with_capacity(config.n_layers);
        for l in 0..config.n_layers {
            let tensor = |which: LayerTensor| {
                let shape = which.shape(&config);
                checked(
                    &format!("layer {l} {which:?}"),
                    source.layer(l, which)?,
                    &shape,
                )
            };
            let linear = |which: LayerTensor| -> Result<LinearWeights, ImportError> {
                let shape = which.shape(&config);
                Ok(LinearWeights::new(
                    &tensor(which)?,
                    shape[0],
                    shape[1],
                    precision,
                ))
            };
            layers.push(LayerWeights {
                attn_norm: tensor(LayerTensor::AttnNorm)?,
                wq: linear(LayerTensor::Q)?,
                wk: linear(LayerTensor::K)?,
                wv: linear(LayerTensor::V)?,
                wo: linear(LayerTensor::O)?,
                ffn_norm: tensor(LayerTensor::FfnNorm)?,
                w_gate: linear(LayerTensor::Gate)?,
                w_up: linear(LayerTensor::Up)?,
                w_down: linear(LayerTensor::Down)?,
            });
        }
        let rope = RopeTable::new(
            config.head_dim,
            config.rope_base,
            config.rope_style,
            config.context_length,
        );
        Ok(Self {
            output_norm: checked("output_norm", source.output_norm()?, &[h])?,
            name: source.name(),
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
            LinearPrecision::W8a8 | LinearPrecision::W8a8Shadow => {
                (Precision::Int8, Precision::Int8)
            }
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

/// `data` if it holds exactly `shape`'s elements.
fn checked(name: &str, data: Vec<f32>, shape: &[usize]) -> Result<Vec<f32>, ImportError> {
    if data.len() == shape.iter().product::<usize>() {
        Ok(data)
    } else {
        Err(ImportError::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            found: vec![data.len()],
        })
    }
}
