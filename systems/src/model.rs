//! Model configuration (llama-family decoder) and the operators of one decoder layer.
//!
//! Operators carry their shape-derived work (operations and bytes) so the cost model can
//! price them on any processor; they know nothing about where they run.

use serde::{Deserialize, Serialize};

pub use crate::attention_span::ChunkShape;
use crate::attention_span::{keys_read, windowed_pairs};
use crate::block::{BlockVariant, GluActivation};
use crate::error::PlanError;
use crate::op::{Block, NormSite, OpRole, Projection};
pub use crate::op::{ExecClass, OpDecl, OpKind};
use crate::shadow::{ShadowConfig, ShadowSite};

/// Numeric precision of weights, activations or a computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 8-bit integer (per-tensor activations, per-channel or per-tensor weights).
    Int8,
    /// IEEE half precision.
    Fp16,
    /// IEEE single precision.
    Fp32,
}

impl Precision {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Precision::Int8 => 1,
            Precision::Fp16 => 2,
            Precision::Fp32 => 4,
        }
    }
}

/// A llama-family decoder-only model, as written in a scene's model file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Human-readable name, e.g. `Qwen1.5-1.8B`.
    pub name: String,
    /// Number of decoder layers.
    pub layers: u32,
    /// Hidden (embedding) size.
    pub hidden: u32,
    /// Attention (query) heads.
    pub heads: u32,
    /// Key/value heads (grouped-query attention); equal to `heads` for multi-head attention.
    pub kv_heads: u32,
    /// Per-head dimension; defaults to `hidden / heads`.
    #[serde(default)]
    pub head_dim: Option<u32>,
    /// Feed-forward (intermediate) size.
    pub ffn: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Maximum context length in tokens.
    pub context: u32,
    /// Precision of linear weights (the NPU needs `int8`).
    pub weight_precision: Precision,
    /// Precision of activations fed to linears (`int8` = per-tensor W8A8 on the NPU).
    pub activation_precision: Precision,
    /// Precision of float work (norms, RoPE, attention) on CPU/GPU.
    #[serde(default = "default_float_precision")]
    pub float_precision: Precision,
    /// Optional custom layer graph; the llama layer is used when absent.
    #[serde(default)]
    pub layer_ops: Option<Vec<OpDecl>>,
    /// Outlier shadow of the INT8 linears (llama layers only); none when absent.
    #[serde(default)]
    pub shadow: Option<ShadowConfig>,
    /// The model family's variant of the built-in layer (a `[block]` table: Gemma's
    /// QK-norm, post-norms, GELU and embedding scale, Qwen2's QKV biases); absent: the
    /// llama layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<BlockVariant>,
}

fn default_float_precision() -> Precision {
    Precision::Fp32
}

impl ModelConfig {
    /// Per-head dimension.
    pub fn head_dim(&self) -> u32 {
        self.head_dim.unwrap_or(self.hidden / self.heads.max(1))
    }

    /// The sliding window layer `layer`'s attention reads through (keys per query at
    /// most), or `None` for a layer attending to every earlier key.
    pub fn attention_window(&self, layer: u32) -> Option<u32> {
        let window = self.block.as_ref()?.sliding_window?;
        window.of_layer(layer)
    }

    /// Checks the shape facts the graph builder relies on: the dimensions, then the
    /// scene's own operators, the grouping of query heads, the family table and the
    /// shadow against the layer.
    pub fn validate(&self) -> Result<(), PlanError> {
        self.validate_dimensions()?;
        let bad = |what: String| Err(PlanError::InvalidModel(format!("{}: {what}", self.name)));
        if let Some(op) = self
            .layer_ops
            .iter()
            .flatten()
            .find(|op| op.in_features == Some(0) || op.out_features == Some(0))
        {
            return bad(format!(
                "operator `{}`: `in_features` and `out_features` must be at least 1 (a linear with a zero dimension has no work to price)",
                op.name
            ));
        }
        if let Some(op) = self.layer_ops.iter().flatten().find(|op| {
            op.window == Some(0) || (op.window.is_some() && op.kind != OpKind::Attention)
        }) {
            return bad(format!(
                "operator `{}`: `window` must be at least 1 and only on an attention operator",
                op.name
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "kv_heads ({}) must divide heads ({}) for grouped-query attention",
                self.kv_heads, self.heads
            ));
        }
        if let Some(op) = self
            .layer_ops
            .iter()
            .flatten()
            .find(|op| op.role.is_some_and(|role| role.kind() != op.kind))
        {
            return bad(format!(
                "operator `{}` of kind {:?} cannot take the role {:?}; drop `role` or fix `kind`",
                op.name, op.kind, op.role
            ));
        }
        if self.block.is_some() && self.layer_ops.is_some() {
            return bad(
                "[block] varies the built-in layer; drop `layer_ops` or the [block] table".into(),
            );
        }
        if let Some(shadow) = &self.shadow {
            if self.layer_ops.is_some() {
                return bad(
                    "[shadow] needs the built-in llama layer; drop `layer_ops` or the shadow"
                        .into(),
                );
            }
            shadow.validate(self.layers)?;
        }
        Ok(())
    }

    /// The counts and sizes: none zero, heads dividing hidden (or an explicit head
    /// dimension), a sliding window of at least one key and a period of at least two.
    fn validate_dimensions(&self) -> Result<(), PlanError> {
        let bad = |what: String| Err(PlanError::InvalidModel(format!("{}: {what}", self.name)));
        for (field, value) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("ffn", self.ffn),
            ("vocab", self.vocab),
            ("context", self.context),
        ] {
            if value == 0 {
                return bad(format!("`{field}` must be at least 1"));
            }
        }
        if self.head_dim.is_none() && !self.hidden.is_multiple_of(self.heads) {
            return bad(format!(
                "heads ({}) do not divide hidden ({}); set `head_dim` explicitly or fix the counts",
                self.heads, self.hidden
            ));
        }
        if self.head_dim == Some(0) {
            return bad("`head_dim` must be at least 1".into());
        }
        if let Some(w) = self.block.as_ref().and_then(|b| b.sliding_window)
            && (w.keys == 0 || w.period < 2)
        {
            return bad(format!(
                "[block.sliding_window] needs keys >= 1 and period >= 2 (got {} and {}); \
                 drop the table for a model without local layers",
                w.keys, w.period
            ));
        }
        Ok(())
    }
}

/// The llama decoder layer as mllm-NPU cuts it: float work (norms, quantize/dequantize,
/// RoPE, attention) between INT8 linears. Operators without inputs read the layer input
/// (the residual stream), which [`layer_carry_ops`] produced.
///
/// The model's [`BlockVariant`] adds its family's operators where that family computes
/// them (QKV biases and QK-norm between the dequantize and RoPE, the post-attention norm
/// before the residual add, GELU instead of SiLU); without one, the llama layer.
pub fn llama_layer(model: &ModelConfig) -> Vec<OpDecl> {
    use ShadowSite::{GateUp, Qkv};
    let variant = model.block.clone().unwrap_or_default();
    let h = model.hidden;
    let q = model.heads * model.head_dim();
    let kv = model.kv_heads * model.head_dim();
    let f = model.ffn;
    // The operators consuming a site's linears read them by their labels.
    let linears = |site| -> Vec<&str> {
        Projection::of_site(site)
            .iter()
            .map(|p| p.label())
            .collect()
    };
    let (qkv, o, gate_up) = (linears(Qkv), linears(ShadowSite::O), linears(GateUp));
    let op = OpDecl::of_role;
    let ops = vec![
        op("attn_norm", OpRole::Norm(NormSite::Attention), &[]),
        op("attn_quant", OpRole::Quantize(Qkv), &["attn_norm"]),
        OpDecl::linear(Projection::Q, "attn_quant", h, q),
        OpDecl::linear(Projection::K, "attn_quant", h, kv),
        OpDecl::linear(Projection::V, "attn_quant", h, kv),
        OpDecl {
            out_features: Some(q + 2 * kv),
            ..op("qkv_dequant", OpRole::Dequantize(Qkv), &qkv)
        },
    ];
    let mut chain = Chain {
        ops,
        last: "qkv_dequant",
    };
    if variant.qkv_bias {
        chain.then("qkv_bias", OpRole::QkvBias, Some(q + 2 * kv));
    }
    if variant.qk_norm {
        chain.then("qk_norm", OpRole::QkNorm, Some(q + kv));
    }
    chain.then("rope", OpRole::Rope, None);
    chain.then("attention", OpRole::Attention, None);
    chain.then("o_quant", OpRole::Quantize(ShadowSite::O), Some(q));
    chain
        .ops
        .push(OpDecl::linear(Projection::O, "o_quant", q, h));
    chain
        .ops
        .push(op("o_dequant", OpRole::Dequantize(ShadowSite::O), &o));
    chain.last = "o_dequant";
    if variant.post_norms {
        chain.then("post_attn_norm", OpRole::PostNorm(Block::Attention), None);
    }
    chain.then("attn_residual", OpRole::Residual, None);
    chain.then("ffn_norm", OpRole::Norm(NormSite::Ffn), None);
    chain.then("ffn_quant", OpRole::Quantize(GateUp), None);
    let mut ops = chain.ops;
    ops.push(OpDecl::linear(Projection::Gate, "ffn_quant", h, f));
    ops.push(OpDecl::linear(Projection::Up, "ffn_quant", h, f));
    let (glu, glu_role) = match variant.activation {
        GluActivation::Silu => ("silu_mul", OpRole::SiluMul),
        GluActivation::GeluTanh => ("gelu_mul", OpRole::GeluMul),
    };
    ops.push(op(glu, glu_role, &gate_up));
    ops.push(OpDecl::linear(Projection::Down, glu, f, h));
    ops
}

/// Operators appended one after another, each reading the one before.
struct Chain {
    ops: Vec<OpDecl>,
    /// The name of the last operator, what the next one reads.
    last: &'static str,
}

impl Chain {
    /// Appends `name` in `role` (of `width` output features, if not hidden).
    fn then(&mut self, name: &'static str, role: OpRole, width: Option<u32>) {
        let input = std::mem::replace(&mut self.last, name);
        self.ops.push(OpDecl {
            out_features: width,
            ..OpDecl::of_role(name, role, &[input])
        });
    }
}

/// Operators that hand one layer's output to the next: dequantise the FFN output (and
/// RMS-normalize it, for a family with post-norms) and add the residual. They run at the
/// start of every layer but the first, and before the model head.
pub fn layer_carry_ops(model: &ModelConfig) -> Vec<OpDecl> {
    let post_norms = model.block.as_ref().is_some_and(|b| b.post_norms);
    let mut ops = vec![OpDecl::of_role(
        "ffn_dequant",
        OpRole::Dequantize(ShadowSite::Down),
        &[],
    )];
    let mut last = "ffn_dequant";
    if post_norms {
        let role = OpRole::PostNorm(Block::FeedForward);
        ops.push(OpDecl::of_role("post_ffn_norm", role, &[last]));
        last = "post_ffn_norm";
    }
    ops.push(OpDecl::of_role("ffn_residual", OpRole::Residual, &[last]));
    ops
}

/// Work of one operator for one chunk: operations, bytes moved, and the precision of the
/// arithmetic (which picks the processor's peak rate).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpWork {
    /// Arithmetic operations (a multiply-add counts 2).
    pub ops: f64,
    /// Bytes read and written.
    pub bytes: f64,
    /// Precision of the arithmetic.
    pub precision: Precision,
}

/// What an operator holds and costs on a model (its declaration is [`crate::op`]'s).
impl OpDecl {
    /// Bytes of weights the operator holds at the model's weight precision: a linear's
    /// matrix, the embedding table, the LM head; none for the rest. A prefill chunk
    /// streams all of them but the embedding table, which it only gathers rows of
    /// ([`OpDecl::streams_weights`]).
    pub fn weight_bytes(&self, model: &ModelConfig) -> u64 {
        let count = match self.kind {
            OpKind::Linear => u64::from(self.in_features.unwrap_or(model.hidden))
                .saturating_mul(u64::from(self.out_features.unwrap_or(model.hidden))),
            OpKind::Embed | OpKind::LmHead => {
                u64::from(model.vocab).saturating_mul(u64::from(model.hidden))
            }
            _ => 0,
        };
        count.saturating_mul(model.weight_precision.bytes())
    }

    /// Work of this operator on a chunk of `shape` for `model`.
    pub fn work(&self, model: &ModelConfig, shape: ChunkShape) -> OpWork {
        let c = shape.tokens as f64;
        let h = model.hidden as f64;
        let hd = model.head_dim() as f64;
        let q_width = model.heads as f64 * hd;
        let kv_width = model.kv_heads as f64 * hd;
        let act = model.activation_precision;
        let float = model.float_precision;
        let fb = float.bytes() as f64;
        let elementwise = |ops_per: f64, width: f64, bytes_per: f64| OpWork {
            ops: ops_per * c * width,
            bytes: bytes_per * c * width,
            precision: float,
        };
        match self.kind {
            OpKind::Embed => elementwise(0.0, h, model.weight_precision.bytes() as f64 + fb),
            OpKind::ResidualAdd => elementwise(1.0, h, 3.0 * fb),
            OpKind::RmsNorm => elementwise(4.0, self.out_features.map_or(h, f64::from), 2.0 * fb),
            OpKind::Elementwise => {
                elementwise(1.0, self.out_features.map_or(h, f64::from), 2.0 * fb)
            }
            OpKind::Quantize | OpKind::Dequantize => {
                let width = self.out_features.map_or(h, f64::from);
                elementwise(2.0, width, fb + act.bytes() as f64)
            }
            OpKind::Rope => elementwise(6.0, q_width + kv_width, 2.0 * fb),
            OpKind::Attention => attention_work(model, self, shape),
            OpKind::SiluMul => {
                let width = model.ffn as f64;
                OpWork {
                    ops: 5.0 * c * width,
                    bytes: 3.0 * c * width * act.bytes() as f64,
                    precision: if self.class() == ExecClass::Int8 {
                        act
                    } else {
                        float
                    },
                }
            }
            OpKind::Linear => self.linear_work(model, c),
            OpKind::Shadow => self.shadow_work(model, c),
            OpKind::LmHead => {
                // Prefill needs logits of the last token only.
                let n = model.vocab as f64;
                OpWork {
                    ops: 2.0 * h * n,
                    bytes: h * n * model.weight_precision.bytes() as f64 + n * 4.0,
                    precision: float,
                }
            }
        }
    }

    /// A linear `[tokens, k] x [k, n]`: weights streamed once, activations in, f32 out; an
    /// INT8-class linear of a float model runs the NPU's FP16 path.
    fn linear_work(&self, model: &ModelConfig, c: f64) -> OpWork {
        let act = model.activation_precision;
        let k = self.in_features.unwrap_or(model.hidden) as f64;
        let n = self.out_features.unwrap_or(model.hidden) as f64;
        let integer = act == Precision::Int8 && model.weight_precision == Precision::Int8;
        let precision = match self.class() {
            ExecClass::Int8 if integer => Precision::Int8,
            // A float model on the NPU runs its FP16 path (seed 000: up to 159x slower).
            ExecClass::Int8 => Precision::Fp16,
            ExecClass::Float => model.float_precision,
        };
        OpWork {
            ops: 2.0 * c * k * n,
            bytes: k * n * model.weight_precision.bytes() as f64
                + c * k * act.bytes() as f64
                + c * n * 4.0,
            precision,
        }
    }

    /// The float shadow of a kept site's outliers (docs/outliers.md).
    fn shadow_work(&self, model: &ModelConfig, c: f64) -> OpWork {
        let fb = model.float_precision.bytes() as f64;
        let shadow = model.shadow.clone().unwrap_or_default();
        let k = self.in_features.unwrap_or(model.hidden) as f64;
        let n = self.out_features.unwrap_or(model.hidden) as f64;
        // At least one outlier per token: a kept site is kept for its outliers.
        let per_token = (shadow.outlier_channels * k).max(1.0);
        // The rows of hot channels are streamed once per chunk; outliers arrive
        // as (index, value) pairs; the result is a dense float [tokens, n].
        OpWork {
            ops: 2.0 * c * per_token * n,
            bytes: shadow.hot_channels * k * n * fb + c * per_token * 8.0 + c * n * 4.0,
            precision: model.float_precision,
        }
    }
}

/// Causal attention of a chunk of `shape` over the KV cache (through the operator's
/// sliding window of keys, if it has one: [`crate::attention_span`]): QK^T, softmax and
/// PV per head, for every head or for the operator's head range (a part of split
/// attention, [`crate::attention_split`]: its query heads and the KV heads they read).
fn attention_work(model: &ModelConfig, op: &OpDecl, shape: ChunkShape) -> OpWork {
    let window = op.window.map(u64::from);
    let (heads, kv_heads) = match op.heads {
        Some(range) => (range.count, range.kv_heads(model.heads, model.kv_heads)),
        None => (model.heads, model.kv_heads),
    };
    let c = shape.tokens as f64;
    let hd = model.head_dim() as f64;
    let q_width = heads as f64 * hd;
    let kv_width = kv_heads as f64 * hd;
    let fb = model.float_precision.bytes() as f64;
    // Query t of the chunk sees past + t + 1 keys (causal), at most `window`.
    let keys = windowed_pairs(shape, window);
    let heads = heads as f64;
    // QK^T and PV (2 multiply-adds per key and head dimension) plus softmax.
    let ops = heads * keys * (4.0 * hd + 5.0);
    let kv_len = keys_read(shape, window);
    let bytes = fb * (2.0 * kv_len * kv_width + 2.0 * c * q_width + 2.0 * c * kv_width);
    OpWork {
        ops,
        bytes,
        precision: model.float_precision,
    }
}

/// Operators before the first layer: the embedding lookup (and its scale, for a family
/// that scales embeddings).
pub fn prologue_ops(model: &ModelConfig) -> Vec<OpDecl> {
    let mut ops = vec![OpDecl::of_role("embed", OpRole::Embed, &[])];
    if model.block.as_ref().is_some_and(|b| b.embedding_scale) {
        ops.push(OpDecl::of_role(
            "embed_scale",
            OpRole::EmbedScale,
            &["embed"],
        ));
    }
    ops
}

/// Operators after the last layer's carry: the final norm and the LM head.
pub fn epilogue_ops() -> Vec<OpDecl> {
    vec![
        OpDecl::of_role("final_norm", OpRole::Norm(NormSite::Final), &[]),
        OpDecl::of_role("lm_head", OpRole::LmHead, &["final_norm"]),
    ]
}
