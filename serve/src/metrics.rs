//! `/metrics`: Prometheus text exposition (OpenMetrics), every name prefixed `hetsched_`.
//!
//! | metric | type | what |
//! |---|---|---|
//! | `hetsched_requests_total{endpoint, outcome}` | counter | HTTP generation requests by how they ended: `completed`, `cancelled` (client gone, or shutdown), `failed` (engine error), `refused` (503), `invalid` (4xx) |
//! | `hetsched_requests_in_engine{state}` | gauge | requests the engine holds now: `queued`, `running` |
//! | `hetsched_time_to_first_token_seconds` | histogram | from the request's body read to its first token |
//! | `hetsched_time_per_output_token_seconds` | histogram | per sample: (end - first token) / (tokens - 1) |
//! | `hetsched_generated_tokens_total` | counter | tokens generated |
//! | `hetsched_processor_busy_seconds_total{processor, kind}` | counter | time each processor ran work |
//! | `hetsched_processor_utilization{processor, kind}` | gauge | busy seconds over the engine's uptime |
//! | `hetsched_kv_cache_bytes` | gauge | KV cache bytes held by running requests |
//! | `hetsched_kv_cache_budget_bytes` | gauge | KV cache bytes running requests may hold together (0: no budget) |
//! | `hetsched_model_ready` | gauge | 1 once the model is loaded |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::engine::EngineSnapshot;

/// `endpoint` and `outcome` of a finished request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    endpoint: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Processor {
    processor: String,
    kind: String,
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<Outcome, Counter>,
    held: Family<State, Gauge>,
    ttft: Histogram,
    tpot: Histogram,
    tokens: Counter,
    busy: Family<Processor, Counter<f64, AtomicU64>>,
    utilization: Family<Processor, Gauge<f64, AtomicU64>>,
    kv_bytes: Gauge,
    kv_budget: Gauge,
    ready: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("hetsched");
        let requests = Family::<Outcome, Counter>::default();
        let held = Family::<State, Gauge>::default();
        // 1 ms to about 65 s, doubling.
        let ttft = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        // 0.5 ms to about 1 s, doubling.
        let tpot = Histogram::new(exponential_buckets(0.0005, 2.0, 12));
        let tokens = Counter::default();
        let busy = Family::<Processor, Counter<f64, AtomicU64>>::default();
        let utilization = Family::<Processor, Gauge<f64, AtomicU64>>::default();
        let kv_bytes = Gauge::default();
        let kv_budget = Gauge::default();
        let ready = Gauge::default();
        registry.register(
            "requests",
            "Generation requests by endpoint and outcome",
            requests.clone(),
        );
        registry.register(
            "requests_in_engine",
            "Requests the engine holds now, by state",
            held.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from a request's arrival to its first token",
            ttft.clone(),
        );
        registry.register(
            "time_per_output_token_seconds",
            "Time per generated token after the first, per sample",
            tpot.clone(),
        );
        registry.register("generated_tokens", "Tokens generated", tokens.clone());
        registry.register(
            "processor_busy_seconds",
            "Time each processor ran work",
            busy.clone(),
        );
        registry.register(
            "processor_utilization",
            "Busy time over the engine's uptime, per processor",
            utilization.clone(),
        );
        registry.register(
            "kv_cache_bytes",
            "KV cache bytes held by running requests",
            kv_bytes.clone(),
        );
        registry.register(
            "kv_cache_budget_bytes",
            "KV cache bytes running requests may hold together (0: no budget)",
            kv_budget.clone(),
        );
        registry.register("model_ready", "1 once the model is loaded", ready.clone());
        Self {
            registry,
            requests,
            held,
            ttft,
            tpot,
            tokens,
            busy,
            utilization,
            kv_bytes,
            kv_budget,
            ready,
        }
    }
}

impl Metrics {
    /// Counts a request that ended with `outcome` at `endpoint`.
    pub fn count(&self, endpoint: &'static str, outcome: &'static str) {
        self.requests
            .get_or_create(&Outcome { endpoint, outcome })
            .inc();
    }

    /// Records a time to first token.
    pub fn first_token(&self, seconds: f64) {
        self.ttft.observe(seconds);
    }

    /// Records a finished sample: `tokens` generated, the last `after_first` seconds after
    /// the first.
    pub fn sample_done(&self, tokens: usize, after_first: f64) {
        self.tokens.inc_by(tokens as u64);
        if tokens > 1 {
            self.tpot.observe(after_first / (tokens - 1) as f64);
        }
    }

    /// The text exposition, with the engine's gauges as of `snapshot` (none while the
    /// model loads).
    pub fn render(&self, snapshot: Option<&EngineSnapshot>) -> String {
        if let Some(s) = snapshot {
            self.ready.set(1);
            self.held
                .get_or_create(&State { state: "queued" })
                .set(s.queued as i64);
            self.held
                .get_or_create(&State { state: "running" })
                .set(s.running as i64);
            self.kv_bytes
                .set(i64::try_from(s.kv_bytes_in_use).unwrap_or(i64::MAX));
            self.kv_budget
                .set(i64::try_from(s.kv_budget_bytes).unwrap_or(i64::MAX));
            for p in &s.processors {
                let labels = Processor {
                    processor: p.name.clone(),
                    kind: p.kind.clone(),
                };
                let counter = self.busy.get_or_create(&labels);
                // Counters only go up: add what is new since the last scrape.
                let new = p.busy_seconds - counter.get();
                if new > 0.0 {
                    counter.inc_by(new);
                }
                let share = match s.uptime_seconds {
                    up if up > 0.0 => p.busy_seconds / up,
                    _ => 0.0,
                };
                self.utilization.get_or_create(&labels).set(share);
            }
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
