//! With the `gpu` feature: the float stages (RMSNorm, RoPE, attention) of a real prefill
//! run on a Vulkan GPU lane (lavapipe in CI) and give the CPU path's logits; and every
//! stage resident on the GPU gives them too. The model is the test model cut to its first
//! blocks (`gpu_common::shallow_model`).
//!
//! `cargo test --features gpu --test gpu_prefill`. Without a Vulkan device the test says
//! it skipped, unless `HETSCHED_REQUIRE_GPU=1` (set by CI after installing lavapipe).
#![cfg(feature = "gpu")]

use std::sync::Arc;

use hetsched::exec::{
    ExecError, ExecModel, GpuModel, GpuUse, GpuWeights, LinearPrecision, PrefillOptions,
    PrefillResult, ResidentWeights, prefill, prefill_on_gpu,
};
use hetsched::import::{GgufFile, GgufTokenizer};
use hetsched::systems::ProcessorKind;
use hetsched_gpu::Elem;

mod compare;
mod gpu_common;
use compare::max_relative_diff;
use gpu_common::{gpu_context, gpu_context_with, shallow_model, unless_no_device};

/// GPU float kernels (f32, other summation orders) against the CPU path.
const LOGIT_TOL: f32 = 1e-3;

fn prompt(file: &GgufFile) -> Vec<u32> {
    GgufTokenizer::from_gguf(file)
        .unwrap()
        .encode("The quick brown fox jumps over the lazy dog. The capital of France is")
        .unwrap()
}

/// `prefill` on the GPU, or `None` (after saying why) when there is no device and none
/// was demanded.
fn on_gpu(
    model: &Arc<ExecModel>,
    tokens: &[u32],
    options: &PrefillOptions,
) -> Option<PrefillResult> {
    unless_no_device(prefill(model.clone(), tokens, options))
}

/// Largest |difference| relative to the largest |logit|.

#[test]
fn resident_gpu_prefill_matches_the_cpu_path() {
    let file = shallow_model();
    let tokens = prompt(file);
    let model = Arc::new(ExecModel::load(file, LinearPrecision::F32).unwrap());
    // Chunks of 5 tokens: attention of later chunks writes earlier chunks' KV rows.
    for all_logits in [false, true] {
        let cpu_options = PrefillOptions {
            chunk_len: 5,
            threads: 2,
            all_logits,
            ..PrefillOptions::default()
        };
        // f32 weights: the reference (the default is f16 where the GEMMs run on tensor
        // cores; the next tests cover it).
        let gpu_options = PrefillOptions {
            gpu: GpuUse::Resident,
            gpu_timestamps: true,
            gpu_weights: GpuWeights::F32,
            ..cpu_options.clone()
        };
        let Some(gpu) = on_gpu(&model, &tokens, &gpu_options) else {
            return;
        };
        let cpu = prefill(model.clone(), &tokens, &cpu_options).unwrap();
        let diff = max_relative_diff(&gpu.logits, &cpu.logits);
        println!(
            "resident GPU vs CPU (all_logits {all_logits}): max |diff| / max |logit| {diff:.2e}"
        );
        assert!(diff <= LOGIT_TOL, "relative diff {diff}");
        // Every chunk's values sit in one arena at the memory planner's offsets, which
        // reuse bytes (the logits above show no value was overwritten while live).
        let bytes = gpu
            .gpu_activations
            .expect("the resident path reports its buffers");
        println!("resident GPU activations: {bytes:?}");
        assert_eq!(bytes.chunks_in_arena, bytes.chunks, "{bytes:?}");
        assert!(bytes.allocated < bytes.separate, "{bytes:?}");
        // One lane, the GPU, ran every instance exactly once.
        let plan = &gpu.outcome.plan;
        assert_eq!(plan.device.processors.len(), 1);
        assert_eq!(plan.device.processors[0].kind, ProcessorKind::Gpu);
        assert_eq!(gpu.outcome.timeline.slices.len(), plan.instance_count());
        // The timeline shows when the device ran each stage (timestamps): one at a time, in
        // the order they were queued.
        let mut slices = gpu.outcome.timeline.slices.clone();
        slices.sort_by_key(|s| s.start_ns);
        for pair in slices.windows(2) {
            assert!(pair[0].start_ns <= pair[0].end_ns, "{:?}", pair[0]);
            assert!(pair[0].end_ns <= pair[1].start_ns, "overlap: {pair:?}");
        }
    }
}

/// Dispatches per layer per chunk of the fused resident path: the q/k/v GEMM with the norm,
/// RoPE and the cache write folded in; attention with the output projection and its
/// residual add (where `GpuContext::attention_fuses_output`, else attention and the o GEMM:
/// one more); gate/up with the norm and SiLU; down with the residual add. Plus one for the
/// head. The unfused kernels took 22 and 2 copies at 512 rows.
fn dispatches_per_layer(
    ctx: &hetsched_gpu::GpuContext,
    model: &ExecModel,
    w: Elem,
    rows: usize,
) -> usize {
    let c = &model.config;
    let shape = hetsched_gpu::AttentionShape {
        n_tokens: rows,
        pos0: 0,
        kv_len: rows,
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
    };
    if ctx.attention_fuses_output(&shape, w) {
        4
    } else {
        5
    }
}

/// Counts the dispatches of a whole prefill (`GpuContext::dispatch_count`): 4 per layer per
/// chunk where attention adds the output projection itself (always on lavapipe, which has
/// float atomics; f16 weights on an H100), 5 with `GpuOptions::unfused_output_projection`;
/// the two agree on the logits (the fused path adds the heads' products in another order).
/// Chunks of 9 tokens: up to 8 run the decode kernels (attention, then the o GEMM), 5
/// dispatches, which the prompt's last chunk may be.
#[test]
fn resident_gpu_prefill_runs_four_dispatches_per_layer_per_chunk() {
    let file = shallow_model();
    let tokens = prompt(file);
    let model = Arc::new(ExecModel::load(file, LinearPrecision::F32).unwrap());
    let chunk = 9;
    let options = PrefillOptions {
        chunk_len: chunk as u32,
        gpu: GpuUse::Resident,
        ..PrefillOptions::default()
    };
    let rows: Vec<usize> = (0..tokens.len())
        .step_by(chunk)
        .map(|p| chunk.min(tokens.len() - p))
        .collect();
    let chunks = rows.len();
    let mut logits = Vec::new();
    for (weights, unfused) in [
        (ResidentWeights::F32, false),
        (ResidentWeights::F16, false),
        (ResidentWeights::F32, true),
    ] {
        let Some(ctx) = gpu_context_with(hetsched_gpu::GpuOptions {
            unfused_output_projection: unfused,
            ..Default::default()
        }) else {
            return;
        };
        let elem = match weights {
            ResidentWeights::F16 => Elem::F16,
            _ => Elem::F32,
        };
        let per_layer = dispatches_per_layer(&ctx, &model, elem, chunk);
        if unfused {
            assert_eq!(per_layer, 5);
        } else if ctx.info().kind == hetsched_gpu::DeviceKind::Cpu {
            assert_eq!(per_layer, 4, "lavapipe adds floats atomically");
        }
        let gpu = Arc::new(GpuModel::upload_as(ctx, model.clone(), weights).unwrap());
        let before = gpu.context.dispatch_count();
        let result = prefill_on_gpu(&gpu, &tokens, &options).unwrap();
        let dispatches = gpu.context.dispatch_count() - before;
        let want = rows
            .iter()
            .map(|&r| model.config.n_layers * dispatches_per_layer(&gpu.context, &model, elem, r))
            .sum::<usize>()
            + 1;
        println!(
            "{weights:?} weights, unfused o {unfused}: {dispatches} dispatches for {chunks} chunks x {} layers ({per_layer} per layer and chunk)",
            model.config.n_layers
        );
        assert_eq!(dispatches, want as u64);
        if weights == ResidentWeights::F32 {
            logits.push(result.logits);
        }
    }
    let diff = max_relative_diff(&logits[0], &logits[1]);
    println!("f32 weights, o fused vs unfused: max |diff| / max |logit| {diff:.2e}");
    assert!(diff <= 1e-4, "{diff}");
}

/// f16 weights and GEMM inputs (f32 sums, f32 residual stream and attention inputs): the
/// tolerance that rounding to f16 at every GEMM of all 30 layers needs (measured on
/// lavapipe with the whole model: 1.03e-3; the three blocks tested round less).
const F16_LOGIT_TOL: f32 = 5e-3;

/// The resident path with f16 weights (tensor cores where the device has KHR cooperative
/// matrices, the CUDA-core kernel of the same arithmetic on lavapipe) against the CPU f32
/// path: every logit within [`F16_LOGIT_TOL`] of the largest, and the same top token.
#[test]
fn resident_gpu_prefill_with_f16_weights_matches_the_cpu_path() {
    let file = shallow_model();
    let tokens = prompt(file);
    let model = Arc::new(ExecModel::load(file, LinearPrecision::F32).unwrap());
    let Some(ctx) = gpu_context() else {
        return;
    };
    let tensor_cores = ctx.fused_gemm_on_tensor_cores();
    let gpu = GpuModel::upload_as(ctx, model.clone(), ResidentWeights::F16).unwrap();
    let gpu = Arc::new(gpu);
    let cpu_options = PrefillOptions {
        chunk_len: 5,
        threads: 2,
        ..PrefillOptions::default()
    };
    let gpu_options = PrefillOptions {
        gpu: GpuUse::Resident,
        ..cpu_options.clone()
    };
    let on_gpu = prefill_on_gpu(&gpu, &tokens, &gpu_options).unwrap();
    let cpu = prefill(model.clone(), &tokens, &cpu_options).unwrap();
    // `PrefillOptions::gpu_weights` (`run --gpu-weights f16`) takes the same path through
    // `prefill`; with f32 the logits are measurably apart; the default (auto) is f16 where
    // the GEMMs run on tensor cores, f32 elsewhere (lavapipe), and the result says which.
    let with = |gpu_weights| PrefillOptions {
        gpu_weights,
        ..gpu_options.clone()
    };
    let through_option = prefill(model.clone(), &tokens, &with(GpuWeights::F16)).unwrap();
    let f32_weights = prefill(model.clone(), &tokens, &with(GpuWeights::F32)).unwrap();
    let auto = prefill(model.clone(), &tokens, &gpu_options).unwrap();
    assert_eq!(through_option.gpu_weights, Some(GpuWeights::F16));
    assert_eq!(f32_weights.gpu_weights, Some(GpuWeights::F32));
    let auto_f16 = if tensor_cores {
        GpuWeights::F16
    } else {
        GpuWeights::F32
    };
    assert_eq!(auto.gpu_weights, Some(auto_f16));
    let same = max_relative_diff(&through_option.logits, &on_gpu.logits);
    let apart = max_relative_diff(&f32_weights.logits, &on_gpu.logits);
    println!("f16 weights through the option: {same:.2e}; f32 weights: {apart:.2e} apart");
    // Not bit-identical where attention adds the heads' output projections into the stream
    // with float atomics (in whatever order its workgroups finish): a last-bit difference
    // in the stream flips some of the next GEMM's f16 roundings (measured on lavapipe with
    // all 30 blocks: 7.2e-4 between two f16 runs, 2.6e-6 between two f32 ones). Which weights ran is in
    // the result (asserted above).
    assert!(same <= F16_LOGIT_TOL, "{same}");
    let diff = max_relative_diff(&on_gpu.logits, &cpu.logits);
    println!(
        "resident GPU, f16 weights (tensor cores {tensor_cores}), vs CPU f32: max |diff| / max |logit| {diff:.2e}; {} weight bytes",
        gpu.resident_bytes
    );
    assert_eq!(gpu.weights, ResidentWeights::F16);
    assert!(diff <= F16_LOGIT_TOL, "relative diff {diff}");
    let top = |l: &[f32]| (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b]));
    assert_eq!(top(&on_gpu.logits), top(&cpu.logits));
}

#[test]
fn resident_gpu_prefill_refuses_int8_weights_clearly() {
    let file = shallow_model();
    let tokens = prompt(file);
    let model = Arc::new(ExecModel::load(file, LinearPrecision::W8a8).unwrap());
    let options = PrefillOptions {
        gpu: GpuUse::Resident,
        ..PrefillOptions::default()
    };
    match prefill(model, &tokens, &options) {
        Err(ExecError::Gpu(reason)) if reason.contains("f32") => {}
        Err(ExecError::Gpu(reason)) if reason.contains("Vulkan") || reason.contains("device") => {
            assert_ne!(
                std::env::var("HETSCHED_REQUIRE_GPU").as_deref(),
                Ok("1"),
                "{reason}"
            );
        }
        other => panic!("expected a clear GPU error, got {other:?}"),
    }
}

/// Chunks of 8 on 2 threads: on the CPU lanes, and with the float stages on the GPU lane.
fn lane_options() -> (PrefillOptions, PrefillOptions) {
    let cpu = PrefillOptions {
        chunk_len: 8,
        threads: 2,
        ..PrefillOptions::default()
    };
    let gpu = PrefillOptions {
        gpu: GpuUse::FloatLane,
        ..cpu.clone()
    };
    (cpu, gpu)
}

#[test]
fn gpu_lane_prefill_matches_the_cpu_path() {
    let file = shallow_model();
    let tokens = prompt(file);
    let model = Arc::new(ExecModel::load(file, LinearPrecision::F32).unwrap());
    let (cpu_options, gpu_options) = lane_options();
    let Some(on_gpu) = on_gpu(&model, &tokens, &gpu_options) else {
        return;
    };
    let on_cpu = prefill(model, &tokens, &cpu_options).unwrap();
    let diff = max_relative_diff(&on_gpu.logits, &on_cpu.logits);
    println!("GPU lane vs CPU: max |diff| / max |logit| {diff:.2e}");
    assert!(diff <= LOGIT_TOL, "relative diff {diff}");
    // The float stages really ran on the GPU lane.
    let plan = &on_gpu.outcome.plan;
    let gpu_lane = plan.device.first_of(ProcessorKind::Gpu).unwrap();
    let on_lane = on_gpu
        .outcome
        .timeline
        .slices
        .iter()
        .filter(|s| s.processor == gpu_lane)
        .count();
    assert!(
        on_lane > 0 && on_lane * 2 >= plan.instance_count(),
        "{on_lane} jobs on the GPU lane"
    );
}

/// The quantized precisions with the float stages on the GPU lane against the same
/// precision on the CPU lanes (the issue-20 report: a different second token on an H100).
///
/// They cannot agree to `LOGIT_TOL`, and that is not the lane's fault: quantizing a whole
/// chunk with one scale per tensor turns float rounding into whole INT8 steps. Measured on
/// lavapipe with all 30 blocks: multiplying the CPU lanes' RMSNorm outputs by (1 + 1e-6) moves their W8A8
/// logits by 3.0e-1 of the largest (w8a8-shadow: 2.5e-2), more than the GPU lane's
/// different rounding does (1.9e-1; w8a8-shadow 2.6e-2). So the test asks what matters:
/// the GPU lane adds no error of its own, its logits being as close to the f32 model's as
/// the CPU lanes' are (within 2x: measured 0.31 against 0.22 for W8A8, 0.038 against 0.025
/// for w8a8-shadow), and the f32 lanes agree (`gpu_lane_prefill_matches_the_cpu_path`).
#[test]
fn gpu_lane_quantized_is_as_close_to_f32_as_the_cpu_lanes() {
    let file = shallow_model();
    let tokens = prompt(file);
    let (cpu_options, gpu_options) = lane_options();
    let reference = Arc::new(ExecModel::load(file, LinearPrecision::F32).unwrap());
    let reference = prefill(reference, &tokens, &cpu_options).unwrap();
    for precision in [LinearPrecision::W8a8, LinearPrecision::W8a8Shadow] {
        let model = Arc::new(ExecModel::load(file, precision).unwrap());
        let Some(on_gpu) = on_gpu(&model, &tokens, &gpu_options) else {
            return;
        };
        let on_cpu = prefill(model, &tokens, &cpu_options).unwrap();
        let gpu_error = max_relative_diff(&on_gpu.logits, &reference.logits);
        let cpu_error = max_relative_diff(&on_cpu.logits, &reference.logits);
        println!("{precision:?} vs f32: GPU lane {gpu_error:.2e}, CPU lanes {cpu_error:.2e}");
        assert!(
            gpu_error <= 2.0 * cpu_error + LOGIT_TOL,
            "{precision:?}: GPU lane {gpu_error} from f32, CPU lanes {cpu_error}"
        );
    }
}
