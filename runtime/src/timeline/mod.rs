//! Timeline dumps of a run: Chrome trace JSON ([`chrome`], opens in ui.perfetto.dev and
//! chrome://tracing) and an SVG picture ([`svg`]) with one lane per processor.
//!
//! Both render a [`Trace`]: the run's slices, the dependency flows that cross processors,
//! and counter tracks. Output depends only on the run, so the same input gives the same
//! bytes.

pub mod chrome;
pub mod decode;
pub mod svg;

use hetsched_systems::resources::CounterSample;
use hetsched_systems::{InstanceKey, PrefillPlan};

use crate::engine::RunOutcome;
use crate::requests::RequestsRun;

/// A processor lane.
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    /// Processor name.
    pub name: String,
    /// Processor kind (`cpu`, `gpu`, `npu`).
    pub kind: &'static str,
}

/// One executed subgraph.
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    /// Lane index.
    pub lane: usize,
    /// (chunk, stage).
    pub key: InstanceKey,
    /// Template name.
    pub template: String,
    /// Operator names.
    pub ops: Vec<String>,
    /// Whether the template is an outlier shadow.
    pub shadow: bool,
    /// Whether the template is shared across chunks.
    pub shared: bool,
    /// Start, ns.
    pub start_ns: u64,
    /// End, ns.
    pub end_ns: u64,
    /// The request it belongs to, in a trace of several requests ([`Trace::of_requests`]);
    /// `None` in a single run's.
    pub request: Option<u64>,
}

impl Slice {
    /// `plan`'s instance `key` run on `lane` over `(start, end)` ns, of `request`.
    fn of(
        plan: &PrefillPlan,
        lane: usize,
        key: InstanceKey,
        (start_ns, end_ns): (u64, u64),
        request: Option<u64>,
    ) -> Slice {
        let stage = &plan.stages[key.stage as usize];
        Slice {
            lane,
            key,
            template: stage.name.clone(),
            ops: stage.op_names().into_iter().map(String::from).collect(),
            shadow: stage.is_shadow(),
            shared: stage.sharing == hetsched_systems::graph::Sharing::Static,
            start_ns,
            end_ns,
            request,
        }
    }
}

/// A request's way to its first token, in a trace of several requests: drawn as a track
/// of its own in the Chrome trace.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpan {
    /// The request's id.
    pub id: u64,
    /// Its priority class (`interactive`, `background` or the number).
    pub priority: String,
    /// Arrival, ns.
    pub arrival_ns: u64,
    /// First token ready (its prefill's end), ns.
    pub first_token_ns: u64,
}

/// A dependency from one slice to another on a different lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// Index of the producing slice.
    pub from: usize,
    /// Index of the waiting slice.
    pub to: usize,
}

/// Everything a timeline shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Title (scene, model, device, policy).
    pub title: String,
    /// Lanes in device order.
    pub lanes: Vec<Lane>,
    /// Slices sorted by (lane, start).
    pub slices: Vec<Slice>,
    /// Cross-lane dependency flows.
    pub flows: Vec<Flow>,
    /// Counter tracks.
    pub counters: Vec<(String, Vec<CounterSample>)>,
    /// Makespan, ns.
    pub makespan_ns: u64,
    /// In a trace of several requests, each request's span to its first token.
    pub requests: Vec<RequestSpan>,
}

impl Trace {
    /// Builds the trace of a finished run.
    pub fn new(title: &str, run: &RunOutcome) -> Trace {
        let plan: &PrefillPlan = &run.plan;
        let mut slices: Vec<Slice> = run
            .timeline
            .slices
            .iter()
            .map(|r| Slice::of(plan, r.processor, r.key, (r.start_ns, r.end_ns), None))
            .collect();
        slices.sort_by_key(|s| (s.lane, s.start_ns, s.key));
        let mut slice_of = vec![usize::MAX; plan.id_space()];
        for (i, s) in slices.iter().enumerate() {
            slice_of[plan.id(s.key)] = i;
        }
        let mut flows = Vec::new();
        for (to, s) in slices.iter().enumerate() {
            // Draw the dependency that released the slice (the predecessor that finished
            // last) and the intra-chunk one, when they cross lanes.
            let preds = plan.predecessors(s.key);
            let releasing = preds
                .iter()
                .max_by_key(|p| (slices[slice_of[plan.id(**p)]].end_ns, p.chunk));
            let intra = preds.iter().find(|p| p.chunk == s.key.chunk);
            let mut chosen: Vec<&InstanceKey> = releasing.into_iter().chain(intra).collect();
            chosen.dedup();
            for p in chosen {
                let from = slice_of[plan.id(*p)];
                if slices[from].lane != s.lane {
                    flows.push(Flow { from, to });
                }
            }
        }
        Trace {
            title: title.to_string(),
            lanes: plan
                .device
                .processors
                .iter()
                .map(|p| Lane {
                    name: p.name.clone(),
                    kind: p.kind.as_str(),
                })
                .collect(),
            slices,
            flows,
            counters: run.timeline.counters.clone(),
            makespan_ns: run.makespan_ns,
            requests: Vec::new(),
        }
    }

    /// The trace of several requests simulated together: every job as a slice on its
    /// processor's lane, tagged with its request (coloured by request in the SVG, named
    /// by it in the Chrome trace), and each request's span from arrival to first token.
    /// No dependency flows: they cross requests' plans. A decode row that rode in a
    /// prefill job is drawn as that job (one slice a job on a lane).
    pub fn of_requests(title: &str, run: &RequestsRun) -> Trace {
        let mut slices: Vec<Slice> = run
            .slices
            .iter()
            .filter(|r| r.rode_in.is_none())
            .filter_map(|r| {
                let plan = run.plans.get(r.plan)?;
                let span = (r.start_ns, r.end_ns);
                Some(Slice::of(plan, r.lane, r.key, span, Some(r.request.0)))
            })
            .collect();
        slices.sort_by_key(|s| (s.lane, s.start_ns, s.request, s.key));
        let lanes = run.plans.first().map_or_else(Vec::new, |plan| {
            plan.device
                .processors
                .iter()
                .map(|p| Lane {
                    name: p.name.clone(),
                    kind: p.kind.as_str(),
                })
                .collect()
        });
        Trace {
            title: title.to_string(),
            lanes,
            slices,
            flows: Vec::new(),
            counters: Vec::new(),
            makespan_ns: run.makespan_ns,
            requests: run
                .outcomes
                .iter()
                .filter_map(|o| {
                    Some(RequestSpan {
                        id: o.id.0,
                        priority: o.priority.label(),
                        arrival_ns: o.arrival_ns,
                        first_token_ns: o.arrival_ns + o.served?.ttft_ns,
                    })
                })
                .collect(),
        }
    }
}

impl Trace {
    /// This (measured) trace with each processor's `predicted` lane drawn right under its
    /// measured lane (named `<name> predicted`), on one time axis: the SVG of `run
    /// --predict`. Dependency flows are kept for the measured lanes only.
    pub fn with_prediction(&self, predicted: &Trace) -> Trace {
        let mut lanes = Vec::with_capacity(2 * self.lanes.len());
        for l in &self.lanes {
            lanes.push(l.clone());
            lanes.push(Lane {
                name: format!("{} predicted", l.name),
                kind: l.kind,
            });
        }
        let moved = |s: &Slice, offset: usize| Slice {
            lane: 2 * s.lane + offset,
            ..s.clone()
        };
        let mut slices: Vec<(usize, Slice)> = self
            .slices
            .iter()
            .enumerate()
            .map(|(i, s)| (i, moved(s, 0)))
            .chain(predicted.slices.iter().map(|s| (usize::MAX, moved(s, 1))))
            .collect();
        slices.sort_by_key(|(_, s)| (s.lane, s.start_ns, s.key));
        let mut index_of = vec![0; self.slices.len()];
        for (new, (old, _)) in slices.iter().enumerate() {
            if *old != usize::MAX {
                index_of[*old] = new;
            }
        }
        Trace {
            title: format!("{} (each lane's prediction below it)", self.title),
            lanes,
            flows: self
                .flows
                .iter()
                .map(|f| Flow {
                    from: index_of[f.from],
                    to: index_of[f.to],
                })
                .collect(),
            slices: slices.into_iter().map(|(_, s)| s).collect(),
            counters: self.counters.clone(),
            makespan_ns: self.makespan_ns.max(predicted.makespan_ns),
            requests: self.requests.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_trace_of_requests_tags_every_job_and_gives_each_request_a_track() {
        use crate::requests::{RequestSpec as Spec, simulate_requests};
        use hetsched_systems::{Priority, RequestId, SloTargets};
        let scene = crate::scene::Scene::default_scene();
        let specs = [
            (0, Priority::BACKGROUND, 0, 256),
            (1, Priority::INTERACTIVE, 20, 64),
        ]
        .map(|(id, priority, arrival_ms, prompt_len)| Spec {
            id: RequestId(id),
            priority,
            targets: SloTargets::default(),
            arrival_ns: arrival_ms * 1_000_000,
            prompt_len,
            max_tokens: 3,
            samples: 1,
        });
        let options = crate::requests::MixOptions::new("priority");
        let run = simulate_requests(&scene, &specs, &options).unwrap();
        let trace = Trace::of_requests("mix", &run);
        assert_eq!(trace.slices.len(), run.slices.len());
        for id in [0, 1] {
            assert!(trace.slices.iter().any(|s| s.request == Some(id)));
        }
        assert_eq!(trace.requests.len(), 2);
        let json: serde_json::Value =
            serde_json::from_str(&chrome::to_chrome_json(&trace)).unwrap();
        let tracks = json["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .count();
        assert_eq!(
            tracks,
            trace.lanes.len() + 2,
            "a track per processor and request"
        );
        let picture = svg::to_svg(&trace);
        assert!(picture.contains("request 1") && !picture.contains(">chunk 0<"));
    }

    use std::sync::Arc;

    use hetsched_systems::PolicyRegistry;
    use hetsched_systems::testing::tiny_plan;

    use super::*;
    use crate::engine::simulate;

    #[test]
    fn each_predicted_lane_sits_under_its_measured_lane() {
        let plan = Arc::new(tiny_plan(1, 128, 64));
        let run = simulate(plan, PolicyRegistry::builtin().create("stall").unwrap()).unwrap();
        let trace = Trace::new("t", &run);
        let both = trace.with_prediction(&trace);
        assert_eq!(both.lanes.len(), 2 * trace.lanes.len());
        assert_eq!(
            both.lanes[1].name,
            format!("{} predicted", trace.lanes[0].name)
        );
        assert_eq!(both.slices.len(), 2 * trace.slices.len());
        for f in &both.flows {
            assert_eq!(both.slices[f.from].lane % 2, 0);
            assert_eq!(both.slices[f.to].lane % 2, 0);
        }
        assert_eq!(both.flows.len(), trace.flows.len());
        assert!(svg::to_svg(&both).contains("predicted"));
    }
}
