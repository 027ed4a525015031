//! With the `gpu` feature: the float stages (RMSNorm, RoPE, attention) of a real prefill
//! run on a Vulkan GPU lane (lavapipe in CI) and give the CPU path's logits.
//!
//! `cargo test --features gpu --test gpu_prefill`. Without a Vulkan device the test says
//! it skipped, unless `HETSCHED_REQUIRE_GPU=1` (set by CI after installing lavapipe).
#![cfg(feature = "gpu")]

use std::path::PathBuf;
use std::sync::Arc;

use hetsched::exec::{ExecError, ExecModel, LinearPrecision, PrefillOptions, prefill};
use hetsched::import::{GgufFile, GgufTokenizer, TEST_MODEL_PATH};
use hetsched::systems::ProcessorKind;

/// GPU float kernels (f32, other summation orders) against the CPU path.
const LOGIT_TOL: f32 = 1e-3;

#[test]
fn gpu_lane_prefill_matches_the_cpu_path() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
    assert!(
        path.is_file(),
        "test model {} is missing: run scripts/setup.sh",
        path.display()
    );
    let file = GgufFile::open(&path).unwrap();
    let tokens = GgufTokenizer::from_gguf(&file)
        .unwrap()
        .encode("The quick brown fox jumps over the lazy dog. The capital of France is")
        .unwrap();
    let model = Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap());
    let cpu_options = PrefillOptions {
        chunk_len: 8,
        threads: 2,
        ..PrefillOptions::default()
    };
    let gpu_options = PrefillOptions {
        gpu: true,
        ..cpu_options.clone()
    };
    let on_gpu = match prefill(model.clone(), &tokens, &gpu_options) {
        Err(ExecError::Gpu(reason))
            if std::env::var("HETSCHED_REQUIRE_GPU").as_deref() != Ok("1") =>
        {
            println!("skipped: no Vulkan device ({reason})");
            return;
        }
        other => other.unwrap(),
    };
    let on_cpu = prefill(model, &tokens, &cpu_options).unwrap();
    let scale = on_cpu.logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = on_gpu
        .logits
        .iter()
        .zip(&on_cpu.logits)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    println!("GPU lane vs CPU: max |diff| {diff:.2e} of max |logit| {scale:.2}");
    assert!(diff <= LOGIT_TOL * scale, "diff {diff}");
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
