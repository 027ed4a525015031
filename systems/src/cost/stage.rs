//! Measured cost models: one fitted formula per kind of stage (subgraph) and processor,
//! written by `hetsched profile` into a device profile's `[[processors.cost.stages]]`.
//!
//! A stage's measured time is modeled as
//!
//! ```text
//! t = launch + per_token * tokens + per_pair * pairs,   pairs = tokens * past + tokens * (tokens + 1) / 2
//! ```
//!
//! `pairs` counts the (query, key) pairs causal attention scores over a chunk of `tokens`
//! after `past` cached ones; it is used only for stages that hold an attention operator.
//! A local layer's attention (a sliding window of `window` keys, Gemma 3) scores at most
//! `window` keys per query ([`crate::attention_span::windowed_pairs`]): its stage is a
//! kind of its own (`attention[window=512]`), fitted and priced with those pairs
//! ([`StageCost::window`]; docs/calibration.md says why), at a cost per pair of its own
//! where the window cuts keys ([`StageCost::per_window_pair_us`]: the executors run
//! another kernel there).
//! Every other operator of a llama layer is linear in the chunk's tokens (linears stream
//! their weights once per chunk, which the launch term absorbs). `fit.rs` fits the
//! coefficients to measured samples.

use serde::{Deserialize, Serialize};

use crate::attention_span::{window_cuts, windowed_pairs};
use crate::model::{ChunkShape, ModelConfig, OpDecl, OpKind, Precision};

/// The fitted cost of one kind of stage on one processor, for one precision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageCost {
    /// The stage kind: its operators' names joined by `+` ([`stage_kind`]); the same in
    /// every decoder layer.
    pub stage: String,
    /// The linears' arithmetic the samples ran with ([`precision_label`]): `w8a8`, `f32`.
    pub precision: String,
    /// Fixed cost per instance, in microseconds.
    pub launch_us: f64,
    /// Cost per chunk token, in microseconds.
    pub per_token_us: f64,
    /// Cost per attended (query, key) pair, in microseconds (attention stages only).
    #[serde(default)]
    pub per_pair_us: f64,
    /// The sliding window (keys per query at most) of the stage's attention, whose pairs
    /// the fit counted; absent for causal attention over every earlier key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Cost per attended pair of a chunk whose window cuts keys
    /// ([`crate::attention_span::window_cuts`]), in microseconds; `per_pair_us` prices
    /// the chunks the window does not cut. Zero without a window.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub per_window_pair_us: f64,
    /// Samples the fit used.
    #[serde(default)]
    pub samples: u64,
    /// Root mean square of the fit's relative error over the samples' shapes (the median
    /// of each shape's repetitions).
    #[serde(default)]
    pub fit_error: f64,
    /// Median relative deviation of a sample from its shape's median: run-to-run noise
    /// (contention for cores, other processes), which no fit removes.
    #[serde(default)]
    pub noise: f64,
}

impl StageCost {
    /// Modeled time of an instance of `shape`, in ns.
    pub fn ns(&self, shape: ChunkShape) -> f64 {
        let [_, tokens, pairs, cut_pairs] = features(shape, self.window);
        if self.window.is_none() {
            return 1e3 * (self.launch_us + self.per_token_us * tokens + self.per_pair_us * pairs);
        }
        1e3 * (self.launch_us
            + self.per_token_us * tokens
            + self.per_pair_us * pairs
            + self.per_window_pair_us * cut_pairs)
    }

    /// This cost with every coefficient multiplied by `factor` (a machine running
    /// uniformly slower or faster than when it was profiled: `run --adapt`).
    pub fn scaled(&self, factor: f64) -> StageCost {
        StageCost {
            launch_us: self.launch_us * factor,
            per_token_us: self.per_token_us * factor,
            per_pair_us: self.per_pair_us * factor,
            per_window_pair_us: self.per_window_pair_us * factor,
            ..self.clone()
        }
    }
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// The fit's features of a chunk of `shape`: one (launch), tokens, the pairs of a chunk
/// its `window` does not cut, the pairs of one it cuts.
pub(super) fn features(shape: ChunkShape, window: Option<u64>) -> [f64; 4] {
    let pairs = windowed_pairs(shape, window);
    let (inside, cut) = match window_cuts(shape, window) {
        true => (0.0, pairs),
        false => (pairs, 0.0),
    };
    [1.0, shape.tokens as f64, inside, cut]
}

/// The (query, key) pairs causal attention scores for a chunk of `shape`.
pub fn attended_pairs(shape: ChunkShape) -> f64 {
    let (t, p) = (shape.tokens as f64, shape.past as f64);
    t * p + t * (t + 1.0) / 2.0
}

/// The kind of a stage: its operators' names joined by `+`, an attention operator's
/// sliding window written after its name (`attention[window=512]`).
pub fn stage_kind(ops: &[OpDecl]) -> String {
    ops.iter()
        .map(|op| match op.window {
            Some(w) if op.kind == OpKind::Attention => format!("{}[window={w}]", op.name),
            _ => op.name.clone(),
        })
        .collect::<Vec<_>>()
        .join("+")
}

/// Whether a stage of `ops` scales with the attended pairs.
pub fn has_attention(ops: &[OpDecl]) -> bool {
    ops.iter().any(|op| op.kind == OpKind::Attention)
}

/// The precision label of `model`'s linears: `w8a8` for INT8 weights and activations
/// (`w8a8-shadow` with an outlier shadow, whose quantize steps clip and split), `f32` for
/// float ones, `w{bits}a{bits}` otherwise.
pub fn precision_label(model: &ModelConfig) -> String {
    let bits = |p: Precision| 8 * p.bytes();
    let label = match (model.weight_precision, model.activation_precision) {
        (Precision::Fp32, Precision::Fp32) => "f32".into(),
        (w, a) => format!("w{}a{}", bits(w), bits(a)),
    };
    if model.shadow.is_some() {
        format!("{label}-shadow")
    } else {
        label
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_windowed_attention_is_a_stage_kind_of_its_own() {
        use crate::op::OpRole;
        let attention = OpDecl::of_role("attention", OpRole::Attention, &[]);
        let quant = OpDecl::of_role("o_quant", OpRole::Residual, &["attention"]);
        let local = OpDecl {
            window: Some(512),
            ..attention.clone()
        };
        assert_eq!(stage_kind(&[attention, quant.clone()]), "attention+o_quant");
        assert_eq!(stage_kind(&[local, quant]), "attention[window=512]+o_quant");
    }
}
