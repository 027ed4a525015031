//! A self-contained SVG picture of a run: a lane per processor, a colour per chunk (per
//! request in a trace of several requests), idle
//! time as the grey lane background, and a time axis in milliseconds.

use std::fmt::Write as _;

use super::Trace;

const WIDTH: f64 = 1600.0;
const LEFT: f64 = 150.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 50.0;
const LANE_HEIGHT: f64 = 44.0;
/// How far below a lane's top an outlier shadow's bar starts.
const SHADOW_INSET: f64 = 18.0;
const LANE_GAP: f64 = 10.0;
/// Tableau 10: distinguishable, and readable on white (the facade's plots share it).
pub const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// `text` with the characters XML gives a meaning to escaped, for SVG text and
/// attributes.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Opens a `width` x `height` SVG document on a white background with `title` at the top
/// left (x = `left`): the start every plot of ours shares.
pub fn open_document(s: &mut String, width: f64, height: f64, left: f64, title: &str) {
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="24" font-size="15">{}</text>"#,
        escape(title)
    );
}

/// A tick step of 1, 2 or 5 times a power of ten giving at most about ten ticks.
pub(crate) fn tick_step_ms(span_ms: f64) -> f64 {
    let raw = (span_ms / 10.0).max(1e-6);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * power)
}

/// Renders `trace` as an SVG document.
pub fn to_svg(trace: &Trace) -> String {
    let plot = WIDTH - LEFT - RIGHT;
    let span_ns = trace.makespan_ns.max(1) as f64;
    let x = |ns: u64| LEFT + ns as f64 / span_ns * plot;
    let lanes_bottom = TOP + trace.lanes.len() as f64 * (LANE_HEIGHT + LANE_GAP);
    let axis_y = lanes_bottom + 4.0;
    let by_request = trace.slices.iter().any(|s| s.request.is_some());
    let swatches = trace
        .slices
        .iter()
        .map(|s| match s.request {
            Some(r) => u32::try_from(r).unwrap_or(u32::MAX).saturating_add(1),
            None => s.key.chunk + 1,
        })
        .max()
        .unwrap_or(0);
    let coloured_by = if by_request { "request" } else { "chunk" };
    let legend_y = axis_y + 40.0;
    let height = legend_y + 30.0;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{}</text>"#,
        escape(&trace.title)
    );
    lanes_svg(&mut svg, trace, plot);
    for s in &trace.slices {
        slice_svg(&mut svg, s, &x);
    }
    axis_svg(&mut svg, span_ns, plot, axis_y);
    legend_svg(&mut svg, trace, (coloured_by, swatches), legend_y);
    svg.push_str("\n</svg>\n");
    svg
}

/// One grey background bar per lane, named by its processor and kind.
fn lanes_svg(svg: &mut String, trace: &Trace, plot: f64) {
    for (lane, l) in trace.lanes.iter().enumerate() {
        let y = TOP + lane as f64 * (LANE_HEIGHT + LANE_GAP);
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{} ({})</text>"##,
            LEFT - 8.0,
            y + LANE_HEIGHT / 2.0 + 4.0,
            escape(&l.name),
            l.kind
        );
        let _ = writeln!(
            svg,
            r##"<rect x="{LEFT}" y="{y:.1}" width="{plot:.1}" height="{LANE_HEIGHT}" fill="#e6e6e6"/>"##
        );
    }
}

/// One slice as a bar in its lane, coloured by request or else by chunk, with a hover title; `x` maps a time
/// to the plot's x.
fn slice_svg(svg: &mut String, s: &super::Slice, x: &impl Fn(u64) -> f64) {
    let y = TOP + s.lane as f64 * (LANE_HEIGHT + LANE_GAP);
    let (x0, x1) = (x(s.start_ns), x(s.end_ns));
    let colour = PALETTE[s.request.unwrap_or(u64::from(s.key.chunk)) as usize % PALETTE.len()];
    // An outlier shadow is drawn as a short outlined bar, to tell it from the float
    // work around it.
    let (y, height, stroke) = if s.shadow {
        (y + SHADOW_INSET, LANE_HEIGHT - SHADOW_INSET, "#222")
    } else {
        (y, LANE_HEIGHT, "white")
    };
    let _ = writeln!(
        svg,
        r##"<rect x="{x0:.2}" y="{y:.1}" width="{:.2}" height="{height:.1}" fill="{colour}" stroke="{stroke}" stroke-width="0.3"><title>{}{} chunk {} stage {}: {:.3}-{:.3} ms</title></rect>"##,
        (x1 - x0).max(0.2),
        s.request
            .map_or_else(String::new, |r| format!("request {r}: ")),
        escape(&s.template),
        s.key.chunk,
        s.key.stage,
        s.start_ns as f64 / 1e6,
        s.end_ns as f64 / 1e6
    );
}

/// The time axis under the lanes, with ticks at a round step in milliseconds.
fn axis_svg(svg: &mut String, span_ns: f64, plot: f64, axis_y: f64) {
    let span_ms = span_ns / 1e6;
    let step = tick_step_ms(span_ms);
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{axis_y:.1}" x2="{:.1}" y2="{axis_y:.1}" stroke="#333"/>"##,
        LEFT + plot
    );
    let mut tick = 0.0;
    while tick <= span_ms + 1e-9 {
        let tx = LEFT + tick / span_ms * plot;
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" y1="{axis_y:.1}" x2="{tx:.1}" y2="{:.1}" stroke="#333"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            axis_y + 5.0,
            axis_y + 18.0,
            format_ms(tick, step)
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="end">time (ms)</text>"#,
        LEFT + plot,
        axis_y + 32.0
    );
}

/// The legend: idle, one swatch per colour (`coloured_by` chunk or request, `chunks` of
/// them), the shadow bar where the trace has one.
fn legend_svg(svg: &mut String, trace: &Trace, (coloured_by, chunks): (&str, u32), legend_y: f64) {
    let _ = write!(
        svg,
        r##"<rect x="{LEFT}" y="{:.1}" width="14" height="14" fill="#e6e6e6"/><text x="{:.1}" y="{:.1}">idle</text>"##,
        legend_y - 11.0,
        LEFT + 18.0,
        legend_y
    );
    for chunk in 0..chunks.min(PALETTE.len() as u32) {
        let lx = LEFT + 60.0 + f64::from(chunk) * 80.0;
        let _ = write!(
            svg,
            r##"<rect x="{lx:.1}" y="{:.1}" width="14" height="14" fill="{}"/><text x="{:.1}" y="{legend_y:.1}">{coloured_by} {chunk}</text>"##,
            legend_y - 11.0,
            PALETTE[chunk as usize],
            lx + 18.0
        );
    }
    let mut next_x = LEFT + 60.0 + f64::from(chunks.min(PALETTE.len() as u32)) * 80.0;
    if trace.slices.iter().any(|s| s.shadow) {
        let lx = next_x;
        next_x += 130.0;
        let _ = write!(
            svg,
            r##"<rect x="{lx:.1}" y="{:.1}" width="14" height="9" fill="#e6e6e6" stroke="#222" stroke-width="0.6"/><text x="{:.1}" y="{legend_y:.1}">outlier shadow</text>"##,
            legend_y - 6.0,
            lx + 18.0
        );
    }
    if chunks as usize > PALETTE.len() {
        let _ = write!(
            svg,
            r#"<text x="{next_x:.1}" y="{legend_y:.1}">colours repeat every {} {coloured_by}s</text>"#,
            PALETTE.len()
        );
    }
}

fn format_ms(value: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.*}", (-step.log10()).ceil() as usize)
    }
}
