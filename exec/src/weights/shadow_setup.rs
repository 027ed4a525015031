//! How the loaded weights carry the outlier shadow: each site's quantization rule, the
//! float rows kept per linear (all, or a calibration's hot channels with cold rows read
//! on demand), and what the shadow costs in memory.

use std::sync::Arc;

use hetsched_import::{ColumnSource, LayerTensor};
use hetsched_systems::op::Projection;
use hetsched_systems::shadow::{KeptSite, ShadowConfig, ShadowSite};

use super::{ExecModel, LinearPrecision};
use crate::calibration::Calibration;
use crate::shadow::{
    ColdRowCache, ColdRows, QuantRule, SHADOW_CLIP_RMS, ShadowReport, ShadowRows, ShadowUsage,
};

/// Which float weights the outlier shadow keeps, and where the rest come from.
#[derive(Clone)]
pub enum ShadowSetup<'a> {
    /// Every site shadowed, every input channel's row resident (no calibration).
    Full,
    /// The calibration's kept sites shadowed with their hot channels' rows resident;
    /// cold rows are read from `columns` (the memory-mapped model file) when needed.
    Calibrated {
        /// Kept sites and hot channels.
        calibration: &'a Calibration,
        /// The model file, for cold rows.
        columns: Arc<dyn ColumnSource>,
        /// The budget for cold rows kept once read.
        cold_cache: Arc<ColdRowCache>,
    },
}

impl ExecModel {
    /// The outlier shadow's footprint and `usage`, or `None` without a shadow.
    pub fn shadow_report(&self, usage: ShadowUsage) -> Option<ShadowReport> {
        if !self.precision.shadows() {
            return None;
        }
        let mut kept_sites = 0;
        for layer in &self.layers {
            // Kept: the full shadow (pruned sites may keep their top channels' rows).
            kept_sites += layer
                .quant
                .iter()
                .filter(|r| matches!(r, QuantRule::Clip { .. }))
                .count();
        }
        let (mut resident_bytes, mut full_copy_bytes, mut cold_kept_bytes) = (0, 0, 0);
        for layer in &self.layers {
            for w in Projection::ALL.map(|p| layer.projection(p)) {
                full_copy_bytes += (4 * w.n() * w.k()) as u64;
                resident_bytes += w.shadow().map_or(0, ShadowRows::resident_bytes);
                cold_kept_bytes += w.shadow().map_or(0, ShadowRows::kept_bytes);
            }
        }
        Some(ShadowReport {
            kept_sites,
            sites: 4 * self.layers.len(),
            calibration: self.calibration_file.clone(),
            resident_bytes,
            full_copy_bytes,
            resident_share: resident_bytes as f64 / full_copy_bytes.max(1) as f64,
            hits: usage.hits,
            misses: usage.misses,
            cold_kept_bytes,
            outliers: usage.outliers,
            shadow_ms: usage.shadow_ns as f64 / 1e6,
            prefill_share: 0.0,
        })
    }

    /// The sites that keep an outlier shadow, for the planner (each becomes a shadow
    /// stage beside its INT8 stage), or `None` when no site does.
    pub(super) fn shadow_config(&self) -> Option<ShadowConfig> {
        let kept: Vec<KeptSite> = self
            .layers
            .iter()
            .enumerate()
            .flat_map(|(layer, l)| {
                ShadowSite::ALL
                    .into_iter()
                    .filter(|site| l.quant[site.index()].shadows())
                    .map(move |site| KeptSite {
                        layer: layer as u32,
                        site,
                    })
            })
            .collect();
        if kept.is_empty() {
            return None;
        }
        // The share of input channels whose float rows are resident, over the kept sites'
        // linears (the planner's memory estimate; times are measured).
        let (mut hot, mut channels) = (0usize, 0usize);
        for site in &kept {
            let layer = &self.layers[site.layer as usize];
            for &p in Projection::of_site(site.site) {
                let w = layer.projection(p);
                if let Some(rows) = w.shadow() {
                    hot += rows.hot_channels();
                    channels += w.k();
                }
            }
        }
        Some(ShadowConfig {
            hot_channels: hot as f64 / channels.max(1) as f64,
            ..ShadowConfig::with_sites(kept)
        })
    }
}

/// How layer `layer` quantizes `site` (whose input rows are `width` wide): f32 passes
/// through, W8A8 uses the max scale, the shadow clips (every site without a calibration;
/// the kept ones with).
pub(super) fn site_rule(
    precision: LinearPrecision,
    setup: &ShadowSetup<'_>,
    layer: usize,
    (site, width): (ShadowSite, usize),
) -> QuantRule {
    let clip = QuantRule::Clip {
        rms: SHADOW_CLIP_RMS,
    };
    match (precision, setup) {
        (LinearPrecision::F32, _) => QuantRule::PassThrough,
        (LinearPrecision::W8a8 | LinearPrecision::W4a8, _) => QuantRule::MaxAbs,
        (LinearPrecision::W4a8G32, _) => QuantRule::Groups,
        (LinearPrecision::W4a8G128, _) => QuantRule::Groups128 { width },
        (LinearPrecision::W8a8Shadow | LinearPrecision::W4a8Shadow, ShadowSetup::Full) => clip,
        (
            LinearPrecision::W8a8Shadow | LinearPrecision::W4a8Shadow,
            ShadowSetup::Calibrated { calibration, .. },
        ) => match calibration.site(layer, site) {
            Some(s) if s.keep => clip,
            Some(s) => calibration.pruned_rule(s),
            None => QuantRule::MaxAbs,
        },
    }
}

/// The shadow rows of linear `w` (`[n, k]`, tensor `which` of layer `layer`, read at
/// `site` under `rule`): every row with the full setup, the calibrated hot channels' with
/// a calibration (cold rows read on demand), none where the rule does not shadow.
pub(super) fn shadow_rows(
    (w, n, k): (&[f32], usize, usize),
    rule: &QuantRule,
    setup: &ShadowSetup<'_>,
    (layer, site, which): (usize, ShadowSite, LayerTensor),
) -> Option<ShadowRows> {
    match (rule, setup) {
        (QuantRule::Clip { .. }, ShadowSetup::Full) => Some(ShadowRows::all(w, n, k)),
        (
            rule @ (QuantRule::Clip { .. } | QuantRule::HotMax { .. }),
            ShadowSetup::Calibrated {
                calibration,
                columns,
                cold_cache,
            },
        ) => {
            let hot = match rule {
                // A pruned site's outliers are mostly in these channels.
                QuantRule::HotMax { hot, .. } => (0..)
                    .zip(hot.iter())
                    .filter(|&(_, &h)| h)
                    .map(|(c, _)| c)
                    .collect(),
                _ => calibration
                    .site(layer, site)
                    .map(|s| s.hot_channel_ids())
                    .unwrap_or_default(),
            };
            let cold = ColdRows {
                source: columns.clone(),
                layer,
                which,
                cache: cold_cache.clone(),
            };
            Some(ShadowRows::hot(w, n, k, &hot, cold))
        }
        _ => None,
    }
}
