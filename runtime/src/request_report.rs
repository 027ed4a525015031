//! The figures of a simulated request mix (`hetsched simulate --requests`): per request
//! its time to first token, time per output token and end to end beside the same request
//! alone, and whether it met its targets; per priority class and across all requests the
//! p50/p95/p99 and the share of targets met; per processor its utilization; the KV caches'
//! peak. Predictions of the simulator.

use std::cmp::Reverse;

use hetsched_systems::Priority;

use crate::request_trace::TraceRequest;
use crate::requests::{RequestOutcome, RequestsRun};
use crate::scene::Scene;

/// One request's figures in a [`MixReport`], ms on the simulated clock.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RequestRow {
    /// The request's id (its position in the trace, from 0).
    pub id: u64,
    /// Its priority class (`interactive`, `background` or the number).
    pub priority: String,
    /// Arrival.
    pub arrival_ms: f64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// New tokens per sample.
    pub max_tokens: u32,
    /// Samples of the prompt.
    pub samples: u32,
    /// Its KV caches, bytes.
    pub kv_bytes: u64,
    /// `served`, or `refused` (its KV caches did not fit; no figures).
    pub status: &'static str,
    /// When its KV caches were admitted.
    pub admitted_ms: Option<f64>,
    /// Time to first token: its prefill's end minus its arrival.
    pub ttft_ms: Option<f64>,
    /// Time per output token after the first (none for one token).
    pub tpot_ms: Option<f64>,
    /// End to end: its last token minus its arrival.
    pub e2e_ms: Option<f64>,
    /// The same request alone on the same scene and policy: time to first token.
    pub alone_ttft_ms: Option<f64>,
    /// The same request alone: end to end.
    pub alone_e2e_ms: Option<f64>,
    /// When its last token was ready.
    pub end_ms: Option<f64>,
    /// Its time-to-first-token target, if any.
    pub ttft_target_ms: Option<f64>,
    /// Its time-per-output-token target, if any.
    pub tpot_target_ms: Option<f64>,
    /// Whether it met every target it has (`None` without targets; a refused request
    /// met none).
    pub slo_met: Option<bool>,
}

/// Nearest-rank percentiles of one figure, ms (`None` where no request has it).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

impl Percentiles {
    fn of(values: impl Iterator<Item = f64>) -> Self {
        let mut sorted: Vec<f64> = values.collect();
        sorted.sort_by(f64::total_cmp);
        let at = |p| (!sorted.is_empty()).then(|| nearest_rank(&sorted, p));
        Percentiles {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
        }
    }
}

/// The figures across a set of requests (one priority class, or all).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClassRow {
    /// The class, or `all`.
    pub priority: String,
    /// Its requests.
    pub requests: usize,
    /// Of those, refused for KV memory.
    pub refused: usize,
    /// Time to first token across its served requests.
    pub ttft_ms: Percentiles,
    /// Time per output token.
    pub tpot_ms: Percentiles,
    /// End to end.
    pub e2e_ms: Percentiles,
    /// Share of its requests with a target that met every one (`None`: no targets).
    pub slo_attainment: Option<f64>,
}

/// How busy one processor was over the mix.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ProcessorRow {
    /// The processor.
    pub name: String,
    /// Time its jobs ran, ms.
    pub busy_ms: f64,
    /// Busy time over the makespan.
    pub utilization: f64,
}

/// A simulated request mix's figures (predictions of the simulator): per request, per
/// priority class (most urgent first) and across all, per processor, and the KV peak.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MixReport {
    /// The scene.
    pub scene: String,
    /// The policy within each request.
    pub policy: String,
    /// The policy across requests.
    pub request_policy: String,
    /// When the last job ended, ms.
    pub makespan_ms: f64,
    /// Most bytes of KV caches held at once.
    pub peak_kv_bytes: u64,
    /// The KV budget, bytes (`None`: none).
    pub kv_budget_bytes: Option<u64>,
    /// Per request, in trace order.
    pub requests: Vec<RequestRow>,
    /// Per priority class, most urgent first.
    pub classes: Vec<ClassRow>,
    /// Across every request.
    pub all: ClassRow,
    /// Per processor, by lane.
    pub processors: Vec<ProcessorRow>,
}

/// The per-request, per-class and overall figures of a mix's outcomes, simulated
/// ([`MixReport`]) or measured (`hetsched run --requests`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RequestRows {
    /// Per request, in trace order.
    pub requests: Vec<RequestRow>,
    /// Per priority class, most urgent first.
    pub classes: Vec<ClassRow>,
    /// Across every request.
    pub all: ClassRow,
}

impl RequestRows {
    /// The rows of `outcomes`, one per request of `trace` (same order).
    pub fn new(outcomes: &[RequestOutcome], trace: &[TraceRequest]) -> Self {
        let requests: Vec<RequestRow> =
            outcomes.iter().zip(trace).map(|(o, t)| row(o, t)).collect();
        let mut classes: Vec<Priority> = outcomes.iter().map(|o| o.priority).collect();
        classes.sort_by_key(|p| Reverse(*p));
        classes.dedup();
        let classes = classes
            .into_iter()
            .map(|class| {
                let rows: Vec<&RequestRow> = outcomes
                    .iter()
                    .zip(&requests)
                    .filter(|(o, _)| o.priority == class)
                    .map(|(_, r)| r)
                    .collect();
                class_row(class.label(), &rows)
            })
            .collect();
        let all = class_row("all".into(), &requests.iter().collect::<Vec<_>>());
        RequestRows {
            requests,
            classes,
            all,
        }
    }
}

impl MixReport {
    /// The report of `run`, the simulation of `trace` on `scene` under `request_policy`.
    pub fn new(
        scene: &Scene,
        request_policy: &str,
        trace: &[TraceRequest],
        run: &RequestsRun,
    ) -> MixReport {
        let RequestRows {
            requests,
            classes,
            all,
        } = RequestRows::new(&run.outcomes, trace);
        let makespan_ms = ms(run.makespan_ns);
        let processors = run
            .plans
            .first()
            .map(|plan| &plan.device.processors[..])
            .unwrap_or(&[])
            .iter()
            .zip(&run.busy_ns)
            .map(|(p, &busy)| ProcessorRow {
                name: p.name.clone(),
                busy_ms: ms(busy),
                utilization: if run.makespan_ns > 0 {
                    busy as f64 / run.makespan_ns as f64
                } else {
                    0.0
                },
            })
            .collect();
        MixReport {
            scene: scene.name.clone(),
            policy: scene.policy.clone(),
            request_policy: request_policy.to_string(),
            makespan_ms,
            peak_kv_bytes: run.peak_kv_bytes,
            kv_budget_bytes: run.kv_budget_bytes,
            all,
            requests,
            classes,
            processors,
        }
    }

    /// The report as text: a row per request, a row per class and one for all, the
    /// processors' utilization and the KV peak.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut out = format!(
            "{}: {} requests, request policy {}, policy {} within each; makespan {:.1} ms \
             (simulated)\n\n",
            self.scene,
            self.requests.len(),
            self.request_policy,
            self.policy,
            self.makespan_ms,
        );
        out.push_str(&request_tables(&self.requests, &self.classes, &self.all));
        out.push('\n');
        for p in &self.processors {
            let _ = writeln!(
                out,
                "{:>12} busy {:.1} ms, {:.0}% of the makespan",
                p.name,
                p.busy_ms,
                p.utilization * 100.0
            );
        }
        let budget = self.kv_budget_bytes.map_or_else(
            || "no budget".to_string(),
            |b| format!("budget {:.1} MiB", mib(b)),
        );
        let _ = writeln!(
            out,
            "KV caches: peak {:.1} MiB held together ({budget})",
            mib(self.peak_kv_bytes)
        );
        out.push_str(
            "(times in ms; ttft = time to first token, its prefill's end; tpot = time per \
             output token after it; e2e = its last token)\n",
        );
        out
    }
}

/// The per-request table and the per-class percentiles of a mix's rows, as text (the
/// body of `simulate --requests` and `run --requests` summaries).
pub fn request_tables(requests: &[RequestRow], classes: &[ClassRow], all: &ClassRow) -> String {
    let mut out = request_table(requests);
    out.push_str(&class_table(classes, all));
    out
}

/// One line per request: its times, each beside its time alone and their ratio.
fn request_table(requests: &[RequestRow]) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{:>4} {:>12} {:>9} {:>6} {:>5} {:>9} {:>9} {:>6} {:>8} {:>10} {:>10} {:>6} {:>5}\n",
        "id",
        "priority",
        "arrival",
        "prompt",
        "new",
        "ttft",
        "alone",
        "x",
        "tpot",
        "e2e",
        "alone",
        "x",
        "slo"
    );
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a / b.max(f64::MIN_POSITIVE)),
        _ => None,
    };
    for r in requests {
        let slo = match (r.status, r.slo_met) {
            ("refused", _) => "REFUSED",
            (_, Some(true)) => "met",
            (_, Some(false)) => "MISS",
            (_, None) => "-",
        };
        let _ = writeln!(
            out,
            "{:>4} {:>12} {:>9.1} {:>6} {:>5} {} {} {} {} {} {} {} {:>5}",
            r.id,
            r.priority,
            r.arrival_ms,
            r.prompt_tokens,
            format!("{}x{}", r.samples, r.max_tokens),
            opt(r.ttft_ms, 9, 1),
            opt(r.alone_ttft_ms, 9, 1),
            opt(ratio(r.ttft_ms, r.alone_ttft_ms), 6, 2),
            opt(r.tpot_ms, 8, 2),
            opt(r.e2e_ms, 10, 1),
            opt(r.alone_e2e_ms, 10, 1),
            opt(ratio(r.e2e_ms, r.alone_e2e_ms), 6, 2),
            slo
        );
    }
    out
}

/// One line per priority class, then `all`: percentiles of its times and its SLO
/// attainment, after a blank line.
fn class_table(classes: &[ClassRow], all: &ClassRow) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{:>12} {:>8} {:>26} {:>26} {:>26} {:>6}",
        "class", "requests", "ttft p50/p95/p99", "tpot p50/p95/p99", "e2e p50/p95/p99", "slo"
    );
    let triple = |p: &Percentiles| {
        format!(
            "{}/{}/{}",
            opt(p.p50, 0, 1),
            opt(p.p95, 0, 1),
            opt(p.p99, 0, 1)
        )
    };
    for c in classes.iter().chain(std::iter::once(all)) {
        let slo = c
            .slo_attainment
            .map_or_else(|| "-".to_string(), |a| format!("{:.0}%", a * 100.0));
        let _ = writeln!(
            out,
            "{:>12} {:>8} {:>26} {:>26} {:>26} {:>6}",
            c.priority,
            c.requests,
            triple(&c.ttft_ms),
            triple(&c.tpot_ms),
            triple(&c.e2e_ms),
            slo
        );
    }
    out
}

/// `v` right-aligned in `width` with `digits` decimals, or `-` when absent.
fn opt(v: Option<f64>, width: usize, digits: usize) -> String {
    v.map_or_else(
        || format!("{:>width$}", "-"),
        |v| format!("{v:>width$.digits$}"),
    )
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// One request's row.
fn row(o: &RequestOutcome, t: &TraceRequest) -> RequestRow {
    let spec = &t.spec;
    let ttft_target = spec.targets.ttft_ns;
    let tpot_target = spec.targets.tpot_ns;
    let served = o.served;
    let slo_met = (ttft_target.is_some() || tpot_target.is_some()).then(|| {
        served.is_some_and(|s| {
            ttft_target.is_none_or(|t| s.ttft_ns <= t)
                && tpot_target.is_none_or(|t| s.tpot_ns.is_none_or(|tpot| tpot <= t))
        })
    });
    RequestRow {
        id: o.id.0,
        priority: o.priority.label(),
        arrival_ms: ms(o.arrival_ns),
        prompt_tokens: spec.prompt_len,
        max_tokens: spec.max_tokens,
        samples: spec.samples,
        kv_bytes: o.kv_bytes,
        status: if served.is_some() {
            "served"
        } else {
            "refused"
        },
        admitted_ms: served.map(|s| ms(s.admitted_ns)),
        ttft_ms: served.map(|s| ms(s.ttft_ns)),
        tpot_ms: served.and_then(|s| s.tpot_ns).map(ms),
        e2e_ms: served.map(|s| ms(s.e2e_ns)),
        alone_ttft_ms: served.map(|s| ms(s.alone_ttft_ns)),
        alone_e2e_ms: served.map(|s| ms(s.alone_e2e_ns)),
        end_ms: served.map(|s| ms(o.arrival_ns + s.e2e_ns)),
        ttft_target_ms: ttft_target.map(ms),
        tpot_target_ms: tpot_target.map(ms),
        slo_met,
    }
}

/// The figures across `rows`.
fn class_row(priority: String, rows: &[&RequestRow]) -> ClassRow {
    let judged: Vec<bool> = rows.iter().filter_map(|r| r.slo_met).collect();
    ClassRow {
        priority,
        requests: rows.len(),
        refused: rows.iter().filter(|r| r.status == "refused").count(),
        ttft_ms: Percentiles::of(rows.iter().filter_map(|r| r.ttft_ms)),
        tpot_ms: Percentiles::of(rows.iter().filter_map(|r| r.tpot_ms)),
        e2e_ms: Percentiles::of(rows.iter().filter_map(|r| r.e2e_ms)),
        slo_attainment: (!judged.is_empty())
            .then(|| judged.iter().filter(|&&met| met).count() as f64 / judged.len() as f64),
    }
}

/// The nearest-rank `p` quantile of `sorted` (0 when empty).
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request_trace::load_trace;
    use crate::requests::{MixOptions, RequestSpec, simulate_requests};

    #[test]
    fn the_mix_report_gives_each_class_its_percentiles_and_targets() {
        let scene = Scene::default_scene();
        let trace = load_trace(std::path::Path::new("agent-burst")).unwrap();
        let specs: Vec<RequestSpec> = trace.iter().map(|t| t.spec.clone()).collect();
        let report = |policy: &str| {
            let run = simulate_requests(&scene, &specs, &MixOptions::new(policy)).unwrap();
            assert_eq!(
                run.slices.iter().map(|s| s.end_ns).max(),
                Some(run.makespan_ns)
            );
            MixReport::new(&scene, policy, &trace, &run)
        };
        let (fcfs, slack) = (report("fcfs"), report("slack"));
        for r in [&fcfs, &slack] {
            let names: Vec<&str> = r.classes.iter().map(|c| c.priority.as_str()).collect();
            assert_eq!(names, ["interactive", "background"]);
            let interactive = &r.requests[1];
            assert_eq!(r.classes[0].ttft_ms.p50, interactive.ttft_ms);
            assert_eq!(r.classes[0].ttft_ms.p99, interactive.ttft_ms);
            assert_eq!(r.all.requests, 2);
            let target = interactive.ttft_target_ms.unwrap();
            assert_eq!(
                interactive.slo_met,
                Some(interactive.ttft_ms.unwrap() <= target)
            );
            assert_eq!(r.requests[0].slo_met, None, "no target, not judged");
            assert_eq!(r.classes[1].slo_attainment, None);
            for row in &r.requests {
                let (ttft, e2e) = (row.ttft_ms.unwrap(), row.e2e_ms.unwrap());
                let steps = f64::from(row.max_tokens - 1);
                assert!(e2e > ttft, "decode steps follow the first token");
                let tpot = row.tpot_ms.unwrap();
                assert!((ttft + tpot * steps - e2e).abs() < 1e-3 * steps.max(1.0) + 1e-6);
            }
            assert!(r.processors.iter().all(|p| p.utilization <= 1.0));
            assert!(r.peak_kv_bytes > 0);
        }
        // fcfs: the interactive request waits for the whole background request.
        let (bg, fg) = (&fcfs.requests[0], &fcfs.requests[1]);
        assert!(fg.ttft_ms.unwrap() > bg.e2e_ms.unwrap() - 100.0);
        assert_eq!(fg.slo_met, Some(false));
        let fg = &slack.requests[1];
        assert!(fg.ttft_ms.unwrap() < 1.25 * fg.alone_ttft_ms.unwrap());
        assert!(slack.summary().contains("interactive"));
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0, 4.0], 0.99), 4.0);
        assert_eq!(nearest_rank(&[], 0.5), 0.0);
    }

    #[test]
    fn a_refused_request_is_reported_without_figures_and_misses_its_target() {
        let scene = Scene::default_scene();
        let trace = load_trace(std::path::Path::new("best-of-8")).unwrap();
        let specs: Vec<RequestSpec> = trace.iter().map(|t| t.spec.clone()).collect();
        let kv: Vec<u64> = specs
            .iter()
            .map(|s| {
                hetsched_systems::kv_cache_bytes(
                    &scene.model,
                    s.prompt_len,
                    s.max_tokens,
                    s.samples,
                )
            })
            .collect();
        let options = MixOptions {
            kv_budget_bytes: Some(kv[0].max(kv[1])),
            kv_full: crate::requests::KvFull::Refuse,
            ..MixOptions::new("slack")
        };
        let run = simulate_requests(&scene, &specs, &options).unwrap();
        let report = MixReport::new(&scene, "slack", &trace, &run);
        let refused = &report.requests[1];
        assert_eq!(refused.status, "refused");
        assert_eq!((refused.ttft_ms, refused.e2e_ms), (None, None));
        assert_eq!(refused.slo_met, Some(false));
        assert_eq!(report.all.refused, 1);
        assert!(report.peak_kv_bytes <= options.kv_budget_bytes.unwrap());
        assert!(report.summary().contains("REFUSED"));
    }
}
