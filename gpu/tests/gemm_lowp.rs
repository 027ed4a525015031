//! f16 GEMM (f32 accumulation), on CUDA-core-style tiles and on cooperative matrices (NV and
//! KHR), against `reference::matmul_f32` on the widened inputs (|diff| <= 1e-4 · Σ|a·w|),
//! and INT8 GEMM against `reference::gemm_i8_reference` (exact).

mod common;

use half::f16;
use hetsched_gpu::{CoopKernel, Elem, GpuError, GpuOptions};
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

/// Ragged for the cooperative-matrix kernels: m and n off their 16-row fragments and
/// 64/128/256 tiles (edge fragments are written element by element), k off the 32- and
/// 48-deep steps and off the 8-half rows of the packed layout; 300 x 96 x 260 has a first
/// tile inside all three dimensions for every tile size (the loads without bounds checks).
const COOP_SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (48, 40, 144),
    (17, 33, 9),
    (130, 70, 129),
    (257, 1000, 383),
    (64, 576, 200),
    (300, 96, 260),
];

/// Every cooperative-matrix kernel against the reference on the widened inputs, within
/// 1e-4 · Σ|a·w| per element (the products are exact in f32; only the order and rounding
/// of the f32 sums differ). Where a kernel cannot run it must say why with `Unsupported` or
/// `NotBuilt`; that skips it, except that with `HETSCHED_REQUIRE_GPU=1` a device offering
/// the kernel's extension must also run it (a build without the KHR kernels fails there).
#[test]
fn coop_matrix_f16_matches_or_is_refused() {
    let Some(ctx) = common::gpu() else { return };
    let info = ctx.info();
    let require = std::env::var("HETSCHED_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let mut rng = SeededRng::new(15);
    for &kernel in CoopKernel::ALL {
        let offered = match kernel {
            CoopKernel::Nv => info.coop_matrix_nv,
            _ => info.coop_matrix_khr_f16_shapes.contains(&[16, 16, 16]),
        };
        if let Err(why) = ctx.check_coop(kernel) {
            assert!(
                matches!(
                    why,
                    GpuError::Unsupported { .. } | GpuError::NotBuilt { .. }
                ),
                "{why:?}"
            );
            assert!(
                !(require && offered && info.shader_f16 && info.subgroup_size == Some(32)),
                "HETSCHED_REQUIRE_GPU=1 and {} offers {}, but: {why}",
                info.name,
                kernel.name()
            );
            let (a, w) = (
                ctx.upload_f16(&[f16::ONE], 1, 1).unwrap(),
                ctx.upload_f16(&[f16::ONE], 1, 1).unwrap(),
            );
            let out = ctx.alloc_matrix(1, 1, Elem::F32).unwrap();
            let refused = ctx.matmul_f16_coop_device_with((&a, &w, &out), kernel, 1);
            assert_eq!(
                refused.as_ref().map_err(|e| e.to_string()).err(),
                Some(why.to_string())
            );
            eprintln!("skipped {}: {why}", kernel.name());
            continue;
        }
        for &(m, k, n) in COOP_SHAPES {
            let a = halves(&mut rng, m * k);
            let w = halves(&mut rng, n * k);
            let a_gpu = ctx.upload_f16(&a, m, k).unwrap();
            let w_gpu = ctx.upload_f16(&w, n, k).unwrap();
            let out = ctx.alloc_matrix(m, n, Elem::F32).unwrap();
            ctx.matmul_f16_coop_device_with((&a_gpu, &w_gpu, &out), kernel, 1)
                .unwrap();
            let (af, wf) = (widen(&a), widen(&w));
            let mut want = vec![0.0; m * n];
            reference::matmul_f32(&af, &wf, &mut want, m, k, n);
            common::assert_close(
                &format!("{} {m}x{k}x{n}", kernel.name()),
                &ctx.download_f32(&out).unwrap(),
                &want,
                &common::abs_dot(&af, &wf, m, k, n),
                1e-4,
            );
        }
    }
}
