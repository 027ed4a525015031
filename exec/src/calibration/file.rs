//! The calibration file on disk: read with its limits and checks (a hostile file fails
//! here, not later), written whole or not at all, and where it is looked for.

use std::path::{Path, PathBuf};

use hetsched_import::limits;
use hetsched_systems::shadow::ShadowSite;

use super::{CALIBRATION_VERSION, Calibration, valid_pruned_clip};
use crate::error::CalibrationError;

impl Calibration {
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
