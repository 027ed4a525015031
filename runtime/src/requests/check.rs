//! Checks of a request mix before it runs, and each request's prefill plan.

use std::collections::HashSet;
use std::sync::Arc;

use hetsched_systems::request_policy::create_request_policy;
use hetsched_systems::{PrefillPlan, Workload, kv_cache_bytes};

use super::{MAX_REQUESTS, MAX_SAMPLES, MixOptions, RequestSpec, RequestsError};
use crate::scene::{Scene, SceneError};

/// Checks `specs` against the scene and the options; each request's prefill plan.
pub(super) fn check_and_plan(
    scene: &Scene,
    specs: &[RequestSpec],
    options: &MixOptions,
) -> Result<Vec<Arc<PrefillPlan>>, RequestsError> {
    if specs.is_empty() {
        return Err(RequestsError::Empty);
    }
    if specs.len() > MAX_REQUESTS {
        return Err(RequestsError::TooMany(specs.len()));
    }
    if let Some(w) = specs.windows(2).find(|w| w[1].arrival_ns < w[0].arrival_ns) {
        return Err(RequestsError::OutOfOrder {
            id: w[1].id,
            arrival_ns: w[1].arrival_ns,
        });
    }
    let mut ids = HashSet::new();
    if let Some(twice) = specs.iter().find(|s| !ids.insert(s.id)) {
        return Err(RequestsError::DuplicateId(twice.id));
    }
    create_request_policy(&options.request_policy)?;
    let context = scene.model.context;
    for s in specs {
        if s.max_tokens == 0 || s.samples == 0 || s.samples > MAX_SAMPLES {
            return Err(RequestsError::Tokens {
                id: s.id,
                max_tokens: s.max_tokens,
                samples: s.samples,
            });
        }
        if u64::from(s.prompt_len) + u64::from(s.max_tokens) - 1 > u64::from(context) {
            return Err(RequestsError::Context {
                id: s.id,
                prompt_len: s.prompt_len,
                max_tokens: s.max_tokens,
                context,
            });
        }
        let need = kv_cache_bytes(&scene.model, s.prompt_len, s.max_tokens, s.samples);
        if let Some(budget) = options.kv_budget_bytes.filter(|&b| need > b) {
            return Err(RequestsError::KvBudgetTooSmall {
                id: s.id,
                need,
                budget,
            });
        }
    }
    specs
        .iter()
        .map(|s| plan_for(scene, s, options).map(Arc::new))
        .collect()
}

/// The scene's plan for `spec`'s prompt (the scene's chunk length, placement and memory),
/// its attention cut by query heads where `options` asks for it.
pub(super) fn plan_for(
    scene: &Scene,
    spec: &RequestSpec,
    options: &MixOptions,
) -> Result<PrefillPlan, RequestsError> {
    let mut scene = scene.clone();
    scene.workload = Workload {
        prompt_len: spec.prompt_len,
        ..scene.workload.clone()
    };
    let plan_error = |source| RequestsError::Plan {
        id: spec.id,
        source,
    };
    let plan = scene.plan().map_err(|e| match e {
        SceneError::Plan(source) => plan_error(source),
        other => RequestsError::Scene(other),
    })?;
    match options.attention_part_ns {
        Some(part_ns) => plan.with_attention_split(part_ns).map_err(plan_error),
        None => Ok(plan),
    }
}
