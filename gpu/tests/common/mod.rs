//! The one place that decides whether GPU tests run, skip or fail.
//!
//! Without a Vulkan device a test prints "skipped: no Vulkan device (<reason>)" and passes,
//! unless `HETSCHED_REQUIRE_GPU=1` is set (CI sets it after installing lavapipe): then it
//! fails, so a broken driver install cannot turn the suite green.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::OnceLock;

use hetsched_gpu::{GpuContext, GpuOptions};

/// The shared context of this test binary, or `None` (after printing why) to skip.
pub fn gpu() -> Option<&'static GpuContext> {
    static CTX: OnceLock<Result<GpuContext, String>> = OnceLock::new();
    CTX.get_or_init(|| GpuContext::new(GpuOptions::default()).map_err(|e| e.to_string()))
        .as_ref()
        .map_or_else(|reason| skip_or_fail(reason), Some)
}

/// A fresh context with `options` (e.g. a lowered buffer limit), or `None` to skip.
pub fn gpu_with(options: GpuOptions) -> Option<GpuContext> {
    match GpuContext::new(options) {
        Ok(ctx) => Some(ctx),
        Err(e) => skip_or_fail(&e.to_string()),
    }
}

fn skip_or_fail<T>(reason: &str) -> Option<T> {
    if std::env::var("HETSCHED_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("HETSCHED_REQUIRE_GPU=1 but no Vulkan device: {reason}");
    }
    eprintln!("skipped: no Vulkan device ({reason})");
    None
}

/// Asserts `got` is within `rel * scale[i]` of `want` elementwise, where `scale` is the
/// per-element magnitude the error budget is relative to (e.g. Σ|a·b| for a GEMM).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], scale: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let tol = rel * s.max(1e-30);
        assert!(
            (g - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w}, |diff| {} > tol {tol}",
            (g - w).abs()
        );
    }
}

/// Σ_k |a[i, k]·w[j, k]| for every output element: the error scale of a GEMM.
pub fn abs_dot(a: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let a_abs: Vec<f32> = a.iter().map(|x| x.abs()).collect();
    let w_abs: Vec<f32> = w.iter().map(|x| x.abs()).collect();
    let mut out = vec![0.0; m * n];
    hetsched_kernels::reference::matmul_f32(&a_abs, &w_abs, &mut out, m, k, n);
    out
}

/// Asserts exact equality, reporting the first differing element rather than both vectors.
pub fn assert_same<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        let n = got.iter().zip(want).filter(|(g, w)| g != w).count();
        panic!(
            "{what}: {n} elements differ, first at {i}: got {:?}, want {:?}",
            got[i], want[i]
        );
    }
}

/// Records one batch with `f` on `ctx` and submits it (waiting for it to finish).
pub fn run_batch(
    ctx: &GpuContext,
    f: impl FnOnce(&mut hetsched_gpu::GpuBatch<&GpuContext>) -> hetsched_gpu::Result<()>,
) {
    let mut b = ctx.batch().unwrap();
    f(&mut b).unwrap();
    b.submit().unwrap();
}
