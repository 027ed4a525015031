//! `--memory-budget`: per-region budgets given on the command line.
//!
//! Three forms: `BYTES` (every region; a `KiB`, `MiB` or `GiB` suffix allowed),
//! `REGION=BYTES[,REGION=BYTES..]` (named regions), and `FACTORx` (every region gets
//! FACTOR times the planned peak of the same scene run with the in-order policy, the
//! baseline of the makespan goal in docs/memory.md).

use std::str::FromStr;
use std::sync::Arc;

use thiserror::Error;

use crate::engine::{EngineError, simulate};
use crate::report::region_memory;
use crate::scene::{Scene, SceneError};

/// A parsed `--memory-budget` value.
#[derive(Debug, Clone, PartialEq)]
pub enum BudgetSpec {
    /// The same budget for every region, bytes.
    Bytes(u64),
    /// Budgets for named regions, bytes.
    PerRegion(Vec<(String, u64)>),
    /// A multiple of each region's planned peak under the in-order policy.
    InOrderFactor(f64),
    /// A device-wide budget: a multiple of the in-order policy's planned peaks summed.
    DeviceInOrderFactor(f64),
}

/// Why a budget could not be parsed or applied.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BudgetError {
    /// The text is not a budget.
    #[error(
        "memory budget `{0}` not understood; write BYTES (e.g. 3000000000 or 512MiB), \
         REGION=BYTES[,REGION=BYTES] (e.g. hexagon=64MiB, device=1GiB), FACTORx (e.g. 1.5x each \
         region's in-order peak) or device=FACTORx (the device total)"
    )]
    Syntax(String),
    /// The scene (or the budgets applied to it) do not make a plan.
    #[error(transparent)]
    Scene(#[from] SceneError),
    /// The in-order baseline run failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// A byte count as written on the command line: a whole number, with a `KiB`, `MiB` or
/// `GiB` suffix allowed (`None`: not one, or beyond u64).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let (number, unit) = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .into_iter()
        .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|n| (n, unit)))
        .unwrap_or((text, 1));
    number.trim().parse::<u64>().ok()?.checked_mul(unit)
}

impl FromStr for BudgetSpec {
    type Err = BudgetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BudgetError::Syntax(s.to_string());
        let factor_of = |f: &str| -> Result<f64, BudgetError> {
            let factor: f64 = f.parse().map_err(|_| bad())?;
            if factor.is_finite() && factor > 0.0 {
                Ok(factor)
            } else {
                Err(bad())
            }
        };
        if let Some(f) = s.strip_prefix("device=").and_then(|f| f.strip_suffix('x')) {
            return Ok(BudgetSpec::DeviceInOrderFactor(factor_of(f)?));
        }
        if let Some(factor) = s.strip_suffix('x') {
            return Ok(BudgetSpec::InOrderFactor(factor_of(factor)?));
        }
        if s.contains('=') {
            let pairs = s
                .split(',')
                .map(|pair| {
                    let (name, value) = pair.split_once('=')?;
                    Some((name.trim().to_string(), parse_bytes(value)?))
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(bad)?;
            return Ok(BudgetSpec::PerRegion(pairs));
        }
        parse_bytes(s).map(BudgetSpec::Bytes).ok_or_else(bad)
    }
}

/// Each region's planned peak when `scene` runs with the in-order policy.
fn in_order_peaks(scene: &Scene) -> Result<Vec<(String, u64)>, BudgetError> {
    let mut baseline = scene.clone();
    baseline.policy = "inorder".to_string();
    let run = simulate(Arc::new(baseline.plan()?), baseline.new_policy()?)?;
    Ok(region_memory(&run)
        .into_iter()
        .map(|m| (m.region, m.peak_bytes))
        .collect())
}

/// Sets `scene`'s region budgets from `spec`. A factor runs the scene once with the
/// in-order policy (with the scene's own budgets) to measure each region's planned peak.
///
/// # Errors
/// A region name the device lacks, a budget that can never be met, or a failed baseline.
pub fn apply_budget(scene: &mut Scene, spec: &BudgetSpec) -> Result<(), BudgetError> {
    let names: Vec<String> = scene
        .device
        .processors
        .iter()
        .map(|p| p.name.clone())
        .collect();
    let budgets: Vec<(String, u64)> = match spec {
        BudgetSpec::DeviceInOrderFactor(factor) => {
            let total: u64 = in_order_peaks(scene)?.into_iter().map(|(_, b)| b).sum();
            scene.memory.device_budget_bytes = Some((total as f64 * factor).ceil() as u64);
            Vec::new()
        }
        BudgetSpec::Bytes(b) => names.into_iter().map(|n| (n, *b)).collect(),
        BudgetSpec::PerRegion(pairs) => pairs.clone(),
        BudgetSpec::InOrderFactor(factor) => in_order_peaks(scene)?
            .into_iter()
            .map(|(name, peak)| (name, (peak as f64 * factor).ceil() as u64))
            .collect(),
    };
    for (name, bytes) in budgets {
        if name == "device" {
            scene.memory.device_budget_bytes = Some(bytes);
        } else {
            scene.memory.budget_bytes.insert(name, bytes);
        }
    }
    // Refuse here, with the scene's error, rather than at the run.
    scene.plan()?;
    Ok(())
}
