//! Measured profiles through any queue: what `hetsched profile` does, as a library, so
//! that a runtime embedding the scheduler on a phone can profile *its own* processors
//! through *its own* [`Backend`] and carry the profile to a desktop that simulates it
//! (docs/calibration.md, "The phone workflow"; `examples/phone_workflow.rs`).
//!
//! The three steps:
//! 1. [`measure`]: run a plan on the device's backend; [`records_of`](crate::history::records_of) turns each
//!    instance's measured duration into a [`HistoryRecord`] (the same records `run
//!    --history` appends);
//! 2. [`fit_profile`]: fit one [`StageCost`] per (processor, precision, stage kind) and
//!    put them into the device profile, which [`crate::scene::toml_text`] writes as a
//!    device TOML that `simulate` loads;
//! 3. [`predict`]: on the desktop, simulate a plan under that profile the way real
//!    queues sharing one worker pool run it ([`WorkerPoolBackend`] when the profile has
//!    one-thread costs, each job with its own parallel fraction; [`SharedPoolBackend`]'s
//!    symmetric rate otherwise).
//!
//! ```
//! use std::sync::Arc;
//! use hetsched_runtime::backends::sim::SimBackend;
//! use hetsched_runtime::history::records_of;
//! use hetsched_runtime::profiling::{fit_profile, measure, predict};
//! use hetsched_systems::testing::tiny_plan;
//!
//! // The "device": here a simulated queue; on a phone, the runtime's own `Backend`.
//! let plan = Arc::new(tiny_plan(2, 512, 128));
//! let measured = measure(plan.clone(), "balance", &mut SimBackend::default())?;
//! let mut device = plan.device.clone();
//! let fits = fit_profile(&mut device, &records_of(&measured));
//! assert!(!fits.is_empty());
//! // The "desktop": the measured profile priced into a plan, simulated.
//! let measured = hetsched_systems::PrefillPlan::new(
//!     plan.model.clone(),
//!     device,
//!     plan.workload.clone(),
//! )?;
//! let predicted = predict(Arc::new(measured), "balance")?;
//! assert!(predicted.makespan_ns > 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use hetsched_systems::model::{ChunkShape, OpDecl};
use hetsched_systems::policy::{CostsMismatch, Policy, UnknownPolicy};
use hetsched_systems::{
    DeviceProfile, OneThreadCost, PlanError, PolicyRegistry, PrefillPlan, StageCost, StageSample,
    Workload, fit_stage_cost, precision_label, stage_kind,
};
use serde::Serialize;
use thiserror::Error;

use crate::backends::Backend;
use crate::backends::shared_pool::{PoolSharing, SharedPoolBackend, amdahl_rate};
use crate::backends::worker_pool::{ParallelFractions, WorkerPoolBackend};
use crate::engine::{self, EngineError, EngineOptions, RunOutcome};
use crate::history::HistoryRecord;
use crate::overlap::overlaps;
use crate::weight_reuse::{WarmWeights, stage_weight_bytes};

/// Why a profiling step failed.
#[derive(Debug, Error)]
pub enum ProfilingError {
    /// The policy name is not registered.
    #[error(transparent)]
    Policy(#[from] UnknownPolicy),
    /// The plan to simulate could not be built.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The run failed (the backend, or the engine's checks of it).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A plan cannot decide for another (other instances or placement).
    #[error(transparent)]
    Costs(#[from] CostsMismatch),
}

/// One fitted stage cost and the processor it belongs to (`profile --json` lists them).
#[derive(Clone, Debug, Serialize)]
pub struct StageFit {
    /// Processor name.
    pub processor: String,
    /// The fitted cost (coefficients, samples, relative RMS error, noise).
    #[serde(flatten)]
    pub cost: StageCost,
}

/// Runs `plan` under `policy` on `backend` (the device's own queue): the run's timeline
/// holds every instance's measured duration ([`records_of`](crate::history::records_of) turns it into samples,
/// [`job_gap_ns`] gives its hand-off gap). The engine checks the backend as for any run
/// ([`EngineOptions::real_queues`]: waits are bounded, completions validated).
pub fn measure(
    plan: Arc<PrefillPlan>,
    policy: &str,
    backend: &mut dyn Backend,
) -> Result<RunOutcome, ProfilingError> {
    let policy = PolicyRegistry::builtin().create(policy)?;
    Ok(engine::run_with(
        plan,
        policy,
        backend,
        &EngineOptions::real_queues(),
    )?)
}

/// A run's time with no job running, per hand-off, ns: the gap from one job's end to the
/// next one's start (completion, the engine's tick, dispatch, the queue thread) where
/// nothing else covers it. [`predict`] adds the profile's median of it (`[measured]
/// job_gap_us`) before each simulated job. Measure it on a run whose jobs do not overlap
/// (`inorder` on the host's queues) for the per-job latency itself.
pub fn job_gap_ns(run: &RunOutcome) -> f64 {
    let spans = run.timeline.slices.iter().map(|s| (s.start_ns, s.end_ns));
    idle_per_handoff(spans.collect(), run.makespan_ns)
}

/// `makespan` less the time some span covers, over the spans that start with nothing
/// running. Why not per span: a job that starts beside a running one (a w8a8-shadow
/// stage beside its INT8 stage, even under `inorder`) adds no hand-off of its own, and
/// in the simulation its gap runs beside the other's too; dividing by every span priced
/// w8a8-shadow's gap a third low (1441 jobs, 1044 hand-offs in a 512/128 run).
fn idle_per_handoff(mut spans: Vec<(u64, u64)>, makespan: u64) -> f64 {
    spans.sort_unstable();
    let (mut covered, mut reach, mut handoffs) = (0u64, 0u64, 0usize);
    for (start, end) in spans {
        if start >= reach {
            handoffs += 1;
        }
        let from = start.max(reach);
        covered += end.saturating_sub(from);
        reach = reach.max(end);
    }
    makespan.saturating_sub(covered) as f64 / handoffs.max(1) as f64
}

/// The rate at which each of two jobs runs when they share the pool, relative to one
/// alone ([`PoolSharing::two_job_rate`]), from two runs of the same plan: `alone`, whose
/// jobs never overlap (`inorder` on the host's queues), gives each instance's alone
/// duration `w`; in `shared` (a policy that overlaps jobs) an instance's span splits into
/// `a` (running alone) and `c` (overlapped), and `w = a + rate * c`. Least squares over
/// every instance; `None` when nothing overlapped or the runs are of different plans.
pub fn two_job_rate(alone: &RunOutcome, shared: &RunOutcome) -> Option<f64> {
    let n = alone.plan.id_space();
    if shared.plan.id_space() != n {
        return None;
    }
    let mut work = vec![None; n];
    for s in &alone.timeline.slices {
        work[s.id as usize] = Some((s.end_ns - s.start_ns) as f64);
    }
    let overlapped = overlaps(&shared.timeline.slices);
    let (mut num, mut den) = (0.0, 0.0);
    for (s, c) in shared.timeline.slices.iter().zip(overlapped) {
        let w = work.get(s.id as usize).copied().flatten()?;
        let c = c as f64;
        let a = (s.end_ns - s.start_ns) as f64 - c;
        num += c * (w - a);
        den += c * c;
    }
    (den > 0.0).then(|| (num / den).clamp(0.5, 1.0))
}

/// Fits every (processor, precision, stage kind) of `samples` and puts the costs into
/// `device`'s processors, replacing the fitted costs they had. A group whose durations
/// are not all positive, or whose processor `device` does not have, is left out: those
/// stages keep the roofline model (a run's report names which model priced each stage).
pub fn fit_profile(device: &mut DeviceProfile, samples: &[HistoryRecord]) -> Vec<StageFit> {
    type Group = (bool, Option<u64>, Vec<StageSample>);
    let mut groups: BTreeMap<(String, String, String), Group> = BTreeMap::new();
    for s in samples {
        let key = (s.processor.clone(), s.precision.clone(), s.stage.clone());
        // The stage kind names its window (`stage_kind`): one window per group.
        let group = groups
            .entry(key)
            .or_insert((s.attention, s.window, Vec::new()));
        group.2.push(StageSample {
            tokens: s.tokens,
            past: s.past,
            ns: s.ns as f64,
        });
    }
    for p in &mut device.processors {
        p.cost.stages.clear();
    }
    let mut fits = Vec::new();
    for ((processor, precision, stage), (attention, window, group)) in groups {
        let Some(target) = device.processors.iter_mut().find(|p| p.name == processor) else {
            continue;
        };
        let Some(cost) = fit_stage_cost(&stage, &precision, attention, window, &group) else {
            continue;
        };
        target.cost.stages.push(cost.clone());
        fits.push(StageFit { processor, cost });
    }
    fits
}

/// Rounds of taking the sharing out of the samples and refitting in
/// [`fit_profile_alone`]: each job's parallel fraction follows the fit; the gap to where
/// they settle halves each round where every sample overlapped (the worst case), less
/// where few did.
const ALONE_ROUNDS: usize = 10;

/// [`fit_profile`] of the work each job has alone. A record that shared the pool with
/// another lane's job (`overlapped_ns`, `c` of its `ns`) counts as `w = (ns - c) + r * c`,
/// `r` the rate at which the pool model runs a job of its parallel fraction beside one
/// other ([`amdahl_rate`] on `threads`), the fraction from its kind's speed-up over its
/// `one_thread` cost ([`ParallelFractions::from_speedup`]). The pool model adds the
/// sharing back when it simulates a plan ([`predict`]), so the raw times would count it
/// twice: w8a8-shadow's INT8 and shadow stages run side by side even under `inorder`.
/// Records without `overlapped_ns` (older files), or whose kind has no one-thread cost,
/// count as measured; so does everything when no record overlapped (`inorder` of a chain
/// of stages). Records of one thread ([`HistoryRecord::threads`]) belong to the
/// one-thread table: fit them with `threads` 1 (two jobs on one worker run at half rate).
/// Records of jobs whose weights were still cached ([`HistoryRecord::warm`]) are left
/// out: the costs are cold ones, from which the pool model takes the cache's saving.
pub fn fit_profile_alone(
    device: &mut DeviceProfile,
    samples: &[HistoryRecord],
    one_thread: &[OneThreadCost],
    threads: usize,
) -> Vec<StageFit> {
    // Copied only where some record is warm (a profile's `inorder` samples never are).
    let samples: Cow<[HistoryRecord]> = match samples.iter().any(|r| r.warm == Some(true)) {
        true => samples
            .iter()
            .filter(|r| r.warm != Some(true))
            .cloned()
            .collect(),
        false => Cow::Borrowed(samples),
    };
    let samples = &samples[..];
    let mut fits = fit_profile(device, samples);
    if samples.iter().all(|r| r.overlapped_ns.unwrap_or(0) == 0) {
        return fits;
    }
    for _ in 0..ALONE_ROUNDS {
        let alone: Vec<HistoryRecord> = samples
            .iter()
            .map(|r| HistoryRecord {
                ns: alone_ns(r, &fits, one_thread, threads),
                ..r.clone()
            })
            .collect();
        fits = fit_profile(device, &alone);
    }
    fits
}

/// `record`'s work alone ([`fit_profile_alone`]) under the costs `fits` (on `threads`) and
/// `one_thread`.
fn alone_ns(
    record: &HistoryRecord,
    fits: &[StageFit],
    one_thread: &[OneThreadCost],
    threads: usize,
) -> u64 {
    let overlapped = record.overlapped_ns.unwrap_or(0).min(record.ns);
    if overlapped == 0 {
        return record.ns;
    }
    let fraction = if threads <= 1 {
        // One worker: two jobs take turns whatever their fractions.
        0.0
    } else {
        let of = |processor: &str, cost: &StageCost| {
            processor == record.processor
                && cost.precision == record.precision
                && cost.stage == record.stage
        };
        let all = fits.iter().find(|f| of(&f.processor, &f.cost));
        let one = one_thread.iter().find(|o| of(&o.processor, &o.cost));
        let (Some(all), Some(one)) = (all, one) else {
            return record.ns;
        };
        let shape = ChunkShape {
            tokens: record.tokens,
            past: record.past,
        };
        ParallelFractions::from_costs(&one.cost, &all.cost, shape, threads)
    };
    let rate = amdahl_rate(fraction, threads, 2);
    let alone = (record.ns - overlapped) as f64 + rate * overlapped as f64;
    (alone.round() as u64).max(1)
}

/// Simulates `plan` the way real queues sharing one worker pool run it: with the
/// profile's one-thread costs, each job holds a worker at its own parallel fraction
/// ([`WorkerPoolBackend`], [`parallel_fractions`]); without them, jobs running at once
/// share the pool's threads at the profile's measured `two_job_rate` (jobs one at a time
/// without one). Each job starts after the profile's measured hand-off gap for the plan's
/// precision (`[measured] job_gaps`, else `job_gap_us`, 0 without one). A prompt shorter than a chunk is simulated as one chunk of the prompt's
/// length, as the executors run it.
pub fn predict(plan: Arc<PrefillPlan>, policy: &str) -> Result<RunOutcome, ProfilingError> {
    predict_with(plan, PolicyRegistry::builtin().create(policy)?)
}

/// [`predict`] with a policy object of one's own (e.g. a [`CostsFrom`] deciding with
/// another plan's costs).
///
/// [`CostsFrom`]: hetsched_systems::policy::CostsFrom
pub fn predict_with(
    plan: Arc<PrefillPlan>,
    policy: Box<dyn Policy>,
) -> Result<RunOutcome, ProfilingError> {
    let measured = plan.device.measured.as_ref();
    let precision = precision_label(&plan.model);
    let gap_us = measured.map_or(0.0, |m| m.job_gap_us_of(&precision));
    let sharing = match measured {
        Some(m) if m.two_job_rate > 0.0 => PoolSharing {
            threads: m.threads.max(1),
            two_job_rate: m.two_job_rate,
        },
        _ => PoolSharing::default(),
    };
    let gap_ns = (gap_us.max(0.0) * 1e3) as u64;
    let plan = as_executed(&plan)?;
    if let Some(fractions) = parallel_fractions(&plan, &sharing) {
        let mut pool = WorkerPoolBackend::new(sharing.threads, gap_ns, fractions);
        return Ok(engine::run(plan, policy, &mut pool)?);
    }
    let mut pool = SharedPoolBackend::new(gap_ns, sharing);
    Ok(engine::run(plan, policy, &mut pool)?)
}

/// Each instance's parallel fraction on each lane, from its measured speed-up on the
/// profile's threads over one thread ([`ProfileOrigin::one_thread`]); a stage without a
/// one-thread cost takes the fraction that gives `sharing`'s two-job rate. `None` for a
/// profile without a one-thread pass (older files), which keeps the symmetric sharing of
/// [`SharedPoolBackend`].
///
/// [`ProfileOrigin::one_thread`]: hetsched_systems::ProfileOrigin::one_thread
pub fn parallel_fractions(plan: &PrefillPlan, sharing: &PoolSharing) -> Option<ParallelFractions> {
    let measured = plan.device.measured.as_ref()?;
    if measured.one_thread.is_empty() {
        return None;
    }
    let threads = sharing.threads.max(1);
    let lanes = plan.lanes();
    let default = sharing.parallel_fraction();
    let mut fraction = vec![default; plan.id_space() * lanes];
    let mut loops = vec![Box::default(); plan.id_space()];
    let precision = precision_label(&plan.model);
    for key in plan.instances() {
        let ops = &plan.stages[key.stage as usize].ops;
        let kind = stage_kind(ops);
        let shape = plan.executed_shape(key);
        loops[plan.id(key)] = loop_shares(plan, ops, shape, plan.eligible(key));
        for &lane in plan.eligible(key) {
            let processor = &plan.device.processors[lane];
            let on_threads = processor.cost.stage_cost(&plan.model, ops);
            let on_one = measured.one_thread_cost(&processor.name, &precision, &kind);
            if let (Some(all), Some(one)) = (on_threads, on_one) {
                fraction[plan.id(key) * lanes + lane] =
                    ParallelFractions::from_costs(one, all, shape, threads);
            }
        }
    }
    let warm = (measured.cache_bytes > 0)
        .then(|| measured.warm_ns_per_byte_of(&precision))
        .flatten()
        .map(|ns_per_byte| WarmWeights {
            cache_bytes: measured.cache_bytes,
            ns_per_byte,
        });
    Some(ParallelFractions {
        lanes,
        fraction,
        default,
        loops,
        stage_weight_bytes: stage_weight_bytes(plan),
        warm,
    })
}

/// A stage's operators' shares of its time (each one parallel loop), from the roofline
/// of the first of `lanes` that prices them all: the stage's measured cost is one
/// number, but where its loops end decides when a job arriving from another lane gets a
/// worker (an attention stage at a long context is mostly its attention loop; re-predicting
/// a quiet grid, lane busy times within 15% went from 80 to 88 of 108 against
/// equal shares, docs/calibration.md).
fn loop_shares(
    plan: &PrefillPlan,
    ops: &[OpDecl],
    shape: ChunkShape,
    lanes: &[usize],
) -> Box<[f32]> {
    let equal = || vec![1.0 / ops.len().max(1) as f32; ops.len()].into_boxed_slice();
    for &lane in lanes {
        let cost = &plan.device.processors[lane].cost;
        let times: Option<Vec<f64>> = ops
            .iter()
            .map(|op| cost.op_ns(&plan.model, op, shape))
            .collect();
        let Some(times) = times else { continue };
        let total: f64 = times.iter().sum();
        if total > 0.0 {
            return times.iter().map(|t| (t / total) as f32).collect();
        }
    }
    equal()
}

/// `plan`, except that a prompt shorter than a chunk is one chunk of the prompt's length
/// (an NPU priced by the roofline pays the full chunk length otherwise, as pre-built
/// graphs would run; the executors run the prompt's tokens).
pub(crate) fn as_executed(plan: &Arc<PrefillPlan>) -> Result<Arc<PrefillPlan>, PlanError> {
    let w = &plan.workload;
    if w.prompt_len >= w.chunk_len {
        return Ok(plan.clone());
    }
    let workload = Workload {
        chunk_len: w.prompt_len,
        ..w.clone()
    };
    let shorter = PrefillPlan::placed(
        plan.model.clone(),
        plan.device.clone(),
        workload,
        plan.placement.clone(),
    )?;
    Ok(Arc::new(shorter))
}

#[cfg(test)]
mod tests {
    use hetsched_systems::testing::{bare_profile_origin, tiny_plan};

    use super::*;
    use crate::backends::sim::SimBackend;
    use crate::history::records_of;

    /// A profile measured on simulated queues predicts those queues: the fitted costs
    /// reproduce the modeled ones, so the prediction of a held-out workload (another
    /// prompt length) matches a measurement of it.
    #[test]
    fn one_thread_costs_set_each_jobs_parallel_fraction() {
        let plan = tiny_plan(2, 512, 128);
        let measured = measure(
            Arc::new(plan.clone()),
            "inorder",
            &mut SimBackend::default(),
        );
        let mut device = plan.device.clone();
        let fits = fit_profile(&mut device, &records_of(&measured.unwrap()));
        // One thread `speedup` times slower than the profile's two on every stage.
        let with_speedup = |speedup: f64| {
            let mut device = device.clone();
            device.measured = Some(hetsched_systems::ProfileOrigin {
                two_job_rate: 0.6,
                one_thread: fits
                    .iter()
                    .map(|f| hetsched_systems::OneThreadCost {
                        processor: f.processor.clone(),
                        cost: f.cost.scaled(speedup),
                    })
                    .collect(),
                ..bare_profile_origin(&plan.model.name, 2)
            });
            PrefillPlan::new(plan.model.clone(), device, plan.workload.clone()).unwrap()
        };
        let sharing = PoolSharing {
            threads: 2,
            two_job_rate: 0.6,
        };
        for (speedup, fraction) in [(2.0, 1.0), (1.0, 0.0), (1.5, 2.0 / 3.0)] {
            let plan = with_speedup(speedup);
            let fractions = parallel_fractions(&plan, &sharing).expect("a one-thread pass");
            for key in plan.instances() {
                for &lane in plan.eligible(key) {
                    let f = fractions.fraction[plan.id(key) * fractions.lanes + lane];
                    assert!((f - fraction).abs() < 1e-9, "speed-up {speedup}: {f}");
                }
            }
        }
        // Fully parallel jobs on the pool: whatever the policy overlaps (a newcomer joins
        // at the end of a running job's loop), the pool does no more than one job's work
        // at a time, so the prefill takes at least the sum of its jobs' alone times.
        let overlapped = predict(Arc::new(with_speedup(2.0)), "balance").unwrap();
        let work: u64 = overlapped
            .timeline
            .slices
            .iter()
            .map(|s| s.estimated_ns)
            .sum();
        assert!(
            overlapped.makespan_ns + 1_000 >= work,
            "{} < {work}",
            overlapped.makespan_ns
        );
        // Without a one-thread pass: the symmetric sharing of older profiles.
        let mut older = with_speedup(2.0);
        if let Some(m) = older.device.measured.as_mut() {
            m.one_thread.clear();
        }
        assert!(parallel_fractions(&older, &sharing).is_none());
    }

    #[test]
    fn a_profile_measured_on_a_queue_predicts_a_held_out_workload() {
        let mut samples = Vec::new();
        for prompt in [256, 512, 1024] {
            let plan = Arc::new(tiny_plan(2, prompt, 128));
            let measured = measure(plan, "inorder", &mut SimBackend::default()).unwrap();
            samples.extend(records_of(&measured));
        }
        let reference = tiny_plan(2, 768, 128);
        let mut device = reference.device.clone();
        let fits = fit_profile(&mut device, &samples);
        assert!(fits.iter().all(|f| f.cost.fit_error < 0.05), "{fits:?}");
        let measured = Arc::new(reference);
        let real = engine::simulate(
            measured.clone(),
            PolicyRegistry::builtin().create("inorder").unwrap(),
        )
        .unwrap();
        let profiled =
            PrefillPlan::new(measured.model.clone(), device, measured.workload.clone()).unwrap();
        let predicted = predict(Arc::new(profiled), "inorder").unwrap();
        // One at a time against independent lanes: the prediction is the serial sum.
        let busy: u64 = real
            .timeline
            .slices
            .iter()
            .map(|s| s.end_ns - s.start_ns)
            .sum();
        let error = predicted.makespan_ns.abs_diff(busy) as f64 / busy as f64;
        assert!(
            error < 0.05,
            "predicted {} vs serial work {busy}",
            predicted.makespan_ns
        );
    }

    #[test]
    fn the_gap_is_the_idle_time_per_job_that_starts_with_nothing_running() {
        // Idle 0-2 (before the first job), 10-12 and 20-25; the job at 12-15 starts
        // beside the one at 12-20 and the one at 14-18 inside it: 3 hand-offs, 9 ns idle.
        let spans = vec![(2, 10), (12, 20), (12, 15), (14, 18), (25, 30)];
        assert_eq!(super::idle_per_handoff(spans, 30), 3.0);
        // Jobs one after another: the idle time (0-1, 5-6, 9-10) per job.
        assert_eq!(super::idle_per_handoff(vec![(1, 5), (6, 9)], 10), 1.5);
        assert_eq!(super::idle_per_handoff(Vec::new(), 7), 7.0);
    }

    /// A run on a pool where two jobs each run at 0.7 of their alone rate gives that
    /// rate back against a run of the same plan whose jobs never overlap.
    #[test]
    fn the_two_job_rate_is_recovered_from_a_pair_of_runs() {
        let plan = Arc::new(tiny_plan(2, 512, 64));
        let alone = engine::simulate(
            plan.clone(),
            PolicyRegistry::builtin().create("inorder").unwrap(),
        )
        .unwrap();
        let sharing = PoolSharing {
            threads: 2,
            two_job_rate: 0.7,
        };
        let serial = PoolSharing {
            threads: 2,
            two_job_rate: 0.5,
        };
        let run_on = |sharing, policy: &str| {
            let mut pool = SharedPoolBackend::new(0, sharing);
            let policy = PolicyRegistry::builtin().create(policy).unwrap();
            engine::run(plan.clone(), policy, &mut pool).unwrap()
        };
        let shared = run_on(sharing, "balance");
        let rate = two_job_rate(&alone, &shared).expect("jobs overlapped");
        assert!((rate - 0.7).abs() < 0.01, "{rate}");
        let rate = two_job_rate(&alone, &run_on(serial, "balance")).expect("jobs overlapped");
        assert!((rate - 0.5).abs() < 0.01, "{rate}");
        // Runs of another plan are no pair.
        let other = engine::simulate(
            Arc::new(tiny_plan(2, 256, 64)),
            PolicyRegistry::builtin().create("balance").unwrap(),
        )
        .unwrap();
        assert_eq!(two_job_rate(&alone, &other), None);
        // Idle time per job: none on a pool without gaps that always has work.
        assert!(job_gap_ns(&shared) >= 0.0);
    }

    #[test]
    fn samples_of_an_unknown_processor_are_left_out() {
        let plan = Arc::new(tiny_plan(2, 256, 64));
        let mut samples =
            records_of(&measure(plan.clone(), "stall", &mut SimBackend::default()).unwrap());
        for s in &mut samples {
            s.processor = "nowhere".into();
        }
        let mut device = plan.device.clone();
        assert!(fit_profile(&mut device, &samples).is_empty());
        assert!(device.processors.iter().all(|p| p.cost.stages.is_empty()));
    }

    #[test]
    fn sharing_is_taken_out_of_jobs_that_overlapped() {
        let plan = Arc::new(tiny_plan(2, 256, 64));
        // The simulated lanes are processors of their own: their jobs count as alone here.
        let alone: Vec<HistoryRecord> =
            records_of(&measure(plan.clone(), "inorder", &mut SimBackend::default()).unwrap())
                .into_iter()
                .map(|r| HistoryRecord {
                    overlapped_ns: Some(0),
                    ..r
                })
                .collect();
        let mut device = plan.device.clone();
        let truth = fit_profile(&mut device, &alone);
        // Fully parallel jobs (one thread half as fast as two), each measured once alone
        // and once sharing the pool for its whole span at the pool model's rate, 1/2.
        let one_thread: Vec<OneThreadCost> = truth
            .iter()
            .map(|f| OneThreadCost {
                processor: f.processor.clone(),
                cost: f.cost.scaled(2.0),
            })
            .collect();
        let mut samples = alone.clone();
        samples.extend(alone.iter().map(|r| HistoryRecord {
            ns: 2 * r.ns,
            overlapped_ns: Some(2 * r.ns),
            ..r.clone()
        }));
        let shape = ChunkShape {
            tokens: 64,
            past: 64,
        };
        let raw = fit_profile(&mut device.clone(), &samples);
        let fitted = fit_profile_alone(&mut device, &samples, &one_thread, 2);
        assert_eq!(fitted.len(), truth.len());
        for ((t, f), r) in truth.iter().zip(&fitted).zip(&raw) {
            let (t, f, r) = (t.cost.ns(shape), f.cost.ns(shape), r.cost.ns(shape));
            assert!((f / t - 1.0).abs() < 0.01, "{}: {f} against {t}", t);
            assert!(r / t > 1.4, "raw, the sharing counts: {r} against {t}");
        }
        // Records of older files (no overlap recorded) count as measured.
        let older: Vec<HistoryRecord> = samples
            .iter()
            .map(|r| HistoryRecord {
                overlapped_ns: None,
                ..r.clone()
            })
            .collect();
        let as_raw = fit_profile_alone(&mut device, &older, &one_thread, 2);
        assert_eq!(as_raw[0].cost.ns(shape), raw[0].cost.ns(shape));
        // Jobs whose weights were still cached (faster) are not fitted.
        let mut with_warm = samples.clone();
        with_warm.extend(alone.iter().map(|r| HistoryRecord {
            ns: r.ns / 2,
            warm: Some(true),
            ..r.clone()
        }));
        let cold = fit_profile_alone(&mut device, &with_warm, &one_thread, 2);
        assert_eq!(cold.len(), fitted.len());
        for (c, f) in cold.iter().zip(&fitted) {
            assert_eq!(c.cost.ns(shape), f.cost.ns(shape));
        }
    }
}
