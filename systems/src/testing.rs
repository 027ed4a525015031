//! Small plans for tests, doc examples and benches.

use crate::cost::{CostModel, PeakRates};
use crate::device::{DeviceProfile, ProcessorKind, ProcessorSpec};
use crate::model::{ModelConfig, Precision};
use crate::plan::{PrefillPlan, Workload};
use crate::policy::Policy;

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
        },
    }
}

/// A phone-like device: a CPU and an NPU four times faster at INT8.
pub fn tiny_device() -> DeviceProfile {
    DeviceProfile {
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
        policy: Policy::Stall,
        float_processor: None,
    };
    PrefillPlan::new(tiny_model(layers), tiny_device(), workload).expect("the tiny plan is valid")
}
