//! The run report: what a profiling engineer wants to know, as JSON or a short summary.

use std::fmt::Write as _;

use hetsched_systems::memory::{ChunkSharing, RegionMemory, chunk_sharing, plan_schedule};
use hetsched_systems::{InstanceKey, LowerBound, ProcessorKind, measured_lower_bound};
use serde::Serialize;

use crate::engine::RunOutcome;

/// One processor's share of the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessorReport {
    /// Name from the device profile.
    pub name: String,
    /// Kind (`cpu`, `gpu`, `npu`).
    pub kind: &'static str,
    /// Time spent running subgraphs, in ms.
    pub busy_ms: f64,
    /// Busy time / makespan.
    pub utilization: f64,
    /// Subgraph instances it ran.
    pub subgraphs: usize,
    /// Real runs only: time its jobs waited between submission and the start of their
    /// work (for a pool worker held by another lane), in ms; not part of `busy_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_wait_ms: Option<f64>,
}

/// The cost model's lower bound of a plan (docs/policies.md, "The lower bound"), beside a
/// real run's measured one.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelBound {
    /// max(load bound, critical path) at modeled costs, in ms.
    pub lower_bound_ms: f64,
    /// The load bound at modeled costs, in ms.
    pub busiest_processor_ms: f64,
    /// The critical path at modeled (cheapest) costs, in ms.
    pub critical_path_ms: f64,
}

/// The outlier shadow in a run (seed 000, section 3.3): its subgraphs, how much of their
/// time the INT8 stage beside them hid, and its resident weight rows.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ShadowRun {
    /// Sites (quantized activations) that keep a shadow.
    pub kept_sites: usize,
    /// Sites in the model (4 per layer).
    pub sites: usize,
    /// Shadow subgraph instances run.
    pub subgraphs: usize,
    /// Time in shadow subgraphs, summed over processors, in ms.
    pub busy_ms: f64,
    /// `busy_ms` / makespan.
    pub share_of_makespan: f64,
    /// Share of the shadow's time that ended before the INT8 stage beside it did, so it
    /// cannot have delayed the merge (1: fully hidden; 0: a serial step after the matmul,
    /// as the peer code runs it).
    pub hidden_share: f64,
    /// Share of the shadow's time during which the INT8 stage beside it was running
    /// (the rest ran before it started, while the NPU worked on other chunks).
    pub concurrent_share: f64,
    /// Time shadows ran on after the INT8 stage beside them had ended, summed, in ms:
    /// the most the shadow can have delayed its merges.
    pub exposed_ms: f64,
    /// Float weight rows kept resident (the hot channels of the kept sites), bytes.
    pub resident_weight_bytes: u64,
    /// A full float copy of every INT8 linear, bytes (shadowing without hot channels).
    pub full_copy_bytes: u64,
}

impl ShadowRun {
    /// The shadow of a finished run, or `None` when the plan has none.
    pub fn of(run: &RunOutcome) -> Option<ShadowRun> {
        let plan = &run.plan;
        let config = plan.model.shadow.as_ref()?;
        let spans = instance_spans(run);
        let (mut subgraphs, mut busy, mut concurrent, mut exposed) = (0usize, 0u64, 0u64, 0u64);
        for s in &run.timeline.slices {
            let key = plan.key(s.id as usize);
            if !plan.stages[key.stage as usize].is_shadow() {
                continue;
            }
            subgraphs += 1;
            busy += s.duration_ns();
            let partner = InstanceKey {
                chunk: key.chunk,
                stage: key.stage - 1,
            };
            if let Some((start, end)) = spans[plan.id(partner)] {
                concurrent += s.end_ns.min(end).saturating_sub(s.start_ns.max(start));
                exposed += s.end_ns.saturating_sub(end.max(s.start_ns));
            }
        }
        let (resident, full) = config.weight_bytes(&plan.model);
        Some(ShadowRun {
            kept_sites: config.kept_sites(plan.model.layers).len(),
            sites: 4 * plan.model.layers as usize,
            subgraphs,
            busy_ms: ms(busy),
            share_of_makespan: round6(busy as f64 / run.makespan_ns.max(1) as f64),
            hidden_share: round6(1.0 - exposed as f64 / busy.max(1) as f64),
            concurrent_share: round6(concurrent as f64 / busy.max(1) as f64),
            exposed_ms: ms(exposed),
            resident_weight_bytes: resident,
            full_copy_bytes: full,
        })
    }
}

/// The report of one prefill run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunReport {
    /// Scene name.
    pub scene: String,
    /// Model name.
    pub model: String,
    /// Device name.
    pub device: String,
    /// Prompt length in tokens.
    pub prompt_len: u32,
    /// Chunk length in tokens.
    pub chunk_len: u32,
    /// Number of chunks.
    pub chunks: u32,
    /// Policy name.
    pub policy: String,
    /// Prefill latency (last completion), in ms.
    pub makespan_ms: f64,
    /// Prompt tokens per second of prefill.
    pub prefill_tokens_per_s: f64,
    /// max(load bound, critical path), in ms. Simulated runs: at modeled costs. Real runs
    /// ([`RunReport::measured`]): from the run's own measured durations, so the makespan
    /// is never below it; the model's bound is then `model_lower_bound`.
    pub lower_bound_ms: f64,
    /// The load bound, in ms: the busiest processor's work under fixed placement; under
    /// flexible placement the best fractional spread of the work over the eligible
    /// processors (`systems/src/bound.rs`). The field keeps its first name.
    pub busiest_processor_ms: f64,
    /// Critical path, in ms.
    pub critical_path_ms: f64,
    /// makespan / lower bound.
    pub ratio_to_lower_bound: f64,
    /// Per processor.
    pub processors: Vec<ProcessorReport>,
    /// Idle share of the NPU between its first start and last end (null without an NPU).
    pub npu_bubble_rate: Option<f64>,
    /// Subgraph instances run.
    pub subgraphs: usize,
    /// Subgraphs per chunk (decoder layers; the model head is counted apart).
    pub subgraphs_per_chunk: usize,
    /// Static subgraphs per chunk, shared across chunks.
    pub shared_subgraphs_per_chunk: usize,
    /// Subgraphs that run for the last chunk only (final norm + LM head).
    pub head_subgraphs: usize,
    /// Scheduler ticks.
    pub ticks: u64,
    /// Median wall time of one tick, in microseconds (a measurement: varies run to run).
    pub scheduler_us_per_tick: f64,
    /// Total tick wall time / makespan (a measurement: varies run to run).
    pub scheduler_overhead_ratio: f64,
    /// Per memory region: the offset plan of the tensors of the schedule that ran
    /// (`peak_bytes`) against the most bytes live at once (`lower_bound_bytes`).
    pub memory: Vec<RegionMemory>,
    /// Dispatch decisions where a ready job waited for memory.
    pub held_for_memory: u64,
    /// Graph memory of per-chunk graphs against chunk-sharing graphs.
    pub chunk_sharing: ChunkSharing,
    /// The outlier shadow's subgraphs and weights (null when the model has none).
    pub shadow: Option<ShadowRun>,
    /// Real runs only: the cost model's bound of the same plan (the `lower_bound_ms` above
    /// is then the measured one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_lower_bound: Option<ModelBound>,
}

/// When each instance ran, `(start, end)` in ns by dense id (`None`: not run).
fn instance_spans(run: &RunOutcome) -> Vec<Option<(u64, u64)>> {
    let mut spans = vec![None; run.plan.id_space()];
    for s in &run.timeline.slices {
        spans[s.id as usize] = Some((s.start_ns, s.end_ns));
    }
    spans
}

/// Threads the memory planner spreads a run's regions over: each thread on a region's
/// strategy holds an index of its own, and a few suffice (the work is a handful of
/// strategies per region).
fn planner_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Each region's planned memory for a finished run.
pub fn region_memory(run: &RunOutcome) -> Vec<RegionMemory> {
    plan_schedule(&run.plan, &instance_spans(run), planner_threads())
        .expect("the plan's alignment was validated and its sizes fit its budgets")
        .into_iter()
        .map(|(summary, _, _)| summary)
        .collect()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl RunReport {
    /// Builds the report of a finished run, its lower bound priced by the plan's cost
    /// model: right for a simulation. For a run on real queues use
    /// [`RunReport::measured`], whose bound comes from the run's own measured durations
    /// (a phone's model priced against a desktop's wall clock gives meaningless ratios).
    pub fn new(scene: &str, run: &RunOutcome) -> RunReport {
        let plan = &run.plan;
        let lanes = plan.device.processors.len();
        let busy = run.timeline.busy_ns_by_lane(lanes);
        let mut count = vec![0usize; lanes];
        let mut span = vec![(u64::MAX, 0u64); lanes];
        for s in &run.timeline.slices {
            count[s.processor] += 1;
            span[s.processor].0 = span[s.processor].0.min(s.start_ns);
            span[s.processor].1 = span[s.processor].1.max(s.end_ns);
        }
        let makespan = run.makespan_ns.max(1);
        let processors = plan
            .device
            .processors
            .iter()
            .enumerate()
            .map(|(i, p)| ProcessorReport {
                name: p.name.clone(),
                kind: p.kind.as_str(),
                busy_ms: ms(busy[i]),
                utilization: round6(busy[i] as f64 / makespan as f64),
                subgraphs: count[i],
                queue_wait_ms: None,
            })
            .collect();
        let npu_bubble_rate = plan.device.first_of(ProcessorKind::Npu).map(|npu| {
            let (first, last) = span[npu];
            if count[npu] == 0 || last <= first {
                0.0
            } else {
                round6(1.0 - busy[npu] as f64 / (last - first) as f64)
            }
        });
        let bound = plan.lower_bound();
        RunReport {
            scene: scene.to_string(),
            model: plan.model.name.clone(),
            device: plan.device.name.clone(),
            prompt_len: plan.workload.prompt_len,
            chunk_len: plan.workload.chunk_len,
            chunks: plan.chunks,
            policy: run.policy.clone(),
            makespan_ms: ms(run.makespan_ns),
            prefill_tokens_per_s: round6(
                f64::from(plan.workload.prompt_len) / (makespan as f64 / 1e9),
            ),
            lower_bound_ms: 0.0,
            busiest_processor_ms: 0.0,
            critical_path_ms: 0.0,
            ratio_to_lower_bound: 0.0,
            processors,
            npu_bubble_rate,
            subgraphs: run.timeline.slices.len(),
            subgraphs_per_chunk: plan.stages_per_chunk(),
            shared_subgraphs_per_chunk: plan.shared_stages_per_chunk(),
            head_subgraphs: plan.stages.len() - plan.stages_per_chunk(),
            ticks: run.stats.ticks,
            scheduler_us_per_tick: median_ns(&run.tick_wall_ns) / 1e3,
            scheduler_overhead_ratio: run.tick_wall_ns.iter().sum::<u64>() as f64 / makespan as f64,
            memory: region_memory(run),
            held_for_memory: run.stats.held_for_memory,
            chunk_sharing: chunk_sharing(plan),
            shadow: ShadowRun::of(run),
            model_lower_bound: None,
        }
        .with_bound(bound, run.makespan_ns)
    }

    /// The report of a real run: its lower bound from its own measured durations
    /// ([`measured_lower_bound`]), the model's beside it, and each lane's queue wait
    /// (`lane_wait_ns`, by lane; empty when not recorded).
    pub fn measured(scene: &str, run: &RunOutcome, lane_wait_ns: &[u64]) -> RunReport {
        let mut report = RunReport::new(scene, run);
        report.model_lower_bound = Some(ModelBound {
            lower_bound_ms: report.lower_bound_ms,
            busiest_processor_ms: report.busiest_processor_ms,
            critical_path_ms: report.critical_path_ms,
        });
        for (p, wait) in report.processors.iter_mut().zip(lane_wait_ns) {
            p.queue_wait_ms = Some(ms(*wait));
        }
        let bound = measured_lower_bound(&run.plan, &run.timeline.slices);
        report.with_bound(bound, run.makespan_ns)
    }

    fn with_bound(mut self, bound: LowerBound, makespan_ns: u64) -> RunReport {
        self.lower_bound_ms = ms(bound.ns());
        self.busiest_processor_ms = ms(bound.busiest_processor_ns);
        self.critical_path_ms = ms(bound.critical_path_ns);
        self.ratio_to_lower_bound = round6(makespan_ns as f64 / bound.ns().max(1) as f64);
        self
    }

    /// A short readable summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        self.write_workload(&mut s);
        for p in &self.processors {
            let _ = write!(
                s,
                "  {:<10} {:<4} busy {:>10.2} ms  utilization {:>5.1}%  {} subgraphs",
                p.name,
                p.kind,
                p.busy_ms,
                100.0 * p.utilization,
                p.subgraphs
            );
            if let Some(wait) = p.queue_wait_ms {
                let _ = write!(s, "  queue wait {wait:.2} ms");
            }
            s.push('\n');
        }
        let _ = writeln!(
            s,
            "scheduler  {} ticks, median {:.2} us per tick, {:.4}% of the simulated makespan",
            self.ticks,
            self.scheduler_us_per_tick,
            100.0 * self.scheduler_overhead_ratio
        );
        self.write_memory(&mut s);
        self.write_shadow(&mut s);
        s
    }

    /// The summary's head: what ran, how long it took and how close that is to the bound.
    fn write_workload(&self, s: &mut String) {
        let _ = writeln!(s, "scene      {}", self.scene);
        let _ = writeln!(s, "model      {} on {}", self.model, self.device);
        let _ = writeln!(
            s,
            "workload   {} tokens in {} chunks of {}, policy {}",
            self.prompt_len, self.chunks, self.chunk_len, self.policy
        );
        let _ = writeln!(
            s,
            "graph      {} subgraphs per chunk ({} shared, {} per chunk), +{} head; {} instances run",
            self.subgraphs_per_chunk,
            self.shared_subgraphs_per_chunk,
            self.subgraphs_per_chunk - self.shared_subgraphs_per_chunk,
            self.head_subgraphs,
            self.subgraphs
        );
        let _ = writeln!(
            s,
            "prefill    {:.2} ms, {:.1} tok/s",
            self.makespan_ms, self.prefill_tokens_per_s
        );
        let _ = writeln!(
            s,
            "bound      {:.2} ms (load {:.2}, critical path {:.2}); makespan is {:.3}x the bound",
            self.lower_bound_ms,
            self.busiest_processor_ms,
            self.critical_path_ms,
            self.ratio_to_lower_bound
        );
    }

    /// One line per memory region, then what chunk-sharing saved over per-chunk graphs.
    fn write_memory(&self, s: &mut String) {
        for m in &self.memory {
            let _ = writeln!(
                s,
                "memory     {:<10} planned {:>9.1} MiB, lower bound {:>9.1} MiB ({:.3}x), KV cache {:.1} MiB, shadow weights {:.1} MiB, budget {:.1} MiB",
                m.region,
                mib(m.peak_bytes),
                mib(m.lower_bound_bytes),
                m.peak_bytes as f64 / m.lower_bound_bytes.max(1) as f64,
                mib(m.kv_cache_bytes),
                mib(m.shadow_weight_bytes),
                mib(m.budget_bytes)
            );
        }
        let c = &self.chunk_sharing;
        let _ = writeln!(
            s,
            "graphs     per-chunk {:.2} GB, chunk-sharing {:.2} GB: {:.1}% ({:.2} GB) less",
            c.per_chunk_graphs_bytes as f64 / 1e9,
            c.chunk_sharing_bytes as f64 / 1e9,
            100.0 * c.saving,
            c.saved_bytes as f64 / 1e9
        );
    }

    /// The outlier-shadow and NPU-bubble lines, each only where the run has it.
    fn write_shadow(&self, s: &mut String) {
        if let Some(sh) = &self.shadow {
            let _ = writeln!(
                s,
                "shadow     {}/{} sites kept, {} subgraphs, {:.2} ms ({:.1}% of the makespan), \
                 {:.1}% hidden (done before the INT8 stage beside it; {:.1}% while it ran; \
                 {:.2} ms exposed); weight rows \
                 {:.1} MiB resident of a {:.1} MiB full copy",
                sh.kept_sites,
                sh.sites,
                sh.subgraphs,
                sh.busy_ms,
                100.0 * sh.share_of_makespan,
                100.0 * sh.hidden_share,
                100.0 * sh.concurrent_share,
                sh.exposed_ms,
                mib(sh.resident_weight_bytes),
                mib(sh.full_copy_bytes)
            );
        }
        if let Some(rate) = self.npu_bubble_rate {
            let _ = writeln!(
                s,
                "NPU bubble rate {:.1}% (idle share between its first start and last end)",
                100.0 * rate
            );
        }
    }
}

fn median_ns(samples: &[u64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).map_or(0.0, |&v| v as f64)
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}
