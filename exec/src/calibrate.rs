//! `hetsched calibrate`: float prefill over a corpus, recording every activation that a
//! W8A8 model would quantize, into a [`Calibration`].
//!
//! Outliers are counted with the run-time rule (`clip_limit`: values beyond
//! min(max |x|, clip × the RMS of the bulk) of their tensor), so the channels calibration
//! calls hot are the ones whose float rows the shadow will need.
//!
//! Per site it also ranks the channels by their largest |x| (the rows a pruned site keeps
//! under [`PrunedScale::HotMax`]) and, with the W8A8-shadow model at hand, measures the
//! site's **sensitivity**: the KL divergence from the float logits that pruning that one
//! site adds, over the first windows ([`Importance::Kl`]). Which ranking keeps which
//! shadows, and what each buys on SmolLM2-135M, is in docs/outliers.md.

use std::sync::Arc;

use hetsched_systems::shadow::ShadowSite;

use super::calibration::{
    CALIBRATION_VERSION, Calibration, Importance, ModelIdentity, valid_pruned_clip,
};
use super::eval::{kl_divergence, log_softmax};
use super::recorder::ActivationRecorder;
use super::shadow::{PRUNED_CLIP_RMS, SHADOW_CLIP_RMS};
use super::shadow::{PrunedScale, QuantRule};
use super::weights::{ExecModel, LinearPrecision};
use super::{ExecError, PrefillOptions, prefill};
use hetsched_runtime::progress::{Progress, Silent};

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

    /// Fills every site's [`crate::SiteCalibration::sensitivity`]: the KL with that site
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
