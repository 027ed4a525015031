//! Small plans for tests, doc examples and benches.

use crate::cost::{CostModel, PeakRates};
use crate::device::{DeviceProfile, ProcessorKind, ProcessorSpec};
use crate::model::{ModelConfig, Precision};
use crate::plan::{PrefillPlan, Workload};
use crate::resources::SliceRecord;

/// A small llama-shaped model with `layers` layers.
pub fn tiny_model(layers: u32) -> ModelConfig {
    ModelConfig {
        name: "tiny".into(),
        layers,
        hidden: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: None,
        ffn: 512,
        vocab: 1000,
        context: 1 << 16,
        weight_precision: Precision::Int8,
        activation_precision: Precision::Int8,
        float_precision: Precision::Fp32,
        layer_ops: None,
        shadow: None,
        block: None,
    }
}

/// A processor with FP16 = FP32 rate, 10 GB/s, 1 us per operator and 4 GiB: the knobs
/// tests vary are the INT8 and FP32 rates and the launch overhead.
pub fn processor(
    name: &str,
    kind: ProcessorKind,
    int8: f64,
    fp32: f64,
    launch_us: f64,
) -> ProcessorSpec {
    ProcessorSpec {
        name: name.into(),
        kind,
        memory_gib: 4.0,
        cost: CostModel {
            peak_gops: PeakRates {
                int8,
                fp16: fp32,
                fp32,
            },
            bandwidth_gbps: 10.0,
            launch_us,
            op_overhead_us: 1.0,
            measured: Vec::new(),
            stages: Vec::new(),
        },
        decode_bandwidth_gbps: None,
    }
}

/// A phone-like device: a CPU and an NPU four times faster at INT8.
pub fn tiny_device() -> DeviceProfile {
    DeviceProfile {
        measured: None,
        name: "tiny phone".into(),
        processors: vec![
            processor("cpu", ProcessorKind::Cpu, 50.0, 20.0, 5.0),
            processor("npu", ProcessorKind::Npu, 200.0, 0.5, 5.0),
        ],
    }
}

/// A tiny plan: `layers` layers, a prompt of `prompt_len` tokens in chunks of `chunk_len`.
pub fn tiny_plan(layers: u32, prompt_len: u32, chunk_len: u32) -> PrefillPlan {
    let workload = Workload {
        prompt_len,
        chunk_len,
        float_processor: None,
    };
    PrefillPlan::new(tiny_model(layers), tiny_device(), workload).expect("the tiny plan is valid")
}

/// Whether slice durations must equal the modeled costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// A simulated run: every job takes exactly its modeled time, and the makespan can
    /// not beat the lower bound.
    Modeled,
    /// Real queues: durations are measured.
    Measured,
}

/// Checks the scheduler invariants on the slices of a finished run: every instance ran
/// exactly once, on a processor it may run on (its home only when `home_only`: for a
/// policy that keeps fixed placement), after all its predecessors ended; a lane never ran
/// two jobs at once; with [`Timing::Modeled`], durations equal their costs and the
/// makespan is at least the lower bound. Returns the first violation.
pub fn check_schedule(
    plan: &PrefillPlan,
    slices: &[SliceRecord],
    timing: Timing,
    home_only: bool,
) -> Result<(), String> {
    let mut slice_of = vec![None; plan.id_space()];
    for s in slices {
        let id = plan.id(s.key);
        if slice_of[id].replace(s).is_some() {
            return Err(format!("{:?} ran twice", s.key));
        }
        let eligible = plan.eligible(s.key);
        let allowed = if home_only { &eligible[..1] } else { eligible };
        if !allowed.contains(&s.processor) {
            return Err(format!(
                "{:?} ran on lane {}, not one of its lanes {allowed:?}",
                s.key, s.processor
            ));
        }
        let modeled = plan.cost_on(s.key, s.processor).unwrap_or(0);
        if timing == Timing::Modeled && s.end_ns - s.start_ns != modeled {
            return Err(format!(
                "{:?} took {} ns on lane {}, modeled {modeled}",
                s.key,
                s.end_ns - s.start_ns,
                s.processor
            ));
        }
    }
    for key in plan.instances() {
        let Some(s) = slice_of[plan.id(key)] else {
            return Err(format!("{key:?} never ran"));
        };
        for p in plan.predecessors(key) {
            let before = slice_of[plan.id(p)].ok_or(format!("{p:?} never ran"))?;
            if before.end_ns > s.start_ns {
                return Err(format!(
                    "{key:?} started at {} before {p:?} ended at {}",
                    s.start_ns, before.end_ns
                ));
            }
        }
    }
    if slices.len() != plan.instance_count() {
        return Err(format!(
            "{} slices for {} instances",
            slices.len(),
            plan.instance_count()
        ));
    }
    for lane in 0..plan.device.processors.len() {
        let mut spans: Vec<(u64, u64)> = slices
            .iter()
            .filter(|s| s.processor == lane)
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(format!(
                "lane {lane} ran two jobs at once: {:?} and {:?}",
                w[0], w[1]
            ));
        }
    }
    let makespan = slices.iter().map(|s| s.end_ns).max().unwrap_or(0);
    if timing == Timing::Modeled && makespan < plan.lower_bound().ns() {
        return Err(format!(
            "makespan {} below the lower bound {}",
            makespan,
            plan.lower_bound().ns()
        ));
    }
    Ok(())
}

/// A measured profile's origin with nothing recorded but the model's name and the thread
/// count (tests that need a profile to count as measured).
pub fn bare_profile_origin(model: &str, threads: usize) -> crate::ProfileOrigin {
    crate::ProfileOrigin {
        model: model.to_string(),
        model_shape: String::new(),
        precisions: Vec::new(),
        cpu: String::new(),
        cpu_features: Vec::new(),
        threads,
        backends: String::new(),
        samples: String::new(),
        job_gap_us: 0.0,
        job_gaps: Vec::new(),
        two_job_rate: 0.0,
        one_thread: Vec::new(),
        adapted: Vec::new(),
        cache_bytes: 0,
        warm_weights: Vec::new(),
    }
}

/// A slice of request 0's first instance on `processor` from `start_ns` to `end_ns`, for
/// tests of what is summed over a timeline.
pub fn slice_on(processor: usize, start_ns: u64, end_ns: u64) -> SliceRecord {
    SliceRecord {
        id: 0,
        request: crate::RequestId(0),
        key: crate::InstanceKey { chunk: 0, stage: 0 },
        processor,
        start_ns,
        end_ns,
        estimated_ns: 0,
    }
}
