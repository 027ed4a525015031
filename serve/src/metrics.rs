//! `/metrics`: Prometheus text exposition (OpenMetrics), every name prefixed `hetsched_`.
//!
//! | metric | type | what |
//! |---|---|---|
//! | `hetsched_requests_total{endpoint, outcome}` | counter | HTTP generation requests by how they ended: `completed`, `cancelled` (client gone, or shutdown), `failed` (engine error), `refused` (503), `invalid` (4xx) |
//! | `hetsched_requests_in_engine{state}` | gauge | requests the engine holds now: `queued`, `running` |
//! | `hetsched_time_to_first_token_seconds` | histogram | from the request's body read to its first token |
//! | `hetsched_time_per_output_token_seconds` | histogram | per sample: (end - first token) / (tokens - 1) |
//! | `hetsched_generated_tokens_total` | counter | tokens generated |
//! | `hetsched_processor_busy_seconds_total{processor, kind}` | counter | time each processor ran work (summed over its threads) |
//! | `hetsched_processor_utilization{processor, kind}` | gauge | share of its capacity it was busy over the last [`UTILIZATION_WINDOW`] |
//! | `hetsched_kv_cache_bytes` | gauge | KV cache bytes held by running requests |
//! | `hetsched_kv_cache_budget_bytes` | gauge | KV cache bytes running requests may hold together (0: no budget) |
//! | `hetsched_model_ready` | gauge | 1 once the model is loaded |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use crate::engine::EngineSnapshot;

/// The span `hetsched_processor_utilization` is measured over, seconds: from the
/// latest scrape at least this old (the engine's start before there is one), so scrapes
/// further apart measure over the time between them.
pub const UTILIZATION_WINDOW: f64 = 10.0;

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
    busy_history: Mutex<BusyHistory>,
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
            "Busy share of each processor's capacity over the last 10 s",
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
            busy_history: Mutex::new(BusyHistory::default()),
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
            let busy: Vec<f64> = s.processors.iter().map(|p| p.busy_seconds).collect();
            let shares = self.busy_history.lock().shares(s.uptime_seconds, &busy);
            for (p, share) in s.processors.iter().zip(shares) {
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
                let utilization = match p.capacity {
                    capacity if capacity > 0.0 => share / capacity,
                    _ => 0.0,
                };
                self.utilization.get_or_create(&labels).set(utilization);
            }
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// Busy times at past scrapes, for utilization over [`UTILIZATION_WINDOW`].
#[derive(Debug, Default)]
struct BusyHistory {
    /// (engine uptime, busy seconds per processor), oldest first; the first is the
    /// latest at least a window older than the newest.
    samples: VecDeque<(f64, Vec<f64>)>,
}

impl BusyHistory {
    /// Records `busy` at `uptime` and returns, per processor, its busy seconds per second
    /// since the window's start.
    fn shares(&mut self, uptime: f64, busy: &[f64]) -> Vec<f64> {
        let same_processors = self
            .samples
            .front()
            .is_some_and(|s| s.1.len() == busy.len());
        if !same_processors {
            // The engine's start: nothing busy yet.
            self.samples.clear();
            self.samples.push_back((0.0, vec![0.0; busy.len()]));
        }
        self.samples.push_back((uptime, busy.to_vec()));
        while self
            .samples
            .get(1)
            .is_some_and(|s| s.0 <= uptime - UTILIZATION_WINDOW)
        {
            self.samples.pop_front();
        }
        let (since, then) = &self.samples[0];
        let span = uptime - since;
        busy.iter()
            .zip(then)
            .map(|(now, then)| match span {
                span if span > 0.0 => ((now - then) / span).max(0.0),
                _ => 0.0,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ProcessorBusy;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn utilization_is_over_the_last_window_not_the_uptime() {
        let mut history = BusyHistory::default();
        // Busy half the time for the first 20 s...
        assert!(close(history.shares(10.0, &[5.0])[0], 0.5));
        assert!(close(history.shares(20.0, &[10.0])[0], 0.5));
        // ...then idle: the last 10 s say 0, whatever came before.
        assert!(close(history.shares(30.0, &[10.0])[0], 0.0));
        // Scrapes closer than the window look back to the latest one at least 10 s old.
        assert!(close(history.shares(35.0, &[12.0])[0], 2.0 / 15.0));
        assert!(close(history.shares(41.0, &[14.0])[0], 4.0 / 11.0));
    }

    fn snapshot(busy: f64, uptime: f64) -> EngineSnapshot {
        EngineSnapshot {
            processors: vec![ProcessorBusy {
                name: "engine-pool".into(),
                kind: "cpu".into(),
                busy_seconds: busy,
                capacity: 2.0,
            }],
            uptime_seconds: uptime,
            kv_bytes_in_use: 46_080,
            kv_budget_bytes: 1 << 30,
            ..EngineSnapshot::default()
        }
    }

    /// The value of the line starting with `name` (labels included) in `text`.
    fn value(text: &str, name: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn busy_time_is_a_counter_and_utilization_a_share_of_the_threads() {
        let metrics = Metrics::default();
        let labels = r#"{processor="engine-pool",kind="cpu"}"#;
        let text = metrics.render(Some(&snapshot(4.0, 10.0)));
        let busy = format!("hetsched_processor_busy_seconds_total{labels}");
        let utilization = format!("hetsched_processor_utilization{labels}");
        assert!(close(value(&text, &busy), 4.0), "{text}");
        // 4 busy seconds of two threads over 10 s.
        assert!(close(value(&text, &utilization), 0.2), "{text}");
        assert!(close(value(&text, "hetsched_kv_cache_bytes"), 46_080.0));
        assert!(close(
            value(&text, "hetsched_kv_cache_budget_bytes"),
            1073741824.0
        ));
        let text = metrics.render(Some(&snapshot(20.0, 20.0)));
        assert!(close(value(&text, &busy), 20.0), "{text}");
        assert!(close(value(&text, &utilization), 0.8), "{text}");
        // A reading lower than the last (it cannot be, but a counter must not go down).
        let text = metrics.render(Some(&snapshot(19.0, 21.0)));
        assert!(close(value(&text, &busy), 20.0), "{text}");
    }
}
