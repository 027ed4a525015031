//! The multi-request engine on SmolLM2-135M (W8A8): an interactive request preempts a
//! background prefill at a chunk boundary and both requests' greedy tokens equal their
//! tokens alone; samples decode together; cancel frees the KV caches and a second cancel
//! is an error; admission refuses (or queues) by the KV budget and the request limit with
//! typed errors; bad requests are refused before anything runs; under each request
//! policy the engine prefills a fixed mix in the order the policy's pick function gives.
//!
//! Needs the model: run `scripts/fetch-model.sh` first (these tests fail, not skip,
//! without it), as tests/real_prefill.rs.

mod common;

use common::loaded;
use std::sync::Arc;
use std::time::Instant;

use hetsched::exec::PrefillOptions;
use hetsched::exec::generate::requests::{
    Admission, CancelError, EngineLimits, Priority, RequestEngine, RequestEvent, RequestHandle,
    RequestMetrics, RequestSpec, SubmitError, kv_bytes,
};
use hetsched::exec::generate::{FinishReason, GenerateError, Sampling};
use hetsched::systems::request_policy::{
    LiveRequest, REQUEST_POLICIES, create_request_policy, pick_next,
};
use hetsched::systems::{RequestId, RequestPhase, SloTargets};

/// The prefill chunk of these tests' engines, tokens.
const CHUNK: usize = 8;

fn engine(limits: EngineLimits) -> RequestEngine {
    engine_with(limits, "priority")
}

fn engine_with(limits: EngineLimits, request_policy: &str) -> RequestEngine {
    engine_chunked(limits, request_policy, CHUNK)
}

fn engine_chunked(limits: EngineLimits, request_policy: &str, chunk: usize) -> RequestEngine {
    let l = loaded();
    let options = PrefillOptions {
        threads: 2,
        chunk_len: chunk as u32,
        ..PrefillOptions::default()
    };
    RequestEngine::start_with_policy(
        l.w8a8.clone(),
        Arc::new(l.tokenizer.clone()),
        options,
        limits,
        request_policy,
    )
    .unwrap()
}

fn spec(text: &str, max_tokens: usize, priority: Priority) -> RequestSpec {
    RequestSpec {
        prompt: loaded().tokenizer.encode(text).unwrap(),
        max_tokens,
        priority,
        ignore_eos: true,
        ..RequestSpec::default()
    }
}

/// What one request produced: tokens per sample, finish reasons, metrics, and when its
/// first token and its end arrived.
#[derive(Debug)]
struct Outcome {
    tokens: Vec<Vec<u32>>,
    reasons: Vec<Option<FinishReason>>,
    metrics: Option<RequestMetrics>,
    first_token: Option<Instant>,
    finished: Instant,
}

fn collect(handle: RequestHandle, n: usize) -> Outcome {
    let mut out = Outcome {
        tokens: vec![Vec::new(); n],
        reasons: vec![None; n],
        metrics: None,
        first_token: None,
        finished: Instant::now(),
    };
    for event in handle.events() {
        match event {
            RequestEvent::Token { sample, token, .. } => {
                out.first_token.get_or_insert_with(Instant::now);
                out.tokens[sample].push(token);
            }
            RequestEvent::SampleFinished { sample, reason, .. } => {
                out.reasons[sample] = Some(reason)
            }
            RequestEvent::Finished(m) => out.metrics = Some(m),
            RequestEvent::Failed(e) => panic!("request failed: {e}"),
        }
    }
    out.finished = Instant::now();
    out
}

fn alone(engine: &RequestEngine, spec: RequestSpec) -> Vec<Vec<u32>> {
    let n = spec.n;
    collect(engine.submit(spec).unwrap(), n).tokens
}

const BACKGROUND: &str = "The history of the printing press begins with movable type in \
    East Asia and continues through Gutenberg's workshop in Mainz, where metal type, oil-based \
    ink and a screw press made books cheap enough for merchants, students and clerks across \
    Europe to own, changing how knowledge spread between cities and generations.";

#[test]
fn an_interactive_request_preempts_a_background_prefill_without_changing_tokens() {
    let engine = engine(EngineLimits::default());
    let background = spec(BACKGROUND, 6, Priority::BACKGROUND);
    let interactive = spec("The capital of France is", 4, Priority::INTERACTIVE);
    assert!(background.prompt.len() >= 48, "a prefill of several chunks");
    let bg_alone = alone(&engine, background.clone());
    let fg_alone = alone(&engine, interactive.clone());
    let bg = engine.submit(background).unwrap();
    let fg = engine.submit(interactive).unwrap();
    let bg = std::thread::spawn(move || collect(bg, 1));
    let fg = collect(fg, 1);
    let bg = bg.join().unwrap();
    assert_eq!(
        fg.tokens, fg_alone,
        "the interactive request's greedy tokens"
    );
    assert_eq!(bg.tokens, bg_alone, "the preempted request's greedy tokens");
    assert!(
        fg.finished < bg.first_token.unwrap(),
        "the interactive request ends before the background prefill does"
    );
    let m = fg.metrics.unwrap();
    assert_eq!((m.priority, m.generated_tokens), (Priority::INTERACTIVE, 4));
    assert!(
        m.ttft_ms > 0.0 && m.e2e_ms >= m.ttft_ms && m.tpot_ms > 0.0,
        "{m:?}"
    );
    let snapshot = engine.metrics();
    assert_eq!(snapshot.kv_bytes_in_use, 0);
    assert_eq!(snapshot.finished, 4);
}

/// A background prompt prefilled as one chunk, and an interactive request that arrives
/// while that chunk runs: under priority the chunk pauses at a subgraph boundary, the
/// interactive request runs to its end, and the chunk then resumes where it stood (its
/// tokens as alone); under fcfs the chunk runs on and the newcomer waits for the
/// background request.
#[test]
fn an_arrival_pauses_a_running_chunk_at_a_subgraph_boundary_under_priority() {
    let long = format!("{BACKGROUND} {BACKGROUND} {BACKGROUND}");
    let background = spec(&long, 3, Priority::BACKGROUND);
    let interactive = spec("The capital of France is", 3, Priority::INTERACTIVE);
    let chunk = background.prompt.len().next_power_of_two();
    let run = |policy: &str| {
        let engine = engine_chunked(EngineLimits::default(), policy, chunk);
        let bg_alone = alone(&engine, background.clone());
        let bg = engine.submit(background.clone()).unwrap();
        // The snapshot counts the request as prefilling once its chunk has started.
        while engine.metrics().prefilling == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let fg = engine.submit(interactive.clone()).unwrap();
        let bg = std::thread::spawn(move || collect(bg, 1));
        let fg = collect(fg, 1);
        let bg = bg.join().unwrap();
        assert_eq!(
            bg.tokens, bg_alone,
            "{policy}: the background's greedy tokens"
        );
        assert_eq!(fg.tokens[0].len(), 3);
        (fg, bg)
    };
    let (fg, bg) = run("priority");
    assert!(
        fg.finished < bg.first_token.unwrap(),
        "priority: the interactive request ends inside the background's one chunk"
    );
    let (fg, bg) = run("fcfs");
    assert!(
        bg.first_token.unwrap() < fg.first_token.unwrap(),
        "fcfs: the chunk runs on"
    );
}

#[test]
fn the_snapshot_shows_nothing_live_once_the_finish_event_is_out() {
    let engine = engine(EngineLimits::default());
    // Several rounds: the snapshot is read the moment each `Finished` arrives, racing
    // the engine thread's next turn.
    for round in 1..=3u64 {
        let handle = engine
            .submit(RequestSpec {
                n: 2,
                ..spec("Once upon a time", 3, Priority::INTERACTIVE)
            })
            .unwrap();
        let finished = handle
            .events()
            .any(|event| matches!(event, RequestEvent::Finished(_)));
        assert!(finished, "round {round}: the request finishes");
        let snapshot = engine.metrics();
        assert_eq!(
            (snapshot.waiting, snapshot.prefilling, snapshot.decoding),
            (0, 0, 0),
            "round {round}: nothing live after the finish event: {snapshot:?}"
        );
        assert_eq!((snapshot.finished, snapshot.kv_bytes_in_use), (round, 0));
    }
}

#[test]
fn samples_of_one_request_decode_together() {
    let engine = engine(EngineLimits::default());
    let one = spec("Once upon a time", 5, Priority::INTERACTIVE);
    let single = alone(&engine, one.clone());
    let three = RequestSpec { n: 3, ..one };
    let out = collect(engine.submit(three).unwrap(), 3);
    for tokens in &out.tokens {
        assert_eq!(
            tokens, &single[0],
            "greedy samples are the single continuation"
        );
    }
    assert!(out.reasons.iter().all(|r| *r == Some(FinishReason::Length)));
    assert_eq!(out.metrics.unwrap().generated_tokens, 15);
}

/// Requests sampled at a temperature, submitted together (their samples decode in the
/// engine's batched steps, their draws side by side on its pool), each draw what they
/// draw alone: every sample keeps its own generator's stream.
#[test]
fn sampled_requests_together_draw_what_they_draw_alone() {
    let engine = engine(EngineLimits::default());
    let sampled = |text, seed| RequestSpec {
        sampling: Sampling {
            temperature: 1.2,
            top_k: None,
            top_p: 1.0,
            seed,
        },
        ..spec(text, 8, Priority::INTERACTIVE)
    };
    let one = sampled("Once upon a time", 5);
    let two = RequestSpec {
        n: 2,
        ..sampled("The capital of France is", 9)
    };
    let one_alone = alone(&engine, one.clone());
    let two_alone = alone(&engine, two.clone());
    let (one, two) = (engine.submit(one).unwrap(), engine.submit(two).unwrap());
    let two = std::thread::spawn(move || collect(two, 2));
    assert_eq!(collect(one, 1).tokens, one_alone);
    assert_eq!(two.join().unwrap().tokens, two_alone);
    assert_ne!(two_alone[0], two_alone[1], "two seeds drew one text");
}

#[test]
fn cancel_frees_the_caches_and_twice_is_an_error() {
    let engine = engine(EngineLimits::default());
    let handle = engine
        .submit(spec(BACKGROUND, 200, Priority::BACKGROUND))
        .unwrap();
    handle.cancel().unwrap();
    assert_eq!(handle.cancel(), Err(CancelError::NotLive(handle.id())));
    let id = handle.id();
    let out = collect(handle, 1);
    assert_eq!(out.reasons, vec![Some(FinishReason::Cancelled)]);
    assert_eq!(engine.cancel(id), Err(CancelError::NotLive(id)));
    let snapshot = engine.metrics();
    assert_eq!((snapshot.kv_bytes_in_use, snapshot.cancelled), (0, 1));
}

#[test]
fn admission_refuses_or_queues_by_the_kv_budget() {
    let l = loaded();
    let c = &l.w8a8.config;
    let request = spec("Hello there", 4, Priority::INTERACTIVE);
    let one = kv_bytes(&request, l.w8a8.layers.len(), c.kv_dim());
    let refusing = engine(EngineLimits {
        kv_budget_bytes: one,
        max_requests: 8,
        admission: Admission::Refuse,
    });
    let first = refusing.submit(request.clone()).unwrap();
    match refusing.submit(request.clone()) {
        Err(SubmitError::KvBudgetFull { needed, .. }) => assert_eq!(needed, one),
        other => panic!("expected a full budget, got {other:?}"),
    }
    let bigger = RequestSpec {
        max_tokens: 40,
        ..request.clone()
    };
    assert!(matches!(
        refusing.submit(bigger),
        Err(SubmitError::KvNeverFits { .. })
    ));
    collect(first, 1);
    // Memory freed: the same request fits again.
    collect(refusing.submit(request.clone()).unwrap(), 1);

    let waiting = engine(EngineLimits {
        kv_budget_bytes: one,
        max_requests: 2,
        admission: Admission::Wait,
    });
    let a = waiting.submit(request.clone()).unwrap();
    let b = waiting.submit(request.clone()).unwrap();
    assert!(matches!(
        waiting.submit(request.clone()),
        Err(SubmitError::TooManyRequests { limit: 2 })
    ));
    let (a, b) = (collect(a, 1), collect(b, 1));
    assert_eq!(a.tokens, b.tokens);
    assert!(
        a.finished <= b.finished,
        "the second waited for the first's memory"
    );
}

#[test]
fn bad_requests_are_refused_before_they_run() {
    let engine = engine(EngineLimits::default());
    let good = spec("Hi", 4, Priority::INTERACTIVE);
    let cases = [
        RequestSpec {
            prompt: Vec::new(),
            ..good.clone()
        },
        RequestSpec {
            n: 0,
            ..good.clone()
        },
        RequestSpec {
            max_tokens: 0,
            ..good.clone()
        },
        RequestSpec {
            max_tokens: 1 << 20,
            ..good.clone()
        },
    ];
    for case in cases {
        let e = engine.submit(case).unwrap_err();
        assert!(matches!(e, SubmitError::Invalid(_)), "{e}");
    }
    let e = engine
        .submit(RequestSpec {
            prompt: vec![u32::MAX],
            ..good.clone()
        })
        .unwrap_err();
    assert!(matches!(e, SubmitError::TokenOutOfRange { .. }), "{e}");
    let e = engine
        .submit(RequestSpec {
            sampling: hetsched::exec::generate::Sampling {
                top_p: 2.0,
                ..good.sampling
            },
            ..good.clone()
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            SubmitError::Invalid(GenerateError::InvalidSampling { .. })
        ),
        "{e}"
    );
    assert_eq!(engine.metrics().kv_bytes_in_use, 0);
}

#[test]
fn decode_steps_of_an_urgent_request_are_not_delayed_by_chunks_under_priority_and_fcfs_waits() {
    let background = spec(BACKGROUND, 4, Priority::BACKGROUND);
    let interactive = spec("The capital of France is", 16, Priority::INTERACTIVE);
    let chunks = background.prompt.len().div_ceil(CHUNK);
    assert!(
        chunks < 15,
        "fewer background chunks than interactive decode steps"
    );
    let together = |policy: &str| {
        let engine = engine_with(EngineLimits::default(), policy);
        let bg = engine.submit(background.clone()).unwrap();
        let fg = engine.submit(interactive.clone()).unwrap();
        let bg = std::thread::spawn(move || collect(bg, 1));
        let fg = collect(fg, 1);
        (fg, bg.join().unwrap())
    };
    // The engine's own clock: when a request's first token and its end were sent.
    let first_and_end = |o: &Outcome| {
        let m = o.metrics.as_ref().unwrap();
        (m.arrival_ms + m.ttft_ms, m.arrival_ms + m.e2e_ms)
    };
    // Priority: once the interactive request decodes, each turn is its step alone, so it
    // ends before the background prefill (a chunk a step would end that prefill first).
    let (fg, bg) = together("priority");
    assert!(
        first_and_end(&fg).1 < first_and_end(&bg).0,
        "priority: no background chunk between the interactive request's steps"
    );
    // fcfs: one request at a time, so the interactive request starts after the background
    // request's last token, not beside its decode steps.
    let (fg, bg) = together("fcfs");
    assert_eq!(bg.tokens[0].len(), 4);
    assert!(
        first_and_end(&bg).1 <= first_and_end(&fg).0,
        "fcfs: the later request waits for the whole earlier one"
    );
}

/// The order (indices into `mix`, submitted in that order) in which `mix` gets its first
/// tokens when every request is prefilling at once, as `policy`'s pick function says:
/// each prefill chunk goes to the request `pick_next` puts first among those with
/// prompt tokens left.
fn policy_order(policy: &str, mix: &[RequestSpec]) -> Vec<usize> {
    let mut policy = create_request_policy(policy).unwrap();
    let mut left: Vec<usize> = mix.iter().map(|s| s.prompt.len()).collect();
    let mut order = Vec::new();
    loop {
        let mut live: Vec<LiveRequest> = (0..mix.len())
            .filter(|&i| left[i] > 0)
            .map(|i| LiveRequest {
                entity: bevy_ecs::entity::Entity::PLACEHOLDER,
                id: RequestId(i as u64),
                priority: mix[i].priority,
                targets: SloTargets::default(),
                arrival_ns: i as u64,
                phase: RequestPhase::Prefill,
                work_left_ns: left[i] as u64,
                work_total_ns: mix[i].prompt.len() as u64,
                alone_bound_ns: mix[i].prompt.len() as u64,
                armed_ns: 0,
            })
            .collect();
        let Some(first) = pick_next(policy.as_mut(), 0, &mut live) else {
            return order;
        };
        let i = first.id.0 as usize;
        left[i] = left[i].saturating_sub(CHUNK);
        if left[i] == 0 {
            order.push(i);
        }
    }
}

#[test]
fn the_engine_prefills_a_mix_in_each_request_policys_order() {
    let l = loaded();
    let (layers, kv_dim) = (l.w8a8.layers.len(), l.w8a8.config.kv_dim());
    let mix = [
        spec(BACKGROUND, 1, Priority::BACKGROUND),
        spec(
            "The capital of France is Paris, and the capital of Italy is",
            1,
            Priority::INTERACTIVE,
        ),
        spec("Water boils at", 1, Priority(120)),
        spec("Once upon a", 1, Priority::INTERACTIVE),
    ];
    assert!(mix[0].prompt.len() > 2 * CHUNK && mix[1].prompt.len() > CHUNK);
    // A request that holds the whole KV budget while the mix is submitted: the mix waits
    // for memory, is admitted in one turn when it ends, and prefills together.
    let blocker = spec("Count to one hundred:", 96, Priority::BACKGROUND);
    let budget = kv_bytes(&blocker, layers, kv_dim);
    let mix_bytes: usize = mix.iter().map(|s| kv_bytes(s, layers, kv_dim)).sum();
    assert!(mix_bytes <= budget, "the mix fits once the blocker ends");
    let limits = EngineLimits {
        kv_budget_bytes: budget,
        max_requests: 8,
        admission: Admission::Wait,
    };
    let mut orders = Vec::new();
    for &(policy, _) in REQUEST_POLICIES {
        let engine = engine_with(limits, policy);
        let blocking = engine.submit(blocker.clone()).unwrap();
        let handles: Vec<RequestHandle> = mix
            .iter()
            .map(|s| engine.submit(s.clone()).unwrap())
            .collect();
        assert_eq!(engine.metrics().kv_bytes_in_use, budget, "{policy}");
        collect(blocking, 1);
        let first_token_ms: Vec<f64> = handles
            .into_iter()
            .map(|h| {
                let m = collect(h, 1).metrics.unwrap();
                m.arrival_ms + m.ttft_ms
            })
            .collect();
        let mut ran: Vec<usize> = (0..mix.len()).collect();
        ran.sort_by(|&a, &b| first_token_ms[a].total_cmp(&first_token_ms[b]));
        let expected = policy_order(policy, &mix);
        assert_eq!(
            ran, expected,
            "{policy}: first tokens in the policy's order"
        );
        orders.push((policy, expected));
    }
    let order_of = |name: &str| &orders.iter().find(|o| o.0 == name).unwrap().1;
    assert_eq!(order_of("fcfs"), &vec![0, 1, 2, 3]);
    assert_eq!(order_of("priority"), &vec![1, 3, 2, 0]);
}

#[test]
fn an_unknown_request_policy_is_refused_at_start() {
    let l = loaded();
    let e = RequestEngine::start_with_policy(
        l.w8a8.clone(),
        Arc::new(l.tokenizer.clone()),
        PrefillOptions::default(),
        EngineLimits::default(),
        "nonesuch",
    )
    .unwrap_err();
    assert!(e.to_string().contains("unknown request policy"), "{e}");
}
