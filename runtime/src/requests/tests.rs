//! A mix's outcomes against the same requests alone, decode batching and placement, and
//! the KV budget's waits and refusals.

use super::check::plan_for;
use super::*;
use hetsched_systems::{batched_decode_step_ns, decode_lane};

fn spec(id: u64, priority: Priority, arrival_ms: u64, prompt_len: u32) -> RequestSpec {
    RequestSpec {
        id: RequestId(id),
        priority,
        targets: SloTargets::default(),
        arrival_ns: arrival_ms * 1_000_000,
        prompt_len,
        max_tokens: 1,
        samples: 1,
    }
}

fn served(o: &RequestOutcome) -> Served {
    o.served.expect("served")
}

#[test]
fn a_lone_request_gets_its_alone_time_and_bad_input_is_refused() {
    let scene = Scene::default_scene();
    let one = [spec(1, Priority::INTERACTIVE, 5, 256)];
    let out = simulate_prefills(&scene, &one, "slack").unwrap();
    let s = served(&out[0]);
    assert_eq!(s.ttft_ns, s.alone_ttft_ns);
    assert_eq!(
        (s.e2e_ns, s.tpot_ns),
        (s.ttft_ns, None),
        "one token: no decode"
    );
    // Alone, the prefill is the engine's own simulation of its plan.
    let plan = Arc::new(plan_for(&scene, &one[0], &MixOptions::new("slack")).unwrap());
    let engine = crate::engine::simulate(plan, scene.new_policy().unwrap()).unwrap();
    assert_eq!(s.ttft_ns, engine.makespan_ns);
    assert!(matches!(
        simulate_prefills(&scene, &[], "fcfs"),
        Err(RequestsError::Empty)
    ));
    let backwards = [
        spec(1, Priority::BACKGROUND, 5, 64),
        spec(2, Priority::BACKGROUND, 1, 64),
    ];
    assert!(matches!(
        simulate_prefills(&scene, &backwards, "fcfs"),
        Err(RequestsError::OutOfOrder { .. })
    ));
    let twice = [
        spec(1, Priority::BACKGROUND, 0, 64),
        spec(1, Priority::BACKGROUND, 1, 64),
    ];
    assert!(matches!(
        simulate_prefills(&scene, &twice, "fcfs"),
        Err(RequestsError::DuplicateId(_))
    ));
    let empty_prompt = [spec(1, Priority::BACKGROUND, 0, 0)];
    assert!(matches!(
        simulate_prefills(&scene, &empty_prompt, "fcfs"),
        Err(RequestsError::Plan { .. })
    ));
    assert!(matches!(
        simulate_prefills(&scene, &one, "nonesuch"),
        Err(RequestsError::RequestPolicy(_))
    ));
    for (max_tokens, samples) in [(0, 1), (4, 0), (4, MAX_SAMPLES + 1)] {
        let bad = [RequestSpec {
            max_tokens,
            samples,
            ..one[0].clone()
        }];
        assert!(matches!(
            simulate_prefills(&scene, &bad, "fcfs"),
            Err(RequestsError::Tokens { .. })
        ));
    }
    let long = [RequestSpec {
        max_tokens: scene.model.context,
        ..one[0].clone()
    }];
    assert!(matches!(
        simulate_prefills(&scene, &long, "fcfs"),
        Err(RequestsError::Context { .. })
    ));
}

#[test]
fn an_interactive_prompt_overtakes_a_background_prefill_except_under_fcfs() {
    let scene = Scene::default_scene();
    let burst = [
        spec(0, Priority::BACKGROUND, 0, 1024),
        spec(1, Priority::INTERACTIVE, 100, 64),
    ];
    let fcfs = simulate_prefills(&scene, &burst, "fcfs").unwrap();
    let slack = simulate_prefills(&scene, &burst, "slack").unwrap();
    // fcfs: the interactive prompt waits for the rest of the background prefill.
    assert!(served(&fcfs[1]).ttft_ns > 2 * served(&fcfs[1]).alone_ttft_ns);
    assert!(served(&slack[1]).ttft_ns < served(&fcfs[1]).ttft_ns);
    assert!(served(&slack[0]).ttft_ns >= served(&slack[0]).alone_ttft_ns);
}

#[test]
fn decode_steps_follow_the_prefill_and_batch_across_requests() {
    let scene = Scene::default_scene();
    let decoding = |id, arrival_ms, prompt_len, max_tokens, samples| RequestSpec {
        max_tokens,
        samples,
        ..spec(id, Priority::INTERACTIVE, arrival_ms, prompt_len)
    };
    let lone = [decoding(0, 0, 64, 9, 1)];
    let run = simulate_requests(&scene, &lone, &MixOptions::new("slack")).unwrap();
    let s = served(&run.outcomes[0]);
    assert_eq!((s.ttft_ns, s.e2e_ns), (s.alone_ttft_ns, s.alone_e2e_ns));
    // Eight steps, each the scene's decode cost of one sequence at its context.
    let want: u64 = (0..8)
        .map(|t| batched_decode_step_ns(&scene.model, &scene.device, &[64 + 1 + t]).unwrap())
        .sum();
    let decode_ns = s.e2e_ns - s.ttft_ns;
    assert!(decode_ns.abs_diff(want) <= 8 * 8, "{decode_ns} vs {want}");
    assert_eq!(s.tpot_ns, Some(decode_ns / 8));
    let lane = decode_lane(&scene.device).unwrap();
    let decode_slices: Vec<&RequestSlice> =
        run.slices.iter().filter(|x| x.decode_rows > 0).collect();
    assert_eq!(decode_slices.len(), 8 * run.plans[1].instance_count());
    assert!(decode_slices.iter().all(|x| x.lane == lane && x.plan == 1));
    // Eight samples of one prompt decode as one batch of eight rows: far less than
    // eight times one sample's decode.
    let eight = [decoding(0, 0, 64, 9, 8)];
    let run8 = simulate_requests(&scene, &eight, &MixOptions::new("slack")).unwrap();
    let s8 = served(&run8.outcomes[0]);
    assert!(run8.slices.iter().any(|x| x.decode_rows == 8));
    assert!(s8.e2e_ns - s8.ttft_ns < 2 * decode_ns);
    assert!(run8.outcomes[0].kv_bytes < 8 * run.outcomes[0].kv_bytes);
    // An interactive prompt arriving while a background request decodes takes the
    // processors at the next boundary; once both are ready they share each step.
    let two = [
        RequestSpec {
            priority: Priority::BACKGROUND,
            ..decoding(0, 0, 64, 33, 1)
        },
        decoding(1, 600, 64, 9, 1),
    ];
    let run2 = simulate_requests(&scene, &two, &MixOptions::new("priority")).unwrap();
    assert!(run2.slices.iter().any(|x| x.decode_rows == 2));
    let fg = served(&run2.outcomes[1]);
    assert!(fg.e2e_ns - fg.ttft_ns < 2 * decode_ns);
    // fcfs: one request at a time, the second starts after the first's last token.
    let two = [decoding(0, 0, 64, 9, 1), decoding(1, 0, 64, 9, 1)];
    let fcfs = simulate_requests(&scene, &two, &MixOptions::new("fcfs")).unwrap();
    assert!(fcfs.slices.iter().all(|x| x.decode_rows <= 1));
    let (a, b) = (served(&fcfs.outcomes[0]), served(&fcfs.outcomes[1]));
    assert!(b.ttft_ns > a.e2e_ns, "{} vs {}", b.ttft_ns, a.e2e_ns);
    let busy: u64 = fcfs.busy_ns.iter().sum();
    let jobs: u64 = fcfs.slices.iter().map(|x| x.end_ns - x.start_ns).sum();
    assert_eq!(busy, jobs);
}

#[test]
fn decode_takes_the_npu_when_it_ends_the_batch_first() {
    let scene = Scene::default_scene();
    let n = 2;
    let burst = [
        RequestSpec {
            max_tokens: 8,
            ..spec(0, Priority::BACKGROUND, 0, 2048)
        },
        RequestSpec {
            max_tokens: 8,
            ..spec(1, Priority::INTERACTIVE, 100, 64)
        },
    ];
    let run = simulate_requests(&scene, &burst, &MixOptions::new("slack")).unwrap();
    let npu = scene.device.first_of(hetsched_systems::ProcessorKind::Npu);
    let npu_plan = n + 1;
    assert_eq!(
        run.plans.len(),
        n + 2,
        "the decode lane's plan and the NPU's"
    );
    // The interactive request decodes while the background prefill loads the CPU:
    // its batches take the NPU's plan (whose linears run on the NPU) where the
    // background has CPU work queued.
    let interactive: Vec<&RequestSlice> = run
        .slices
        .iter()
        .filter(|x| x.request == RequestId(1) && x.decode_rows > 0)
        .collect();
    assert!(interactive.iter().any(|x| x.plan == npu_plan));
    assert!(interactive.iter().any(|x| Some(x.lane) == npu));
    // Alone, nothing queued: the decode lane ends a step first on this scene.
    let alone = simulate_requests(&scene, &burst[1..], &MixOptions::new("slack")).unwrap();
    assert!(
        alone
            .slices
            .iter()
            .filter(|x| x.decode_rows > 0)
            .all(|x| x.plan == 1 && Some(x.lane) != npu)
    );
}

#[test]
fn kv_caches_wait_or_are_refused_beyond_the_budget_and_are_freed() {
    let scene = Scene::default_scene();
    let decoding = |id, arrival_ms| RequestSpec {
        max_tokens: 4,
        ..spec(id, Priority::INTERACTIVE, arrival_ms, 256)
    };
    let mix = [decoding(0, 0), decoding(1, 0), decoding(2, 1)];
    let one = kv_cache_bytes(&scene.model, 256, 4, 1);
    let free = simulate_requests(&scene, &mix, &MixOptions::new("priority")).unwrap();
    assert_eq!(free.peak_kv_bytes, 3 * one);
    let budget = MixOptions {
        kv_budget_bytes: Some(2 * one),
        ..MixOptions::new("priority")
    };
    let waited = simulate_requests(&scene, &mix, &budget).unwrap();
    assert_eq!(waited.peak_kv_bytes, 2 * one);
    let third = served(&waited.outcomes[2]);
    let first_end = served(&waited.outcomes[0]).e2e_ns;
    assert!(
        third.admitted_ns >= first_end,
        "waits for a cache to be freed"
    );
    let refuse = MixOptions {
        kv_full: KvFull::Refuse,
        ..budget.clone()
    };
    let refused = simulate_requests(&scene, &mix, &refuse).unwrap();
    assert!(refused.outcomes[2].served.is_none());
    assert!(refused.outcomes[..2].iter().all(|o| o.served.is_some()));
    let tiny = MixOptions {
        kv_budget_bytes: Some(one - 1),
        ..budget
    };
    assert!(matches!(
        simulate_requests(&scene, &mix, &tiny),
        Err(RequestsError::KvBudgetTooSmall { .. })
    ));
}
