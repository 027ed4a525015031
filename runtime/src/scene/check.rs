//! Checks of a scene against the limits before its plan is built: the model's shape and
//! an upper bound of every processor's modeled time.

use hetsched_limits::{self as limits, LimitError};
use hetsched_systems::ModelConfig;
use hetsched_systems::graph::build_stages;
use hetsched_systems::model::ChunkShape;

use super::{Scene, SceneError};

impl Scene {
    /// Checks, before the plan is built, that its size and every processor's modeled
    /// time stay within the limits: an upper bound (every chunk at the last chunk's
    /// past) computed in f64, so that the plan's u64 sums cannot overflow.
    pub(super) fn check_cost_range(&self) -> Result<(), SceneError> {
        check_model(&self.model)?;
        self.device.validate()?;
        let stages = build_stages(&self.model)?;
        let w = &self.workload;
        let chunks = u64::from(w.prompt_len.div_ceil(w.chunk_len.max(1)));
        limits::check(
            "plan instances (chunks × stages)",
            chunks.saturating_mul(stages.len() as u64),
            limits::MAX_INSTANCES,
        )?;
        let shape = ChunkShape {
            tokens: u64::from(w.chunk_len),
            past: u64::from(w.prompt_len),
        };
        for p in &self.device.processors {
            let (mut total, mut worst) = (0.0f64, (0.0f64, ""));
            for stage in &stages {
                let roofline = || {
                    stage.ops.iter().fold(p.cost.launch_us * 1e3, |sum, op| {
                        sum + p.cost.op_ns(&self.model, op, shape).unwrap_or(0.0)
                    })
                };
                let ns = p
                    .cost
                    .stage_cost(&self.model, &stage.ops)
                    .map_or_else(roofline, |measured| measured.ns(shape));
                if ns > worst.0 || ns.is_nan() {
                    worst = (ns, &stage.name);
                }
                total += ns * chunks as f64;
            }
            if total.is_nan() || total > limits::MAX_MODELED_NS {
                return Err(SceneError::CostOverflow {
                    processor: p.name.clone(),
                    seconds: total * 1e-9,
                    stage: worst.1.to_string(),
                    stage_seconds: worst.0 * 1e-9,
                    max_seconds: limits::MAX_MODELED_NS * 1e-9,
                });
            }
        }
        Ok(())
    }
}

/// Checks a model's shape (a scene's model TOML) against the limits.
pub(super) fn check_model(model: &ModelConfig) -> Result<(), LimitError> {
    let dims = [
        ("layers", model.layers, limits::MAX_LAYERS),
        ("hidden", model.hidden, limits::MAX_HIDDEN),
        ("heads", model.heads, limits::MAX_HEADS),
        ("kv_heads", model.kv_heads, limits::MAX_HEADS),
        ("head_dim", model.head_dim.unwrap_or(0), limits::MAX_HIDDEN),
        ("ffn", model.ffn, limits::MAX_FFN),
        ("vocab", model.vocab, limits::MAX_VOCAB),
        ("context", model.context, limits::MAX_CONTEXT),
    ];
    for (what, value, max) in dims {
        limits::check(&format!("{} `{what}`", model.name), value.into(), max)?;
    }
    if let Some(ops) = &model.layer_ops {
        limits::check("layer_ops entries", ops.len() as u64, 4096)?;
    }
    Ok(())
}
