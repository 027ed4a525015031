//! `hetsched calibrate`: float prefill over a corpus, recording every activation that a
//! W8A8 model would quantize, into a [`Calibration`].
//!
//! Outliers are counted with the run-time rule ([`clip_limit`]: values beyond
//! min(max |x|, clip × the RMS of the bulk) of their tensor), so the channels calibration
//! calls hot are the ones whose float rows the shadow will need.
//!
//! Per site it also ranks the channels by their largest |x| (the rows a pruned site keeps
//! under [`PrunedScale::HotMax`]) and, with the W8A8-shadow model at hand, measures the
//! site's **sensitivity**: the KL divergence from the float logits that pruning that one
//! site adds, over the first windows ([`Importance::Kl`]). Which ranking keeps which
//! shadows, and what each buys on SmolLM2-135M, is in docs/outliers.md.

use std::sync::Arc;

use hetsched_systems::op::Projection;
use hetsched_systems::shadow::ShadowSite;
use parking_lot::Mutex;

use super::calibration::{
    CALIBRATION_VERSION, Calibration, HotChannel, Importance, ModelIdentity, SiteCalibration,
    valid_pruned_clip,
};
use super::eval::{kl_divergence, log_softmax};
use super::shadow::{PrunedScale, QuantRule};
use super::steps::projection_tensor;
use super::values::{PRUNED_CLIP_RMS, SHADOW_CLIP_RMS, clip_limit};
use super::weights::{ExecModel, LinearPrecision};
use super::{ExecError, PrefillOptions, prefill};
use hetsched_runtime::progress::{Progress, Silent};

/// Histogram bins per octave of |x| (for the percentile scale): 1/16 octave, a 4.4%
/// step, finer than the INT8 grid's own relative step near its top.
const BINS_PER_OCTAVE: f32 = 16.0;
/// |x| below 2^-`LOW_OCTAVES` shares the first bin.
const LOW_OCTAVES: f32 = 32.0;
/// Octaves covered: 2^-32 .. 2^32.
const OCTAVES: usize = 64;

/// Channels per site that calibration ranks by max |x| (what [`PrunedScale::HotMax`]
/// can keep; a pruned site keeps as many as `Calibration::pruned_shadow_bytes` hold).
pub const TOP_CHANNELS: usize = 256;

/// How to calibrate.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    /// Tokens per window (one prefill each).
    pub ctx: usize,
    /// Windows at most, over the whole corpus.
    pub max_windows: usize,
    /// Share of sites whose shadow is dropped.
    pub prune: f64,
    /// Percentile of |x| for the clipped scale (e.g. 99.99).
    pub percentile: f64,
    /// How pruned sites scale their activations.
    pub pruned_scale: PrunedScale,
    /// With [`PrunedScale::HotMax`]: the float-row bytes each pruned site may keep.
    pub pruned_shadow_bytes: u64,
    /// With [`PrunedScale::HotMax`]: a pruned site's ceiling in RMS of the bulk
    /// ([`PRUNED_CLIP_RMS`] by default).
    pub pruned_clip_rms: f32,
    /// Which score ranks the sites for pruning ([`Importance::Kl`] needs the shadow model).
    pub importance: Importance,
    /// Windows (the first ones) that each site's sensitivity is measured on.
    pub sensitivity_windows: usize,
    /// Threads, device, policy.
    pub prefill: PrefillOptions,
}

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
        let c = &model.config;
        let channels = ShadowSite::ALL.map(|site| match site {
            ShadowSite::Qkv | ShadowSite::GateUp => c.hidden,
            ShadowSite::O => c.q_dim(),
            ShadowSite::Down => c.ffn,
        });
        let row_bytes = ShadowSite::ALL.map(|site| {
            let outputs: usize = Projection::of_site(site)
                .iter()
                .map(|&p| projection_tensor(p).shape(c)[0])
                .sum();
            4 * outputs as u64
        });
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

    fn finish(&self, percentile: f64) -> Vec<SiteCalibration> {
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

/// Calibrates the f32 `model` on `corpus` (each text's name and tokens): windows of
/// `options.ctx` tokens, one float prefill each, at most `options.max_windows`; with
/// `shadow` (the same model loaded for W8A8-shadow, every row resident), each site's
/// sensitivity on the first `options.sensitivity_windows`; then prunes the shadow of the
/// `options.prune` least important sites under `options.importance`.
pub fn calibrate(
    model: &Arc<ExecModel>,
    shadow: Option<ExecModel>,
    corpus: &[(String, Vec<u32>)],
    options: &CalibrateOptions,
) -> Result<Calibration, ExecError> {
    calibrate_with_progress(model, shadow, corpus, options, &mut Silent)
}

/// [`calibrate`], counting its prefills (windows, then sites x sensitivity windows) on
/// `progress`.
pub fn calibrate_with_progress(
    model: &Arc<ExecModel>,
    shadow: Option<ExecModel>,
    corpus: &[(String, Vec<u32>)],
    options: &CalibrateOptions,
    progress: &mut dyn Progress,
) -> Result<Calibration, ExecError> {
    check_options(model, options)?;
    let windows = corpus_windows(corpus, options)?;
    let sensitivity_windows = if shadow.is_some() {
        options.sensitivity_windows.min(windows.len())
    } else {
        0
    };
    let recorder = Arc::new(ActivationRecorder::new(model, SHADOW_CLIP_RMS));
    let prefill_options = PrefillOptions {
        chunk_len: options.ctx as u32,
        recorder: Some(recorder.clone()),
        ..options.prefill.clone()
    };
    let sites = model.layers.len() * ShadowSite::ALL.len();
    progress.set_len((windows.len() + sites * usize::from(sensitivity_windows > 0)) as u64);
    // The float log-probabilities of the sensitivity windows, every position.
    let mut reference = Vec::with_capacity(sensitivity_windows);
    for (w, window) in windows.iter().enumerate() {
        let keep_logits = w < sensitivity_windows;
        let run = prefill(
            model.clone(),
            window,
            &PrefillOptions {
                all_logits: keep_logits,
                ..prefill_options.clone()
            },
        )?;
        if keep_logits {
            reference.push(log_probs(&run.logits, model.config.vocab_size));
        }
        progress.inc(1);
    }
    let mut calibration = Calibration {
        version: CALIBRATION_VERSION,
        model: ModelIdentity::of_model(model),
        corpus: corpus.iter().map(|(name, _)| name.clone()).collect(),
        ctx: options.ctx,
        windows: windows.len(),
        tokens: windows.iter().map(|w| w.len()).sum(),
        clip_rms: SHADOW_CLIP_RMS,
        pruned_clip_rms: options.pruned_clip_rms,
        percentile: options.percentile,
        prune: 0.0,
        importance: options.importance,
        pruned_scale: options.pruned_scale,
        pruned_shadow_bytes: options.pruned_shadow_bytes,
        sites: recorder.finish(options.percentile),
    };
    if let Some(shadow) = shadow.filter(|_| sensitivity_windows > 0) {
        let probe = SensitivityProbe {
            windows: &windows[..sensitivity_windows],
            reference: &reference,
            options: &PrefillOptions {
                chunk_len: options.ctx as u32,
                all_logits: true,
                ..options.prefill.clone()
            },
        };
        probe.measure(&mut calibration, shadow, progress)?;
    }
    progress.finish();
    calibration.prune(options.prune)?;
    Ok(calibration)
}

/// Refuses, before any prefill, a model or options that cannot make a calibration.
fn check_options(model: &ExecModel, options: &CalibrateOptions) -> Result<(), ExecError> {
    if model.precision != LinearPrecision::F32 {
        return Err(ExecError::InvalidEval(
            "calibration records the float model's activations: load it with f32 precision".into(),
        ));
    }
    if options.ctx == 0 {
        return Err(ExecError::InvalidEval(
            "--ctx 0 makes empty windows: use at least 1 token per window".into(),
        ));
    }
    if !valid_pruned_clip(options.pruned_clip_rms) {
        return Err(ExecError::InvalidEval(format!(
            "--pruned-clip-rms {} is not a clip: give a finite number of RMS of at least 1, e.g. {PRUNED_CLIP_RMS}",
            options.pruned_clip_rms
        )));
    }
    Ok(())
}

/// The corpus cut into windows of `options.ctx` tokens, at most `options.max_windows`.
fn corpus_windows<'a>(
    corpus: &'a [(String, Vec<u32>)],
    options: &CalibrateOptions,
) -> Result<Vec<&'a [u32]>, ExecError> {
    let windows: Vec<&[u32]> = corpus
        .iter()
        .flat_map(|(_, tokens)| tokens.chunks(options.ctx))
        .take(options.max_windows)
        .collect();
    if windows.is_empty() {
        return Err(ExecError::InvalidEval(
            "the corpus has no tokens: give --corpus files with text".into(),
        ));
    }
    Ok(windows)
}

/// `[tokens, vocab]` logits as log-probabilities per position.
fn log_probs(logits: &[f32], vocab: usize) -> Vec<Vec<f64>> {
    logits.chunks_exact(vocab).map(log_softmax).collect()
}

/// Measures what pruning one site alone does to the W8A8-shadow logits.
struct SensitivityProbe<'a> {
    windows: &'a [&'a [u32]],
    /// The float log-probabilities of `windows`, per window and position.
    reference: &'a [Vec<Vec<f64>>],
    /// Prefill options: one chunk per window, every position's logits.
    options: &'a PrefillOptions,
}

impl SensitivityProbe<'_> {
    /// Mean KL(f32 || `model`) over every position of the windows, in nats.
    fn kl(&self, model: &Arc<ExecModel>) -> Result<f64, ExecError> {
        let vocab = model.config.vocab_size;
        let (mut kl, mut positions) = (0.0, 0usize);
        for (window, reference) in self.windows.iter().zip(self.reference) {
            let logits = prefill(model.clone(), window, self.options)?.logits;
            for (lq, logits) in reference.iter().zip(logits.chunks_exact(vocab)) {
                kl += kl_divergence(lq, &log_softmax(logits));
                positions += 1;
            }
        }
        Ok(kl / positions.max(1) as f64)
    }

    /// Fills every site's [`SiteCalibration::sensitivity`]: the KL with that site
    /// quantized as a pruned site ([`Calibration::pruned_rule`]) and every other shadowed,
    /// less the KL with every site shadowed. `shadow` must be the calibrated model loaded
    /// for W8A8-shadow without a calibration (every site shadowed).
    fn measure(
        &self,
        calibration: &mut Calibration,
        shadow: ExecModel,
        progress: &mut dyn Progress,
    ) -> Result<(), ExecError> {
        if shadow.precision != LinearPrecision::W8a8Shadow
            || ModelIdentity::of_model(&shadow) != calibration.model
        {
            return Err(ExecError::InvalidEval(
                "the sensitivity pass needs the calibrated model loaded for w8a8-shadow".into(),
            ));
        }
        let mut model = Arc::new(shadow);
        let shadowed = self.kl(&model)?;
        let pruned: Vec<QuantRule> = calibration
            .sites
            .iter()
            .map(|site| calibration.pruned_rule(site))
            .collect();
        for (site, pruned) in calibration.sites.iter_mut().zip(pruned) {
            let kept = swap_rule(&mut model, site.layer, site.site, pruned)?;
            let kl = self.kl(&model);
            swap_rule(&mut model, site.layer, site.site, kept)?;
            site.sensitivity = Some((kl? - shadowed) as f32);
            progress.inc(1);
        }
        Ok(())
    }
}

/// Sets how `model` quantizes `site` of layer `layer`; returns the rule it had.
fn swap_rule(
    model: &mut Arc<ExecModel>,
    layer: usize,
    site: ShadowSite,
    rule: QuantRule,
) -> Result<QuantRule, ExecError> {
    let model = Arc::get_mut(model).ok_or_else(|| {
        ExecError::InvalidEval("a finished prefill still holds the model it ran".into())
    })?;
    let slot = &mut model.layers[layer].quant[site.index()];
    Ok(std::mem::replace(slot, rule))
}
