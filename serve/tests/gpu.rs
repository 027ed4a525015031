//! With the `gpu` feature: the server with a GPU lane, through the engine `generate
//! --backends gpu` uses (a generation session per request, one request at a time), over
//! the test model: every stage resident on the GPU (f32), and a GPU float lane beside the
//! CPU and emulated-NPU lanes (W8A8). Each answers two greedy completions (the first on
//! the session opened at start, the second on the one opened ahead after it) with the
//! text the CPU path generates for the same prompt, and `/metrics` counts busy time on the
//! GPU lane. The model is the test model cut to its first blocks
//! (`support::shallow_model_path`).
//!
//! `cargo test -p hetsched-serve --features gpu --test gpu`. Without a Vulkan device the
//! tests say they skipped, unless `HETSCHED_REQUIRE_GPU=1` (set by CI after installing
//! lavapipe).
#![cfg(feature = "gpu")]

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use hetsched_exec::generate::{DecodePath, GenerateOptions, Session};
use hetsched_exec::{ExecModel, GpuUse, LinearPrecision, PrefillOptions};
use hetsched_import::{GgufFile, GgufTokenizer};
use hetsched_serve::Limits;
use hetsched_serve::load::{BackendError, EngineBounds, check_backends, loader};

mod support;
use support::{ServerThread, curl, metric};

const PROMPT: &str = "The capital of France is";
/// Greedy tokens compared: as many as tests/gpu_decode.rs finds equal on the two paths.
const MAX_TOKENS: usize = 8;

/// Whether a GPU lane can run here; `false` (after saying why) when there is no device and
/// none is demanded.
fn gpu_here(gpu: GpuUse, precision: LinearPrecision) -> bool {
    match check_backends(gpu, precision) {
        Ok(device) => {
            println!("GPU: {device:?}");
            true
        }
        Err(BackendError::NoDevice { reason, .. })
            if std::env::var("HETSCHED_REQUIRE_GPU").as_deref() != Ok("1") =>
        {
            println!("skipped: no Vulkan device ({reason})");
            false
        }
        Err(e) => panic!("{e}"),
    }
}

fn options(gpu: GpuUse) -> PrefillOptions {
    PrefillOptions {
        threads: 2,
        chunk_len: 4,
        gpu,
        ..PrefillOptions::default()
    }
}

/// What the CPU path (direct decode steps) generates greedily after [`PROMPT`] at
/// `precision`.
fn cpu_greedy(precision: LinearPrecision) -> String {
    let file = GgufFile::open(support::shallow_model_path()).unwrap();
    let tokenizer = GgufTokenizer::from_gguf(&file).unwrap();
    let model = Arc::new(ExecModel::load(&file, precision).unwrap());
    let mut session = Session::new(model, options(GpuUse::Off), DecodePath::Direct).unwrap();
    let generate = GenerateOptions {
        max_tokens: MAX_TOKENS,
        ..GenerateOptions::default()
    };
    let tokens = tokenizer.encode(PROMPT).unwrap();
    session
        .generate(
            &tokens,
            &tokenizer,
            &generate,
            &AtomicBool::new(false),
            |_| {},
        )
        .unwrap()
        .text
}

/// Serves the test model at `precision` with `gpu`, sends one greedy completion and checks
/// its text against the CPU path's and the GPU lane's busy time in `/metrics`; returns
/// the `/metrics` text.
fn serve_one_completion(gpu: GpuUse, precision: LinearPrecision) -> Option<String> {
    if !gpu_here(gpu, precision) {
        return None;
    }
    let bounds = EngineBounds {
        max_requests: 4,
        kv_budget_bytes: 1 << 30,
    };
    let limits = Limits {
        shutdown_grace: Duration::from_secs(2),
        ..Limits::default()
    };
    let load = loader(
        support::shallow_model_path().to_owned(),
        precision,
        options(gpu),
        bounds,
    );
    let mut server = ServerThread::start(support::config("smollm2", limits, None), load);
    // Loading, uploading the weights and building the kernels on lavapipe.
    let deadline = Instant::now() + Duration::from_secs(300);
    while curl(&[&server.url("/health")]).0 != 200 {
        assert!(Instant::now() < deadline, "the model never loaded");
        std::thread::sleep(Duration::from_millis(100));
    }
    let body = format!(r#"{{"prompt":"{PROMPT}","max_tokens":{MAX_TOKENS},"temperature":0}}"#);
    let url = server.url("/v1/completions");
    let want = cpu_greedy(precision);
    // The second request runs on the session opened ahead after the first.
    for request in ["first", "second"] {
        let (status, text) = curl(&[
            "--max-time",
            "300",
            "-H",
            "Content-Type: application/json",
            "-d",
            &body,
            &url,
        ]);
        assert_eq!(status, 200, "{request} request: {text}");
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            answer["choices"][0]["text"].as_str().unwrap(),
            want,
            "{request} request: {answer}"
        );
    }
    let metrics = curl(&[&server.url("/metrics")]).1;
    let gpu_busy = r#"hetsched_processor_busy_seconds_total{processor="gpu",kind="gpu"}"#;
    assert!(metric(&metrics, gpu_busy) > 0.0, "{metrics}");
    server.stop().unwrap();
    Some(metrics)
}

#[test]
fn every_stage_resident_on_the_gpu_serves_the_cpu_f32_paths_text() {
    let Some(metrics) = serve_one_completion(GpuUse::Resident, LinearPrecision::F32) else {
        return;
    };
    // The GPU is the only lane: the prefill and every decode step ran there.
    assert!(!metrics.contains(r#"kind="cpu""#), "{metrics}");
}

#[test]
fn a_gpu_float_lane_beside_the_cpu_serves_the_cpu_paths_text() {
    let Some(metrics) = serve_one_completion(GpuUse::FloatLane, LinearPrecision::W8a8) else {
        return;
    };
    // The INT8 stages on the emulated NPU, the decode steps on the CPU lane.
    for lane in [
        r#"{processor="npu-emu",kind="npu"}"#,
        r#"{processor="cpu",kind="cpu"}"#,
    ] {
        let busy = format!("hetsched_processor_busy_seconds_total{lane}");
        assert!(metric(&metrics, &busy) > 0.0, "{metrics}");
    }
}
