//! A valid calibration of a tiny two-layer model (hidden 8, ffn 16, vocab 10): the start
//! the hostile-input tests edit and the parser fuzzer mutates. Included by path (it is not
//! part of `common/mod.rs`, whose model loader these two do not need).

use hetsched::exec::{
    Calibration, HotChannel, Importance, ModelIdentity, PrunedScale, SiteCalibration,
};
use hetsched::systems::shadow::ShadowSite;

/// The tiny model's width, feed-forward width and vocabulary.
pub const HIDDEN: usize = 8;
pub const FFN: usize = 16;
pub const VOCAB: usize = 10;

/// Every site of both layers, each with one hot channel; `sensitivity` for each site, and
/// the sites of the layers `kept` says keep their shadow.
pub fn tiny_calibration(sensitivity: Option<f32>, kept: fn(usize) -> bool) -> Calibration {
    let site = |layer: usize, which: ShadowSite, channels: usize| SiteCalibration {
        layer,
        site: which,
        channels,
        min: -1.0,
        max: 2.0,
        rms: 0.5,
        scale_max: 2.0 / 127.0,
        scale_percentile: 1.0 / 127.0,
        importance: 2.0,
        sensitivity,
        elements: 1000,
        outliers: 3,
        keep: kept(layer),
        hot_channels: vec![HotChannel {
            channel: 1,
            outliers: 3,
        }],
        top_channels: vec![1, 0],
        top_channel_max: vec![2.0, 1.0],
        row_bytes: 4 * channels as u64,
    };
    let sites = (0..2)
        .flat_map(|l| {
            ShadowSite::ALL.map(|s| site(l, s, if s == ShadowSite::Down { FFN } else { HIDDEN }))
        })
        .collect();
    Calibration {
        version: hetsched::exec::CALIBRATION_VERSION,
        model: ModelIdentity {
            name: "tiny".into(),
            layers: 2,
            hidden: HIDDEN,
            ffn: FFN,
            vocab: VOCAB,
            fingerprint: "0123456789abcdef".into(),
            q_dim: None,
        },
        corpus: vec!["corpus.txt".into()],
        ctx: 64,
        windows: 1,
        tokens: 64,
        clip_rms: 8.0,
        pruned_clip_rms: 8.0,
        percentile: 99.9,
        prune: 0.0,
        importance: Importance::default(),
        pruned_scale: PrunedScale::default(),
        pruned_shadow_bytes: 0,
        sites,
    }
}
