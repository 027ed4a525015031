//! Tensor lifetimes from the schedule that actually ran, planned per region.

use serde::Serialize;

use super::tensors::KvCache;
use super::{Buffer, MemoryError, MemoryPlan, Strategy, lower_bound, plan_offsets_each};
use crate::plan::{InstanceKey, PrefillPlan};

/// The buffers of a finished run, per region (lane order).
///
/// `spans[id]` is when instance `id` ran, `(start, end)` in ns (`None` where no instance
/// ran). A tensor is live from its producer's start to its last consumer's end (at
/// least to its producer's end); a workspace while its stage runs; where a stage shares a
/// memory step with an outlier shadow, "start" and "end" are the step's (the first of the
/// two to start, the last to end), as the ledger allocates; each layer's KV cache
/// buffer and the shadow's resident weight rows for the whole prefill, `[0, makespan)`.
/// Buffer ids count from 0 per region in this order: KV cache layers, shadow weights,
/// then tensors by (chunk, stage).
pub fn schedule_buffers(plan: &PrefillPlan, spans: &[Option<(u64, u64)>]) -> Vec<Vec<Buffer>> {
    let regions = plan.device.processors.len();
    let mut buffers: Vec<Vec<Buffer>> = vec![Vec::new(); regions];
    let makespan = spans.iter().flatten().map(|s| s.1).max().unwrap_or(0);
    let mut push = |region: usize, bytes: u64, start: u64, end: u64| {
        let list = &mut buffers[region];
        list.push(Buffer {
            id: list.len() as u32,
            bytes,
            start,
            // A zero-length job still holds its buffers for an instant.
            end: end.max(start + 1),
        });
    };
    let kv = KvCache::of(&plan.layout());
    for _ in 0..kv.layers {
        push(kv.region, kv.bytes_per_layer, 0, makespan);
    }
    let profile = plan.memory_profile();
    for (region, &bytes) in profile.shadow_bytes.iter().take(regions).enumerate() {
        if bytes > 0 {
            push(region, bytes, 0, makespan);
        }
    }
    // Memory is held by steps (an INT8 stage and the shadow beside it share one; see
    // `MemoryLedger`): from the first of the step's stages to start to the last to end.
    let steps = plan.memory_step_count();
    for chunk in 0..plan.chunks {
        let mut step_spans: Vec<Option<(u64, u64)>> = vec![None; steps as usize];
        for stage in 0..plan.stage_count() {
            let key = InstanceKey { chunk, stage };
            if !plan.exists(key) {
                continue;
            }
            if let Some((start, end)) = spans[plan.id(key)] {
                let step = &mut step_spans[plan.memory_step(stage) as usize];
                *step = Some(step.map_or((start, end), |(s, e)| (s.min(start), e.max(end))));
            }
        }
        let span = |stage: u32| step_spans[plan.memory_step(stage) as usize];
        for t in &profile.tensors {
            if !plan.exists(InstanceKey {
                chunk,
                stage: t.producer,
            }) {
                continue;
            }
            let Some((start, produced)) = span(t.producer) else {
                continue;
            };
            let end = t
                .last_consumer(&plan.layout(), chunk)
                .and_then(span)
                .map_or(produced, |(_, e)| e.max(produced));
            push(t.region, t.bytes, start, end);
        }
    }
    buffers
}

/// One region's memory after a run: the planned arena against the lower bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RegionMemory {
    /// Region (processor) name.
    pub region: String,
    /// Arena size of the best offset plan, bytes.
    pub peak_bytes: u64,
    /// Most bytes live at any one time: no plan needs less.
    pub lower_bound_bytes: u64,
    /// Bytes the processor can address.
    pub capacity_bytes: u64,
    /// Budget the scheduler kept live bytes under.
    pub budget_bytes: u64,
    /// KV cache bytes in this region (live for the whole prefill).
    pub kv_cache_bytes: u64,
    /// Outlier-shadow weight rows resident in this region (live for the whole prefill).
    pub shadow_weight_bytes: u64,
    /// Buffers planned.
    pub buffers: usize,
    /// Strategy of the plan kept.
    pub strategy: Strategy,
    /// Alignment of offsets and sizes.
    pub alignment: u64,
}

/// Plans every region's buffers of a finished run ([`schedule_buffers`]) with the
/// strategies of the plan's `plan_effort` ([`PlanEffort`](super::PlanEffort): under
/// `exhaustive` [`plan_offsets`](super::plan_offsets)'s plan; under `scaled` only the
/// sweeps past [`SWEEPS_ONLY_ABOVE`](super::SWEEPS_ONLY_ABOVE) buffers, and the others'
/// plans kept only past [`SWEEPS_MARGIN`](super::SWEEPS_MARGIN)); returns each region's
/// summary, buffers and plan.
///
/// The regions share no buffer, so their strategies are spread over up to `threads`
/// threads ([`plan_offsets_each`], which the caller sizes: this crate starts none
/// itself): the plans are those of one thread, and the wall time is about the planner's
/// CPU time over the cores where they are free.
///
/// # Errors
/// As [`plan_offsets`](super::plan_offsets) (an invalid alignment, or sizes overflowing `u64`).
pub fn plan_schedule(
    plan: &PrefillPlan,
    spans: &[Option<(u64, u64)>],
    threads: usize,
) -> Result<Vec<(RegionMemory, Vec<Buffer>, MemoryPlan)>, MemoryError> {
    let regions = &plan.memory_profile().regions;
    let kv = KvCache::of(&plan.layout());
    let buffers = schedule_buffers(plan, spans);
    let sets: Vec<(&[Buffer], u64)> = buffers
        .iter()
        .zip(regions)
        .map(|(list, region)| (list.as_slice(), region.alignment))
        .collect();
    let offsets = plan_offsets_each(&sets, threads, plan.memory().plan_effort);
    buffers
        .into_iter()
        .zip(regions)
        .zip(offsets)
        .map(|((buffers, region), offsets)| {
            let offsets = offsets?;
            let summary = RegionMemory {
                region: region.name.clone(),
                peak_bytes: offsets.peak_bytes,
                lower_bound_bytes: lower_bound(&buffers),
                capacity_bytes: region.capacity_bytes,
                budget_bytes: region.budget_bytes,
                kv_cache_bytes: if kv.region == region.lane {
                    kv.bytes()
                } else {
                    0
                },
                shadow_weight_bytes: plan.memory_profile().shadow_bytes[region.lane],
                buffers: buffers.len(),
                strategy: offsets.strategy,
                alignment: region.alignment,
            };
            Ok((summary, buffers, offsets))
        })
        .collect()
}
