//! f32 GEMM against `reference::matmul_f32`: |diff| <= 1e-4 · Σ|a·w| per element.

mod common;

use hetsched_gpu::{Elem, GemmTile, GpuError, GpuOptions};
use hetsched_kernels::{reference, seeded::SeededRng};

const REL: f32 = 1e-4;

fn reference(a: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    reference::matmul_f32(a, w, &mut out, m, k, n);
    out
}

#[test]
fn matches_reference_on_ragged_shapes() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(1);
    // Odd sizes straddle every tile and vec4 boundary; 1x1x1 and k = 1 are the edges; the
    // small-m, long-k shapes take the split-K path (9 and 13 slices, the last one short).
    for &(m, k, n) in &[
        (1, 1, 1),
        (3, 5, 7),
        (17, 33, 9),
        (130, 70, 129),
        (64, 576, 200),
        (33, 1000, 70),
        (5, 1, 300),
    ] {
        let a = rng.f32s(m * k);
        let w = rng.f32s(n * k);
        let got = ctx.matmul_f32(&a, m, k, &w, n).unwrap();
        let want = reference(&a, &w, m, k, n);
        common::assert_close(
            &format!("{m}x{k}x{n}"),
            &got,
            &want,
            &common::abs_dot(&a, &w, m, k, n),
            REL,
        );
    }
}

#[test]
fn resident_weights_are_reused_and_chain() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(2);
    let (k, n, n2) = (37, 23, 11);
    let w = rng.f32s(n * k);
    let w_gpu = ctx.upload_f32(&w, n, k).unwrap();
    for m in [1, 9, 140] {
        let a = rng.f32s(m * k);
        let got = ctx.matmul_f32_resident(&a, m, &w_gpu).unwrap();
        common::assert_close(
            "resident",
            &got,
            &reference(&a, &w, m, k, n),
            &common::abs_dot(&a, &w, m, k, n),
            REL,
        );
    }
    // Device-resident chain: (a · wᵀ) · w2ᵀ without leaving the GPU; the output's row padding
    // must be zero for the second product to be right.
    let m = 19;
    let a = rng.f32s(m * k);
    let w2 = rng.f32s(n2 * n);
    let a_gpu = ctx.upload_f32(&a, m, k).unwrap();
    let w2_gpu = ctx.upload_f32(&w2, n2, n).unwrap();
    let h = ctx.alloc_matrix(m, n, Elem::F32).unwrap();
    let y = ctx.alloc_matrix(m, n2, Elem::F32).unwrap();
    let t = ctx.matmul_f32_device(&a_gpu, &w_gpu, &h).unwrap();
    assert_eq!(t.is_some(), ctx.info().has_timestamps());
    ctx.matmul_f32_device(&h, &w2_gpu, &y).unwrap();
    let h_ref = reference(&a, &w, m, k, n);
    let y_ref = reference(&h_ref, &w2, m, n, n2);
    let got = ctx.download_f32(&y).unwrap();
    common::assert_close(
        "chain",
        &got,
        &y_ref,
        &common::abs_dot(&h_ref, &w2, m, n, n2),
        2.0 * REL,
    );
}

#[test]
fn splits_operands_larger_than_one_storage_buffer() {
    // A 4 KiB limit forces both the row split of `a` and the column split of `w`.
    let Some(ctx) = common::gpu_with(GpuOptions {
        max_buffer_bytes: Some(4096),
        ..Default::default()
    }) else {
        return;
    };
    let mut rng = SeededRng::new(3);
    let (m, k, n) = (45, 100, 31);
    let a = rng.f32s(m * k);
    let w = rng.f32s(n * k);
    let got = ctx.matmul_f32(&a, m, k, &w, n).unwrap();
    common::assert_close(
        "split",
        &got,
        &reference(&a, &w, m, k, n),
        &common::abs_dot(&a, &w, m, k, n),
        REL,
    );
    // A resident matrix over the limit is refused with a clear error.
    let big = vec![0.0; 64 * 64];
    match ctx.upload_f32(&big, 64, 64) {
        Err(GpuError::BufferTooLarge { bytes, limit, .. }) => assert!(bytes > limit),
        other => panic!("expected BufferTooLarge, got {other:?}"),
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let Some(ctx) = common::gpu() else { return };
    assert!(matches!(
        ctx.matmul_f32(&[1.0; 5], 2, 3, &[1.0; 6], 2),
        Err(GpuError::Shape { .. })
    ));
    assert!(matches!(
        ctx.matmul_f32(&[1.0; 6], 2, 3, &[1.0; 5], 2),
        Err(GpuError::Shape { .. })
    ));
    let w = ctx.upload_f32(&[1.0; 6], 2, 3).unwrap();
    let a = ctx.upload_f32(&[1.0; 8], 2, 4).unwrap();
    let out = ctx.alloc_matrix(2, 2, Elem::F32).unwrap();
    let err = ctx.matmul_f32_device(&a, &w, &out).unwrap_err();
    assert!(err.to_string().contains("k differs"), "{err}");
    // Empty products are fine.
    assert_eq!(
        ctx.matmul_f32(&[], 0, 3, &[1.0; 6], 2).unwrap(),
        Vec::<f32>::new()
    );
}

#[test]
fn device_info_is_reported() {
    let Some(ctx) = common::gpu() else { return };
    let info = ctx.info();
    assert!(!info.name.is_empty());
    assert!(info.max_storage_buffer_range >= 1 << 20);
    eprintln!("{info:?}");
}

#[test]
fn both_tile_sizes_match_reference() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(4);
    for &(m, k, n) in &[(3, 5, 7), (130, 70, 129), (65, 33, 200)] {
        let a = rng.f32s(m * k);
        let w = rng.f32s(n * k);
        let want = reference(&a, &w, m, k, n);
        let scale = common::abs_dot(&a, &w, m, k, n);
        let (a_gpu, w_gpu) = (
            ctx.upload_f32(&a, m, k).unwrap(),
            ctx.upload_f32(&w, n, k).unwrap(),
        );
        for tile in [GemmTile::Large, GemmTile::Small] {
            let out = ctx.alloc_matrix(m, n, Elem::F32).unwrap();
            ctx.matmul_f32_device_with((&a_gpu, &w_gpu, &out), tile, 2)
                .unwrap();
            common::assert_close(
                &format!("{tile:?} {m}x{k}x{n}"),
                &ctx.download_f32(&out).unwrap(),
                &want,
                &scale,
                REL,
            );
        }
    }
}
