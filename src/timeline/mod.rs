//! Timeline dumps of a run: Chrome trace JSON ([`chrome`], opens in ui.perfetto.dev and
//! chrome://tracing) and an SVG picture ([`svg`]) with one lane per processor.
//!
//! Both render a [`Trace`]: the run's slices, the dependency flows that cross processors,
//! and counter tracks. Output depends only on the run, so the same input gives the same
//! bytes.

pub mod chrome;
pub mod svg;

use hetsched_systems::resources::CounterSample;
use hetsched_systems::{InstanceKey, PrefillPlan};

use crate::engine::RunOutcome;

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
}

impl Trace {
    /// Builds the trace of a finished run.
    pub fn new(title: &str, run: &RunOutcome) -> Trace {
        let plan: &PrefillPlan = &run.plan;
        let mut slices: Vec<Slice> = run
            .timeline
            .slices
            .iter()
            .map(|r| {
                let stage = &plan.stages[r.key.stage as usize];
                Slice {
                    lane: r.processor,
                    key: r.key,
                    template: stage.name.clone(),
                    ops: stage.op_names().into_iter().map(String::from).collect(),
                    shadow: stage.is_shadow(),
                    shared: stage.sharing == hetsched_systems::graph::Sharing::Static,
                    start_ns: r.start_ns,
                    end_ns: r.end_ns,
                }
            })
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
        }
    }
}
