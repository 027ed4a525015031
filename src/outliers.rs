//! Activation outlier statistics of a calibration (seed 000 Figs 10-11): a text table
//! and an SVG plot, one point per layer and activation site.

use std::fmt::Write;

use hetsched_systems::shadow::ShadowSite;

use crate::exec::{Calibration, OutlierStats};
use crate::timeline::svg::{escape, open_document};

/// Per layer: the share of channels with outliers and the share of outliers in the top
/// 3% channels, for each site, and whether the site's shadow is kept.
pub fn table(calibration: &Calibration) -> String {
    let stats = calibration.outlier_stats();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "layer  site     channels w/ outliers  outliers in top 3% ch.  outlier rate  importance  shadow"
    );
    for st in &stats {
        let _ = writeln!(
            s,
            "{:>5}  {:<7}  {:>20.1}%  {:>21.1}%  {:>11.4}%  {:>10.1}  {}",
            st.layer,
            st.site.as_str(),
            100.0 * st.channels_with_outliers,
            100.0 * st.outliers_in_top_channels,
            100.0 * st.outlier_rate,
            st.importance,
            if st.keep { "kept" } else { "pruned" }
        );
    }
    let (mean_channels, mean_top) = means(&stats);
    let _ = writeln!(
        s,
        "mean: {:.1}% of channels have outliers; {:.1}% of outliers fall in the top 3% of channels; {}/{} sites kept (prune {})",
        100.0 * mean_channels,
        100.0 * mean_top,
        calibration.kept_sites(),
        stats.len(),
        calibration.prune
    );
    s
}

/// Means over sites of the two statistics (sites without outliers count for the first
/// only).
pub fn means(stats: &[OutlierStats]) -> (f64, f64) {
    let n = stats.len().max(1) as f64;
    let with: Vec<&OutlierStats> = stats.iter().filter(|s| s.outlier_rate > 0.0).collect();
    (
        stats.iter().map(|s| s.channels_with_outliers).sum::<f64>() / n,
        with.iter().map(|s| s.outliers_in_top_channels).sum::<f64>() / with.len().max(1) as f64,
    )
}

const WIDTH: f64 = 900.0;
const PANEL_HEIGHT: f64 = 260.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 130.0;
const TOP: f64 = 50.0;
const GAP: f64 = 50.0;
/// One statistic of a site, plotted as a fraction.
type Statistic = fn(&OutlierStats) -> f64;

const COLORS: [&str; 4] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];

/// Two panels against the layer index, one line per site: (a) share of channels with
/// outliers, (b) share of outliers in the top 3% of channels. Pruned sites are hollow.
pub fn to_svg(title: &str, calibration: &Calibration) -> String {
    let stats = calibration.outlier_stats();
    let height = TOP + 2.0 * (PANEL_HEIGHT + GAP);
    let mut s = String::new();
    open_document(&mut s, WIDTH, height, LEFT, title);
    let panels: [(&str, Statistic); 2] = [
        ("(a) share of channels with outliers", |st| {
            st.channels_with_outliers
        }),
        ("(b) share of outliers in the top 3% of channels", |st| {
            st.outliers_in_top_channels
        }),
    ];
    let layers = stats.iter().map(|st| st.layer).max().unwrap_or(0).max(1) as f64;
    for (p, (label, value)) in panels.iter().enumerate() {
        let top = TOP + p as f64 * (PANEL_HEIGHT + GAP);
        panel_svg(&mut s, top, label, *value, &stats, layers);
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}">filled: shadow kept; hollow: pruned</text>"#,
        WIDTH - RIGHT - 220.0,
        height - 8.0
    );
    s.push_str("</svg>\n");
    s
}

/// One panel at `top`: title, axes with their ticks, then one line per site of `value`.
fn panel_svg(
    s: &mut String,
    top: f64,
    label: &str,
    value: Statistic,
    stats: &[OutlierStats],
    layers: f64,
) {
    let bottom = top + PANEL_HEIGHT;
    let plot_w = WIDTH - LEFT - RIGHT;
    let x = |layer: usize| LEFT + layer as f64 / layers * plot_w;
    let y = |v: f64| bottom - v.clamp(0.0, 1.0) * (PANEL_HEIGHT - 20.0);
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="{}">{}</text><line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#333"/><line x1="{LEFT}" y1="{}" x2="{LEFT}" y2="{bottom}" stroke="#333"/>"##,
        top + 6.0,
        escape(label),
        LEFT + plot_w,
        top + 12.0
    );
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{:.0}%</text><line x1="{LEFT}" y1="{y0}" x2="{}" y2="{y0}" stroke="#ddd"/>"##,
            LEFT - 6.0,
            y(tick) + 4.0,
            100.0 * tick,
            LEFT + plot_w,
            y0 = y(tick)
        );
    }
    for layer in (0..=layers as usize).step_by(5) {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{layer}</text>"#,
            x(layer),
            bottom + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">layer</text>"#,
        LEFT + plot_w / 2.0,
        bottom + 32.0
    );
    for (i, site) in ShadowSite::ALL.into_iter().enumerate() {
        site_svg(s, top, i, site, stats, &|st| (x(st.layer), y(value(st))));
    }
}

/// One site's line and points in a panel (hollow where the shadow is pruned), and its legend
/// entry; `at` maps a site's statistics to the point's panel coordinates.
fn site_svg(
    s: &mut String,
    top: f64,
    i: usize,
    site: ShadowSite,
    stats: &[OutlierStats],
    at: &impl Fn(&OutlierStats) -> (f64, f64),
) {
    let points: Vec<&OutlierStats> = stats.iter().filter(|st| st.site == site).collect();
    let path: Vec<String> = points
        .iter()
        .map(|st| {
            let (px, py) = at(st);
            format!("{px:.1},{py:.1}")
        })
        .collect();
    let _ = writeln!(
        s,
        r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.5"/>"#,
        path.join(" "),
        COLORS[i]
    );
    for st in &points {
        let fill = if st.keep { COLORS[i] } else { "white" };
        let (px, py) = at(st);
        let _ = writeln!(
            s,
            r#"<circle cx="{px:.1}" cy="{py:.1}" r="3" fill="{fill}" stroke="{}"/>"#,
            COLORS[i]
        );
    }
    let ly = top + 20.0 + 18.0 * i as f64;
    let _ = writeln!(
        s,
        r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
        WIDTH - RIGHT + 34.0,
        COLORS[i],
        WIDTH - RIGHT + 40.0,
        ly + 4.0,
        site.as_str(),
        lx = WIDTH - RIGHT + 14.0
    );
}
