//! Many requests in one world, over random request mixes (proptest): every request's
//! instances run exactly once, on lanes they may run on, after their predecessors; no
//! processor runs two jobs at once across requests; under `fcfs` every request is
//! scheduled exactly as it is alone, shifted to when it started; under `priority` an
//! interactive request that arrives alone with background work is never behind it.

use std::cmp::Reverse;
use std::sync::Arc;

use bevy_ecs::prelude::{Entity, World};
use hetsched_systems::request_policy::create_request_policy;
use hetsched_systems::resources::{Clock, Completion, Inbox, Outbox, SliceRecord, TimelineLog};
use hetsched_systems::testing::{Timing, check_schedule, tiny_plan};
use hetsched_systems::{
    ActiveRequestPolicy, LiveRuns, PolicyRegistry, PrefillPlan, Priority, Request, RequestId,
    RequestPhase, SloTargets, arm_request, scheduler_schedule, spawn_request_entity,
    spawn_request_world, spawn_world,
};
use proptest::prelude::*;

const POLICIES: [&str; 5] = ["balance", "stall", "inorder", "heft", "lookahead"];

#[derive(Clone, Debug)]
struct Spec {
    layers: u32,
    prompt_len: u32,
    chunk_len: u32,
    arrival_ns: u64,
    interactive: bool,
    policy: usize,
    /// Attention cut by query heads into as many parts as the model has heads.
    split: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        1u32..3,
        1u32..6,
        prop::sample::select(vec![4u32, 8, 16]),
        0u64..400_000,
        any::<bool>(),
        0usize..POLICIES.len(),
        any::<bool>(),
    )
        .prop_map(
            |(layers, chunks, chunk_len, arrival_ns, interactive, policy, split)| Spec {
                layers,
                prompt_len: chunks * chunk_len - chunk_len / 2,
                chunk_len,
                arrival_ns,
                interactive,
                policy,
                split,
            },
        )
}

fn plan_of(spec: &Spec) -> Arc<PrefillPlan> {
    let plan = tiny_plan(spec.layers, spec.prompt_len, spec.chunk_len);
    // A part of 1 ns: one part per query head.
    let plan = match spec.split {
        true => plan.with_attention_split(1).expect("a valid split plan"),
        false => plan,
    };
    Arc::new(plan)
}

fn policy_of(spec: &Spec) -> Box<dyn hetsched_systems::Policy> {
    PolicyRegistry::builtin()
        .create(POLICIES[spec.policy])
        .unwrap()
}

/// Runs `specs` in one world under `request_policy` on simulated queues (every job takes
/// its modeled time); each request's run is armed at its arrival. Returns every slice.
fn run_together(specs: &[Spec], request_policy: &str) -> Result<Vec<SliceRecord>, String> {
    let device = plan_of(&specs[0]).device.clone();
    let mut world = spawn_request_world(&device);
    world.insert_resource(ActiveRequestPolicy(
        create_request_policy(request_policy).unwrap(),
    ));
    let mut schedule = scheduler_schedule();
    let mut arrivals: Vec<(u64, usize)> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| (s.arrival_ns, i))
        .collect();
    arrivals.sort_unstable_by_key(|&(at, i)| Reverse((at, i)));
    let mut in_flight: Vec<(u64, usize, u32, u64)> = Vec::new();
    let mut slices = Vec::new();
    for _ in 0..1_000_000 {
        let now = world.resource::<Clock>().now_ns;
        while arrivals.last().is_some_and(|&(at, _)| at <= now) {
            let (_, i) = arrivals.pop().unwrap();
            arm(&mut world, i, &specs[i]);
        }
        schedule.run(&mut world);
        for job in std::mem::take(&mut world.resource_mut::<Outbox>().0) {
            in_flight.push((now + job.estimated_ns, job.processor, job.id, now));
        }
        slices.append(&mut world.resource_mut::<TimelineLog>().slices);
        let outstanding = world.resource::<LiveRuns>().outstanding;
        if outstanding == 0 && arrivals.is_empty() && in_flight.is_empty() {
            return Ok(slices);
        }
        let next_end = in_flight.iter().map(|j| j.0).min();
        let next_arrival = arrivals.last().map(|a| a.0);
        let next = match (next_end, next_arrival) {
            (Some(e), Some(a)) => e.min(a),
            (Some(e), None) => e,
            (None, Some(a)) => a,
            (None, None) => return Err(format!("stalled with {outstanding} outstanding")),
        };
        world.resource_mut::<Clock>().now_ns = next;
        let (done, rest): (Vec<_>, Vec<_>) = in_flight.into_iter().partition(|j| j.0 == next);
        in_flight = rest;
        let mut done = done;
        done.sort_unstable_by_key(|j| j.1);
        world.resource_mut::<Inbox>().0.extend(done.into_iter().map(
            |(end, processor, id, start)| Completion {
                id,
                processor,
                start_ns: start,
                end_ns: end,
            },
        ));
    }
    Err("no end after a million ticks".into())
}

fn arm(world: &mut World, i: usize, spec: &Spec) -> Entity {
    let priority = if spec.interactive {
        Priority::INTERACTIVE
    } else {
        Priority::BACKGROUND
    };
    let now = world.resource::<Clock>().now_ns;
    let request = Request::new(RequestId(i as u64), priority, SloTargets::default(), now);
    let entity = spawn_request_entity(world, request);
    arm_request(
        world,
        entity,
        plan_of(spec),
        policy_of(spec),
        RequestPhase::Prefill,
    )
    .unwrap();
    entity
}

/// `spec`'s run alone in a fresh world, from time 0.
fn alone(spec: &Spec) -> Vec<SliceRecord> {
    let mut world = spawn_world(plan_of(spec), policy_of(spec));
    let mut schedule = scheduler_schedule();
    let mut in_flight: Vec<(u64, usize, u32, u64)> = Vec::new();
    let mut slices = Vec::new();
    loop {
        schedule.run(&mut world);
        let now = world.resource::<Clock>().now_ns;
        for job in std::mem::take(&mut world.resource_mut::<Outbox>().0) {
            in_flight.push((now + job.estimated_ns, job.processor, job.id, now));
        }
        slices.append(&mut world.resource_mut::<TimelineLog>().slices);
        let Some(next) = in_flight.iter().map(|j| j.0).min() else {
            return slices;
        };
        world.resource_mut::<Clock>().now_ns = next;
        let (done, rest): (Vec<_>, Vec<_>) = in_flight.into_iter().partition(|j| j.0 == next);
        in_flight = rest;
        world.resource_mut::<Inbox>().0.extend(done.into_iter().map(
            |(end, processor, id, start)| Completion {
                id,
                processor,
                start_ns: start,
                end_ns: end,
            },
        ));
    }
}

fn of_request(slices: &[SliceRecord], id: u64) -> Vec<SliceRecord> {
    let mut mine: Vec<SliceRecord> = slices
        .iter()
        .filter(|s| s.request == RequestId(id))
        .copied()
        .collect();
    mine.sort_unstable_by_key(|s| (s.start_ns, s.processor, s.id));
    mine
}

fn check_together(specs: &[Spec], slices: &[SliceRecord]) -> Result<(), TestCaseError> {
    for (i, spec) in specs.iter().enumerate() {
        let plan = plan_of(spec);
        let mine = of_request(slices, i as u64);
        let home_only = !policy_of(spec).chooses_placement();
        check_schedule(&plan, &mine, Timing::Modeled, home_only)
            .map_err(|e| TestCaseError::fail(format!("request {i}: {e}")))?;
        let first = mine.iter().map(|s| s.start_ns).min().unwrap_or(0);
        prop_assert!(
            first >= spec.arrival_ns,
            "request {i} started before it arrived"
        );
    }
    let lanes = plan_of(&specs[0]).lanes();
    for lane in 0..lanes {
        let mut spans: Vec<(u64, u64)> = slices
            .iter()
            .filter(|s| s.processor == lane)
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        spans.sort_unstable();
        prop_assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "lane {} ran two jobs at once",
            lane
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Each request's instances once, in dependency order, on their lanes; no lane runs
    /// two jobs at once; under fcfs each request's schedule is its schedule alone, shifted.
    #[test]
    fn every_request_policy_keeps_the_invariants_and_fcfs_equals_alone(
        specs in prop::collection::vec(spec(), 1..5),
        which in 0usize..3,
    ) {
        let request_policy = ["fcfs", "priority", "slack"][which];
        let slices = run_together(&specs, request_policy).map_err(TestCaseError::fail)?;
        check_together(&specs, &slices)?;
        if request_policy == "fcfs" {
            for (i, spec) in specs.iter().enumerate() {
                let mine = of_request(&slices, i as u64);
                let start = mine.iter().map(|s| s.start_ns).min().unwrap();
                let mut shifted: Vec<SliceRecord> = alone(spec)
                    .into_iter()
                    .map(|s| SliceRecord {
                        request: RequestId(i as u64),
                        start_ns: s.start_ns + start,
                        end_ns: s.end_ns + start,
                        ..s
                    })
                    .collect();
                shifted.sort_unstable_by_key(|s| (s.start_ns, s.processor, s.id));
                prop_assert_eq!(&mine, &shifted, "request {} under fcfs differs from alone", i);
            }
        }
    }
}

/// Under `priority`, an interactive request arriving while a long background prefill
/// runs finishes its prefill well before the background one, and the background run
/// still completes (preemption loses no work).
#[test]
fn an_interactive_request_overtakes_a_background_prefill_under_priority() {
    let background = Spec {
        layers: 2,
        prompt_len: 256,
        chunk_len: 16,
        arrival_ns: 0,
        interactive: false,
        policy: 0,
        split: false,
    };
    let interactive = Spec {
        prompt_len: 16,
        arrival_ns: 50_000,
        interactive: true,
        ..background.clone()
    };
    let specs = [background, interactive];
    let end = |slices: &[SliceRecord], id| of_request(slices, id).iter().map(|s| s.end_ns).max();
    let prio = run_together(&specs, "priority").unwrap();
    let fcfs = run_together(&specs, "fcfs").unwrap();
    let alone_ns = end(&alone(&specs[1]), 0).unwrap();
    let (bg, fg) = (end(&prio, 0).unwrap(), end(&prio, 1).unwrap());
    assert!(fg < bg, "interactive {fg} ns, background {bg} ns");
    assert!(
        end(&fcfs, 1).unwrap() > end(&fcfs, 0).unwrap(),
        "fcfs waits"
    );
    let waited = fg - specs[1].arrival_ns;
    assert!(
        waited < 2 * alone_ns,
        "the interactive prefill took {waited} ns beside the background one, {alone_ns} ns alone"
    );
    assert_eq!(
        of_request(&prio, 0).len(),
        plan_of(&specs[0]).instance_count()
    );
}
