//! The executor's view of a stage: each operator of a [`StageTemplate`] compiled once,
//! before the run, into a [`Step`] bound to its kernel. An operator without a kernel is
//! refused here rather than midway through a prefill.

use hetsched_systems::graph::StageTemplate;
use hetsched_systems::shadow::ShadowSite;

use super::error::ExecError;
use crate::import::LayerTensor;

/// Which RMSNorm weight a norm reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormSite {
    /// Before attention.
    Attention,
    /// Before the feed-forward block.
    Ffn,
    /// After the last layer.
    Final,
}

/// A linear projection of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Projection {
    /// Queries.
    Q,
    /// Keys (kept for the KV cache).
    K,
    /// Values (kept for the KV cache).
    V,
    /// Attention output.
    O,
    /// FFN gate.
    Gate,
    /// FFN up.
    Up,
    /// FFN down.
    Down,
}

impl Projection {
    /// How many there are.
    pub const COUNT: usize = 7;

    /// Every projection, in declaration order.
    pub const ALL: [Projection; Projection::COUNT] = [
        Projection::Q,
        Projection::K,
        Projection::V,
        Projection::O,
        Projection::Gate,
        Projection::Up,
        Projection::Down,
    ];

    /// Position in declaration order, below [`Projection::COUNT`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The projections reading `site`, in layer order.
    pub fn of_site(site: ShadowSite) -> &'static [Projection] {
        match site {
            ShadowSite::Qkv => &[Projection::Q, Projection::K, Projection::V],
            ShadowSite::O => &[Projection::O],
            ShadowSite::GateUp => &[Projection::Gate, Projection::Up],
            ShadowSite::Down => &[Projection::Down],
        }
    }

    /// The activation this projection reads.
    pub fn site(self) -> ShadowSite {
        ShadowSite::ALL
            .into_iter()
            .find(|&s| Projection::of_site(s).contains(&self))
            .expect("every projection reads one site")
    }

    /// Its weight tensor in the model file.
    pub fn tensor(self) -> LayerTensor {
        match self {
            Projection::Q => LayerTensor::Q,
            Projection::K => LayerTensor::K,
            Projection::V => LayerTensor::V,
            Projection::O => LayerTensor::O,
            Projection::Gate => LayerTensor::Gate,
            Projection::Up => LayerTensor::Up,
            Projection::Down => LayerTensor::Down,
        }
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
}

impl Step {
    /// Binds an operator of `stage` by its name in the built-in llama layer.
    pub fn compile(stage: &StageTemplate, op: &str) -> Result<Step, ExecError> {
        Ok(match op {
            "embed" => Step::Embed,
            "attn_norm" => Step::Norm(NormSite::Attention),
            "ffn_norm" => Step::Norm(NormSite::Ffn),
            "final_norm" => Step::Norm(NormSite::Final),
            "attn_quant" => Step::QuantizeNormed(ShadowSite::Qkv),
            "ffn_quant" => Step::QuantizeNormed(ShadowSite::GateUp),
            "o_quant" => Step::QuantizeAttention,
            "q_proj" => Step::Linear(Projection::Q),
            "k_proj" => Step::Linear(Projection::K),
            "v_proj" => Step::Linear(Projection::V),
            "o_proj" => Step::Linear(Projection::O),
            "gate_proj" => Step::Linear(Projection::Gate),
            "up_proj" => Step::Linear(Projection::Up),
            "down_proj" => Step::Linear(Projection::Down),
            "qkv_dequant" => Step::DequantizeQkv,
            "rope" => Step::Rope,
            "attention" => Step::Attention,
            "o_dequant" => Step::DequantizeO,
            "ffn_dequant" => Step::DequantizeDown,
            "attn_residual" | "ffn_residual" => Step::Residual,
            "silu_mul" => Step::SiluMul,
            "lm_head" => Step::LmHead,
            _ if let Some(site) = ShadowSite::of_op_name(op) => Step::Shadow(site),
            _ => {
                return Err(ExecError::UnsupportedOp {
                    op: op.to_string(),
                    stage: stage.name.clone(),
                });
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
                    .map(|op| Step::compile(stage, &op.name))
                    .collect()
            })
            .collect()
    }
}
