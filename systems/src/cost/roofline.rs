//! The roofline cost model: what an operator costs on a processor, whatever its kind.
//!
//! Roofline per operator (`max(ops / peak[precision], bytes / bandwidth)`) plus a fixed
//! per-operator overhead; a subgraph adds one launch overhead. A table of measured
//! latencies in the device profile overrides the roofline for the shapes it lists, and a
//! measured profile's fitted stage costs ([`StageCost`], written by `hetsched profile`)
//! override it for whole stages of the kinds and precision they were fitted for.

use serde::{Deserialize, Serialize};

use super::stage::{StageCost, precision_label, stage_kind};
use crate::model::{ChunkShape, ModelConfig, OpDecl, OpKind, OpWork, Precision};

/// Peak arithmetic rates of a processor, in giga-operations per second (a multiply-add
/// counts 2). Zero means the processor cannot do that precision.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakRates {
    /// INT8 rate.
    pub int8: f64,
    /// FP16 rate.
    pub fp16: f64,
    /// FP32 rate.
    pub fp32: f64,
}

impl PeakRates {
    /// Rate for `precision`, in operations per second.
    pub fn ops_per_s(&self, precision: Precision) -> f64 {
        1e9 * match precision {
            Precision::Int8 => self.int8,
            Precision::Fp16 => self.fp16,
            Precision::Fp32 => self.fp32,
        }
    }
}

/// One measured latency that overrides the roofline: matched on operator kind, chunk
/// tokens and, where given, the other shape fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredLatency {
    /// Operator kind.
    pub op: OpKind,
    /// Tokens in the chunk.
    pub tokens: u64,
    /// Tokens already in the KV cache (attention), if the entry is specific to it.
    #[serde(default)]
    pub past: Option<u64>,
    /// Input features (linears), if the entry is specific to it.
    #[serde(default)]
    pub in_features: Option<u32>,
    /// Output features (linears), if the entry is specific to it.
    #[serde(default)]
    pub out_features: Option<u32>,
    /// Measured latency in microseconds.
    pub us: f64,
}

impl MeasuredLatency {
    fn matches(&self, op: &OpDecl, shape: ChunkShape) -> bool {
        self.op == op.kind
            && self.tokens == shape.tokens
            && self.past.is_none_or(|p| p == shape.past)
            && self.in_features.is_none_or(|f| Some(f) == op.in_features)
            && self.out_features.is_none_or(|f| Some(f) == op.out_features)
    }
}

/// Cost model of one processor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostModel {
    /// Peak rates per precision (GOPS).
    pub peak_gops: PeakRates,
    /// Memory bandwidth in GB/s.
    pub bandwidth_gbps: f64,
    /// Fixed cost of launching one subgraph, in microseconds.
    pub launch_us: f64,
    /// Fixed cost per operator, in microseconds.
    pub op_overhead_us: f64,
    /// Measured latencies that override the roofline.
    #[serde(default)]
    pub measured: Vec<MeasuredLatency>,
    /// Fitted costs of whole stages (`hetsched profile`), by stage kind and precision;
    /// a stage without one is priced by the roofline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageCost>,
}

/// Which model priced a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CostSource {
    /// A fitted, measured stage cost ([`StageCost`]).
    Measured,
    /// The roofline per operator.
    Roofline,
}

impl CostModel {
    /// Time of one operator in nanoseconds, or `None` when the processor cannot run its
    /// precision at all.
    pub fn op_ns(&self, model: &ModelConfig, op: &OpDecl, shape: ChunkShape) -> Option<f64> {
        if let Some(m) = self.measured.iter().find(|m| m.matches(op, shape)) {
            return Some(m.us * 1e3);
        }
        self.work_ns(op.work(model, shape))
    }

    /// Roofline time of one operator's `work` in nanoseconds, its per-operator overhead
    /// included, or `None` when the processor cannot run its precision at all.
    pub fn work_ns(&self, work: OpWork) -> Option<f64> {
        let rate = self.peak_gops.ops_per_s(work.precision);
        if rate <= 0.0 && work.ops > 0.0 {
            return None;
        }
        let compute_s = if work.ops > 0.0 { work.ops / rate } else { 0.0 };
        let memory_s = work.bytes / (self.bandwidth_gbps * 1e9);
        Some(compute_s.max(memory_s) * 1e9 + self.op_overhead_us * 1e3)
    }

    /// The measured cost of a stage of `ops` for `model`'s precision, if the profile has
    /// one.
    pub fn stage_cost(&self, model: &ModelConfig, ops: &[OpDecl]) -> Option<&StageCost> {
        if self.stages.is_empty() {
            return None;
        }
        let (kind, precision) = (stage_kind(ops), precision_label(model));
        self.stages
            .iter()
            .find(|s| s.stage == kind && s.precision == precision)
    }

    /// Which model prices a stage of `ops` for `model`.
    pub fn source(&self, model: &ModelConfig, ops: &[OpDecl]) -> CostSource {
        match self.stage_cost(model, ops) {
            Some(_) => CostSource::Measured,
            None => CostSource::Roofline,
        }
    }

    /// Time of a subgraph, rounded to whole nanoseconds: its fitted stage cost when the
    /// profile has one, else one launch plus its operators' roofline times.
    pub fn subgraph_ns(
        &self,
        model: &ModelConfig,
        ops: &[OpDecl],
        shape: ChunkShape,
    ) -> Option<u64> {
        if let Some(stage) = self.stage_cost(model, ops) {
            return Some(stage.ns(shape).round().max(1.0) as u64);
        }
        let mut total = self.launch_us * 1e3;
        for op in ops {
            total += self.op_ns(model, op, shape)?;
        }
        Some(total.round().max(1.0) as u64)
    }
}
