//! The figures of a simulated request mix (`hetsched simulate --requests`): per request
//! its time to first token beside alone and whether it met its target, per priority
//! class the p50/p99 and the share of targets met. Predictions of the simulator.

use std::cmp::Reverse;

use hetsched_systems::Priority;

use crate::request_trace::TraceRequest;
use crate::requests::RequestsRun;
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
    /// New tokens at most (not simulated: decode steps are not in the mix yet).
    pub max_tokens: u32,
    /// Time to first token: its prefill's end minus its arrival.
    pub ttft_ms: f64,
    /// The same prefill alone on the same scene and policy.
    pub alone_ttft_ms: f64,
    /// When its last simulated work ended: its prefill's end (decode is not simulated).
    pub end_ms: f64,
    /// Its time-to-first-token target, if any.
    pub ttft_target_ms: Option<f64>,
    /// Whether it met its TTFT target (`None` without one; a per-token target is not
    /// checked while decode is not simulated).
    pub slo_met: Option<bool>,
}

/// TTFT across the requests of one priority class in a [`MixReport`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClassRow {
    /// The class.
    pub priority: String,
    /// Its requests.
    pub requests: usize,
    /// Median TTFT (nearest rank), ms.
    pub ttft_p50_ms: f64,
    /// 99th percentile TTFT (nearest rank), ms.
    pub ttft_p99_ms: f64,
    /// Share of its requests with a TTFT target that met it (`None`: no targets).
    pub slo_attainment: Option<f64>,
}

/// A simulated request mix's figures (predictions of the simulator): per request, and
/// per priority class, most urgent first.
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
    /// Per request, in trace order.
    pub requests: Vec<RequestRow>,
    /// Per priority class, most urgent first.
    pub classes: Vec<ClassRow>,
}

impl MixReport {
    /// The report of `run`, the simulation of `trace` (its requests' max tokens) on
    /// `scene` under `request_policy`.
    pub fn new(
        scene: &Scene,
        request_policy: &str,
        trace: &[TraceRequest],
        run: &RequestsRun,
    ) -> MixReport {
        let ms = |ns: u64| ns as f64 / 1e6;
        let requests: Vec<RequestRow> = run
            .outcomes
            .iter()
            .zip(trace)
            .map(|(o, t)| {
                let target = t.spec.targets.ttft_ns;
                RequestRow {
                    id: o.id.0,
                    priority: o.priority.label(),
                    arrival_ms: ms(o.arrival_ns),
                    prompt_tokens: t.spec.prompt_len,
                    max_tokens: t.max_tokens,
                    ttft_ms: ms(o.ttft_ns),
                    alone_ttft_ms: ms(o.alone_ttft_ns),
                    end_ms: ms(o.arrival_ns + o.ttft_ns),
                    ttft_target_ms: target.map(ms),
                    slo_met: target.map(|t| o.ttft_ns <= t),
                }
            })
            .collect();
        let mut classes: Vec<Priority> = run.outcomes.iter().map(|o| o.priority).collect();
        classes.sort_by_key(|p| Reverse(*p));
        classes.dedup();
        let classes = classes
            .into_iter()
            .map(|class| {
                let rows: Vec<&RequestRow> = run
                    .outcomes
                    .iter()
                    .zip(&requests)
                    .filter(|(o, _)| o.priority == class)
                    .map(|(_, r)| r)
                    .collect();
                let mut ttft: Vec<f64> = rows.iter().map(|r| r.ttft_ms).collect();
                ttft.sort_by(f64::total_cmp);
                let judged: Vec<bool> = rows.iter().filter_map(|r| r.slo_met).collect();
                ClassRow {
                    priority: class.label(),
                    requests: rows.len(),
                    ttft_p50_ms: nearest_rank(&ttft, 0.50),
                    ttft_p99_ms: nearest_rank(&ttft, 0.99),
                    slo_attainment: (!judged.is_empty()).then(|| {
                        judged.iter().filter(|&&met| met).count() as f64 / judged.len() as f64
                    }),
                }
            })
            .collect();
        MixReport {
            scene: scene.name.clone(),
            policy: scene.policy.clone(),
            request_policy: request_policy.to_string(),
            makespan_ms: ms(run.makespan_ns),
            requests,
            classes,
        }
    }

    /// The report as text: a row per request, then a row per class.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut out = format!(
            "{}: {} requests, request policy {}, policy {} within each; makespan {:.1} ms \
             (simulated)\n\n{:>4} {:>12} {:>10} {:>7} {:>10} {:>10} {:>6} {:>10} {:>4}\n",
            self.scene,
            self.requests.len(),
            self.request_policy,
            self.policy,
            self.makespan_ms,
            "id",
            "priority",
            "arrival",
            "prompt",
            "ttft",
            "alone",
            "x",
            "end",
            "slo"
        );
        for r in &self.requests {
            let slo = match r.slo_met {
                Some(true) => "met",
                Some(false) => "MISS",
                None => "-",
            };
            let _ = writeln!(
                out,
                "{:>4} {:>12} {:>10.1} {:>7} {:>10.2} {:>10.2} {:>6.2} {:>10.1} {:>4}",
                r.id,
                r.priority,
                r.arrival_ms,
                r.prompt_tokens,
                r.ttft_ms,
                r.alone_ttft_ms,
                r.ttft_ms / r.alone_ttft_ms.max(f64::MIN_POSITIVE),
                r.end_ms,
                slo
            );
        }
        let _ = writeln!(
            out,
            "\n{:>12} {:>8} {:>10} {:>10} {:>6}",
            "class", "requests", "ttft p50", "ttft p99", "slo"
        );
        for c in &self.classes {
            let slo = c
                .slo_attainment
                .map_or_else(|| "-".to_string(), |a| format!("{:.0}%", a * 100.0));
            let _ = writeln!(
                out,
                "{:>12} {:>8} {:>10.2} {:>10.2} {:>6}",
                c.priority, c.requests, c.ttft_p50_ms, c.ttft_p99_ms, slo
            );
        }
        out.push_str("(times in ms; ttft = time to first token, its prefill's end)\n");
        out
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
    use crate::requests::{RequestSpec, simulate_requests};

    #[test]
    fn the_mix_report_gives_each_class_its_percentiles_and_targets() {
        let scene = Scene::default_scene();
        let trace = load_trace(std::path::Path::new("agent-burst")).unwrap();
        let specs: Vec<RequestSpec> = trace.iter().map(|t| t.spec.clone()).collect();
        let report = |policy: &str| {
            let run = simulate_requests(&scene, &specs, policy).unwrap();
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
            assert_eq!(r.classes[0].ttft_p50_ms, interactive.ttft_ms);
            assert_eq!(r.classes[0].ttft_p99_ms, interactive.ttft_ms);
            let target = interactive.ttft_target_ms.unwrap();
            assert_eq!(interactive.slo_met, Some(interactive.ttft_ms <= target));
            assert_eq!(r.requests[0].slo_met, None, "no target, not judged");
            assert_eq!(r.classes[1].slo_attainment, None);
        }
        // fcfs: the interactive request waits for the whole 4K background prefill.
        assert!(fcfs.requests[1].ttft_ms > fcfs.requests[0].ttft_ms - 100.0);
        assert_eq!(fcfs.requests[1].slo_met, Some(false));
        assert!(slack.requests[1].ttft_ms < 1.25 * slack.requests[1].alone_ttft_ms);
        assert!(slack.summary().contains("interactive"));
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0, 4.0], 0.99), 4.0);
        assert_eq!(nearest_rank(&[], 0.5), 0.0);
    }
}
