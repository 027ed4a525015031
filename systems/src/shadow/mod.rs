//! Outlier shadow configuration (seed 000, section 3.3): which quantized activations keep a
//! float shadow, and how much work and memory the shadow costs.
//!
//! A *site* is one per-tensor quantized activation of a llama layer (the input of q/k/v,
//! of o, of gate/up, of down). At a kept site the values beyond the clipped scale go to a
//! shadow subgraph on a float processor, which multiplies them with the float weight rows
//! of their channels *beside* the INT8 matmul; the operator that consumes the matmul's
//! output (its dequantize) adds the shadow's result. [`crate::graph::build_stages`] turns
//! every kept site into such a subgraph.
//!
//! A model either lists its kept sites (a calibration decided them, as `hetsched calibrate`
//! does for real models) or gives the share to keep and the order of site kinds by
//! importance, for simulated models whose calibration we do not have.
//!
//! The configuration (`config.rs`: sites, kept sites, the `[shadow]` table) names no
//! model, so that the model's configuration can hold it; what the shadow holds on a
//! given model (`site_shape`, [`ShadowConfig::weight_bytes`]) is here, above the model.

mod config;

pub use config::{KeptSite, ShadowConfig, ShadowSite};

use crate::model::ModelConfig;

impl ShadowConfig {
    /// Bytes of the float weight rows the shadow keeps resident for `model` (the hot
    /// channels' rows of every kept site's linears), and of a full float copy of every
    /// INT8 linear (what shadowing without hot channels would hold: seed 000, 3.3).
    pub fn weight_bytes(&self, model: &ModelConfig) -> (u64, u64) {
        let float = model.float_precision.bytes();
        let resident = self
            .kept_sites(model.layers)
            .iter()
            .map(|s| {
                let (k, n) = site_shape(model, s.site);
                let rows = (self.hot_channels * k as f64).ceil() as u64;
                rows.saturating_mul(n).saturating_mul(float)
            })
            .fold(0u64, u64::saturating_add);
        let full = ShadowSite::ALL
            .iter()
            .map(|&s| {
                let (k, n) = site_shape(model, s);
                k.saturating_mul(n).saturating_mul(float)
            })
            .fold(0u64, u64::saturating_add)
            .saturating_mul(u64::from(model.layers));
        (resident, full)
    }
}

/// In-features of a site's linears and their out-features summed (llama layer).
pub fn site_shape(model: &ModelConfig, site: ShadowSite) -> (u64, u64) {
    let h = u64::from(model.hidden);
    let q = u64::from(model.heads) * u64::from(model.head_dim());
    let kv = u64::from(model.kv_heads) * u64::from(model.head_dim());
    let f = u64::from(model.ffn);
    match site {
        ShadowSite::Qkv => (h, q + 2 * kv),
        ShadowSite::O => (q, h),
        ShadowSite::GateUp => (h, 2 * f),
        ShadowSite::Down => (f, h),
    }
}
