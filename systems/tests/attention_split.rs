//! Attention cut by query heads (`PrefillPlan::with_attention_split`): the parts wait for
//! what the whole stage waited for and the stage after waits for every part; the parts
//! cost their whole plus one launch and one operator overhead per extra job; every
//! instance of a cut plan runs exactly once, in dependency order, under every policy.

use std::sync::Arc;

use hetsched_systems::attention_split::head_groups;
use hetsched_systems::model::OpKind;
use hetsched_systems::resources::{Clock, Completion, Inbox, Outbox, SliceRecord, TimelineLog};
use hetsched_systems::testing::{Timing, check_schedule, tiny_plan};
use hetsched_systems::{
    InstanceKey, LiveRuns, PolicyRegistry, PrefillPlan, scheduler_schedule, spawn_world,
};
use proptest::prelude::*;

const POLICIES: [&str; 5] = ["balance", "stall", "inorder", "heft", "lookahead"];

/// Runs `plan` alone under `policy`, every job for its modeled time.
fn simulate(plan: Arc<PrefillPlan>, policy: &str) -> Vec<SliceRecord> {
    let policy = PolicyRegistry::builtin().create(policy).unwrap();
    let mut world = spawn_world(plan, policy);
    let mut schedule = scheduler_schedule();
    let mut in_flight = Vec::new();
    loop {
        schedule.run(&mut world);
        let now = world.resource::<Clock>().now_ns;
        in_flight.extend(
            world
                .resource_mut::<Outbox>()
                .0
                .drain(..)
                .map(|j| (now + j.estimated_ns, now, j)),
        );
        in_flight.sort_by_key(|(end, _, j)| (std::cmp::Reverse(*end), std::cmp::Reverse(j.id)));
        let Some((end, start, job)) = in_flight.pop() else {
            break;
        };
        world.resource_mut::<Clock>().now_ns = end;
        world.resource_mut::<Inbox>().0.push(Completion {
            id: job.id,
            processor: job.processor,
            start_ns: start,
            end_ns: end,
        });
    }
    schedule.run(&mut world);
    assert_eq!(world.resource::<LiveRuns>().outstanding, 0, "work left");
    std::mem::take(&mut world.resource_mut::<TimelineLog>().slices)
}

/// The stages of a cut plan that came from one whole attention stage: prep, parts, merge.
fn cut_stages(plan: &PrefillPlan) -> Vec<(u32, Vec<u32>, u32)> {
    let mut cuts = Vec::new();
    for (j, stage) in plan.stages.iter().enumerate() {
        if stage.head_range().is_some_and(|r| r.first == 0) {
            let parts: Vec<u32> = (j..plan.stages.len())
                .take_while(|&k| plan.stages[k].head_range().is_some())
                .map(|k| k as u32)
                .collect();
            let merge = parts.last().unwrap() + 1;
            cuts.push((j as u32 - 1, parts, merge));
        }
    }
    cuts
}

#[test]
fn parts_wait_for_every_chunks_prep_and_the_merge_for_every_part() {
    let whole = tiny_plan(2, 64, 16);
    let plan = tiny_plan(2, 64, 16).with_attention_split(1).unwrap();
    let cuts = cut_stages(&plan);
    assert_eq!(cuts.len(), 2, "one cut per layer");
    for (prep, parts, merge) in &cuts {
        assert_eq!(parts.len(), whole.model.heads as usize);
        assert_eq!(plan.stages[*merge as usize].ops[0].name, "o_quant");
        for chunk in 0..plan.chunks {
            for &part in parts {
                let waits = plan.predecessors(InstanceKey { chunk, stage: part });
                let preps: Vec<u32> = (0..=chunk).collect();
                assert_eq!(
                    waits.iter().map(|k| k.chunk).collect::<Vec<_>>(),
                    preps,
                    "chunk {chunk} part {part}"
                );
                assert!(waits.iter().all(|k| k.stage == *prep));
            }
            let waits = plan.predecessors(InstanceKey {
                chunk,
                stage: *merge,
            });
            let want: Vec<InstanceKey> = parts
                .iter()
                .map(|&stage| InstanceKey { chunk, stage })
                .collect();
            assert_eq!(waits, want);
        }
    }
    // Every stage but the cut ones is the whole plan's, and waits the same way.
    assert_eq!(
        plan.stages.len(),
        whole.stages.len() + cuts.len() * (whole.model.heads as usize + 1)
    );
}

#[test]
fn parts_cost_their_whole_plus_one_launch_and_overhead_per_extra_job() {
    let whole = tiny_plan(2, 128, 32);
    // Two parts of 2 query heads, one KV head each: nothing is read twice.
    assert_eq!(head_groups(&whole.model, 2).len(), 2);
    // Two parts: a part length just under half the longest attention.
    let lane = 0;
    let attention_stage = whole
        .stages
        .iter()
        .position(|s| s.ops.iter().any(|op| op.kind == OpKind::Attention))
        .unwrap() as u32;
    let last = InstanceKey {
        chunk: whole.chunks - 1,
        stage: attention_stage,
    };
    let processor = &whole.device.processors[lane];
    let attention_ns = {
        let op = whole.stages[attention_stage as usize]
            .ops
            .iter()
            .find(|op| op.kind == OpKind::Attention)
            .unwrap();
        processor
            .cost
            .op_ns(&whole.model, op, whole.executed_shape(last))
            .unwrap()
    };
    let split = tiny_plan(2, 128, 32)
        .with_attention_split((attention_ns / 2.0).ceil() as u64)
        .unwrap();
    let cuts = cut_stages(&split);
    assert_eq!(cuts[0].1.len(), 2, "two parts");
    let (launch, overhead) = (
        (processor.cost.launch_us * 1e3) as u64,
        (processor.cost.op_overhead_us * 1e3) as u64,
    );
    for ((prep, parts, merge), whole_stage) in cuts.iter().zip(
        whole
            .stages
            .iter()
            .enumerate()
            .filter(|(_, s)| s.ops.iter().any(|op| op.kind == OpKind::Attention))
            .map(|(j, _)| j as u32),
    ) {
        for chunk in 0..whole.chunks {
            let cost = |plan: &PrefillPlan, stage| {
                plan.cost_on(InstanceKey { chunk, stage }, lane).unwrap()
            };
            let sum: u64 = std::iter::once(*prep)
                .chain(parts.iter().copied())
                .chain([*merge])
                .map(|s| cost(&split, s))
                .sum();
            let jobs = parts.len() as u64 + 2;
            // One launch per extra job; one operator overhead per extra part.
            let want = cost(&whole, whole_stage)
                + (jobs - 1) * launch
                + (parts.len() as u64 - 1) * overhead;
            // Each job's cost is rounded to whole ns.
            assert!(
                sum.abs_diff(want) <= jobs,
                "chunk {chunk}: parts {sum} ns, whole plus overheads {want} ns"
            );
        }
    }
}

#[test]
fn a_short_attention_or_one_processor_is_left_whole() {
    let plan = tiny_plan(2, 64, 16);
    let stages = plan.stages.len();
    assert_eq!(
        plan.with_attention_split(u64::MAX).unwrap().stages.len(),
        stages
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_part_runs_once_after_its_predecessors(
        layers in 1u32..3,
        chunks in 1u32..6,
        chunk_len in prop::sample::select(vec![4u32, 8, 16]),
        part_ns in prop::sample::select(vec![1u64, 2_000, 20_000, u64::MAX]),
        policy in 0usize..POLICIES.len(),
    ) {
        let prompt_len = chunks * chunk_len - chunk_len / 2;
        let plan = Arc::new(
            tiny_plan(layers, prompt_len, chunk_len)
                .with_attention_split(part_ns)
                .unwrap(),
        );
        let slices = simulate(Arc::clone(&plan), POLICIES[policy]);
        prop_assert_eq!(check_schedule(&plan, &slices, Timing::Modeled, false), Ok(()));
    }
}
