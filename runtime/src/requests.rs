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
    /// For a decode step's stage that rode in another request's prefill job (its rows
    /// joining the job's, docs/requests.md "Decode rows riding in prefill chunks"): that
    /// request. Its lane and times are that job's, so it adds nothing to the lane's busy
    /// time. `None`: a job of its own.
    pub rode_in: Option<RequestId>,
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
    /// Cut each prefill's attention stages by query heads into parts of about this many
    /// ns or less on their home processor ([`PrefillPlan::with_attention_split`]), the
    /// same plan alone and in the mix; `None`: attention whole. Off by default: on the
    /// shipped scenes the parts' overheads cost more than the gaps they fill
    /// (docs/requests.md, "Attention cut by query heads").
    pub attention_part_ns: Option<u64>,
    /// When a decode step may ride another request's prefill chunks instead of running
    /// as a batch of its own.
    pub ride: RideMode,
}

/// When a decode step rides another request's prefill chunks: its linears join the
/// jobs of the same layer's linears of a prefill chunk as extra rows, its float stages
/// its own jobs ([`hetsched_systems::ride`]; docs/requests.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RideMode {
    /// Never: every step runs as a batch of its own.
    Off,
    /// When the request policy lets it ([`RequestPolicy::may_ride`]: under `slack`, when
    /// the step is predicted to end by its deadline that way; never under `fcfs` and
    /// `priority`).
    ///
    /// [`RequestPolicy::may_ride`]: hetsched_systems::RequestPolicy::may_ride
    #[default]
    Policy,
    /// Whenever a prefill the request policy runs beside the step has a chunk left to
    /// carry it (the comparison: what riding gives and costs).
    Always,
}

impl RideMode {
    /// `off`, `policy`, `always`.
    pub fn name(self) -> &'static str {
        match self {
            RideMode::Off => "off",
            RideMode::Policy => "policy",
            RideMode::Always => "always",
        }
    }

    /// The mode named `name` ([`RideMode::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        [RideMode::Off, RideMode::Policy, RideMode::Always]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

impl MixOptions {
    /// `request_policy`, no KV budget.
    pub fn new(request_policy: &str) -> Self {
        MixOptions {
            request_policy: request_policy.to_string(),
            kv_budget_bytes: None,
            kv_full: KvFull::Wait,
            attention_part_ns: None,
            ride: RideMode::default(),
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
    for slice in mix.slices.iter().filter(|s| s.rode_in.is_none()) {
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
mod tests;
