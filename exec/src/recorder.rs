//! The activations of a float prefill, seen before their (pass-through) quantize: per
//! site, the running statistics a [`crate::Calibration`] is made of (range, RMS, a
//! histogram of |x| for the percentile scale, outliers beyond the run-time clip per
//! channel, the channels ranked by max |x|).

use hetsched_systems::shadow::ShadowSite;
use parking_lot::Mutex;

use crate::calibration::{HotChannel, SiteCalibration, site_channels, site_row_bytes};
use crate::values::clip_limit;
use crate::weights::ExecModel;

/// Histogram bins per octave of |x| (for the percentile scale): 1/16 octave, a 4.4%
/// step, finer than the INT8 grid's own relative step near its top.
const BINS_PER_OCTAVE: f32 = 16.0;
/// |x| below 2^-`LOW_OCTAVES` shares the first bin.
const LOW_OCTAVES: f32 = 32.0;
/// Octaves covered: 2^-32 .. 2^32.
const OCTAVES: usize = 64;

/// Channels per site that calibration ranks by max |x| (what [`PrunedScale::HotMax`](crate::shadow::PrunedScale::HotMax)
/// can keep; a pruned site keeps as many as `Calibration::pruned_shadow_bytes` hold).
pub const TOP_CHANNELS: usize = 256;

/// Running statistics of one site.
#[derive(Debug, Clone)]
struct SiteAccumulator {
    channels: usize,
    min: f32,
    max: f32,
    sum_squares: f64,
    elements: u64,
    importance: f32,
    outliers: u64,
    channel_outliers: Vec<u64>,
    channel_max: Vec<f32>,
    histogram: Vec<u64>,
}

impl SiteAccumulator {
    fn new() -> Self {
        Self {
            channels: 0,
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            sum_squares: 0.0,
            elements: 0,
            importance: 1.0,
            outliers: 0,
            channel_outliers: Vec::new(),
            channel_max: Vec::new(),
            histogram: vec![0; OCTAVES * BINS_PER_OCTAVE as usize],
        }
    }

    fn observe(&mut self, x: &[f32], channels: usize, clip: f32) {
        if x.is_empty() || channels == 0 {
            return;
        }
        if self.channel_outliers.len() != channels {
            self.channels = channels;
            self.channel_outliers = vec![0; channels];
            self.channel_max = vec![0.0; channels];
        }
        let limit = clip_limit(x, clip);
        let last = self.histogram.len() - 1;
        let mut max_abs = 0f32;
        for (i, &v) in x.iter().enumerate() {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
            self.sum_squares += f64::from(v) * f64::from(v);
            let a = v.abs();
            max_abs = max_abs.max(a);
            let channel_max = &mut self.channel_max[i % channels];
            *channel_max = channel_max.max(a);
            let bin = ((a.log2() + LOW_OCTAVES) * BINS_PER_OCTAVE).max(0.0) as usize;
            self.histogram[bin.min(last)] += 1;
            if a > limit {
                self.outliers += 1;
                self.channel_outliers[i % channels] += 1;
            }
        }
        self.elements += x.len() as u64;
        if limit > 0.0 {
            self.importance = self.importance.max(max_abs / limit);
        }
    }

    /// The upper edge of the histogram bin holding the `percentile`-th |x|.
    fn percentile(&self, percentile: f64) -> f32 {
        let wanted = (percentile / 100.0 * self.elements as f64).ceil() as u64;
        let mut seen = 0;
        for (bin, &count) in self.histogram.iter().enumerate() {
            seen += count;
            if seen >= wanted.max(1) {
                return ((bin + 1) as f32 / BINS_PER_OCTAVE - LOW_OCTAVES).exp2();
            }
        }
        self.max.abs().max(self.min.abs())
    }

    /// Up to [`TOP_CHANNELS`] channels by descending max |x| (ties: lower index first).
    fn top_channels(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.channel_max.len() as u32).collect();
        order.sort_by(|&a, &b| {
            self.channel_max[b as usize]
                .total_cmp(&self.channel_max[a as usize])
                .then(a.cmp(&b))
        });
        order.truncate(TOP_CHANNELS);
        order
    }

    fn finish(
        &self,
        layer: usize,
        site: ShadowSite,
        row_bytes: u64,
        percentile: f64,
    ) -> SiteCalibration {
        let max_abs = self.max.abs().max(self.min.abs());
        let seen = self.elements > 0;
        let top_channels = self.top_channels();
        SiteCalibration {
            layer,
            site,
            channels: self.channels,
            min: if seen { self.min } else { 0.0 },
            max: if seen { self.max } else { 0.0 },
            rms: (self.sum_squares / self.elements.max(1) as f64).sqrt() as f32,
            scale_max: max_abs / 127.0,
            // Never above the max scale: the histogram's bin edge may overshoot it.
            scale_percentile: self.percentile(percentile).min(max_abs) / 127.0,
            importance: self.importance,
            sensitivity: None,
            elements: self.elements,
            outliers: self.outliers,
            keep: true,
            top_channel_max: top_channels
                .iter()
                .map(|&c| self.channel_max[c as usize])
                .collect(),
            top_channels,
            row_bytes,
            hot_channels: self
                .channel_outliers
                .iter()
                .enumerate()
                .filter(|&(_, &n)| n > 0)
                .map(|(c, &n)| HotChannel {
                    channel: c as u32,
                    outliers: n,
                })
                .collect(),
        }
    }
}

/// Sees every activation of a float prefill before its (pass-through) quantize.
#[derive(Debug)]
pub struct ActivationRecorder {
    clip: f32,
    /// Input channels of each site's linears.
    channels: [usize; 4],
    /// Bytes of one input channel's float row over each site's linears.
    row_bytes: [u64; 4],
    /// `[layer * 4 + site]`.
    sites: Mutex<Vec<SiteAccumulator>>,
}

impl ActivationRecorder {
    /// A recorder for `model`'s layers, counting values beyond `clip` RMS as outliers.
    pub fn new(model: &ExecModel, clip: f32) -> Self {
        let channels = site_channels(&model.config);
        let row_bytes = site_row_bytes(&model.config);
        Self {
            clip,
            channels,
            row_bytes,
            sites: Mutex::new(vec![
                SiteAccumulator::new();
                model.layers.len() * ShadowSite::ALL.len()
            ]),
        }
    }

    /// Records activation `x` (rows of the site's input channels) of `site` in layer
    /// `layer`.
    pub fn observe(&self, layer: usize, site: ShadowSite, x: &[f32]) {
        let mut sites = self.sites.lock();
        if let Some(acc) = sites.get_mut(layer * ShadowSite::ALL.len() + site.index()) {
            acc.observe(x, self.channels[site.index()], self.clip);
        }
    }

    /// Every site's calibration from what was recorded, scales at `percentile`.
    pub(crate) fn finish(&self, percentile: f64) -> Vec<SiteCalibration> {
        let sites = self.sites.lock();
        sites
            .iter()
            .enumerate()
            .map(|(i, acc)| {
                let site = ShadowSite::ALL[i % ShadowSite::ALL.len()];
                acc.finish(
                    i / ShadowSite::ALL.len(),
                    site,
                    self.row_bytes[site.index()],
                    percentile,
                )
            })
            .collect()
    }
}
