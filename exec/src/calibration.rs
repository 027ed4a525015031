//! The calibration file: per activation site of every layer, the ranges and outliers a
//! float prefill over a corpus saw, the site's importance, whether its outlier shadow is
//! kept, and its hot channels (seed 000 section 3.3, Figs 10-11).
//!
//! JSON, versioned ([`CALIBRATION_VERSION`]), and tied to one model by a
//! [`ModelIdentity`]: a file made for another model is refused with a clear error instead
//! of silently shadowing the wrong channels.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use hetsched_systems::shadow::ShadowSite;

use super::error::CalibrationError;
use super::shadow::{PrunedScale, QuantRule};
use super::steps::projection_tensor;
use hetsched_import::limits;
use hetsched_import::{ImportError, LayerTensor, LlamaConfig, LlamaSource};
use hetsched_systems::op::Projection;

/// The calibration file format this build reads and writes.
pub const CALIBRATION_VERSION: u32 = 3;

/// The share of a site's channels that Fig. 11's statistic calls "top" channels.
pub const TOP_CHANNEL_SHARE: f64 = 0.03;

/// Which model a calibration belongs to: shapes, name and a fingerprint of its norm
/// weights (FNV-1a over their bits; they differ between checkpoints of one architecture
/// and are stored unquantized in every format).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    /// `general.name` or the checkpoint directory's name.
    pub name: String,
    /// Decoder layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// FFN size.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Hex FNV-1a 64 of every norm weight's f32 bits.
    pub fingerprint: String,
    /// Width of the query heads together (the O site's channels), written only where it
    /// is not the hidden size (Gemma 3: 4 heads of 256 on a hidden of 640).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_dim: Option<usize>,
}

impl std::fmt::Display for ModelIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} ({} layers, hidden {}, ffn {}, vocab {}, fingerprint {})",
            self.name, self.layers, self.hidden, self.ffn, self.vocab, self.fingerprint
        )
    }
}

impl ModelIdentity {
    pub(crate) fn new<'a>(
        name: String,
        c: &LlamaConfig,
        norms: impl Iterator<Item = &'a [f32]>,
    ) -> Self {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for v in norms.flatten() {
            for b in v.to_bits().to_le_bytes() {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        Self {
            q_dim: (c.q_dim() != c.hidden).then_some(c.q_dim()),
            name,
            layers: c.n_layers,
            hidden: c.hidden,
            ffn: c.ffn,
            vocab: c.vocab_size,
            fingerprint: format!("{hash:016x}"),
        }
    }

    /// The identity of a model file, read from its norm weights only.
    pub fn of_source(source: &dyn LlamaSource) -> Result<Self, ImportError> {
        let c = source.config();
        let mut norms = Vec::with_capacity(2 * c.n_layers + 1);
        for l in 0..c.n_layers {
            norms.push(source.layer(l, LayerTensor::AttnNorm)?);
            norms.push(source.layer(l, LayerTensor::FfnNorm)?);
        }
        norms.push(source.output_norm()?);
        Ok(Self::new(source.name(), c, norms.iter().map(|v| &v[..])))
    }
}

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

    /// Reads the calibration at `path`.
    pub fn load(path: &Path) -> Result<Self, CalibrationError> {
        let text = hetsched_import::limits::read_text(
            path,
            hetsched_import::limits::MAX_CALIBRATION_BYTES,
        )
        .map_err(|source| CalibrationError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses calibration JSON held in memory, with the checks of [`Self::load`];
    /// `path` only names the file in errors. (The fuzzer `examples/fuzz_parsers.rs`
    /// drives this.)
    pub fn parse(text: &str, path: &Path) -> Result<Self, CalibrationError> {
        let corrupt = |reason: String| CalibrationError::Corrupt {
            path: path.to_owned(),
            reason,
        };
        // The version first: a file of another version may not parse as this one.
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
        let version = value
            .get("version")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| corrupt("no `version` number".into()))?;
        if version != u64::from(CALIBRATION_VERSION) {
            return Err(CalibrationError::Version {
                path: path.to_owned(),
                found: version,
                expected: CALIBRATION_VERSION,
            });
        }
        let calibration: Self =
            serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        calibration.validate().map_err(corrupt)?;
        if !valid_pruned_clip(calibration.pruned_clip_rms) {
            return Err(corrupt(format!(
                "`pruned_clip_rms` {} is not a finite clip of at least 1 RMS",
                calibration.pruned_clip_rms
            )));
        }
        Ok(calibration)
    }

    /// Checks the sites against the model the file names (which [`Self::check_model`]
    /// then ties to the model loaded): layers and channels in range, one entry per
    /// (layer, site), finite statistics and positive scales. Every later use indexes by
    /// these, so a hostile file fails here, not with a panic or a huge allocation.
    pub fn validate(&self) -> Result<(), String> {
        let m = &self.model;
        let dims = [
            ("model.layers", m.layers, limits::MAX_LAYERS),
            ("model.hidden", m.hidden, limits::MAX_HIDDEN),
            ("model.ffn", m.ffn, limits::MAX_FFN),
            ("model.vocab", m.vocab, limits::MAX_VOCAB),
            ("model.q_dim", m.q_dim.unwrap_or(0), limits::MAX_HIDDEN),
        ];
        for (what, value, max) in dims {
            limits::check(what, value as u64, max).map_err(|e| e.to_string())?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for s in &self.sites {
            let at = format!("site {:?} of layer {}", s.site, s.layer);
            if s.layer >= m.layers {
                return Err(format!("{at}: the model has {} layers", m.layers));
            }
            if !seen.insert((s.layer, s.site)) {
                return Err(format!("{at} appears twice"));
            }
            let width = match s.site {
                ShadowSite::Down => m.ffn,
                ShadowSite::O => m.q_dim.unwrap_or(m.hidden),
                ShadowSite::Qkv | ShadowSite::GateUp => m.hidden,
            };
            if s.channels > width {
                return Err(format!(
                    "{at} has {} channels, the model's site has {width}",
                    s.channels
                ));
            }
            let mut channels = s
                .hot_channels
                .iter()
                .map(|h| h.channel)
                .chain(s.top_channels.iter().copied());
            if let Some(c) = channels.find(|&c| c as usize >= s.channels) {
                return Err(format!("{at} names channel {c} of {}", s.channels));
            }
            if s.top_channel_max.len() != s.top_channels.len() {
                return Err(format!(
                    "{at}: top_channels and top_channel_max differ in length"
                ));
            }
            let mut stats = [s.min, s.max, s.rms, s.importance, s.scale_percentile]
                .into_iter()
                .chain(s.top_channel_max.iter().copied())
                .chain(s.sensitivity);
            if stats.any(|v| !v.is_finite()) {
                return Err(format!("{at} has a non-finite statistic"));
            }
            // A site that saw values has a positive max scale; none is negative.
            let observed = s.elements > 0 && s.max.abs().max(s.min.abs()) > 0.0;
            let bad_max =
                !s.scale_max.is_finite() || s.scale_max < 0.0 || (observed && s.scale_max == 0.0);
            if bad_max || s.scale_percentile < 0.0 || s.rms < 0.0 {
                return Err(format!(
                    "{at} has scale_max {} and scale_percentile {}: scales must be positive",
                    s.scale_max, s.scale_percentile
                ));
            }
        }
        Ok(())
    }

    /// Writes this calibration to `path` (pretty JSON), whole or not at all.
    pub fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        let text = serde_json::to_string_pretty(self).expect("a calibration always serialises");
        hetsched_runtime::fsutil::write_atomic(path, text.as_bytes()).map_err(|source| {
            CalibrationError::Write {
                path: path.to_owned(),
                source,
            }
        })
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

/// Where `hetsched calibrate` writes a model's calibration by default, and where `run`
/// and `eval` look for it: `FILE.gguf.calibration.json` beside a GGUF file,
/// `hetsched-calibration.json` inside a Hugging Face directory.
pub fn default_calibration_path(model: &Path) -> PathBuf {
    if model.is_dir() {
        model.join("hetsched-calibration.json")
    } else {
        let mut name = model.as_os_str().to_owned();
        name.push(".calibration.json");
        PathBuf::from(name)
    }
}
