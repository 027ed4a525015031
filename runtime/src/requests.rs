//! Several requests simulated together in one world on a scene's device: each request
//! is a request entity spawned at its arrival, admitted against the KV budget, its
//! prefill armed beside the others' runs ([`hetsched_systems::arm_request`]); after its
//! prefill (its first token) its decode steps are armed as runs of the decode-step plan
//! on the decode processor, the steps of every request decoding at the time batched into
//! one job per stage. A request policy orders the requests; every job takes its modeled
//! time on a virtual clock. The outcome per request: time to first token, time per output
//! token and end to end, beside the same request alone on the same scene and policy.
//!
//! **Decode.** A request of `max_tokens` new tokens gets its first from its prefill and
//! `max_tokens - 1` decode steps after it, each of its `samples` sequences one row of the
//! step. One batch runs at a time: when it ends, every request ready to decode (in the
//! request policy's order, up to [`MAX_DECODE_BATCH`] sequences) joins the next, armed on
//! the first of them, so its priority class and arrival are what the request policy
//! sees. Each batch is placed by [`DecodePlans::choose`] from the world's state: on the
//! decode lane (the first CPU, the step priced by `batched_decode_step_ns`) or with its
//! linears on the NPU at a static batch shape (the one-token plan a prefill would run,
//! priced by each processor's cost model for the batch), whichever is predicted to end
//! it first given what each processor runs and has queued.
//! Under `fcfs` the order holds one request, so a batch holds one request's samples.
//!
//! **KV memory.** A request holds its KV caches ([`kv_cache_bytes`]: the prompt's, shared
//! by its samples, and each sample's own) from admission to its last token. With a budget
//! ([`MixOptions::kv_budget_bytes`]), a request whose caches do not fit beside the live
//! ones waits (the waiting requests are admitted in the request policy's order, the first
//! of them before any behind it) or is refused at arrival ([`KvFull`]); one that could
//! not fit even alone is an error before anything runs.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use hetsched_systems::request_policy::UnknownRequestPolicy;
use hetsched_systems::{
    DEFAULT_DECODE_LAYERS_PER_STAGE, DecodePlans, InstanceKey, MAX_DECODE_BATCH, PlanError,
    PrefillPlan, Priority, RequestError, RequestId, SloTargets, kv_cache_bytes,
};
use thiserror::Error;

use crate::scene::{Scene, SceneError};

mod check;
mod mix;

use check::check_and_plan;
use mix::run_mix;

/// At most this many requests in one simulation; more is refused
/// ([`RequestsError::TooMany`]).
pub const MAX_REQUESTS: usize = 1024;

/// Samples of one prompt in one request at most (the real request engine's limit); each
/// is one sequence of the decode batch.
pub const MAX_SAMPLES: u32 = MAX_DECODE_BATCH as u32;

/// One request to simulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpec {
    /// Caller's id (unique in a mix).
    pub id: RequestId,
    /// Priority class.
    pub priority: Priority,
    /// Latency targets.
    pub targets: SloTargets,
    /// Arrival, ns from the start.
    pub arrival_ns: u64,
    /// Prompt length, tokens.
    pub prompt_len: u32,
    /// New tokens per sample, at least 1: the first from the prefill, the rest from
    /// decode steps.
    pub max_tokens: u32,
    /// Samples of the prompt (1 to [`MAX_SAMPLES`]), sharing its KV cache.
    pub samples: u32,
}

/// What a request that was admitted got, ns on the simulated clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// When its KV caches were admitted (its arrival, or later under a budget).
    pub admitted_ns: u64,
    /// Time to first token: its prefill's end minus its arrival.
    pub ttft_ns: u64,
    /// End to end: its last token minus its arrival.
    pub e2e_ns: u64,
    /// Time per output token after the first (`None` for one token).
    pub tpot_ns: Option<u64>,
    /// The same request alone on the same scene and policy: time to first token.
    pub alone_ttft_ns: u64,
    /// The same request alone: end to end.
    pub alone_e2e_ns: u64,
}

/// What one request got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestOutcome {
    /// Caller's id.
    pub id: RequestId,
    /// Priority class.
    pub priority: Priority,
    /// Arrival, ns.
    pub arrival_ns: u64,
    /// Its KV caches, bytes.
    pub kv_bytes: u64,
    /// Its figures; `None` when it was refused for KV memory ([`KvFull::Refuse`]).
    pub served: Option<Served>,
}

/// One job of a simulated mix: which request's instance ran where and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestSlice {
    /// The request (for a decode batch, the one it is armed on).
    pub request: RequestId,
    /// The plan of the job's run, an index into [`RequestsRun::plans`] (past the
    /// requests' prefills: a decode batch, by placement).
    pub plan: usize,
    /// (chunk, stage) in that plan.
    pub key: InstanceKey,
    /// Sequences in the job: 0 for a prefill job, the batch's rows for a decode step.
    pub decode_rows: u32,
    /// Processor lane.
    pub lane: usize,
    /// Start, ns.
    pub start_ns: u64,
    /// End, ns.
    pub end_ns: u64,
}

/// A simulated mix: per request its outcome (in the order given), every job run, the
/// plans of the jobs, the peak of the KV caches held together and how busy each
/// processor was.
#[derive(Clone, Debug)]
pub struct RequestsRun {
    /// Per request.
    pub outcomes: Vec<RequestOutcome>,
    /// Every job, in dispatch order.
    pub slices: Vec<RequestSlice>,
    /// Per request (same index), its prefill's plan; then the decode step's plans, one a
    /// placement the device offers ([`DecodePlans::placements`]: the decode lane's, then
    /// the NPU's where it has one), unpriced (each batch is priced for its rows).
    pub plans: Vec<Arc<PrefillPlan>>,
    /// When the last job ended, ns.
    pub makespan_ns: u64,
    /// Most bytes of KV caches held at once across the requests.
    pub peak_kv_bytes: u64,
    /// The KV budget simulated under, bytes (`None`: no budget).
    pub kv_budget_bytes: Option<u64>,
    /// Per processor lane, the time its jobs ran, ns.
    pub busy_ns: Vec<u64>,
}

/// What a request whose KV caches do not fit beside the live requests' gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvFull {
    /// It waits until enough caches are freed.
    #[default]
    Wait,
    /// It is refused at arrival (reported without figures).
    Refuse,
}

impl KvFull {
    /// `wait` or `refuse`.
    pub fn name(self) -> &'static str {
        match self {
            KvFull::Wait => "wait",
            KvFull::Refuse => "refuse",
        }
    }
}

impl FromStr for KvFull {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "wait" => Ok(KvFull::Wait),
            "refuse" => Ok(KvFull::Refuse),
            other => Err(format!("`{other}`: give wait or refuse")),
        }
    }
}

/// How a mix is simulated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MixOptions {
    /// The policy across requests (`fcfs`, `priority`, `slack`).
    pub request_policy: String,
    /// Bytes of KV caches the live requests may hold together (`None`: no limit).
    pub kv_budget_bytes: Option<u64>,
    /// What a request that does not fit gets.
    pub kv_full: KvFull,
}

impl MixOptions {
    /// `request_policy`, no KV budget.
    pub fn new(request_policy: &str) -> Self {
        MixOptions {
            request_policy: request_policy.to_string(),
            kv_budget_bytes: None,
            kv_full: KvFull::Wait,
        }
    }
}

/// Why a simulation of requests could not run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RequestsError {
    /// No request given.
    #[error("no request to simulate")]
    Empty,
    /// More requests than [`MAX_REQUESTS`].
    #[error("{0} requests; at most {MAX_REQUESTS} are simulated together")]
    TooMany(usize),
    /// Arrivals must not go back in time.
    #[error("request {id} arrives at {arrival_ns} ns, before the request listed before it")]
    OutOfOrder {
        /// The request.
        id: RequestId,
        /// Its arrival.
        arrival_ns: u64,
    },
    /// Two requests with one id.
    #[error("request id {0} is given twice")]
    DuplicateId(RequestId),
    /// No new token asked for, or samples 0 or beyond [`MAX_SAMPLES`].
    #[error(
        "request {id}: {max_tokens} new tokens and {samples} samples; give at least 1 token \
         and 1 to {MAX_SAMPLES} samples"
    )]
    Tokens {
        /// The request.
        id: RequestId,
        /// Its new tokens.
        max_tokens: u32,
        /// Its samples.
        samples: u32,
    },
    /// The prompt and the tokens to generate do not fit the model's context.
    #[error(
        "request {id}: a prompt of {prompt_len} tokens and {max_tokens} new tokens exceed \
         the context of {context} tokens"
    )]
    Context {
        /// The request.
        id: RequestId,
        /// Its prompt.
        prompt_len: u32,
        /// Its new tokens.
        max_tokens: u32,
        /// The model's context.
        context: u32,
    },
    /// A request's KV caches exceed the whole budget: it could never run.
    #[error(
        "request {id} needs {need} bytes of KV cache and the KV budget is {budget} bytes: \
         give a budget of at least the largest request's caches"
    )]
    KvBudgetTooSmall {
        /// The request.
        id: RequestId,
        /// Its caches, bytes.
        need: u64,
        /// The budget, bytes.
        budget: u64,
    },
    /// A request's prefill cannot be planned (prompt 0 or beyond the context, ...).
    #[error("request {id}: {source}")]
    Plan {
        /// The request.
        id: RequestId,
        /// Why.
        source: PlanError,
    },
    /// The decode step cannot be planned or priced on the scene's device.
    #[error("decode step: {0}")]
    Decode(PlanError),
    /// The scene's policy.
    #[error(transparent)]
    Scene(#[from] SceneError),
    /// The request policy's name.
    #[error(transparent)]
    RequestPolicy(#[from] UnknownRequestPolicy),
    /// Arming a request.
    #[error(transparent)]
    Arm(#[from] RequestError),
    /// Nothing runs, nothing arrives, work is left.
    #[error("the simulation stalled with {0} instances outstanding")]
    Stalled(usize),
}

/// [`simulate_requests`] under `request_policy` without a KV budget; the outcomes.
///
/// # Errors
/// As [`simulate_requests`].
pub fn simulate_prefills(
    scene: &Scene,
    specs: &[RequestSpec],
    request_policy: &str,
) -> Result<Vec<RequestOutcome>, RequestsError> {
    simulate_requests(scene, specs, &MixOptions::new(request_policy)).map(|run| run.outcomes)
}

/// Simulates `specs` (in arrival order) on `scene`'s device: each request's prefill
/// decided within by the scene's policy, its decode steps batched with the others',
/// requests ordered by `options.request_policy` and admitted against its KV budget.
///
/// # Errors
/// [`RequestsError`]: bad requests (none, too many, out of order, an id twice, no token,
/// samples out of range, beyond the context, an unplannable prompt, caches beyond the
/// whole budget), an unknown policy, or a stall.
pub fn simulate_requests(
    scene: &Scene,
    specs: &[RequestSpec],
    options: &MixOptions,
) -> Result<RequestsRun, RequestsError> {
    let plans = check_and_plan(scene, specs, options)?;
    let decode = DecodePlans::new(&scene.model, &scene.device, DEFAULT_DECODE_LAYERS_PER_STAGE)
        .map_err(RequestsError::Decode)?;
    let mix = run_mix(scene, specs, options, &plans, &decode)?;
    let mut alone: HashMap<(u32, u32, u32), (u64, u64)> = HashMap::new();
    let mut outcomes = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let kv_bytes = kv_cache_bytes(&scene.model, s.prompt_len, s.max_tokens, s.samples);
        let served = match mix.times[i] {
            None => None,
            Some(times) => {
                let key = (s.prompt_len, s.max_tokens, s.samples);
                let (alone_ttft_ns, alone_e2e_ns) = match alone.get(&key) {
                    Some(&figures) => figures,
                    None => {
                        let lone = RequestSpec {
                            arrival_ns: 0,
                            ..s.clone()
                        };
                        let run = run_mix(
                            scene,
                            std::slice::from_ref(&lone),
                            options,
                            &plans[i..=i],
                            &decode,
                        )?;
                        let t = run.times[0].ok_or(RequestsError::Stalled(0))?;
                        *alone.entry(key).or_insert((t.first_token_ns, t.end_ns))
                    }
                };
                let ttft_ns = times.first_token_ns - s.arrival_ns;
                let e2e_ns = times.end_ns - s.arrival_ns;
                Some(Served {
                    admitted_ns: times.admitted_ns,
                    ttft_ns,
                    e2e_ns,
                    tpot_ns: (s.max_tokens > 1).then(|| {
                        (times.end_ns - times.first_token_ns) / u64::from(s.max_tokens - 1)
                    }),
                    alone_ttft_ns,
                    alone_e2e_ns,
                })
            }
        };
        outcomes.push(RequestOutcome {
            id: s.id,
            priority: s.priority,
            arrival_ns: s.arrival_ns,
            kv_bytes,
            served,
        });
    }
    let mut busy_ns = vec![0; scene.device.processors.len()];
    for slice in &mix.slices {
        busy_ns[slice.lane] += slice.end_ns - slice.start_ns;
    }
    let mut all_plans = plans;
    all_plans.extend(
        decode
            .placements()
            .into_iter()
            .filter_map(|p| decode.plan(p).cloned()),
    );
    Ok(RequestsRun {
        outcomes,
        makespan_ns: mix.slices.iter().map(|s| s.end_ns).max().unwrap_or(0),
        slices: mix.slices,
        plans: all_plans,
        peak_kv_bytes: mix.peak_kv_bytes,
        kv_budget_bytes: options.kv_budget_bytes,
        busy_ns,
    })
}

#[cfg(test)]
mod tests {
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
        let plan = Arc::new(plan_for(&scene, &one[0]).unwrap());
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
}
