//! Where a decode batch runs, decided in one place.
//!
//! A decode batch (one step of every sequence decoding together) runs either
//!
//! - on the **decode lane** ([`DecodePlacement::Lane`]): every stage on the first CPU
//!   ([`decode_lane`]), priced as a whole by [`batched_decode_step_ns`] (the weights read
//!   once for the batch, each sequence's cache, against the arithmetic of a small GEMM);
//! - or with its **linears on the NPU** ([`DecodePlacement::Npu`]): the one-token plan of
//!   the device as a prefill places it (INT8 linears on the NPU, float stages, attention
//!   and the head on the float processor), its rows padded on the NPU to a static batch
//!   shape ([`crate::NPU_DECODE_ROWS`], as a pre-built NPU graph needs) and priced there by the
//!   NPU's own cost model at that padded row count, INT8 per tensor as the NPU's prefill
//!   stages are; the float stages priced by their processor's cost model for the rows the
//!   batch holds, each sequence's attention over its own cache.
//!
//! [`DecodePlans::choose`] prices both for the batch and takes the one predicted to end
//! it first from the world's state ([`LaneLoads::of_world`]: each processor's running
//! job, and the ready work queued for it by the requests that run beside the batch's):
//! the later of its stages run one after another in dependency order, and each
//! processor it uses done with its running job, its queue and the step's work there
//! ([`predicted_finish_ns`]). Ties go to the decode lane. A device without an NPU, or
//! whose decode lane is its NPU, has one placement.

use std::sync::Arc;

use bevy_ecs::prelude::{Entity, Has, World};

use crate::components::{BusySlot, Offline, Processor};
use crate::decode_cost::{batched_decode_step_ns, decode_lane};
use crate::device::{DeviceProfile, ProcessorKind, ProcessorSpec};
use crate::dispatch::OFFLINE_FREE_AT_NS;
use crate::error::PlanError;
use crate::model::{ChunkShape, ModelConfig, OpDecl, OpKind, OpWork};
use crate::placement::PlacementConfig;
use crate::plan::{InstanceKey, PrefillPlan, Workload};
use crate::request::{LiveRuns, Request, RequestRun};
use crate::request_policy::{ActiveRequestPolicy, LiveRequest};
use crate::resources::Clock;

/// Where a decode batch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodePlacement {
    /// Every stage on the decode lane (the first CPU).
    Lane,
    /// INT8 linears on the NPU at a static batch shape, float stages on the float
    /// processor.
    Npu,
}

impl DecodePlacement {
    /// `lane` or `npu`.
    pub fn name(self) -> &'static str {
        match self {
            DecodePlacement::Lane => "lane",
            DecodePlacement::Npu => "npu",
        }
    }
}

/// The plans of one decode step for each placement a device offers, priced per batch.
#[derive(Clone, Debug)]
pub struct DecodePlans {
    model: ModelConfig,
    device: DeviceProfile,
    lane: Arc<PrefillPlan>,
    npu: Option<Arc<PrefillPlan>>,
}

impl DecodePlans {
    /// The decode step's plans on `device`: on its decode lane, layers grouped
    /// `layers_per_stage` to a stage; and, where the device has an NPU that is not its
    /// decode lane, the one-token plan with the linears on the NPU.
    ///
    /// # Errors
    /// [`PlanError`] where the device has no processor or a step cannot be planned.
    pub fn new(
        model: &ModelConfig,
        device: &DeviceProfile,
        layers_per_stage: u32,
    ) -> Result<Self, PlanError> {
        let lane = decode_lane(device).ok_or_else(|| {
            PlanError::NoProcessor("the device has no processor to decode on".into())
        })?;
        let on_lane =
            PrefillPlan::decode_step_on(model.clone(), device.clone(), lane, layers_per_stage)?;
        let npu = match device.first_of(ProcessorKind::Npu) {
            Some(npu) if npu != lane => {
                let workload = Workload {
                    prompt_len: 1,
                    chunk_len: 1,
                    float_processor: None,
                };
                let plan = PrefillPlan::placed(
                    model.clone(),
                    device.clone(),
                    workload,
                    PlacementConfig::default(),
                )?;
                let uses_npu = plan.instances().any(|k| plan.processor(k) == npu);
                uses_npu.then(|| Arc::new(plan))
            }
            _ => None,
        };
        Ok(DecodePlans {
            model: model.clone(),
            device: device.clone(),
            lane: Arc::new(on_lane),
            npu,
        })
    }

    /// The unpriced plan of `placement` (`None`: the device does not offer it).
    pub fn plan(&self, placement: DecodePlacement) -> Option<&Arc<PrefillPlan>> {
        match placement {
            DecodePlacement::Lane => Some(&self.lane),
            DecodePlacement::Npu => self.npu.as_ref(),
        }
    }

    /// The placements this device offers, the decode lane first.
    pub fn placements(&self) -> Vec<DecodePlacement> {
        let mut all = vec![DecodePlacement::Lane];
        if self.npu.is_some() {
            all.push(DecodePlacement::Npu);
        }
        all
    }

    /// The plan of one step of sequences at `contexts` (tokens each, the one fed
    /// included) under `placement`, priced for that batch.
    ///
    /// # Errors
    /// [`PlanError::InvalidWorkload`] for no sequence, more than the largest batch, a
    /// context of 0 or beyond the model's; [`PlanError::InvalidDevice`] for a placement
    /// the device does not offer or a stage its processor cannot price.
    pub fn priced(
        &self,
        placement: DecodePlacement,
        contexts: &[u64],
    ) -> Result<PrefillPlan, PlanError> {
        // Checks the batch (rows, contexts) for both placements.
        let lane_ns = batched_decode_step_ns(&self.model, &self.device, contexts)?;
        match placement {
            DecodePlacement::Lane => Ok(self.lane.as_ref().clone().with_home_total_ns(lane_ns)),
            DecodePlacement::Npu => {
                let plan = self.npu.as_ref().ok_or_else(|| {
                    PlanError::InvalidDevice("the device has no NPU to decode on".into())
                })?;
                plan.as_ref().clone().with_stage_prices(|ops, processor| {
                    batch_stage_ns(&self.model, ops, processor, contexts)
                })
            }
        }
    }

    /// The placement of a step of sequences at `contexts` predicted to end first under
    /// `loads` ([`predicted_finish_ns`]), and its priced plan. Ties go to the decode
    /// lane.
    ///
    /// # Errors
    /// As [`DecodePlans::priced`].
    pub fn choose(
        &self,
        contexts: &[u64],
        loads: &LaneLoads,
    ) -> Result<(DecodePlacement, PrefillPlan), PlanError> {
        let mut best: Option<(u64, DecodePlacement, PrefillPlan)> = None;
        for placement in self.placements() {
            let plan = self.priced(placement, contexts)?;
            let finish = predicted_finish_ns(&plan, loads);
            if best.as_ref().is_none_or(|(b, _, _)| finish < *b) {
                best = Some((finish, placement, plan));
            }
        }
        let (_, placement, plan) = best.expect("the decode lane is always offered");
        Ok((placement, plan))
    }
}

/// What each processor holds when a decode batch is placed, read from the world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneLoads {
    /// The world's clock, ns.
    pub now_ns: u64,
    /// Per processor, when its running job is modeled to end (now when idle, the far
    /// future when offline).
    pub free_at_ns: Vec<u64>,
    /// Per processor, the modeled work (ns, at home) of the ready instances queued for
    /// it by the requests the request policy runs beside the batch's.
    pub queued_ns: Vec<u64>,
}

impl LaneLoads {
    /// Idle processors with nothing queued, at `now_ns`.
    pub fn idle(lanes: usize, now_ns: u64) -> Self {
        LaneLoads {
            now_ns,
            free_at_ns: vec![now_ns; lanes],
            queued_ns: vec![0; lanes],
        }
    }

    /// The loads of `world`'s processors for a decode batch to be armed on request
    /// `leader`: each running job until its modeled end, and the ready work of every
    /// other armed run the request policy would run beside `leader`'s (the policy orders
    /// them with it: under `fcfs`, which runs one request at a time, none).
    pub fn of_world(world: &mut World, leader: Entity) -> Self {
        let now_ns = world.resource::<Clock>().now_ns;
        let mut processors = world.query::<(&Processor, &BusySlot, Has<Offline>)>();
        let mut free: Vec<(usize, u64)> = processors
            .iter(world)
            .map(|(p, slot, offline)| {
                let at = match slot.running {
                    _ if offline => OFFLINE_FREE_AT_NS,
                    Some(_) => slot.expected_end_ns.max(now_ns),
                    None => now_ns,
                };
                (p.index, at)
            })
            .collect();
        free.sort_unstable();
        let free_at_ns: Vec<u64> = free.into_iter().map(|(_, at)| at).collect();
        let mut queued_ns = vec![0; free_at_ns.len()];
        let armed = world.resource::<LiveRuns>().requests.clone();
        let mut runs = world.query::<(&Request, &RequestRun)>();
        let mut live = Vec::with_capacity(armed.len() + 1);
        let mut backlog = Vec::with_capacity(armed.len());
        for entity in armed.into_iter().filter(|&e| e != leader) {
            let Ok((request, run)) = runs.get(world, entity) else {
                continue;
            };
            if run.is_done() {
                continue;
            }
            live.push(LiveRequest::of(entity, request, run));
            backlog.push((entity, run.ready.backlog().to_vec()));
        }
        if let Ok(request) = world.query::<&Request>().get(world, leader) {
            live.push(LiveRequest {
                entity: leader,
                id: request.id,
                priority: request.priority,
                targets: request.targets,
                arrival_ns: request.arrival_ns,
                phase: request.phase,
                work_left_ns: 0,
                work_total_ns: 0,
                alone_bound_ns: 0,
                armed_ns: now_ns,
            });
        }
        if let Some(mut policy) = world.get_resource_mut::<ActiveRequestPolicy>() {
            policy.0.order(now_ns, &mut live);
        }
        for kept in &live {
            if let Some((_, lanes)) = backlog.iter().find(|(e, _)| *e == kept.entity) {
                for (queued, lane) in queued_ns.iter_mut().zip(lanes) {
                    *queued += lane.work_ns;
                }
            }
        }
        LaneLoads {
            now_ns,
            free_at_ns,
            queued_ns,
        }
    }
}

/// When `plan` (one decode step) is predicted to end if armed under `loads`: the later
/// of
///
/// - its stages run one after another in dependency order, each when its predecessors
///   have ended and its processor's running job is done (a list schedule, one job at a
///   time per processor);
/// - for each processor it uses, that processor's running job, its queued work and the
///   step's own work there, one after another (the queued work is done either before
///   the step's or between its stages, whatever the order).
pub fn predicted_finish_ns(plan: &PrefillPlan, loads: &LaneLoads) -> u64 {
    let now_ns = loads.now_ns;
    let at = |v: &[u64], p: usize| v.get(p).copied().unwrap_or(0);
    let mut free: Vec<u64> = (0..plan.lanes())
        .map(|p| at(&loads.free_at_ns, p).max(now_ns))
        .collect();
    let mut work = vec![0u64; plan.lanes()];
    let mut end = vec![now_ns; plan.id_space()];
    let mut chain = now_ns;
    for key in plan.instances() {
        let ready = plan
            .predecessors(key)
            .into_iter()
            .map(|p: InstanceKey| end[plan.id(p)])
            .max()
            .unwrap_or(now_ns);
        let lane = plan.processor(key);
        let finish = ready.max(free[lane]) + plan.cost_ns(key);
        free[lane] = finish;
        end[plan.id(key)] = finish;
        work[lane] += plan.cost_ns(key);
        chain = chain.max(finish);
    }
    let loaded = (0..plan.lanes())
        .filter(|&p| work[p] > 0)
        .map(|p| at(&loads.free_at_ns, p).max(now_ns) + at(&loads.queued_ns, p) + work[p])
        .max()
        .unwrap_or(now_ns);
    chain.max(loaded)
}

/// A stage of a decode batch of sequences at `contexts` on `processor`, ns: the rows its
/// kind runs the batch as ([`ProcessorKind::decode_rows`]: on an NPU padded to its static
/// shape, padding rows at the shortest context); one
/// launch plus each operator's roofline time for the rows (the weights read once; each
/// sequence's attention over its own cache; the head's logits per row), or the fitted
/// stage cost where the processor's profile has one. `None`: the processor cannot run
/// an operator's precision, or the batch exceeds the largest NPU shape.
fn batch_stage_ns(
    model: &ModelConfig,
    ops: &[OpDecl],
    processor: &ProcessorSpec,
    contexts: &[u64],
) -> Option<u64> {
    let rows = processor.kind.decode_rows(contexts)?;
    let n = rows.len() as u64;
    let longest = rows.iter().copied().max()?;
    let cost = &processor.cost;
    if let Some(stage) = cost.stage_cost(model, ops) {
        let shape = ChunkShape {
            tokens: n,
            past: longest.saturating_sub(1),
        };
        return Some(stage.ns(shape).round().max(1.0) as u64);
    }
    let mut total = cost.launch_us * 1e3;
    for op in ops {
        total += match op.kind {
            OpKind::Attention => {
                let mut sum = 0.0;
                for &c in &rows {
                    let shape = ChunkShape {
                        tokens: 1,
                        past: c.saturating_sub(1),
                    };
                    sum += cost.op_ns(model, op, shape)?;
                }
                // One operator: its overhead once.
                sum - (n - 1) as f64 * cost.op_overhead_us * 1e3
            }
            OpKind::LmHead => {
                // The head's work is one row's logits: the weights once, arithmetic and
                // logits per row.
                let one = op.work(model, ChunkShape { tokens: 1, past: 0 });
                cost.work_ns(OpWork {
                    ops: one.ops * n as f64,
                    bytes: one.bytes + (n - 1) as f64 * f64::from(model.vocab) * 4.0,
                    precision: one.precision,
                })?
            }
            _ => cost.op_ns(model, op, ChunkShape { tokens: n, past: 0 })?,
        };
    }
    Some(total.round().max(1.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{tiny_device, tiny_model};

    #[test]
    fn the_npu_batch_pays_its_padded_shape_and_the_choice_follows_the_queues() {
        let model = tiny_model(2);
        let device = tiny_device();
        let plans = DecodePlans::new(&model, &device, 5).unwrap();
        assert_eq!(
            plans.placements(),
            [DecodePlacement::Lane, DecodePlacement::Npu]
        );
        let npu = device.first_of(ProcessorKind::Npu).unwrap();
        let npu_ns = |contexts: &[u64]| -> u64 {
            let plan = plans.priced(DecodePlacement::Npu, contexts).unwrap();
            plan.instances()
                .filter(|&k| plan.processor(k) == npu)
                .map(|k| plan.cost_ns(k))
                .sum()
        };
        // Two and four rows run the same NPU graph (shape 4); five run shape 8.
        assert_eq!(npu_ns(&[9, 9]), npu_ns(&[9, 9, 9, 9]));
        assert!(npu_ns(&[9; 5]) >= npu_ns(&[9; 4]));
        // The float side pays each sequence's own cache: a longer context costs more.
        let float_ns = |contexts: &[u64]| -> u64 {
            let plan = plans.priced(DecodePlacement::Npu, contexts).unwrap();
            plan.instances()
                .filter(|&k| plan.processor(k) != npu)
                .map(|k| plan.cost_ns(k))
                .sum()
        };
        assert!(float_ns(&[9, 200]) > float_ns(&[9, 9]));
        // The choice: whichever ends first given when each processor frees.
        let contexts = [9u64, 9];
        let lanes = plans.plan(DecodePlacement::Lane).unwrap().lanes();
        let idle = LaneLoads::idle(lanes, 0);
        let priced = |p| plans.priced(p, &contexts).unwrap();
        let earlier = |loads: &LaneLoads| {
            let npu_end = predicted_finish_ns(&priced(DecodePlacement::Npu), loads);
            let lane_end = predicted_finish_ns(&priced(DecodePlacement::Lane), loads);
            if npu_end < lane_end {
                DecodePlacement::Npu
            } else {
                DecodePlacement::Lane
            }
        };
        assert_eq!(plans.choose(&contexts, &idle).unwrap().0, earlier(&idle));
        // Alone, a step ends no earlier than its stages one after another.
        let lane_plan = priced(DecodePlacement::Lane);
        let total: u64 = lane_plan.instances().map(|k| lane_plan.cost_ns(k)).sum();
        assert_eq!(predicted_finish_ns(&lane_plan, &idle), total);
        // The NPU busy for a long time: the decode lane.
        let mut npu_busy = idle.clone();
        npu_busy.free_at_ns[npu] = u64::MAX / 8;
        let chosen = plans.choose(&contexts, &npu_busy).unwrap().0;
        assert_eq!(chosen, DecodePlacement::Lane);
        // Work queued on the decode lane: the placement that needs less of it ends first.
        let lane = decode_lane(&device).unwrap();
        let mut lane_queued = idle;
        lane_queued.queued_ns[lane] = 1_000_000_000_000;
        let on_lane = |plan: &PrefillPlan| -> u64 {
            plan.instances()
                .filter(|&k| plan.processor(k) == lane)
                .map(|k| plan.cost_ns(k))
                .sum()
        };
        let want = match on_lane(&priced(DecodePlacement::Npu)) < total {
            true => DecodePlacement::Npu,
            false => DecodePlacement::Lane,
        };
        assert_eq!(want, earlier(&lane_queued));
        assert_eq!(plans.choose(&contexts, &lane_queued).unwrap().0, want);
        // Bad batches are typed errors.
        assert!(plans.priced(DecodePlacement::Npu, &[]).is_err());
        assert!(plans.priced(DecodePlacement::Npu, &[0]).is_err());
        assert!(plans.priced(DecodePlacement::Npu, &[9; 65]).is_err());
    }
}
