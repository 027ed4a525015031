//! RMSNorm, RoPE, SiLU·up, quantize / dequantize against their scalar references.
//! Tolerances: RMSNorm and RoPE 1e-5 relative to the largest magnitude involved; SiLU·up
//! 1e-5 of |silu(g)·u| + 1e-7; quantize and dequantize exact.

mod common;

use hetsched_gpu::{Elem, GpuOptions, RopeStyle};
use hetsched_kernels::{reference, seeded::SeededRng};

fn scaled(rng: &mut SeededRng, len: usize, s: f32) -> Vec<f32> {
    rng.f32s(len).into_iter().map(|x| x * s).collect()
}

#[test]
fn rms_norm_matches_reference() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(21);
    for &(rows, cols) in &[(1, 1), (3, 7), (17, 576), (5, 1000), (130, 64)] {
        let x = scaled(&mut rng, rows * cols, 3.0);
        let w = scaled(&mut rng, cols, 2.0);
        let got = ctx.rms_norm(&x, &w, 1e-5, rows, cols).unwrap();
        let mut want = vec![0.0; rows * cols];
        reference::rms_norm(&x, &w, 1e-5, &mut want, rows, cols);
        let scale: Vec<f32> = want.iter().map(|v| v.abs().max(1e-3)).collect();
        common::assert_close(
            &format!("rms_norm {rows}x{cols}"),
            &got,
            &want,
            &scale,
            1e-5,
        );
    }
}

#[test]
fn rope_matches_reference_in_both_styles() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(22);
    for style in [RopeStyle::Adjacent, RopeStyle::HalfSplit] {
        for &(tokens, heads, dim, pos0) in &[
            (1, 1, 2, 0),
            (5, 3, 8, 7),
            (33, 9, 64, 4000),
            (4, 2, 130, 100_000),
        ] {
            let x = rng.f32s(tokens * heads * dim);
            let positions: Vec<usize> = (pos0..pos0 + tokens).collect();
            let mut got = x.clone();
            ctx.rope(&mut got, &positions, heads, dim, 1e5, style)
                .unwrap();
            let mut want = x.clone();
            reference::rope(&mut want, &positions, heads, dim, 1e5, style);
            common::assert_close(
                &format!("rope {style:?} {tokens}x{heads}x{dim}@{pos0}"),
                &got,
                &want,
                &vec![1.0; want.len()],
                1e-5,
            );
        }
    }
    assert!(
        ctx.rope(&mut [0.0; 3], &[0], 1, 3, 1e4, RopeStyle::Adjacent)
            .is_err()
    );
}

#[test]
fn silu_mul_matches_reference() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(23);
    for len in [1, 7, 1000, 9 * 1536] {
        let g = scaled(&mut rng, len, 12.0);
        let u = scaled(&mut rng, len, 3.0);
        let got = ctx.silu_mul(&g, &u).unwrap();
        let mut want = vec![0.0; len];
        reference::silu_mul(&g, &u, &mut want);
        let scale: Vec<f32> = want.iter().map(|v| v.abs() + 1e-2).collect();
        common::assert_close("silu_mul", &got, &want, &scale, 1e-5);
    }
    // Extremes stay finite: silu(-200) = 0, silu(100) = 100.
    assert_eq!(
        ctx.silu_mul(&[-200.0, 100.0], &[1.0, 1.0]).unwrap(),
        vec![0.0, 100.0]
    );
}

#[test]
fn quantize_is_exact_including_ties_and_saturation() {
    let Some(ctx) = common::gpu() else { return };
    if !ctx.info().shader_f64 {
        eprintln!("skipped: exact quantization needs shaderFloat64, which this device lacks");
        return;
    }
    let mut rng = SeededRng::new(24);
    for len in [1, 3, 4, 5, 1001] {
        let x = scaled(&mut rng, len, 5.0);
        let s = reference::scale_for_max_abs(&x);
        let mut want = vec![0i8; len];
        reference::quantize_per_tensor(&x, s, &mut want);
        common::assert_same(
            &format!("len {len}"),
            &ctx.quantize_per_tensor(&x, s).unwrap(),
            &want,
        );
        let (q, scale) = ctx.quantize_dynamic(&x).unwrap();
        assert_eq!(scale, s, "dynamic scale, len {len}");
        common::assert_same(&format!("dynamic, len {len}"), &q, &want);
    }
    // Ties to even, saturation, infinities, NaN.
    let x = [
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        -2.6,
        1000.0,
        -1000.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    let mut want = vec![0i8; x.len()];
    reference::quantize_per_tensor(&x, 1.0, &mut want);
    assert_eq!(ctx.quantize_per_tensor(&x, 1.0).unwrap(), want);
    // Quotients that land on ties only after exact division: 0.3 / 0.2 = 1.5 in real numbers.
    let x: Vec<f32> = (0..2000).map(|i| (i as f32 - 1000.0) * 0.05).collect();
    for s in [0.1f32, 0.2, 0.3, 0.7] {
        let mut want = vec![0i8; x.len()];
        reference::quantize_per_tensor(&x, s, &mut want);
        common::assert_same(
            &format!("scale {s}"),
            &ctx.quantize_per_tensor(&x, s).unwrap(),
            &want,
        );
    }
    assert_eq!(ctx.quantize_dynamic(&[0.0; 6]).unwrap(), (vec![0; 6], 1.0));
    assert!(ctx.quantize_per_tensor(&[1.0], 0.0).is_err());
}

#[test]
fn dequantize_is_exact_host_and_resident() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(25);
    let (m, k, n) = (13, 70, 29);
    let a = scaled(&mut rng, m * k, 2.0);
    let w = rng.f32s(n * k);
    let a_scale = reference::scale_for_max_abs(&a);
    let mut a_q = vec![0i8; m * k];
    reference::quantize_per_tensor(&a, a_scale, &mut a_q);
    let (w_q, w_scales) = reference::quantize_weights_per_row(&w, n, k);
    let mut acc = vec![0i32; m * n];
    reference::gemm_i8_reference(&a_q, &w_q, &mut acc, m, k, n);
    let mut want = vec![0.0; m * n];
    reference::dequantize_i32_acc(&acc, m, n, a_scale, &w_scales, &mut want);
    assert_eq!(
        ctx.dequantize_i32_acc(&acc, m, n, a_scale, &w_scales)
            .unwrap(),
        want
    );
    // The whole W8A8 linear on the device: quantized GEMM then dequantize, no host round trip.
    let a_gpu = ctx.upload_i8(&a_q, m, k).unwrap();
    let w_gpu = ctx.upload_i8(&w_q, n, k).unwrap();
    let s_gpu = ctx.upload_f32(&w_scales, 1, n).unwrap();
    let acc_gpu = ctx.alloc_matrix(m, n, Elem::I32).unwrap();
    let out = ctx.alloc_matrix(m, n, Elem::F32).unwrap();
    ctx.gemm_i8_device(&a_gpu, &w_gpu, &acc_gpu).unwrap();
    ctx.dequantize_device(&acc_gpu, a_scale, &s_gpu, &out)
        .unwrap();
    common::assert_same("w8a8 on device", &ctx.download_f32(&out).unwrap(), &want);
}

#[test]
fn elementwise_ops_split_large_tensors() {
    let Some(ctx) = common::gpu_with(GpuOptions {
        max_buffer_bytes: Some(16 * 1024),
        ..Default::default()
    }) else {
        return;
    };
    let mut rng = SeededRng::new(26);
    let (rows, cols) = (40, 300);
    let x = rng.f32s(rows * cols);
    let w = rng.f32s(cols);
    let mut want = vec![0.0; rows * cols];
    reference::rms_norm(&x, &w, 1e-5, &mut want, rows, cols);
    let got = ctx.rms_norm(&x, &w, 1e-5, rows, cols).unwrap();
    let scale: Vec<f32> = want.iter().map(|v| v.abs().max(1e-3)).collect();
    common::assert_close("split rms_norm", &got, &want, &scale, 1e-5);
    let big = rng.f32s(20_000);
    let mut want = vec![0.0; big.len()];
    reference::silu_mul(&big, &big, &mut want);
    let scale: Vec<f32> = want.iter().map(|v| v.abs() + 1e-2).collect();
    common::assert_close(
        "split silu",
        &ctx.silu_mul(&big, &big).unwrap(),
        &want,
        &scale,
        1e-5,
    );
    let mut q = vec![0i8; big.len()];
    reference::quantize_per_tensor(&big, 0.01, &mut q);
    common::assert_same(
        "split quantize",
        &ctx.quantize_per_tensor(&big, 0.01).unwrap(),
        &q,
    );
}
