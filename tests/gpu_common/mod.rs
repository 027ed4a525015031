//! Shared by the root's GPU integration tests: the test model cut to its first blocks;
//! skipping a test on a machine without a Vulkan device, unless `HETSCHED_REQUIRE_GPU=1`
//! (CI sets it after installing lavapipe) makes that a failure (a result's error, or a
//! context of its own); greedy decode steps on the GPU compared with the CPU's.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use hetsched::exec::ExecError;
use hetsched::exec::generate::{GenerateError, Session, argmax};
use hetsched::import::gguf::writer::GgufWriter;
use hetsched::import::{GgufFile, TEST_MODEL_PATH};

use crate::compare::max_relative_diff;

/// Blocks of the test model's 30 that the GPU tests run: a first, a middle and a last
/// one. Every block runs the same kernels at the same shapes, and the head (49152 x 576)
/// stays whole, so a wrong kernel, a block reading another's weights or cache rows, or a
/// wrong head shows as it does at full depth; on lavapipe, a CPU driver, the whole depth
/// made these tests most of the test run's time.
pub const LAYERS: usize = 3;

/// The test model cut to its first [`LAYERS`] blocks (`GgufWriter::truncated`: its
/// tokenizer, real weights, widths and heads), built in memory once per test binary.
pub fn shallow_model() -> &'static GgufFile {
    static SHALLOW: OnceLock<GgufFile> = OnceLock::new();
    SHALLOW.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
        assert!(
            path.is_file(),
            "test model {} is missing: run scripts/setup.sh",
            path.display()
        );
        let file = GgufFile::open(&path).unwrap();
        let cut = GgufWriter::truncated(&file, LAYERS).unwrap();
        GgufFile::from_bytes(cut.to_bytes()).unwrap()
    })
}

/// The reason an error says there is no GPU to run on, if it says so.
pub trait NoDevice {
    /// `Some(reason)` for a missing device ([`ExecError::Gpu`]).
    fn no_device(&self) -> Option<&str>;
}

impl NoDevice for ExecError {
    fn no_device(&self) -> Option<&str> {
        match self {
            ExecError::Gpu(reason) => Some(reason),
            _ => None,
        }
    }
}

impl NoDevice for GenerateError {
    fn no_device(&self) -> Option<&str> {
        match self {
            GenerateError::Exec(e) => e.no_device(),
            _ => None,
        }
    }
}

/// `result`'s value; `None` (after saying why) when it failed for want of a device and
/// none was demanded. Any other error fails the test.
pub fn unless_no_device<T, E: NoDevice + std::fmt::Debug>(result: Result<T, E>) -> Option<T> {
    match result {
        Err(e) if std::env::var("HETSCHED_REQUIRE_GPU").as_deref() != Ok("1") => {
            match e.no_device() {
                Some(reason) => {
                    println!("skipped: no Vulkan device ({reason})");
                    None
                }
                None => panic!("{e:?}"),
            }
        }
        other => Some(other.unwrap()),
    }
}

/// A GPU context, or `None` (after saying why) when there is no device and none was
/// demanded.
pub fn gpu_context() -> Option<hetsched_gpu::GpuContext> {
    gpu_context_with(hetsched_gpu::GpuOptions::default())
}

/// [`gpu_context`] with `options`.
pub fn gpu_context_with(options: hetsched_gpu::GpuOptions) -> Option<hetsched_gpu::GpuContext> {
    match hetsched_gpu::GpuContext::new(options) {
        Ok(ctx) => Some(ctx),
        Err(e) if std::env::var("HETSCHED_REQUIRE_GPU").as_deref() != Ok("1") => {
            println!("skipped: no Vulkan device ({e})");
            None
        }
        Err(e) => panic!("HETSCHED_REQUIRE_GPU=1 but no Vulkan device: {e}"),
    }
}

/// Feeds both sessions (prefilled alike) `steps` greedy tokens, the CPU's choice, and
/// checks at every step, the first included, that `gpu`'s logits are within `tol` of
/// `cpu`'s (relative to the largest) and pick the same token; returns the largest
/// difference.
pub fn greedy_steps_agree(gpu: &mut Session, cpu: &mut Session, steps: usize, tol: f32) -> f32 {
    let mut worst = 0f32;
    for step in 0..=steps {
        let (want, got) = (cpu.logits().unwrap(), gpu.logits().unwrap());
        let diff = max_relative_diff(got, want);
        worst = worst.max(diff);
        assert!(diff <= tol, "step {step}: logits differ by {diff}");
        let token = argmax(want);
        assert_eq!(argmax(got), token, "step {step}: greedy tokens differ");
        if step < steps {
            cpu.step(token).unwrap();
            gpu.step(token).unwrap();
        }
    }
    assert_eq!(gpu.tokens(), cpu.tokens());
    worst
}
