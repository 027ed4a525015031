//! `hetsched sweep`: policy × chunk length (× prompt length) on one scene, as CSV rows and
//! an SVG plot of tokens per second against chunk length, a line per policy.

use std::fmt::Write as _;

use crate::compare::{CompareError, CompareRow, compare};
use crate::progress::Progress;
use crate::scene::Scene;
use crate::timeline::svg::{PALETTE, escape, open_document};

/// Simulates `scene` for every chunk length, prompt length (the scene's own when empty)
/// and policy; `progress` counts the (chunk length, prompt length) settings done.
pub fn sweep(
    scene: &Scene,
    chunk_lens: &[u32],
    prompt_lens: &[u32],
    policies: &[String],
    progress: &mut dyn Progress,
) -> Result<Vec<CompareRow>, CompareError> {
    let prompts = if prompt_lens.is_empty() {
        vec![scene.workload.prompt_len]
    } else {
        prompt_lens.to_vec()
    };
    progress.set_len((chunk_lens.len() * prompts.len()) as u64);
    let mut rows = Vec::new();
    for &chunk_len in chunk_lens {
        let mut scene = scene.clone();
        scene.workload.chunk_len = chunk_len;
        for &prompt_len in &prompts {
            progress.set_message(&format!("chunk {chunk_len}, prompt {prompt_len}"));
            rows.extend(compare(
                std::slice::from_ref(&scene),
                &[prompt_len],
                policies,
            )?);
            progress.inc(1);
        }
    }
    progress.finish();
    Ok(rows)
}

/// The rows as CSV (header included).
pub fn to_csv(rows: &[CompareRow]) -> Result<String, csv::Error> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    for row in rows {
        writer.serialize(row)?;
    }
    let bytes = writer
        .into_inner()
        .map_err(|e| csv::Error::from(e.into_error()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

const WIDTH: f64 = 900.0;
const PANEL_HEIGHT: f64 = 360.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 50.0;

/// A line chart per prompt length: tokens per second (y) against chunk length (x, log2
/// scale), a line per policy.
pub fn to_svg(title: &str, rows: &[CompareRow]) -> String {
    let mut prompts: Vec<u32> = rows.iter().map(|r| r.prompt_len).collect();
    prompts.sort_unstable();
    prompts.dedup();
    let mut policies: Vec<&str> = Vec::new();
    for r in rows {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    let height = TOP + prompts.len() as f64 * (PANEL_HEIGHT + BOTTOM);
    let mut s = String::new();
    open_document(&mut s, WIDTH, height, LEFT, title);
    for (p, &prompt) in prompts.iter().enumerate() {
        let panel: Vec<&CompareRow> = rows.iter().filter(|r| r.prompt_len == prompt).collect();
        let top = TOP + p as f64 * (PANEL_HEIGHT + BOTTOM);
        panel_svg(&mut s, top, prompt, &panel, &policies);
    }
    s.push_str("</svg>\n");
    s
}

fn panel_svg(s: &mut String, top: f64, prompt: u32, rows: &[&CompareRow], policies: &[&str]) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let bottom = top + PANEL_HEIGHT - 20.0;
    let log = |c: u32| f64::from(c.max(1)).log2();
    let (x_min, x_max) = rows.iter().fold((f64::MAX, f64::MIN), |(lo, hi), r| {
        (lo.min(log(r.chunk_len)), hi.max(log(r.chunk_len)))
    });
    let y_max = rows
        .iter()
        .map(|r| r.prefill_tokens_per_s)
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.1;
    let x = |c: u32| {
        let span = (x_max - x_min).max(1e-9);
        LEFT + (log(c) - x_min) / span * plot_w
    };
    let y = |v: f64| bottom - v / y_max * (PANEL_HEIGHT - 40.0);
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#333"/><line x1="{LEFT}" y1="{}" x2="{LEFT}" y2="{bottom}" stroke="#333"/>"##,
        LEFT + plot_w,
        top + 20.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{}" >prompt {prompt} tokens: tokens/s against chunk length</text>"#,
        top + 12.0
    );
    let mut chunks: Vec<u32> = rows.iter().map(|r| r.chunk_len).collect();
    chunks.sort_unstable();
    chunks.dedup();
    for &c in &chunks {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{c}</text>"#,
            x(c),
            bottom + 16.0
        );
    }
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/>"##,
            LEFT - 6.0,
            y(v) + 4.0,
            y(v),
            LEFT + plot_w,
            y(v)
        );
    }
    for (i, policy) in policies.iter().enumerate() {
        series_svg(s, top, i, policy, rows, &x, &y);
    }
}

/// One policy's line, its points (with a hover title) and its legend entry; `x` and `y` map
/// a chunk length and a tokens/s value to panel coordinates.
fn series_svg(
    s: &mut String,
    top: f64,
    i: usize,
    policy: &str,
    rows: &[&CompareRow],
    x: &impl Fn(u32) -> f64,
    y: &impl Fn(f64) -> f64,
) {
    let colour = PALETTE[i % PALETTE.len()];
    let mut points: Vec<&&CompareRow> = rows.iter().filter(|r| r.policy == *policy).collect();
    points.sort_by_key(|r| r.chunk_len);
    let path: Vec<String> = points
        .iter()
        .map(|r| format!("{:.1},{:.1}", x(r.chunk_len), y(r.prefill_tokens_per_s)))
        .collect();
    let _ = writeln!(
        s,
        r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
        path.join(" ")
    );
    for r in &points {
        let _ = writeln!(
            s,
            r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"><title>{} chunk {}: {:.0} tok/s</title></circle>"#,
            x(r.chunk_len),
            y(r.prefill_tokens_per_s),
            escape(policy),
            r.chunk_len,
            r.prefill_tokens_per_s
        );
    }
    let ly = top + 30.0 + 18.0 * i as f64;
    let _ = writeln!(
        s,
        r#"<rect x="{:.1}" y="{:.1}" width="14" height="4" fill="{colour}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
        WIDTH - RIGHT + 16.0,
        ly - 4.0,
        WIDTH - RIGHT + 36.0,
        ly,
        escape(policy)
    );
}
