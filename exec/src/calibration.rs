//! The calibration file: per activation site of every layer, the ranges and outliers a
//! float prefill over a corpus saw, the site's importance, whether its outlier shadow is
//! kept, and its hot channels (seed 000 section 3.3, Figs 10-11).
//!
//! JSON, versioned ([`CALIBRATION_VERSION`]), and tied to one model by a
//! [`ModelIdentity`]: a file made for another model is refused with a clear error instead
//! of silently shadowing the wrong channels.

use serde::{Deserialize, Serialize};

use hetsched_systems::shadow::ShadowSite;

use super::error::CalibrationError;
use super::shadow::{PrunedScale, QuantRule};
use super::steps::projection_tensor;
use hetsched_import::LlamaConfig;
use hetsched_systems::op::Projection;

mod file;
mod identity;

pub use file::default_calibration_path;
pub use identity::ModelIdentity;

/// The calibration file format this build reads and writes.
pub const CALIBRATION_VERSION: u32 = 3;

/// The share of a site's channels that Fig. 11's statistic calls "top" channels.
pub const TOP_CHANNEL_SHARE: f64 = 0.03;

/// How calibration ranks the sites whose shadow is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Importance {
    /// Seed 000's ratio, largest outlier / clipped scale ([`SiteCalibration::importance`]):
    /// how much resolution the plain max scale loses.
    Ratio,
    /// The same ratio for the range a pruned site actually quantizes with: under
    /// [`PrunedScale::HotMax`] the max |x| outside the top channels it keeps (the
    /// paper's ratio overrates the sites whose outliers sit in a few channels, which a
    /// pruned site's channel shadow already covers).
    #[default]
    Residual,
    /// The KL divergence from f32 that pruning this one site adds to the final logits
    /// ([`SiteCalibration::sensitivity`]), measured on calibration windows.
    Kl,
}

/// A channel whose values exceeded the clipped range during calibration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotChannel {
    /// Input channel.
    pub channel: u32,
    /// Values beyond the range seen in it.
    pub outliers: u64,
}

/// What calibration saw at one activation site of one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteCalibration {
    /// Decoder layer.
    pub layer: usize,
    /// Which activation.
    pub site: ShadowSite,
    /// Input channels (the linears' k).
    pub channels: usize,
    /// Smallest value seen.
    pub min: f32,
    /// Largest value seen.
    pub max: f32,
    /// Root-mean-square over every value seen.
    pub rms: f32,
    /// Per-tensor scale from the whole range: max |x| / 127 (symmetric).
    pub scale_max: f32,
    /// Per-tensor scale from the calibration's percentile of |x| / 127 (clipped).
    pub scale_percentile: f32,
    /// Largest ratio of max |x| to the clipped range over the windows: how far the plain
    /// max scale stretches beyond the bulk (1 when nothing was clipped). Seed 000's
    /// importance: largest outlier / scale.
    pub importance: f32,
    /// The KL divergence from f32 (nats per position) that pruning only this site adds to
    /// the final logits over the calibration's first windows; `None` when not measured.
    pub sensitivity: Option<f32>,
    /// Values seen.
    pub elements: u64,
    /// Values beyond the clipped range.
    pub outliers: u64,
    /// Whether this site's outlier shadow runs (the others quantize with `scale_max`).
    pub keep: bool,
    /// Channels that had outliers, ascending.
    pub hot_channels: Vec<HotChannel>,
    /// The channels of largest max |x|, descending (at most
    /// [`TOP_CHANNELS`](super::TOP_CHANNELS)): the rows a pruned site keeps under
    /// [`PrunedScale::HotMax`].
    pub top_channels: Vec<u32>,
    /// The max |x| of each of `top_channels`.
    pub top_channel_max: Vec<f32>,
    /// Bytes of one input channel's float row over the site's linears (4 × their outputs).
    pub row_bytes: u64,
}

impl SiteCalibration {
    /// The hot channels' indices.
    pub fn hot_channel_ids(&self) -> Vec<u32> {
        self.hot_channels.iter().map(|h| h.channel).collect()
    }
}

/// Figs 10-11 of seed 000 for one site.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutlierStats {
    /// Decoder layer.
    pub layer: usize,
    /// Which activation.
    pub site: ShadowSite,
    /// Share of input channels that had an outlier.
    pub channels_with_outliers: f64,
    /// Share of the outliers that fell in the top `TOP_CHANNEL_SHARE` of channels
    /// (ranked by outlier count).
    pub outliers_in_top_channels: f64,
    /// Outliers per value.
    pub outlier_rate: f64,
    /// The site's importance.
    pub importance: f32,
    /// Whether its shadow is kept.
    pub keep: bool,
}

/// A model's calibration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// [`CALIBRATION_VERSION`].
    pub version: u32,
    /// The model calibrated.
    pub model: ModelIdentity,
    /// The corpus files.
    pub corpus: Vec<String>,
    /// Tokens per window.
    pub ctx: usize,
    /// Windows run.
    pub windows: usize,
    /// Tokens run.
    pub tokens: usize,
    /// The clip (in RMS of the bulk) that defines outliers, as at run time.
    pub clip_rms: f32,
    /// With [`PrunedScale::HotMax`]: a pruned site's ceiling, in RMS of the bulk.
    pub pruned_clip_rms: f32,
    /// The percentile of |x| behind `scale_percentile`.
    pub percentile: f64,
    /// Share of sites whose shadow is dropped (the least important).
    pub prune: f64,
    /// Which score ranks the sites for pruning.
    pub importance: Importance,
    /// How pruned sites scale their activations.
    pub pruned_scale: PrunedScale,
    /// With [`PrunedScale::HotMax`]: the float-row bytes each pruned site may keep
    /// resident, spent on its top channels in order (at most 256 channels).
    pub pruned_shadow_bytes: u64,
    /// Every layer's four sites, in (layer, site) order.
    pub sites: Vec<SiteCalibration>,
}

impl Calibration {
    /// Site `site` of layer `layer`.
    pub fn site(&self, layer: usize, site: ShadowSite) -> Option<&SiteCalibration> {
        self.sites
            .iter()
            .find(|s| s.layer == layer && s.site == site)
    }

    /// How many of `site`'s top channels keep a shadow once it is pruned: as many as
    /// [`Self::pruned_shadow_bytes`] of float rows hold under [`PrunedScale::HotMax`],
    /// none otherwise.
    pub fn pruned_channels(&self, site: &SiteCalibration) -> usize {
        if self.pruned_scale != PrunedScale::HotMax {
            return 0;
        }
        let rows = self.pruned_shadow_bytes / site.row_bytes.max(1);
        site.top_channels.len().min(rows as usize)
    }

    /// How `site` quantizes once pruned: [`Self::pruned_scale`]'s per-tensor rule, with
    /// the shadow of its [`Self::pruned_channels`] top channels (and, under
    /// [`PrunedScale::HotMax`], of the rare values beyond [`Self::pruned_clip_rms`]).
    pub fn pruned_rule(&self, site: &SiteCalibration) -> QuantRule {
        let channels = self.pruned_channels(site);
        match self.pruned_scale {
            PrunedScale::Percentile if site.scale_percentile > 0.0 => QuantRule::Static {
                scale: site.scale_percentile,
            },
            PrunedScale::HotMax if channels > 0 && site.channels > 0 => {
                let mut hot = vec![false; site.channels];
                for &c in &site.top_channels[..channels] {
                    if let Some(h) = hot.get_mut(c as usize) {
                        *h = true;
                    }
                }
                QuantRule::HotMax {
                    hot: hot.into(),
                    clip: self.pruned_clip_rms,
                }
            }
            _ => QuantRule::MaxAbs,
        }
    }

    /// `site`'s score under [`Self::importance`] (larger: kept first); `None` where
    /// calibration did not measure it.
    pub fn importance_of(&self, site: &SiteCalibration) -> Option<f32> {
        match self.importance {
            Importance::Ratio => Some(site.importance),
            Importance::Residual => {
                // The largest channel max left outside the kept channels (the last one
                // recorded bounds those never recorded).
                let kept = self.pruned_channels(site);
                let left = site
                    .top_channel_max
                    .get(kept)
                    .or(site.top_channel_max.last())
                    .copied()
                    .unwrap_or(0.0);
                Some(left / (self.clip_rms * site.rms).max(f32::MIN_POSITIVE))
            }
            Importance::Kl => site.sensitivity,
        }
    }

    /// Fails unless this calibration was made for `model`.
    pub fn check_model(&self, model: &ModelIdentity) -> Result<(), CalibrationError> {
        if &self.model == model {
            Ok(())
        } else {
            Err(CalibrationError::ModelMismatch {
                expected: self.model.to_string(),
                found: model.to_string(),
            })
        }
    }

    /// Fails unless every site's input channels and float-row bytes are `config`'s: a
    /// site's `row_bytes` sizes the rows a pruned site keeps, so a wrong one would change
    /// the answer without a word. (The fingerprint in [`Self::check_model`] ties the file
    /// to the model's tensors; this ties the figures in it to the model's shapes.)
    pub fn check_shapes(&self, config: &LlamaConfig) -> Result<(), CalibrationError> {
        let channels = site_channels(config);
        let row_bytes = site_row_bytes(config);
        for s in &self.sites {
            let (expected_channels, expected_bytes) =
                (channels[s.site.index()], row_bytes[s.site.index()]);
            if s.channels != expected_channels || s.row_bytes != expected_bytes {
                return Err(CalibrationError::Shape {
                    at: format!("site {} of layer {}", s.site.as_str(), s.layer),
                    found: format!("{} channels, row_bytes {}", s.channels, s.row_bytes),
                    expected: format!("{expected_channels} channels, row_bytes {expected_bytes}"),
                });
            }
        }
        Ok(())
    }

    /// Keeps the shadow of the `1 - rate` most important sites under
    /// [`Self::importance`] and drops the rest (ties: earlier layer and site first).
    pub fn prune(&mut self, rate: f64) -> Result<(), CalibrationError> {
        if !(0.0..=1.0).contains(&rate) {
            return Err(CalibrationError::InvalidPrune(rate));
        }
        let scores = self
            .sites
            .iter()
            .map(|s| self.importance_of(s))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| {
                CalibrationError::NoData(format!(
                    "the calibration has no {:?} importance for every site: run `hetsched calibrate --importance kl` again",
                    self.importance
                ))
            })?;
        let keep = ((1.0 - rate) * self.sites.len() as f64).round() as usize;
        let mut order: Vec<usize> = (0..self.sites.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        for (rank, &i) in order.iter().enumerate() {
            self.sites[i].keep = rank < keep;
        }
        self.prune = rate;
        Ok(())
    }

    /// Sites whose shadow is kept.
    pub fn kept_sites(&self) -> usize {
        self.sites.iter().filter(|s| s.keep).count()
    }

    /// Figs 10-11 per site.
    pub fn outlier_stats(&self) -> Vec<OutlierStats> {
        self.sites
            .iter()
            .map(|s| {
                let mut counts: Vec<u64> = s.hot_channels.iter().map(|h| h.outliers).collect();
                counts.sort_unstable_by(|a, b| b.cmp(a));
                let top = (TOP_CHANNEL_SHARE * s.channels as f64).ceil() as usize;
                let in_top: u64 = counts.iter().take(top).sum();
                OutlierStats {
                    layer: s.layer,
                    site: s.site,
                    channels_with_outliers: s.hot_channels.len() as f64 / s.channels.max(1) as f64,
                    outliers_in_top_channels: if s.outliers == 0 {
                        0.0
                    } else {
                        in_top as f64 / s.outliers as f64
                    },
                    outlier_rate: s.outliers as f64 / s.elements.max(1) as f64,
                    importance: s.importance,
                    keep: s.keep,
                }
            })
            .collect()
    }
}

/// Input channels of each site's linears (in [`ShadowSite::index`] order).
pub(crate) fn site_channels(c: &LlamaConfig) -> [usize; 4] {
    ShadowSite::ALL.map(|site| match site {
        ShadowSite::Qkv | ShadowSite::GateUp => c.hidden,
        ShadowSite::O => c.q_dim(),
        ShadowSite::Down => c.ffn,
    })
}

/// Bytes of one input channel's float row over each site's linears: 4 × their outputs.
pub(crate) fn site_row_bytes(c: &LlamaConfig) -> [u64; 4] {
    ShadowSite::ALL.map(|site| {
        let outputs: usize = Projection::of_site(site)
            .iter()
            .map(|&p| projection_tensor(p).shape(c)[0])
            .sum();
        4 * outputs as u64
    })
}

/// Whether `rms` can be a pruned site's ceiling: finite and at least one RMS (below that
/// most values would go to the shadow).
pub(super) fn valid_pruned_clip(rms: f32) -> bool {
    rms.is_finite() && rms >= 1.0
}
