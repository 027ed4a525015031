//! One mix of requests run on a fresh world: arrivals, KV admission, prefills armed beside
//! each other, decode steps batched across requests, every job on a virtual clock.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use bevy_ecs::prelude::{Entity, World};
use hetsched_systems::components::SubgraphInstance;
use hetsched_systems::decode_placement::LaneLoads;
use hetsched_systems::request_policy::{
    LiveRequest, RequestPolicy, create_request_policy, pick_next,
};
use hetsched_systems::resources::{Clock, Completion, Inbox, Index, Job, Outbox};
use hetsched_systems::ride::{Carries, RidesOn, predicted_ride_end_ns, ride_stages};
use hetsched_systems::{
    ActiveRequestPolicy, DecodePlacement, DecodePlans, LiveRuns, PrefillPlan, Request, RequestId,
    RequestPhase, arm_request, disarm_request, kv_cache_bytes, scheduler_schedule_halves,
    spawn_request_entity, spawn_request_world,
};

use super::{KvFull, MAX_SAMPLES, MixOptions, RequestSlice, RequestSpec, RequestsError, RideMode};
use crate::scene::Scene;

/// When one admitted request's milestones fell, ns.
#[derive(Clone, Copy, Debug)]
pub(super) struct Times {
    pub(super) admitted_ns: u64,
    pub(super) first_token_ns: u64,
    pub(super) end_ns: u64,
}

/// The raw outcome of one mix: per request its times (`None`: refused), every job, the
/// KV peak.
pub(super) struct Mix {
    pub(super) times: Vec<Option<Times>>,
    pub(super) slices: Vec<RequestSlice>,
    pub(super) peak_kv_bytes: u64,
}

/// Where one request of a mix stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    NotArrived,
    WaitingForKv,
    Prefill,
    ReadyToDecode,
    InBatch,
    Done,
    Refused,
}

/// The decode batch in flight: armed on `leader`, a step for each of `members`, placed
/// where [`DecodePlans::choose`] predicted it to end first.
struct Batch {
    leader: usize,
    members: Vec<usize>,
    rows: u32,
    placement: DecodePlacement,
}

/// A ride chosen for a decode batch: the prefilling request it rides, the step's plan
/// (the NPU placement's, priced for the batch) and its stage map.
struct Ride {
    host: usize,
    plan: PrefillPlan,
    stages: Arc<[Option<u32>]>,
}

/// The state of one mix as it runs.
struct MixState<'a> {
    scene: &'a Scene,
    specs: &'a [RequestSpec],
    plans: &'a [Arc<PrefillPlan>],
    decode: &'a DecodePlans,
    options: &'a MixOptions,
    /// Orders waiting requests for admission and ready ones for a batch.
    order: Box<dyn RequestPolicy>,
    world: World,
    stage: Vec<Stage>,
    entity: Vec<Option<Entity>>,
    by_entity: HashMap<Entity, usize>,
    by_id: HashMap<RequestId, usize>,
    /// Tokens each sample has so far.
    tokens: Vec<u32>,
    kv: Vec<u64>,
    kv_used: u64,
    peak_kv_bytes: u64,
    waiting: Vec<usize>,
    batch: Option<Batch>,
    admitted: Vec<Option<u64>>,
    first_token: Vec<Option<u64>>,
    end: Vec<Option<u64>>,
    /// Per request's prefill plan, the stage map of a decode step riding it, once
    /// computed.
    ride_maps: HashMap<usize, Arc<[Option<u32>]>>,
}

/// Runs the mix of `specs` (checked, with their prefill plans) on a fresh world.
pub(super) fn run_mix(
    scene: &Scene,
    specs: &[RequestSpec],
    options: &MixOptions,
    plans: &[Arc<PrefillPlan>],
    decode: &DecodePlans,
) -> Result<Mix, RequestsError> {
    let mut state = MixState::new(scene, specs, options, plans, decode)?;
    let n = specs.len();
    let (mut settle, mut launch) = scheduler_schedule_halves();
    let mut next_arrival = 0;
    let mut in_flight = InFlight::new();
    let mut slices = Vec::new();
    loop {
        let now = state.world.resource::<Clock>().now_ns;
        settle.run(&mut state.world);
        let finished = std::mem::take(&mut state.world.resource_mut::<LiveRuns>().finished);
        for entity in finished {
            state.run_finished(entity, now)?;
        }
        while next_arrival < n && specs[next_arrival].arrival_ns <= now {
            state.arrive(next_arrival);
            next_arrival += 1;
        }
        state.admit(now)?;
        state.form_batch(now)?;
        launch.run(&mut state.world);
        state.take_launched(now, &mut slices, &mut in_flight);
        let outstanding = state.world.resource::<LiveRuns>().outstanding;
        let arrival = specs.get(next_arrival).map(|s| s.arrival_ns);
        let end = in_flight.peek().map(|Reverse(j)| j.0);
        let next = match (end, arrival) {
            (None, None) if state.all_settled() => break,
            (None, None) => return Err(RequestsError::Stalled(outstanding)),
            (Some(e), Some(a)) => e.min(a),
            (Some(e), None) => e,
            (None, Some(a)) => a,
        };
        state.world.resource_mut::<Clock>().now_ns = next;
        complete_due(&mut state.world, &mut in_flight, next);
    }
    Ok(Mix {
        times: state.times(),
        slices,
        peak_kv_bytes: state.peak_kv_bytes,
    })
}

/// Jobs in flight as (end, lane, id, start): earliest end first, ties by lane.
type InFlight = BinaryHeap<Reverse<(u64, usize, u32, u64)>>;

/// Moves every job in flight that ends at `now` into the world's inbox, completed.
fn complete_due(world: &mut World, in_flight: &mut InFlight, now: u64) {
    let mut inbox = world.resource_mut::<Inbox>();
    while let Some(&Reverse((end, processor, id, start))) = in_flight.peek() {
        if end != now {
            break;
        }
        in_flight.pop();
        inbox.0.push(Completion {
            id,
            processor,
            start_ns: start,
            end_ns: end,
        });
    }
}

impl<'a> MixState<'a> {
    /// A fresh world for the mix of `specs`, nothing arrived yet.
    fn new(
        scene: &'a Scene,
        specs: &'a [RequestSpec],
        options: &'a MixOptions,
        plans: &'a [Arc<PrefillPlan>],
        decode: &'a DecodePlans,
    ) -> Result<Self, RequestsError> {
        let mut world = spawn_request_world(&scene.device);
        world.insert_resource(ActiveRequestPolicy(create_request_policy(
            &options.request_policy,
        )?));
        let n = specs.len();
        Ok(MixState {
            scene,
            specs,
            plans,
            decode,
            options,
            order: create_request_policy(&options.request_policy)?,
            world,
            stage: vec![Stage::NotArrived; n],
            entity: vec![None; n],
            by_entity: HashMap::new(),
            by_id: specs.iter().enumerate().map(|(i, s)| (s.id, i)).collect(),
            tokens: vec![0; n],
            kv: specs
                .iter()
                .map(|s| kv_cache_bytes(&scene.model, s.prompt_len, s.max_tokens, s.samples))
                .collect(),
            kv_used: 0,
            peak_kv_bytes: 0,
            waiting: Vec::new(),
            batch: None,
            admitted: vec![None; n],
            first_token: vec![None; n],
            end: vec![None; n],
            ride_maps: HashMap::new(),
        })
    }

    /// Takes the jobs launched at `now` from the outbox: a slice for each, naming the plan
    /// it runs (a batch leader's job: the decode plan of the batch's placement, after the
    /// requests' own), and each in flight until its modeled end.
    fn take_launched(
        &mut self,
        now: u64,
        slices: &mut Vec<RequestSlice>,
        in_flight: &mut InFlight,
    ) {
        let n = self.specs.len();
        for job in std::mem::take(&mut self.world.resource_mut::<Outbox>().0) {
            let i = self.by_id[&job.request];
            let (plan, decode_rows) = match (&self.batch, self.stage[i]) {
                (Some(b), Stage::InBatch) if b.leader == i => {
                    let placements = self.decode.placements();
                    let offset = placements.iter().position(|&p| p == b.placement);
                    (n + offset.unwrap_or(0), b.rows)
                }
                _ => (i, 0),
            };
            slices.push(RequestSlice {
                request: job.request,
                plan,
                key: job.key,
                decode_rows,
                lane: job.processor,
                start_ns: now,
                end_ns: now + job.estimated_ns,
                rode_in: None,
            });
            self.record_riders(&job, now, slices);
            in_flight.push(Reverse((
                now + job.estimated_ns,
                job.processor,
                job.id,
                now,
            )));
        }
    }

    /// A slice for each decode row that rode in `job` (launched at `now`): its batch's
    /// plan and rows, the job's lane and times.
    fn record_riders(&self, job: &Job, now: u64, slices: &mut Vec<RequestSlice>) {
        let index = self.world.resource::<Index>();
        let Some(host) = index.instances.get(job.id as usize).copied().flatten() else {
            return;
        };
        let Some(carried) = self.world.get::<Carries>(host) else {
            return;
        };
        let Some(batch) = &self.batch else {
            return;
        };
        let placements = self.decode.placements();
        let offset = placements.iter().position(|&p| p == batch.placement);
        for &rider in &carried.0 {
            let Some(entity) = index.instances.get(rider as usize).copied().flatten() else {
                continue;
            };
            let Some(instance) = self.world.get::<SubgraphInstance>(entity) else {
                continue;
            };
            slices.push(RequestSlice {
                request: self.specs[batch.leader].id,
                plan: self.specs.len() + offset.unwrap_or(0),
                key: instance.key,
                decode_rows: batch.rows,
                lane: job.processor,
                start_ns: now,
                end_ns: now + job.estimated_ns,
                rode_in: Some(job.request),
            });
        }
    }

    /// Each request's milestones, `None` for one that never ended (refused).
    fn times(&self) -> Vec<Option<Times>> {
        (0..self.specs.len())
            .map(
                |i| match (self.admitted[i], self.first_token[i], self.end[i]) {
                    (Some(admitted_ns), Some(first_token_ns), Some(end_ns)) => Some(Times {
                        admitted_ns,
                        first_token_ns,
                        end_ns,
                    }),
                    _ => None,
                },
            )
            .collect()
    }
}

impl MixState<'_> {
    /// Request `i` arrives: its entity is spawned, waiting for KV memory (or refused at
    /// once when it does not fit and the options say so).
    fn arrive(&mut self, i: usize) {
        let s = &self.specs[i];
        let entity = spawn_request_entity(
            &mut self.world,
            Request::new(s.id, s.priority, s.targets, s.arrival_ns),
        );
        self.entity[i] = Some(entity);
        self.by_entity.insert(entity, i);
        if self.options.kv_full == KvFull::Refuse && !self.fits(i) {
            self.stage[i] = Stage::Refused;
            if let Some(mut r) = self.world.get_mut::<Request>(entity) {
                r.phase = RequestPhase::Cancelled;
            }
            return;
        }
        self.stage[i] = Stage::WaitingForKv;
        self.waiting.push(i);
    }

    fn fits(&self, i: usize) -> bool {
        self.options
            .kv_budget_bytes
            .is_none_or(|budget| self.kv_used + self.kv[i] <= budget)
    }

    /// The request policy's view of request `i` at `now_ns` (`work_ns`: its armed or
    /// next run's modeled work, `bound_ns` its lower bound alone).
    fn view(&self, i: usize, now_ns: u64, work_ns: u64, bound_ns: u64) -> LiveRequest {
        let s = &self.specs[i];
        LiveRequest {
            entity: self.entity[i].expect("an arrived request"),
            id: s.id,
            priority: s.priority,
            targets: s.targets,
            arrival_ns: s.arrival_ns,
            phase: RequestPhase::Waiting,
            work_left_ns: work_ns,
            work_total_ns: work_ns,
            alone_bound_ns: bound_ns,
            armed_ns: now_ns,
        }
    }

    /// Admits waiting requests in the request policy's order while the first fits: each
    /// gets its KV caches and its prefill armed.
    fn admit(&mut self, now_ns: u64) -> Result<(), RequestsError> {
        while !self.waiting.is_empty() {
            let mut views: Vec<LiveRequest> = self
                .waiting
                .iter()
                .map(|&i| {
                    let plan = &self.plans[i];
                    let work = plan.instances().map(|k| plan.cost_ns(k)).sum();
                    self.view(i, now_ns, work, plan.lower_bound().ns())
                })
                .collect();
            let Some(first) = pick_next(self.order.as_mut(), now_ns, &mut views) else {
                return Ok(());
            };
            let i = self.by_entity[&first.entity];
            if !self.fits(i) {
                return Ok(());
            }
            self.waiting.retain(|&w| w != i);
            self.kv_used += self.kv[i];
            self.peak_kv_bytes = self.peak_kv_bytes.max(self.kv_used);
            self.admitted[i] = Some(now_ns);
            self.stage[i] = Stage::Prefill;
            arm_request(
                &mut self.world,
                first.entity,
                self.plans[i].clone(),
                self.scene.new_policy()?,
                RequestPhase::Prefill,
            )?;
        }
        Ok(())
    }

    /// The run armed on `entity` finished at `now_ns`: a prefill gives its request's
    /// first token, a decode batch one token to each of its members.
    fn run_finished(&mut self, entity: Entity, now_ns: u64) -> Result<(), RequestsError> {
        let Some(&i) = self.by_entity.get(&entity) else {
            return Ok(());
        };
        let members = match self.stage[i] {
            Stage::Prefill => {
                self.first_token[i] = Some(now_ns);
                vec![i]
            }
            Stage::InBatch => match self.batch.take() {
                Some(batch) if batch.leader == i => {
                    self.world.entity_mut(entity).remove::<RidesOn>();
                    batch.members
                }
                other => {
                    self.batch = other;
                    return Ok(());
                }
            },
            _ => return Ok(()),
        };
        for m in members {
            self.tokens[m] += 1;
            if self.tokens[m] < self.specs[m].max_tokens {
                self.stage[m] = Stage::ReadyToDecode;
                continue;
            }
            self.stage[m] = Stage::Done;
            self.end[m] = Some(now_ns);
            self.kv_used -= self.kv[m];
            let e = self.entity[m].expect("an arrived request");
            disarm_request(&mut self.world, e)?;
            if let Some(mut r) = self.world.get_mut::<Request>(e) {
                r.phase = RequestPhase::Finished;
            }
        }
        Ok(())
    }

    /// With no decode batch in flight, the requests ready to decode (in the request
    /// policy's order, up to [`MAX_DECODE_BATCH`] sequences) form the next one, armed on
    /// the first of them.
    fn form_batch(&mut self, now_ns: u64) -> Result<(), RequestsError> {
        if self.batch.is_some() {
            return Ok(());
        }
        let ready: Vec<usize> = (0..self.specs.len())
            .filter(|&i| self.stage[i] == Stage::ReadyToDecode)
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        let mut views: Vec<LiveRequest> =
            ready.iter().map(|&i| self.view(i, now_ns, 0, 0)).collect();
        self.order.order(now_ns, &mut views);
        let mut members = Vec::new();
        let mut rows = 0;
        for v in &views {
            let i = self.by_entity[&v.entity];
            if rows + self.specs[i].samples > MAX_SAMPLES {
                break;
            }
            rows += self.specs[i].samples;
            members.push(i);
        }
        let Some(&leader) = members.first() else {
            return Ok(());
        };
        let mut contexts = Vec::with_capacity(rows as usize);
        for &m in &members {
            let context = u64::from(self.specs[m].prompt_len) + u64::from(self.tokens[m]);
            contexts.extend(std::iter::repeat_n(context, self.specs[m].samples as usize));
            let e = self.entity[m].expect("an arrived request");
            if m != leader {
                // Its own last run (its prefill, or a batch it led) is done: its ids go.
                disarm_request(&mut self.world, e)?;
            }
            self.stage[m] = Stage::InBatch;
            if let Some(mut r) = self.world.get_mut::<Request>(e) {
                r.phase = RequestPhase::Decode {
                    step: u64::from(self.tokens[m] - 1),
                };
            }
        }
        let leader_entity = self.entity[leader].expect("an arrived request");
        let loads = LaneLoads::of_world(&mut self.world, leader_entity);
        let (mut placement, plan) = self
            .decode
            .choose(&contexts, &loads)
            .map_err(RequestsError::Decode)?;
        let step = u64::from(self.tokens[leader] - 1);
        let ride = self.ride_for(leader, &members, &contexts, &plan, now_ns)?;
        let plan = match ride {
            Some(ride) => {
                placement = DecodePlacement::Npu;
                self.world.entity_mut(leader_entity).insert(RidesOn {
                    host: self.entity[ride.host].expect("an arrived request"),
                    stages: ride.stages,
                    rows,
                });
                ride.plan
            }
            None => {
                self.world.entity_mut(leader_entity).remove::<RidesOn>();
                plan
            }
        };
        arm_request(
            &mut self.world,
            leader_entity,
            Arc::new(plan),
            self.scene.new_policy()?,
            RequestPhase::Decode { step },
        )?;
        self.batch = Some(Batch {
            leader,
            members,
            rows,
            placement,
        });
        Ok(())
    }

    /// The ride of the decode batch of `members` (led by `leader`, sequences at
    /// `contexts`; `alone` its plan as a batch of its own), if it takes one: under
    /// [`RideMode::Policy`] when the request policy lets the step ride
    /// ([`RequestPolicy::may_ride`]) at the end predicted for it, under
    /// [`RideMode::Always`] whenever it can. It can ride a request in its prefill that
    /// the request policy runs beside it, with a chunk left whose first matching stage is
    /// still to be dispatched, on a device whose NPU placement exists; of several, the
    /// one it is predicted to end first with ([`predicted_ride_end_ns`]).
    fn ride_for(
        &mut self,
        leader: usize,
        members: &[usize],
        contexts: &[u64],
        alone: &PrefillPlan,
        now_ns: u64,
    ) -> Result<Option<Ride>, RequestsError> {
        if self.options.ride == RideMode::Off || self.decode.plan(DecodePlacement::Npu).is_none() {
            return Ok(None);
        }
        let rider = self
            .decode
            .priced(DecodePlacement::Npu, contexts)
            .map_err(RequestsError::Decode)?;
        let rows = contexts.len() as u32;
        let mut best: Option<(u64, usize)> = None;
        for host in 0..self.specs.len() {
            if self.stage[host] != Stage::Prefill || members.contains(&host) {
                continue;
            }
            let Some(host_entity) = self.entity[host] else {
                continue;
            };
            // The host must be offered processors beside the step, or the step would
            // wait for jobs that never run.
            let mut beside = vec![
                self.view(leader, now_ns, 0, 0),
                self.view(host, now_ns, 1, 1),
            ];
            self.order.order(now_ns, &mut beside);
            if !beside.iter().any(|v| v.entity == host_entity) {
                continue;
            }
            let stages = self
                .ride_maps
                .entry(host)
                .or_insert_with(|| ride_stages(&rider, &self.plans[host]).into())
                .clone();
            if stages.iter().all(Option::is_none) {
                continue;
            }
            let end = predicted_ride_end_ns(&self.world, host_entity, &rider, &stages, rows);
            if let Some(end) = end
                && best.is_none_or(|(b, _)| end < b)
            {
                best = Some((end, host));
            }
        }
        let Some((end, host)) = best else {
            return Ok(None);
        };
        let rides = match self.options.ride {
            RideMode::Off => false,
            RideMode::Always => true,
            RideMode::Policy => {
                let step = LiveRequest {
                    phase: RequestPhase::Decode {
                        step: u64::from(self.tokens[leader] - 1),
                    },
                    work_left_ns: 1,
                    work_total_ns: 1,
                    alone_bound_ns: alone.lower_bound().ns(),
                    armed_ns: now_ns,
                    ..self.view(leader, now_ns, 0, 0)
                };
                self.order.may_ride(&step, end)
            }
        };
        Ok(rides.then(|| Ride {
            host,
            plan: rider,
            stages: self.ride_maps[&host].clone(),
        }))
    }

    /// Whether every request is done or refused.
    fn all_settled(&self) -> bool {
        self.stage
            .iter()
            .all(|s| matches!(s, Stage::Done | Stage::Refused))
    }
}
