//! `calibrate` (record activation outliers over a corpus, decide the shadow, write the
//! calibration file) and `outliers` (the statistics of such a file).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hetsched::exec::{self, Calibration, Importance, LinearPrecision, PrefillOptions};

use crate::CliError;
use crate::choices::{Rank, Scale};
use crate::model::{load, read_text};
use crate::output::{check_outputs, print_json_or, print_text, write_file};
use crate::progress::Bar;

/// `hetsched calibrate`.
#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// GGUF model file or Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    /// Text files to calibrate on (e.g. /usr/share/common-licenses/Apache-2.0).
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    corpus: Vec<PathBuf>,
    /// Where to write the calibration [default: MODEL.calibration.json beside the model].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Share of sites (layer x activation) whose outlier shadow is dropped: the least
    /// important ones under --importance.
    #[arg(long, default_value_t = 0.85)]
    prune: f64,
    /// How sites are ranked for pruning: residual (largest |x| a pruned site would
    /// quantize with, outside the channels it keeps, / clipped scale), ratio (seed 000:
    /// largest outlier / clipped scale) or kl (the KL divergence from f32 that pruning the
    /// site alone adds, measured on --sensitivity-windows; one prefill per site and window).
    #[arg(long, value_enum, default_value = "residual")]
    importance: Rank,
    /// With --pruned-scale hot-max: the float rows (KiB) each pruned site keeps resident
    /// for its channels of largest max |x| (at most 256 channels).
    #[arg(long, value_name = "KIB", default_value_t = 256)]
    pruned_shadow_kib: u64,
    /// With --pruned-scale hot-max: a pruned site's ceiling, in RMS of the activation's
    /// bulk; values beyond it in the other channels also go to the shadow, reading their
    /// rows from the model file (higher: fewer reads, less accuracy).
    #[arg(long, value_name = "RMS", default_value_t = exec::PRUNED_CLIP_RMS)]
    pruned_clip_rms: f32,
    /// Windows (the corpus's first) each site's kl importance is measured on.
    #[arg(long, default_value_t = 2)]
    sensitivity_windows: usize,
    /// Tokens per window.
    #[arg(long, default_value_t = 256)]
    ctx: usize,
    /// Windows at most over the whole corpus.
    #[arg(long, default_value_t = 16)]
    max_windows: usize,
    /// Percentile of |x| for each site's clipped scale.
    #[arg(long, default_value_t = 99.99)]
    percentile: f64,
    /// Scale of pruned sites: max (each tensor's max |x|), percentile (the calibrated
    /// percentile of |x|; values beyond saturate) or hot-max (the max |x| outside the
    /// site's top channels, as many as --pruned-shadow-kib holds, whose float rows shadow
    /// the values beyond).
    #[arg(long, value_enum, default_value = "hot-max")]
    pruned_scale: Scale,
    /// Compute threads [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Write the outlier statistics plot (SVG) here.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print the outlier statistics as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `hetsched outliers`.
#[derive(clap::Args)]
pub struct OutliersArgs {
    /// Calibration file written by `hetsched calibrate`.
    calibration: PathBuf,
    /// Write the plot (SVG) here.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Calibrates, prints the statistics, then writes the calibration and the plot.
pub fn calibrate(args: CalibrateArgs) -> Result<(), CliError> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| exec::default_calibration_path(&args.model));
    check_outputs([Some(out.as_path()), args.svg.as_deref()])?;
    let importance = Importance::from(args.importance);
    // The kl importance runs the model as w8a8-shadow with one site pruned at a time.
    let precisions: &[LinearPrecision] = match importance {
        Importance::Kl => &[LinearPrecision::F32, LinearPrecision::W8a8Shadow],
        Importance::Ratio | Importance::Residual => &[LinearPrecision::F32],
    };
    // The corpus is read (capped) before the model loads: a bad file fails at once.
    let mut texts = Vec::with_capacity(args.corpus.len());
    for path in &args.corpus {
        let text = read_text("corpus file", path, hetsched::limits::MAX_CORPUS_BYTES)?;
        texts.push((path.display().to_string(), text));
    }
    let loaded = load(&args.model, precisions, None, 0)?;
    let mut corpus = Vec::with_capacity(texts.len());
    for (name, text) in texts {
        corpus.push((name, loaded.tokenizer.encode(&text)?));
    }
    let mut models = loaded.models.into_iter();
    let model = Arc::new(models.next().expect("f32 asked for"));
    let options = calibrate_options(&args, importance);
    let calibration = exec::calibrate_with_progress(
        &model,
        models.next(),
        &corpus,
        &options,
        &mut Bar::new("prefills"),
    )?;
    if !args.json {
        print_text(&format!(
            "calibrated {} on {} windows ({} tokens); writing {}\n",
            model.name,
            calibration.windows,
            calibration.tokens,
            out.display()
        ));
    }
    show_outliers(&calibration, args.svg.as_deref(), args.json)?;
    calibration.save(&out)?;
    Ok(())
}

/// The library's options from the command line's.
fn calibrate_options(args: &CalibrateArgs, importance: Importance) -> exec::CalibrateOptions {
    let defaults = PrefillOptions::default();
    exec::CalibrateOptions {
        ctx: args.ctx,
        max_windows: args.max_windows,
        prune: args.prune,
        percentile: args.percentile,
        pruned_scale: args.pruned_scale.into(),
        pruned_shadow_bytes: args.pruned_shadow_kib * 1024,
        pruned_clip_rms: args.pruned_clip_rms,
        importance,
        sensitivity_windows: args.sensitivity_windows,
        prefill: PrefillOptions {
            threads: args.threads.unwrap_or(defaults.threads),
            ..defaults
        },
    }
}

/// The statistics of a calibration file.
pub fn outliers(args: OutliersArgs) -> Result<(), CliError> {
    check_outputs([args.svg.as_deref()])?;
    let calibration = Calibration::load(&args.calibration)?;
    show_outliers(&calibration, args.svg.as_deref(), args.json)
}

/// Prints a calibration's outlier statistics (table or JSON), then writes the plot.
fn show_outliers(
    calibration: &Calibration,
    svg: Option<&Path>,
    json: bool,
) -> Result<(), CliError> {
    if json {
        let stats = calibration.outlier_stats();
        let (channels, top) = hetsched::outliers::means(&stats);
        let value = serde_json::json!({
            "model": calibration.model,
            "prune": calibration.prune,
            "kept_sites": calibration.kept_sites(),
            "sites": stats.len(),
            "mean_channels_with_outliers": channels,
            "mean_outliers_in_top_channels": top,
            "stats": stats,
        });
        print_json_or(true, &value, String::new);
    } else {
        print_text(&hetsched::outliers::table(calibration));
    }
    if let Some(path) = svg {
        let title = format!(
            "{}: activation outliers beyond {} RMS ({} windows of {})",
            calibration.model.name, calibration.clip_rms, calibration.windows, calibration.ctx
        );
        write_file(path, &hetsched::outliers::to_svg(&title, calibration))?;
    }
    Ok(())
}
