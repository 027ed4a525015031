//! Memory planner: validity on random buffer sets, hand cases, a SmolLM2-shaped
//! chunked prefill, and the best-plan choice on 20k buffers (its speed is in
//! `benches/memory_planner.rs`).

use hetsched_systems::memory::{
    Buffer, MemoryError, MemoryPlan, Placement, PlanEffort, SWEEPS_MARGIN, SWEEPS_ONLY_ABOVE,
    Strategy, aligned_lower_bound, check_plan, fits, lower_bound, plan_offsets, plan_offsets_each,
    plan_with,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as PropStrategy;

fn buf(id: u32, bytes: u64, start: u64, end: u64) -> Buffer {
    Buffer {
        id,
        bytes,
        start,
        end,
    }
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// O(n^2) reference check of address conflicts.
fn naive_conflict(buffers: &[Buffer], plan: &MemoryPlan, alignment: u64) -> bool {
    (0..buffers.len()).any(|i| {
        (0..i).any(|j| {
            let (a, b) = (&buffers[i], &buffers[j]);
            let (ao, bo) = (plan.offset(i), plan.offset(j));
            let (ae, be) = (
                ao + align_up(a.bytes, alignment),
                bo + align_up(b.bytes, alignment),
            );
            a.overlaps_in_time(b) && ao < be && bo < ae
        })
    })
}

fn buffer_set() -> impl PropStrategy<Value = Vec<Buffer>> {
    prop::collection::vec((1u64..1 << 20, 0u64..1000, 1u64..300), 0..60).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (bytes, start, len))| buf(i as u32, bytes, start, start + len))
            .collect()
    })
}

fn alignment() -> impl PropStrategy<Value = u64> {
    prop::sample::select(vec![1u64, 16, 64, 4096])
}

proptest! {
    // Failures print their seed; no regression files next to the tests.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_strategy_gives_a_valid_plan_above_the_bound(
        buffers in buffer_set(),
        alignment in alignment(),
    ) {
        let bound = lower_bound(&buffers);
        let aligned_bound = aligned_lower_bound(&buffers, alignment).unwrap();
        prop_assert!(aligned_bound >= bound);
        let best = plan_offsets(&buffers, alignment).unwrap();
        check_plan(&buffers, &best, alignment).map_err(TestCaseError::fail)?;
        prop_assert!(!naive_conflict(&buffers, &best, alignment));
        prop_assert!(best.peak_bytes >= aligned_bound);
        for strategy in Strategy::ALL {
            let plan = plan_with(&buffers, alignment, strategy).unwrap();
            prop_assert_eq!(plan.strategy, strategy);
            check_plan(&buffers, &plan, alignment).map_err(TestCaseError::fail)?;
            prop_assert!(!naive_conflict(&buffers, &plan, alignment));
            prop_assert!(plan.peak_bytes >= aligned_bound);
            prop_assert!(best.peak_bytes <= plan.peak_bytes);
        }
        // Deterministic.
        prop_assert_eq!(plan_offsets(&buffers, alignment).unwrap(), best);
    }

    /// `check_plan` agrees with the O(n^2) reference on arbitrary (often bad) plans.
    /// Whatever order `plan_offsets` runs the strategies in and however early it gives
    /// them up, it keeps what running every strategy to the end keeps: the lowest
    /// peak, the first such in `Strategy::ALL`. Few distinct sizes and times, so that
    /// strategies often tie.
    #[test]
    fn plan_offsets_keeps_the_first_lowest_plan(
        raw in prop::collection::vec((1u64..6, 0u64..12, 1u64..8), 0..80),
        alignment in alignment(),
    ) {
        let buffers: Vec<Buffer> = raw
            .into_iter()
            .enumerate()
            .map(|(i, (units, start, len))| buf(i as u32, 48 * units, start, start + len))
            .collect();
        let plans: Vec<MemoryPlan> = Strategy::ALL
            .iter()
            .map(|&s| plan_with(&buffers, alignment, s).unwrap())
            .collect();
        let lowest = plans.iter().map(|p| p.peak_bytes).min().unwrap();
        let first_lowest = plans.iter().find(|p| p.peak_bytes == lowest).unwrap();
        prop_assert_eq!(&plan_offsets(&buffers, alignment).unwrap(), first_lowest);
    }

    /// Several sets planned at once, their strategies over threads, keep each set's
    /// `plan_offsets` plan (or error), whichever thread runs what when. Few distinct
    /// sizes and times, so that strategies tie often; bad alignments among the sets.
    #[test]
    fn plans_over_threads_are_plan_offsets_plans(
        sets in prop::collection::vec(
            (prop::collection::vec((1u64..6, 0u64..12, 1u64..8), 0..80),
             prop::sample::select(vec![1u64, 16, 64, 4096, 24])),
            0..5,
        ),
        threads in 1usize..5,
    ) {
        let sets: Vec<(Vec<Buffer>, u64)> = sets
            .into_iter()
            .map(|(raw, alignment)| {
                let buffers = raw
                    .into_iter()
                    .enumerate()
                    .map(|(i, (units, start, len))| buf(i as u32, 48 * units, start, start + len))
                    .collect();
                (buffers, alignment)
            })
            .collect();
        let borrowed: Vec<(&[Buffer], u64)> =
            sets.iter().map(|(b, a)| (b.as_slice(), *a)).collect();
        let each = plan_offsets_each(&borrowed, threads, PlanEffort::Exhaustive);
        prop_assert_eq!(each.len(), sets.len());
        for ((buffers, alignment), got) in sets.iter().zip(each) {
            prop_assert_eq!(got, plan_offsets(buffers, *alignment));
        }
    }

    #[test]
    fn check_plan_catches_exactly_the_overlaps(
        buffers in buffer_set(),
        alignment in alignment(),
        slots in prop::collection::vec(0u64..8, 60),
    ) {
        let unit = align_up(1 << 20, alignment);
        let placements: Vec<Placement> = buffers
            .iter()
            .zip(&slots)
            .map(|(b, &s)| Placement { id: b.id, offset: s * unit })
            .collect();
        let peak_bytes = placements
            .iter()
            .zip(&buffers)
            .map(|(p, b)| p.offset + align_up(b.bytes, alignment))
            .max()
            .unwrap_or(0);
        let plan = MemoryPlan { placements, peak_bytes, strategy: Strategy::GreedyBySize, alignment };
        prop_assert_eq!(
            check_plan(&buffers, &plan, alignment).is_ok(),
            !naive_conflict(&buffers, &plan, alignment)
        );
    }
}

#[test]
fn disjoint_lifetimes_share_offset_zero() {
    let buffers: Vec<Buffer> = (0..10)
        .map(|i| {
            buf(
                i,
                1000 * u64::from(i + 1),
                10 * u64::from(i),
                10 * u64::from(i + 1),
            )
        })
        .collect();
    for strategy in Strategy::ALL {
        let plan = plan_with(&buffers, 1, strategy).unwrap();
        assert!(plan.placements.iter().all(|p| p.offset == 0), "{strategy}");
        assert_eq!(plan.peak_bytes, 10_000, "{strategy}");
    }
    assert_eq!(lower_bound(&buffers), 10_000);
}

#[test]
fn overlapping_lifetimes_stack() {
    let sizes = [100u64, 64, 1, 4097, 300];
    let buffers: Vec<Buffer> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| buf(i as u32, s, i as u64, 100))
        .collect();
    for alignment in [1, 16, 64, 4096] {
        let stacked: u64 = sizes.iter().map(|&s| align_up(s, alignment)).sum();
        for strategy in Strategy::ALL {
            let plan = plan_with(&buffers, alignment, strategy).unwrap();
            check_plan(&buffers, &plan, alignment).unwrap();
            assert_eq!(
                plan.peak_bytes, stacked,
                "{strategy} at alignment {alignment}"
            );
        }
        assert_eq!(aligned_lower_bound(&buffers, alignment).unwrap(), stacked);
    }
}

#[test]
fn greedy_by_size_beats_by_start() {
    // By start: 0 at 0, 1 at 10, then 2 (20 bytes) does not fit in 0's old 10 bytes.
    // By size: 2 at 0, 1 above it, 0 under 1 in the bytes 2 is not yet using.
    let buffers = [buf(0, 10, 0, 2), buf(1, 10, 1, 4), buf(2, 20, 2, 5)];
    let by_size = plan_with(&buffers, 1, Strategy::GreedyBySize).unwrap();
    let by_start = plan_with(&buffers, 1, Strategy::GreedyByStart).unwrap();
    assert_eq!(lower_bound(&buffers), 30);
    assert_eq!(by_size.peak_bytes, 30);
    assert_eq!(by_start.peak_bytes, 40);
    let best = plan_offsets(&buffers, 1).unwrap();
    assert_eq!(best.peak_bytes, 30);
    assert_eq!(best.strategy, Strategy::GreedyBySize);
}

#[test]
fn half_open_lifetimes_touching_do_not_conflict() {
    let buffers = [buf(0, 64, 0, 5), buf(1, 64, 5, 9), buf(2, 64, 4, 6)];
    let plan = plan_offsets(&buffers, 64).unwrap();
    check_plan(&buffers, &plan, 64).unwrap();
    assert_eq!(plan.peak_bytes, 128);
    assert_eq!(plan.offset(0), plan.offset(1));
}

#[test]
fn bad_input_is_rejected_with_advice() {
    let buffers = [buf(0, 64, 0, 5)];
    for bad in [0, 3, 48, 1000] {
        let err = plan_offsets(&buffers, bad).unwrap_err();
        assert_eq!(err, MemoryError::BadAlignment(bad));
        assert!(err.to_string().contains("power of two"));
        assert!(aligned_lower_bound(&buffers, bad).is_err());
    }
    let err = plan_offsets(&[buf(9, 64, 5, 5)], 64).unwrap_err();
    assert!(matches!(err, MemoryError::EmptyLifetime { id: 9, .. }));
    let err = plan_offsets(&[buf(0, u64::MAX, 0, 1)], 64).unwrap_err();
    assert_eq!(err, MemoryError::Overflow);

    let plan = plan_offsets(&[buf(0, 5000, 0, 1), buf(1, 5000, 0, 1)], 4096).unwrap();
    assert_eq!(plan.peak_bytes, 16384);
    let err = fits(&plan, 10_000).unwrap_err();
    assert_eq!(
        err,
        MemoryError::BudgetExceeded {
            needed: 16384,
            available: 10_000
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("16384") && msg.contains("10000") && msg.contains("6384"),
        "{msg}"
    );
    assert!(fits(&plan, 16384).is_ok());
}

#[test]
fn zero_byte_buffers_and_empty_sets() {
    let plan = plan_offsets(&[], 64).unwrap();
    assert_eq!(plan.peak_bytes, 0);
    assert!(plan.placements.is_empty());
    let buffers = [buf(0, 0, 0, 10), buf(1, 100, 0, 10), buf(2, 0, 3, 4)];
    for strategy in Strategy::ALL {
        let plan = plan_with(&buffers, 64, strategy).unwrap();
        check_plan(&buffers, &plan, 64).unwrap();
        assert_eq!(plan.peak_bytes, 128);
    }
}

/// A SmolLM2-135M-shaped chunked prefill: its buffers, lifetimes in ns from a
/// pipelined two-processor schedule.
mod smollm2 {
    use super::{Buffer, buf};

    const LAYERS: usize = 30;
    const HIDDEN: u64 = 576;
    const HEADS: u64 = 9;
    const KV_DIM: u64 = 3 * 64;
    const FFN: u64 = 1536;
    const VOCAB: u64 = 49152;
    const CHUNK: u64 = 256;
    /// fp32 activations.
    const ELEM: u64 = 4;

    /// Per-chunk stages: 0 embedding, then per layer 5 (qkv, attention, o-proj +
    /// residual, gate/up, down + residual); the head runs after the last chunk's
    /// last layer.
    const STAGES: usize = 1 + 5 * LAYERS;
    const HEAD: usize = STAGES;

    fn qkv(l: usize) -> usize {
        1 + 5 * l
    }
    fn attn(l: usize) -> usize {
        2 + 5 * l
    }
    fn o_proj(l: usize) -> usize {
        3 + 5 * l
    }
    fn up(l: usize) -> usize {
        4 + 5 * l
    }
    fn down(l: usize) -> usize {
        5 + 5 * l
    }

    /// Attention runs on the CPU (1), everything else on the NPU (0).
    fn processor(stage: usize) -> usize {
        usize::from(stage != 0 && stage != HEAD && (stage - 1) % 5 == 1)
    }

    /// Modeled ns: linears at ~1 int8 TOP/s on the NPU, attention growing with the past.
    fn duration(chunk: usize, stage: usize) -> u64 {
        let linear = |k: u64, n: u64| CHUNK * k * n * 2 / 1000;
        if stage == 0 {
            return 20_000;
        }
        if stage == HEAD {
            return HIDDEN * VOCAB * 2 / 1000;
        }
        match (stage - 1) % 5 {
            0 => linear(HIDDEN, HIDDEN + 2 * KV_DIM),
            1 => 4 * CHUNK * (chunk as u64 + 1) * CHUNK * HEADS * 64 / 4000,
            2 => linear(HIDDEN, HIDDEN),
            3 => linear(HIDDEN, 2 * FFN),
            _ => linear(FFN, HIDDEN),
        }
    }

    /// List-schedules every (chunk, stage) on its processor, lowest (chunk, stage)
    /// first among the ready ones, so chunk i+1 starts while chunk i is in flight.
    /// Returns (start, end) per chunk and stage.
    fn schedule(chunks: usize) -> Vec<Vec<(u64, u64)>> {
        let stages = |c: usize| if c + 1 == chunks { STAGES + 1 } else { STAGES };
        let mut times: Vec<Vec<Option<(u64, u64)>>> =
            (0..chunks).map(|c| vec![None; stages(c)]).collect();
        let done = |times: &Vec<Vec<Option<(u64, u64)>>>, c: usize, s: usize, now: u64| {
            times[c][s].is_some_and(|(_, e)| e <= now)
        };
        let (mut now, mut busy) = (0u64, [0u64; 2]);
        let total: usize = (0..chunks).map(stages).sum();
        let mut started = 0;
        while started < total {
            for (p, busy_until) in busy.iter_mut().enumerate() {
                if *busy_until > now {
                    continue;
                }
                let pick = (0..chunks)
                    .flat_map(|c| (0..stages(c)).map(move |s| (c, s)))
                    .find(|&(c, s)| {
                        times[c][s].is_none()
                            && processor(s) == p
                            && (s == 0 || done(&times, c, s - 1, now))
                            && (processor(s) == 0 || (0..c).all(|e| done(&times, e, s - 1, now)))
                    });
                if let Some((c, s)) = pick {
                    let end = now + duration(c, s);
                    times[c][s] = Some((now, end));
                    *busy_until = end;
                    started += 1;
                }
            }
            let next = times
                .iter()
                .flatten()
                .flatten()
                .map(|&(_, e)| e)
                .filter(|&e| e > now)
                .min();
            if let Some(next) = next {
                now = next;
            } else {
                assert_eq!(started, total, "schedule deadlocked");
            }
        }
        for c in 1..chunks {
            // Pipelined: chunk c starts while chunk c - 1 is in flight.
            assert!(times[c][0].unwrap().0 < times[c - 1][STAGES - 1].unwrap().1);
        }
        times
            .into_iter()
            .map(|t| t.into_iter().map(Option::unwrap).collect())
            .collect()
    }

    /// The prefill's buffers: per chunk and layer the activations between stages, the
    /// attention scores scratch, and K/V slices read by that and every later chunk.
    pub fn buffers(prompt: u64) -> Vec<Buffer> {
        let chunks = prompt.div_ceil(CHUNK) as usize;
        let t = schedule(chunks);
        let mut out = Vec::new();
        let mut add = |bytes: u64, producer: (usize, usize), consumers: &[(usize, usize)]| {
            let start = t[producer.0][producer.1].0;
            let end = consumers
                .iter()
                .map(|&(c, s)| t[c][s].1)
                .chain([t[producer.0][producer.1].1])
                .max()
                .unwrap();
            out.push(buf(out.len() as u32, bytes, start, end));
        };
        let act = |width: u64| CHUNK * width * ELEM;
        for c in 0..chunks {
            for l in 0..LAYERS {
                // The layer's input hidden state: read by qkv and the residual add.
                let producer = if l == 0 { 0 } else { down(l - 1) };
                add(act(HIDDEN), (c, producer), &[(c, qkv(l)), (c, o_proj(l))]);
                add(act(HIDDEN), (c, qkv(l)), &[(c, attn(l))]);
                // K and V slices: read by this and every later chunk's attention.
                let readers: Vec<_> = (c..chunks).map(|r| (r, attn(l))).collect();
                add(act(KV_DIM), (c, qkv(l)), &readers);
                add(act(KV_DIM), (c, qkv(l)), &readers);
                // Scores scratch, all heads, over the past and this chunk.
                add(
                    HEADS * CHUNK * CHUNK * (c as u64 + 1) * ELEM,
                    (c, attn(l)),
                    &[],
                );
                add(act(HIDDEN), (c, attn(l)), &[(c, o_proj(l))]);
                // Post-attention hidden state: read by gate/up and the residual add.
                add(act(HIDDEN), (c, o_proj(l)), &[(c, up(l)), (c, down(l))]);
                add(act(FFN), (c, up(l)), &[(c, down(l))]);
                add(act(FFN), (c, up(l)), &[(c, down(l))]);
            }
            // The final hidden state: the head reads the last chunk's.
            let readers: &[(usize, usize)] = if c + 1 == chunks { &[(c, HEAD)] } else { &[] };
            add(act(HIDDEN), (c, down(LAYERS - 1)), readers);
        }
        add(VOCAB * ELEM, (chunks - 1, HEAD), &[]);
        out
    }
}

#[test]
fn smollm2_chunked_prefill_plans_near_the_bound() {
    for prompt in [1024, 4096] {
        let buffers = smollm2::buffers(prompt);
        let alignment = 64;
        let bound = aligned_lower_bound(&buffers, alignment).unwrap();
        assert_eq!(bound, lower_bound(&buffers));
        let total: u64 = buffers.iter().map(|b| b.bytes).sum();
        println!(
            "SmolLM2-shaped prefill, prompt {prompt}, chunk 256: {} buffers, {total} bytes in all, \
             lower bound {bound} bytes",
            buffers.len()
        );
        for strategy in Strategy::ALL {
            let plan = plan_with(&buffers, alignment, strategy).unwrap();
            check_plan(&buffers, &plan, alignment).unwrap();
            println!(
                "  {:<30} peak {:>10} bytes, {:.4} x bound",
                strategy.name(),
                plan.peak_bytes,
                plan.peak_bytes as f64 / bound as f64
            );
        }
        let best = plan_offsets(&buffers, alignment).unwrap();
        check_plan(&buffers, &best, alignment).unwrap();
        println!(
            "  plan_offsets: {} ({:.4} x bound)",
            best.strategy,
            best.peak_bytes as f64 / bound as f64
        );
        assert!(best.peak_bytes * 100 <= bound * 110, "prompt {prompt}");
    }
}

/// splitmix64: a small deterministic generator for the random sets.
fn rng(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 20k buffers over 10 ms: sizes log-uniform in 64 B..1 MiB, lifetimes mostly short
/// (up to 100 us), one in twenty long (up to 2 ms).
fn random_buffers(n: u32, seed: u64) -> Vec<Buffer> {
    let mut seed = seed;
    (0..n)
        .map(|id| {
            let bytes = (64 << (rng(&mut seed) % 15)) | (rng(&mut seed) % 64);
            let start = rng(&mut seed) % 10_000_000;
            let max_len = if rng(&mut seed).is_multiple_of(20) {
                2_000_000
            } else {
                100_000
            };
            buf(id, bytes, start, start + 1 + rng(&mut seed) % max_len)
        })
        .collect()
}

/// `plan_offsets` stops early (a strategy whose arena reaches the best peak so far is
/// given up; none runs once a plan meets the aligned bound), yet returns what trying
/// every strategy to the end gives: the lowest peak, the first such strategy.
#[test]
fn twenty_thousand_buffers_keep_the_first_lowest_plan() {
    let buffers = random_buffers(20_000, 7);
    let alignment = 64;
    let bound = aligned_lower_bound(&buffers, alignment).unwrap();
    let plans: Vec<MemoryPlan> = Strategy::ALL
        .iter()
        .map(|&s| plan_with(&buffers, alignment, s).unwrap())
        .collect();
    let lowest = plans.iter().map(|p| p.peak_bytes).min().unwrap();
    let first_lowest = plans.iter().find(|p| p.peak_bytes == lowest).unwrap();
    let best = plan_offsets(&buffers, alignment).unwrap();
    assert_eq!(&best, first_lowest);
    check_plan(&buffers, &best, alignment).unwrap();
    // Over threads, beside another set: the same plan.
    let other = random_buffers(5_000, 8);
    let each = plan_offsets_each(
        &[(&buffers, alignment), (&other, 16)],
        2,
        PlanEffort::Exhaustive,
    );
    assert_eq!(each[0].as_ref(), Ok(&best));
    assert_eq!(each[1], plan_offsets(&other, 16));
    println!(
        "20k random: {} at {:.4} x the aligned bound",
        best.strategy,
        best.peak_bytes as f64 / bound as f64
    );
}

/// `PlanEffort::Scaled`: a set past `SWEEPS_ONLY_ABOVE` buffers gets the lower of the two
/// sweeps' plans (greedy by start on ties), valid; a smaller set gets every strategy
/// (with the margin over the sweeps).
#[test]
fn scaled_effort_keeps_the_sweeps_past_the_limit() {
    let large = random_buffers(SWEEPS_ONLY_ABOVE as u32 + 1, 11);
    let small = random_buffers(3_000, 12);
    let each = plan_offsets_each(&[(&large, 64), (&small, 64)], 2, PlanEffort::Scaled);
    let got = each[0].as_ref().unwrap();
    assert_eq!(got, &sweeps_plan(&large, 64));
    check_plan(&large, got, 64).unwrap();
    assert_eq!(each[1], Ok(scaled_plan(&small, 64)));
}

/// The lower of the two sweeps' plans (greedy by start on ties).
fn sweeps_plan(buffers: &[Buffer], alignment: u64) -> MemoryPlan {
    let [by_start, by_end] = [Strategy::GreedyByStart, Strategy::GreedyByEnd]
        .map(|s| plan_with(buffers, alignment, s).unwrap());
    if by_end.peak_bytes < by_start.peak_bytes {
        by_end
    } else {
        by_start
    }
}

/// What `PlanEffort::Scaled` keeps on a set of at most `SWEEPS_ONLY_ABOVE` buffers, by
/// its definition: `plan_offsets`'s plan where it is lower than the sweeps' by more
/// than `SWEEPS_MARGIN` parts of the aligned bound, else the sweeps'.
fn scaled_plan(buffers: &[Buffer], alignment: u64) -> MemoryPlan {
    let margin = aligned_lower_bound(buffers, alignment).unwrap() / SWEEPS_MARGIN;
    let sweeps = sweeps_plan(buffers, alignment);
    let exhaustive = plan_offsets(buffers, alignment).unwrap();
    if exhaustive.peak_bytes + margin < sweeps.peak_bytes {
        exhaustive
    } else {
        sweeps
    }
}

/// `PlanEffort::Scaled` keeps a strategy other than the two sweeps only where its plan
/// beats theirs by `SWEEPS_MARGIN` parts of the aligned bound: on a set whose sweeps'
/// plan is within that of the bound (a long-lived buffer far larger than the rest, as a
/// KV cache beside activations), their plan, though another strategy packs lower;
/// elsewhere `plan_offsets`'s plan where it beats the sweeps by more than the margin,
/// else the sweeps'. Never more than the margin above `plan_offsets`, the same plan on
/// any number of threads; `Exhaustive` is `plan_offsets`.
#[test]
fn scaled_effort_keeps_other_strategies_only_past_a_margin() {
    let mut settled = random_buffers(3_000, 21);
    let small: u64 = settled.iter().map(|b| b.bytes).sum();
    settled.push(buf(3_000, small * 20, 0, 10_200_000));
    let beside = random_buffers(2_000, 23);
    for (set, settles, seed) in [(settled, true, 21), (random_buffers(3_000, 22), false, 22)] {
        let floor = aligned_lower_bound(&set, 64).unwrap();
        let sweeps = sweeps_plan(&set, 64);
        let exhaustive = plan_offsets(&set, 64).unwrap();
        assert_eq!(
            PlanEffort::Scaled.settled_by_sweeps(sweeps.peak_bytes, floor),
            settles,
            "seed {seed}"
        );
        let expected = &scaled_plan(&set, 64);
        assert!(expected.peak_bytes <= exhaustive.peak_bytes + floor / SWEEPS_MARGIN);
        if settles {
            // A set where stopping early costs something, within the margin.
            assert!(exhaustive.peak_bytes < sweeps.peak_bytes, "{exhaustive:?}");
        }
        println!(
            "seed {seed}: sweeps {:.4}, every strategy {:.4} x the bound ({}), scaled keeps {}",
            sweeps.peak_bytes as f64 / floor as f64,
            exhaustive.peak_bytes as f64 / floor as f64,
            exhaustive.strategy,
            expected.strategy
        );
        for threads in 1..=3 {
            let sets = [(set.as_slice(), 64), (beside.as_slice(), 16)];
            let each = plan_offsets_each(&sets, threads, PlanEffort::Scaled);
            assert_eq!(
                each[0].as_ref(),
                Ok(expected),
                "seed {seed}, {threads} threads"
            );
            check_plan(&set, expected, 64).unwrap();
            let each = plan_offsets_each(&sets, threads, PlanEffort::Exhaustive);
            assert_eq!(
                each[0].as_ref(),
                Ok(&exhaustive),
                "seed {seed}, {threads} threads"
            );
        }
    }
}

/// When the first strategy meets the aligned bound, the plan is that one.
#[test]
fn a_plan_at_the_bound_is_kept() {
    // Equal sizes, each lifetime overlapping only its neighbours: greedy by size packs
    // two slots, which is the bound.
    let buffers: Vec<Buffer> = (0..1000)
        .map(|i| buf(i, 100, u64::from(i) * 10, u64::from(i) * 10 + 15))
        .collect();
    let best = plan_offsets(&buffers, 64).unwrap();
    assert_eq!(best.peak_bytes, 256);
    assert_eq!(best.strategy, Strategy::GreedyBySize);
    check_plan(&buffers, &best, 64).unwrap();
}

#[test]
fn twenty_thousand_overlapping_buffers_stack() {
    // Every lifetime overlaps every other: each placement conflicts with all placed.
    let mut seed = 3;
    let buffers: Vec<Buffer> = (0..20_000)
        .map(|id| {
            let start = rng(&mut seed) % 1000;
            buf(id, 64 + rng(&mut seed) % 100_000, start, start + 1_000_000)
        })
        .collect();
    let plan = plan_with(&buffers, 64, Strategy::GreedyBySize).unwrap();
    let stacked: u64 = buffers.iter().map(|b| align_up(b.bytes, 64)).sum();
    assert_eq!(plan.peak_bytes, stacked);
    check_plan(&buffers, &plan, 64).unwrap();
}

/// The largest arena there is: a plan, not a give-up or a panic.
#[test]
fn a_buffer_of_u64_max_bytes_is_planned() {
    let buffers = [buf(0, u64::MAX, 0, 1), buf(1, 0, 0, 1)];
    let best = plan_offsets(&buffers, 1).unwrap();
    assert_eq!(best.peak_bytes, u64::MAX);
    assert_eq!(best.strategy, Strategy::GreedyBySize);
    for strategy in Strategy::ALL {
        assert_eq!(
            plan_with(&buffers, 1, strategy).unwrap().peak_bytes,
            u64::MAX
        );
    }
}
