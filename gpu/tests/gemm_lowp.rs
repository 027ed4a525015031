//! f16 GEMM (f32 accumulation) against `reference::matmul_f32` on the widened inputs
//! (|diff| <= 1e-4 · Σ|a·w|), and INT8 GEMM against `reference::gemm_i8_reference` (exact).

mod common;

use half::f16;
use hetsched_gpu::{Elem, GpuOptions};
use hetsched_kernels::{reference, seeded::SeededRng};

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (3, 5, 7),
    (17, 33, 9),
    (130, 70, 129),
    (64, 576, 200),
    (2, 1000, 3),
];

fn halves(rng: &mut SeededRng, len: usize) -> Vec<f16> {
    rng.f32s(len).into_iter().map(f16::from_f32).collect()
}

fn widen(x: &[f16]) -> Vec<f32> {
    x.iter().map(|h| h.to_f32()).collect()
}

#[test]
fn f16_matches_reference_on_ragged_shapes() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(11);
    for &(m, k, n) in SHAPES {
        let a = halves(&mut rng, m * k);
        let w = halves(&mut rng, n * k);
        let got = ctx.matmul_f16(&a, m, k, &w, n).unwrap();
        let (af, wf) = (widen(&a), widen(&w));
        let mut want = vec![0.0; m * n];
        reference::matmul_f32(&af, &wf, &mut want, m, k, n);
        common::assert_close(
            &format!("f16 {m}x{k}x{n}"),
            &got,
            &want,
            &common::abs_dot(&af, &wf, m, k, n),
            1e-4,
        );
    }
}

#[test]
fn f16_resident_and_device() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(12);
    let (m, k, n) = (33, 45, 27);
    let a = halves(&mut rng, m * k);
    let w = halves(&mut rng, n * k);
    let (af, wf) = (widen(&a), widen(&w));
    let mut want = vec![0.0; m * n];
    reference::matmul_f32(&af, &wf, &mut want, m, k, n);
    let scale = common::abs_dot(&af, &wf, m, k, n);
    let w_gpu = ctx.upload_f16(&w, n, k).unwrap();
    common::assert_close(
        "resident",
        &ctx.matmul_f16_resident(&a, m, &w_gpu).unwrap(),
        &want,
        &scale,
        1e-4,
    );
    let a_gpu = ctx.upload_f16(&a, m, k).unwrap();
    let out = ctx.alloc_matrix(m, n, Elem::F32).unwrap();
    ctx.matmul_f16_device(&a_gpu, &w_gpu, &out).unwrap();
    common::assert_close(
        "device",
        &ctx.download_f32(&out).unwrap(),
        &want,
        &scale,
        1e-4,
    );
}

#[test]
fn i8_is_exact_on_ragged_shapes_and_extremes() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(13);
    for &(m, k, n) in SHAPES {
        let a = rng.i8s(m * k);
        let w = rng.i8s(n * k);
        let got = ctx.gemm_i8(&a, m, k, &w, n).unwrap();
        let mut want = vec![0i32; m * n];
        reference::gemm_i8_reference(&a, &w, &mut want, m, k, n);
        common::assert_same(&format!("i8 {m}x{k}x{n}"), &got, &want);
    }
    // -128 · -128 summed 1000 times: sign extension and no saturation.
    let (m, k, n) = (2, 1000, 3);
    let a = vec![-128i8; m * k];
    let w = vec![-128i8; n * k];
    assert_eq!(
        ctx.gemm_i8(&a, m, k, &w, n).unwrap(),
        vec![16384 * 1000; m * n]
    );
}

#[test]
fn i8_resident_device_and_split() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(14);
    let (m, k, n) = (70, 200, 40);
    let a = rng.i8s(m * k);
    let w = rng.i8s(n * k);
    let mut want = vec![0i32; m * n];
    reference::gemm_i8_reference(&a, &w, &mut want, m, k, n);
    let w_gpu = ctx.upload_i8(&w, n, k).unwrap();
    assert_eq!(ctx.gemm_i8_resident(&a, m, &w_gpu).unwrap(), want);
    let a_gpu = ctx.upload_i8(&a, m, k).unwrap();
    let out = ctx.alloc_matrix(m, n, Elem::I32).unwrap();
    ctx.gemm_i8_device(&a_gpu, &w_gpu, &out).unwrap();
    assert_eq!(ctx.download_i32(&out).unwrap(), want);
    let Some(small) = common::gpu_with(GpuOptions {
        max_buffer_bytes: Some(2048),
        ..Default::default()
    }) else {
        return;
    };
    assert_eq!(small.gemm_i8(&a, m, k, &w, n).unwrap(), want);
}

#[test]
fn coop_matrix_f16_matches_or_is_refused() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(15);
    let (m, k, n) = (48, 40, 144);
    let a = halves(&mut rng, m * k);
    let w = halves(&mut rng, n * k);
    let a_gpu = ctx.upload_f16(&a, m, k).unwrap();
    let w_gpu = ctx.upload_f16(&w, n, k).unwrap();
    let out = ctx.alloc_matrix(m, n, Elem::F32).unwrap();
    let result = ctx.matmul_f16_coop_device(&a_gpu, &w_gpu, &out, 1);
    if !ctx.has_coop_matrix_f16() {
        assert!(
            matches!(result, Err(hetsched_gpu::GpuError::Unsupported { .. })),
            "{result:?}"
        );
        return;
    }
    result.unwrap();
    let (af, wf) = (widen(&a), widen(&w));
    let mut want = vec![0.0; m * n];
    reference::matmul_f32(&af, &wf, &mut want, m, k, n);
    common::assert_close(
        "coop",
        &ctx.download_f32(&out).unwrap(),
        &want,
        &common::abs_dot(&af, &wf, m, k, n),
        1e-4,
    );
}
