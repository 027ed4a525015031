//! Property tests of simulated request mixes (prefills, batched decode steps, KV
//! admission) over random mixes: every instance runs exactly once and in dependency
//! order, no processor runs two jobs at once, the KV caches held never exceed the
//! budget, and under `fcfs` every request's schedule is its schedule alone, shifted (and
//! a request alone is the engine's own schedule of its prefill).

use std::collections::HashMap;
use std::sync::Arc;

use hetsched_runtime::engine;
use hetsched_runtime::requests::{
    KvFull, MixOptions, RequestSlice, RequestSpec, RequestsRun, RideMode, simulate_requests,
};
use hetsched_runtime::scene::Scene;
use hetsched_systems::{InstanceKey, Priority, RequestId, SloTargets, kv_cache_bytes};
use proptest::prelude::*;

/// (arrival gap ms, prompt tokens, new tokens, samples, interactive)
type Raw = (u64, u32, u32, u32, bool);

fn specs(raw: &[Raw]) -> Vec<RequestSpec> {
    let mut arrival_ms = 0;
    raw.iter()
        .enumerate()
        .map(
            |(i, &(gap, prompt_len, max_tokens, samples, interactive))| {
                arrival_ms += gap;
                RequestSpec {
                    id: RequestId(i as u64),
                    priority: if interactive {
                        Priority::INTERACTIVE
                    } else {
                        Priority::BACKGROUND
                    },
                    targets: SloTargets::default(),
                    arrival_ns: arrival_ms * 1_000_000,
                    prompt_len,
                    max_tokens,
                    samples,
                }
            },
        )
        .collect()
}

fn check_invariants(
    specs: &[RequestSpec],
    run: &RequestsRun,
    budget: Option<u64>,
) -> Result<(), TestCaseError> {
    // No processor runs two jobs at once (a decode row riding in a prefill job is that
    // job, below).
    let mut by_lane: Vec<&RequestSlice> =
        run.slices.iter().filter(|s| s.rode_in.is_none()).collect();
    by_lane.sort_by_key(|s| (s.lane, s.start_ns));
    for w in by_lane.windows(2) {
        if w[0].lane == w[1].lane {
            prop_assert!(
                w[0].end_ns <= w[1].start_ns,
                "overlap on lane {}",
                w[0].lane
            );
        }
    }
    // The plans after the requests' prefills are the decode step's, one a placement.
    let decode_plans = specs.len();
    // A decode row that rode ran inside a job of another request's prefill: on its lane,
    // at its times, the same layer's same linears.
    for rider in run.slices.iter().filter(|s| s.rode_in.is_some()) {
        prop_assert!(rider.plan >= decode_plans, "only a decode step rides");
        let host = run.slices.iter().find(|h| {
            h.rode_in.is_none()
                && Some(h.request) == rider.rode_in
                && h.plan < decode_plans
                && (h.lane, h.start_ns, h.end_ns) == (rider.lane, rider.start_ns, rider.end_ns)
        });
        let Some(host) = host else {
            return Err(TestCaseError::fail(format!(
                "{rider:?} rode in no prefill job"
            )));
        };
        let (r, h) = (
            &run.plans[rider.plan].stages[rider.key.stage as usize],
            &run.plans[host.plan].stages[host.key.stage as usize],
        );
        prop_assert_eq!((r.layer, &r.ops), (h.layer, &h.ops));
    }
    // Each served request's prefill: every instance once, after its predecessors, not
    // before the request was admitted.
    for (i, (spec, outcome)) in specs.iter().zip(&run.outcomes).enumerate() {
        let mine: Vec<&RequestSlice> = run.slices.iter().filter(|s| s.plan == i).collect();
        let Some(served) = outcome.served else {
            prop_assert!(mine.is_empty());
            continue;
        };
        let plan = &run.plans[i];
        prop_assert_eq!(mine.len(), plan.instance_count());
        let at: HashMap<InstanceKey, &RequestSlice> = mine.iter().map(|s| (s.key, *s)).collect();
        prop_assert_eq!(at.len(), mine.len(), "an instance ran twice");
        for s in &mine {
            prop_assert!(s.start_ns >= served.admitted_ns && served.admitted_ns >= spec.arrival_ns);
            for pred in plan.predecessors(s.key) {
                prop_assert!(
                    at[&pred].end_ns <= s.start_ns,
                    "{:?} before {:?}",
                    s.key,
                    pred
                );
            }
        }
        prop_assert_eq!(
            spec.arrival_ns + served.ttft_ns,
            mine.iter().map(|s| s.end_ns).max().unwrap()
        );
        prop_assert!(served.e2e_ns >= served.ttft_ns);
    }
    // Decode: one batch at a time, each a whole run of one decode plan (the decode
    // lane's or the NPU's) in dependency order, armed on a request after its first
    // token; every sequence gets its steps.
    let mut decode: Vec<&RequestSlice> = run
        .slices
        .iter()
        .filter(|s| s.plan >= decode_plans)
        .collect();
    decode.sort_by_key(|s| (s.start_ns, s.key.stage));
    let mut last_end = 0;
    let mut rows = 0u64;
    let mut rest = &decode[..];
    while let Some(first) = rest.first() {
        let plan = &run.plans[first.plan];
        let step = plan.instance_count();
        prop_assert!(rest.len() >= step, "a decode batch cut short");
        let (batch, tail) = rest.split_at(step);
        rest = tail;
        let leader = first.request;
        prop_assert!(batch.iter().all(|s| s.request == leader
            && s.plan == first.plan
            && s.decode_rows == first.decode_rows));
        prop_assert!(first.start_ns >= last_end, "two decode batches at once");
        let at: HashMap<InstanceKey, &RequestSlice> = batch.iter().map(|s| (s.key, *s)).collect();
        prop_assert_eq!(at.len(), step, "a decode instance ran twice");
        for s in batch {
            prop_assert!(plan.exists(s.key));
            for pred in plan.predecessors(s.key) {
                prop_assert!(at[&pred].end_ns <= s.start_ns);
            }
        }
        let i = leader.0 as usize;
        let first_token = specs[i].arrival_ns + run.outcomes[i].served.unwrap().ttft_ns;
        prop_assert!(first.start_ns >= first_token);
        last_end = batch.iter().map(|s| s.end_ns).max().unwrap();
        rows += u64::from(first.decode_rows);
    }
    let want: u64 = specs
        .iter()
        .zip(&run.outcomes)
        .filter(|(_, o)| o.served.is_some())
        .map(|(s, _)| u64::from(s.samples) * u64::from(s.max_tokens - 1))
        .sum();
    prop_assert_eq!(rows, want);
    // KV memory never above the budget.
    if let Some(budget) = budget {
        prop_assert!(run.peak_kv_bytes <= budget);
    }
    Ok(())
}

/// A request's jobs (its prefill and the decode batches armed on it) as (lane, which
/// decode plan if any, key, rows, start from its first job, duration).
type Shape = Vec<(usize, Option<usize>, InstanceKey, u32, u64, u64)>;

fn shape(run: &RequestsRun, id: RequestId, index: usize, requests: usize) -> Shape {
    let mut mine: Vec<&RequestSlice> = run
        .slices
        .iter()
        .filter(|s| s.request == id && (s.plan == index || s.plan >= requests))
        .collect();
    mine.sort_by_key(|s| (s.start_ns, s.lane));
    let origin = mine.first().map_or(0, |s| s.start_ns);
    mine.iter()
        .map(|s| {
            (
                s.lane,
                s.plan.checked_sub(requests),
                s.key,
                s.decode_rows,
                s.start_ns - origin,
                s.end_ns - s.start_ns,
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_mixes_keep_the_invariants(
        raw in prop::collection::vec((0u64..800, 1u32..600, 1u32..6, 1u32..4, any::<bool>()), 1..5),
        which in 0usize..3,
        budget_share in prop::option::of(0.0f64..1.0),
        refuse in any::<bool>(),
        ride in 0usize..3,
    ) {
        let scene = Scene::default_scene();
        let specs = specs(&raw);
        let kv: Vec<u64> = specs
            .iter()
            .map(|s| kv_cache_bytes(&scene.model, s.prompt_len, s.max_tokens, s.samples))
            .collect();
        // A budget between the largest request's caches and all of them together.
        let (largest, all) = (*kv.iter().max().unwrap(), kv.iter().sum::<u64>());
        let budget = budget_share.map(|f| largest + ((all - largest) as f64 * f) as u64);
        let options = MixOptions {
            request_policy: ["fcfs", "priority", "slack"][which].to_string(),
            kv_budget_bytes: budget,
            kv_full: if refuse { KvFull::Refuse } else { KvFull::Wait },
            attention_part_ns: None,
            ride: [RideMode::Off, RideMode::Policy, RideMode::Always][ride],
        };
        let run = simulate_requests(&scene, &specs, &options).unwrap();
        check_invariants(&specs, &run, budget)?;
        if budget.is_none() || !refuse {
            prop_assert!(run.outcomes.iter().all(|o| o.served.is_some()), "only refusal drops a request");
        }
    }

    #[test]
    fn fcfs_schedules_each_request_as_alone(
        raw in prop::collection::vec((0u64..800, 1u32..600, 1u32..5, 1u32..3, any::<bool>()), 1..4),
        split in any::<bool>(),
        ride in any::<bool>(),
    ) {
        let scene = Scene::default_scene();
        let specs = specs(&raw);
        // With attention cut by heads (parts of about 2 ms: up to 4 on these prompts),
        // alone and in the mix; riding asked for always or never (under `fcfs` no step
        // rides: the prefill beside it gets no processor).
        let options = MixOptions {
            attention_part_ns: split.then_some(2_000_000),
            ride: if ride { RideMode::Always } else { RideMode::Off },
            ..MixOptions::new("fcfs")
        };
        let run = simulate_requests(&scene, &specs, &options).unwrap();
        check_invariants(&specs, &run, None)?;
        for (i, spec) in specs.iter().enumerate() {
            let lone = RequestSpec { arrival_ns: 0, ..spec.clone() };
            let alone = simulate_requests(&scene, std::slice::from_ref(&lone), &options).unwrap();
            prop_assert_eq!(
                shape(&run, spec.id, i, specs.len()),
                shape(&alone, spec.id, 0, 1),
                "request {}",
                i
            );
            // Alone, its prefill is the engine's schedule of its plan, job for job.
            let engine = engine::simulate(Arc::clone(&alone.plans[0]), scene.new_policy().unwrap()).unwrap();
            let mut want: Vec<(usize, InstanceKey, u64, u64)> = engine
                .timeline
                .slices
                .iter()
                .map(|s| (s.processor, s.key, s.start_ns, s.end_ns))
                .collect();
            let mut got: Vec<(usize, InstanceKey, u64, u64)> = alone
                .slices
                .iter()
                .filter(|s| s.plan == 0)
                .map(|s| (s.lane, s.key, s.start_ns, s.end_ns))
                .collect();
            want.sort();
            got.sort();
            prop_assert_eq!(got, want);
        }
    }
}

/// A background prefill loading the CPU while an interactive request decodes: its decode
/// batches take the NPU's plan, and the mix keeps every invariant.
#[test]
fn decode_batches_on_the_npu_keep_the_invariants() {
    let scene = Scene::default_scene();
    let specs = specs(&[(0, 2048, 8, 1, false), (100, 64, 8, 2, true)]);
    for policy in ["priority", "slack"] {
        let run = simulate_requests(&scene, &specs, &MixOptions::new(policy)).unwrap();
        check_invariants(&specs, &run, None).unwrap();
        let npu_plan = specs.len() + 1;
        assert!(
            run.slices
                .iter()
                .any(|s| s.plan == npu_plan && s.decode_rows > 0),
            "{policy}: no decode batch took the NPU's plan"
        );
    }
}

/// An interactive request decoding during a long background prefill, its steps riding
/// the prefill's chunks: rows rode (each inside a job of the background's same linears,
/// checked with every other invariant), none without riding, and the interactive
/// request still gets every token.
#[test]
fn decode_rows_ride_in_a_background_prefill_and_keep_the_invariants() {
    let scene = Scene::default_scene();
    let specs = specs(&[(0, 2048, 4, 1, false), (100, 64, 6, 2, true)]);
    for policy in ["priority", "slack"] {
        let ride = |mode| {
            let options = MixOptions {
                ride: mode,
                ..MixOptions::new(policy)
            };
            simulate_requests(&scene, &specs, &options).unwrap()
        };
        let rode = ride(RideMode::Always);
        check_invariants(&specs, &rode, None).unwrap();
        let riders = rode
            .slices
            .iter()
            .filter(|s| s.rode_in == Some(RequestId(0)))
            .count();
        assert!(riders > 0, "{policy}: no decode row rode");
        let alone = ride(RideMode::Off);
        check_invariants(&specs, &alone, None).unwrap();
        assert!(alone.slices.iter().all(|s| s.rode_in.is_none()));
        assert!(rode.outcomes.iter().all(|o| o.served.is_some()));
    }
}
