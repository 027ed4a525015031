//! `hetsched compare`: every policy side by side over scenes and prompt lengths.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Serialize;

use crate::engine::{EngineError, simulate};
use crate::report::RunReport;
use crate::scene::{Scene, SceneError};

/// One (scene, prompt length, policy) measurement.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CompareRow {
    /// Scene name.
    pub scene: String,
    /// Prompt length.
    pub prompt_len: u32,
    /// Chunk length.
    pub chunk_len: u32,
    /// Policy.
    pub policy: String,
    /// Simulated prefill latency, ms.
    pub makespan_ms: f64,
    /// Prompt tokens per second.
    pub prefill_tokens_per_s: f64,
    /// makespan / lower bound.
    pub ratio_to_lower_bound: f64,
    /// NPU idle share between its first start and last end.
    pub npu_bubble_rate: Option<f64>,
    /// 1 - makespan / in-order makespan (latency cut against in-order).
    pub gain_over_inorder: f64,
    /// For a scene with flexible placement: the same policy's makespan with every stage
    /// on its home processor (fixed placement), ms.
    pub fixed_placement_makespan_ms: Option<f64>,
    /// 1 - makespan / fixed-placement makespan: what placement choice buys.
    pub gain_over_fixed_placement: Option<f64>,
}

/// Why a comparison failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompareError {
    /// A scene or its plan is invalid.
    #[error(transparent)]
    Scene(#[from] SceneError),
    /// A simulation failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The baseline every row's `gain_over_inorder` is measured against.
const BASELINE_POLICY: &str = "inorder";

/// Simulates every policy (built-in, by name) on every scene at every prompt length (the
/// scene's own when `prompt_lens` is empty).
pub fn compare(
    scenes: &[Scene],
    prompt_lens: &[u32],
    policies: &[String],
) -> Result<Vec<CompareRow>, CompareError> {
    let mut rows = Vec::new();
    for scene in scenes {
        let lens = if prompt_lens.is_empty() {
            vec![scene.workload.prompt_len]
        } else {
            prompt_lens.to_vec()
        };
        for prompt_len in lens {
            let run = |scene: &Scene, policy: &str| -> Result<RunReport, CompareError> {
                let mut scene = scene.clone();
                scene.workload.prompt_len = prompt_len;
                scene.policy = policy.to_string();
                let run = simulate(Arc::new(scene.plan()?), scene.new_policy()?)?;
                Ok(RunReport::new(&scene.name, &run))
            };
            let fixed = scene
                .has_flexible_placement()
                .then(|| scene.with_fixed_placement());
            let in_order = run(scene, BASELINE_POLICY)?;
            for policy in policies {
                let report = if policy == BASELINE_POLICY {
                    in_order.clone()
                } else {
                    run(scene, policy)?
                };
                let fixed_ms = match &fixed {
                    Some(fixed) => Some(run(fixed, policy)?.makespan_ms),
                    None => None,
                };
                rows.push(CompareRow {
                    scene: scene.name.clone(),
                    prompt_len,
                    chunk_len: report.chunk_len,
                    policy: policy.clone(),
                    makespan_ms: report.makespan_ms,
                    prefill_tokens_per_s: report.prefill_tokens_per_s,
                    ratio_to_lower_bound: report.ratio_to_lower_bound,
                    npu_bubble_rate: report.npu_bubble_rate,
                    gain_over_inorder: 1.0 - report.makespan_ms / in_order.makespan_ms,
                    fixed_placement_makespan_ms: fixed_ms,
                    gain_over_fixed_placement: fixed_ms.map(|f| 1.0 - report.makespan_ms / f),
                });
            }
        }
    }
    Ok(rows)
}

/// A plain-text table of `rows`.
pub fn table(rows: &[CompareRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<58} {:>6} {:<10} {:>12} {:>9} {:>8} {:>8} {:>9} {:>9}",
        "scene",
        "prompt",
        "policy",
        "makespan ms",
        "tok/s",
        "/bound",
        "bubble",
        "vs inord",
        "vs fixed"
    );
    for r in rows {
        let bubble = r
            .npu_bubble_rate
            .map_or("-".to_string(), |b| format!("{:.1}%", 100.0 * b));
        let vs_fixed = r
            .gain_over_fixed_placement
            .map_or("-".to_string(), |g| format!("{:.1}%", 100.0 * g));
        let _ = writeln!(
            s,
            "{:<58} {:>6} {:<10} {:>12.1} {:>9.1} {:>8.3} {:>8} {:>8.1}% {:>9}",
            r.scene,
            r.prompt_len,
            r.policy,
            r.makespan_ms,
            r.prefill_tokens_per_s,
            r.ratio_to_lower_bound,
            bubble,
            100.0 * r.gain_over_inorder,
            vs_fixed
        );
    }
    s
}
