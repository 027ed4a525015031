//! Which activations keep a float shadow: the sites of a layer, the kept ones, and the
//! model file's `[shadow]` table that chooses them. It names no model: the model's
//! configuration holds a [`ShadowConfig`], and what the shadow costs on a model is the
//! parent module's.

use serde::{Deserialize, Serialize};

use crate::error::PlanError;

/// One quantized activation of a llama layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShadowSite {
    /// The attention norm's output, read by q, k and v.
    Qkv,
    /// The attention output, read by o.
    O,
    /// The FFN norm's output, read by gate and up.
    GateUp,
    /// SiLU(gate) * up, read by down.
    Down,
}

impl ShadowSite {
    /// Every site, in layer order.
    pub const ALL: [ShadowSite; 4] = [
        ShadowSite::Qkv,
        ShadowSite::O,
        ShadowSite::GateUp,
        ShadowSite::Down,
    ];

    /// Position in [`Self::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Short name (`qkv`, `o`, `gate_up`, `down`), as in calibration files.
    pub fn as_str(self) -> &'static str {
        match self {
            ShadowSite::Qkv => "qkv",
            ShadowSite::O => "o",
            ShadowSite::GateUp => "gate_up",
            ShadowSite::Down => "down",
        }
    }

    /// Display label of the shadow operator of this site, e.g. `down_shadow`.
    pub fn op_name(self) -> String {
        format!("{}_shadow", self.as_str())
    }
}

/// A kept site: its layer and which activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeptSite {
    /// Decoder layer.
    pub layer: u32,
    /// Which activation of the layer.
    pub site: ShadowSite,
}

/// The outlier shadow of a model, as a model file's optional `[shadow]` table.
///
/// ```toml
/// [shadow]
/// keep = 0.15                 # prune the shadow of 85% of the sites (seed 000)
/// priority = ["down", "qkv", "gate_up", "o"]
/// outlier_channels = 0.003    # share of a token's input channels beyond the clip
/// hot_channels = 0.03         # share of float weight rows kept resident
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// Share of the sites (4 per layer) that keep their shadow; the rest are pruned.
    #[serde(default = "default_keep")]
    pub keep: f64,
    /// Site kinds from most to least important: kept sites are taken kind by kind, each
    /// kind's spread evenly over the layers. Default: `down`, `qkv`, `gate_up`, `o` (the
    /// order of median importance `hetsched calibrate` measured on SmolLM2-135M).
    #[serde(default = "default_priority")]
    pub priority: Vec<ShadowSite>,
    /// The kept sites, as a calibration decided them; overrides `keep` and `priority`.
    #[serde(default)]
    pub sites: Option<Vec<KeptSite>>,
    /// Share of a token's input channels whose values lie beyond the clipped scale (seed
    /// 000: 0.1-0.3% of the channels).
    #[serde(default = "default_outlier_channels")]
    pub outlier_channels: f64,
    /// Share of each kept linear's float weight rows kept resident (seed 000: fewer than
    /// 3% of the channels hold most outliers); the others are read from the model file.
    #[serde(default = "default_hot_channels")]
    pub hot_channels: f64,
}

fn default_keep() -> f64 {
    0.15
}

fn default_priority() -> Vec<ShadowSite> {
    vec![
        ShadowSite::Down,
        ShadowSite::Qkv,
        ShadowSite::GateUp,
        ShadowSite::O,
    ]
}

fn default_outlier_channels() -> f64 {
    0.003
}

fn default_hot_channels() -> f64 {
    0.03
}

impl Default for ShadowConfig {
    fn default() -> Self {
        ShadowConfig {
            keep: default_keep(),
            priority: default_priority(),
            sites: None,
            outlier_channels: default_outlier_channels(),
            hot_channels: default_hot_channels(),
        }
    }
}

impl ShadowConfig {
    /// Exactly these sites, with the default densities.
    pub fn with_sites(sites: Vec<KeptSite>) -> Self {
        ShadowConfig {
            sites: Some(sites),
            ..ShadowConfig::default()
        }
    }

    /// Checks ranges and site names against a model of `layers` layers.
    pub fn validate(&self, layers: u32) -> Result<(), PlanError> {
        let bad = |what: String| Err(PlanError::InvalidModel(format!("[shadow]: {what}")));
        let share = |v: f64| (0.0..=1.0).contains(&v);
        if !share(self.keep) {
            return bad(format!("keep = {} must lie in [0, 1]", self.keep));
        }
        if !(self.outlier_channels > 0.0 && self.outlier_channels <= 1.0) {
            return bad(format!(
                "outlier_channels = {} must lie in (0, 1]",
                self.outlier_channels
            ));
        }
        if !share(self.hot_channels) {
            return bad(format!(
                "hot_channels = {} must lie in [0, 1]",
                self.hot_channels
            ));
        }
        let mut seen = self.priority.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != self.priority.len() {
            return bad("priority names a site twice".into());
        }
        if let Some(sites) = &self.sites
            && let Some(s) = sites.iter().find(|s| s.layer >= layers)
        {
            return bad(format!(
                "site {} of layer {} is beyond the model's {layers} layers",
                s.site.as_str(),
                s.layer
            ));
        }
        Ok(())
    }

    /// The kept sites of a model of `layers` layers, sorted by (layer, site).
    pub fn kept_sites(&self, layers: u32) -> Vec<KeptSite> {
        let mut kept = match &self.sites {
            Some(sites) => sites.clone(),
            None => {
                let total = f64::from(layers) * ShadowSite::ALL.len() as f64;
                let mut left = (self.keep * total).round() as u32;
                let mut kept = Vec::new();
                for &site in &self.priority {
                    let count = left.min(layers);
                    left -= count;
                    // Evenly spread: the middle layer of each of `count` equal bands.
                    kept.extend((0..count).map(|i| KeptSite {
                        layer: ((2 * u64::from(i) + 1) * u64::from(layers) / (2 * u64::from(count)))
                            as u32,
                        site,
                    }));
                }
                kept
            }
        };
        kept.sort_unstable();
        kept.dedup();
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_share_takes_sites_by_priority_spread_over_layers() {
        let config = ShadowConfig {
            keep: 0.15,
            ..ShadowConfig::default()
        };
        // 24 layers x 4 sites x 0.15 = 14.4 -> 14 down sites.
        let kept = config.kept_sites(24);
        assert_eq!(kept.len(), 14);
        assert!(kept.iter().all(|s| s.site == ShadowSite::Down));
        let layers: Vec<u32> = kept.iter().map(|s| s.layer).collect();
        assert_eq!(layers.first(), Some(&0));
        assert_eq!(layers.last(), Some(&23));
        // Past one kind the next takes over.
        let all = ShadowConfig {
            keep: 1.0,
            ..ShadowConfig::default()
        };
        assert_eq!(all.kept_sites(3).len(), 12);
        let none = ShadowConfig {
            keep: 0.0,
            ..ShadowConfig::default()
        };
        assert!(none.kept_sites(3).is_empty());
    }

    #[test]
    fn bad_settings_are_refused_with_the_field_named() {
        let bad = ShadowConfig {
            keep: 1.5,
            ..ShadowConfig::default()
        };
        assert!(bad.validate(2).unwrap_err().to_string().contains("keep"));
        let beyond = ShadowConfig::with_sites(vec![KeptSite {
            layer: 9,
            site: ShadowSite::O,
        }]);
        assert!(
            beyond
                .validate(2)
                .unwrap_err()
                .to_string()
                .contains("layer 9")
        );
    }
}
