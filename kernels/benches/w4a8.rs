//! W4A8 against W8A8 GEMM throughput at SmolLM2-135M prefill shapes, single-threaded,
//! side by side in one run (the same shapes, the same activations), and W4A8 with
//! per-group activation scales (`w4a8-g32`, and `w4a8-g128` with one scale per 128
//! inputs; their f32 output dequantized by the kernel; the per-tensor rows leave the
//! dequantization out). Criterion's
//! throughput is set in operations (2·m·k·n), so "elem/s" reads as ops/s (GOPS). A second
//! group times the activation quantizers in front of them (values/s).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched_kernels::gemm_w4::{gemm_w4_g128, quantize_groups_into, quantize_groups128_into};
use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{
    PackedI8Weights, PackedW4Weights, gemm_i8, gemm_w4, gemm_w4_grouped, quantize_per_tensor_fast,
    scale_for_max_abs_fast,
};

/// (name, m, k, n): SmolLM2's FFN up/gate and down projections at chunk lengths.
const SHAPES: [(&str, usize, usize, usize); 4] = [
    ("gate m=16", 16, 576, 1536),
    ("gate m=128", 128, 576, 1536),
    ("down m=128", 128, 1536, 576),
    ("gate m=512", 512, 576, 1536),
];

fn w4a8_vs_w8a8(c: &mut Criterion) {
    let mut rng = SeededRng::new(7);
    let mut group = c.benchmark_group("w4a8_vs_w8a8");
    for (name, m, k, n) in SHAPES {
        let a = rng.i8s(m * k);
        let w = rng.f32s(n * k);
        let w8 = PackedI8Weights::pack(&rng.i8s(n * k), n, k);
        let w4 = PackedW4Weights::quantize(&w, n, k);
        let scales: Vec<f32> = rng.f32s(m * k / 32).iter().map(|v| v.abs()).collect();
        // The g128 kernel takes activations in -127..=127 (its quantizer's range).
        let a127: Vec<i8> = a.iter().map(|&v| v.max(-127)).collect();
        let scales128 = &scales[..m * k.div_ceil(128)];
        let mut out = vec![0i32; m * n];
        let mut out_f32 = vec![0f32; m * n];
        group.throughput(Throughput::Elements((2 * m * k * n) as u64));
        group.bench_function(BenchmarkId::new("w8a8", name), |b| {
            b.iter(|| gemm_i8(black_box(&a), m, &w8, &mut out))
        });
        group.bench_function(BenchmarkId::new("w4a8", name), |b| {
            b.iter(|| gemm_w4(black_box(&a), m, &w4, &mut out))
        });
        group.bench_function(BenchmarkId::new("w4a8-g32", name), |b| {
            b.iter(|| gemm_w4_grouped(black_box(&a), &scales, m, &w4, &mut out_f32))
        });
        group.bench_function(BenchmarkId::new("w4a8-g128", name), |b| {
            b.iter(|| gemm_w4_g128(black_box(&a127), scales128, m, &w4, &mut out_f32))
        });
    }
    group.finish();
}

/// The activation quantizers in front of the two GEMMs: per group of 32 (`w4a8-g32`)
/// against per tensor (max |x| and quantize, W8A8's), on an FFN input chunk of 128
/// rows (576 wide: up/gate; 1536: down). Throughput in values.
fn act_quantize(c: &mut Criterion) {
    let mut group = c.benchmark_group("act_quantize");
    for k in [576, 1536] {
        let m = 128;
        let x = SeededRng::new(11).f32s(m * k);
        let mut q = vec![0i8; m * k];
        let mut scales = vec![0f32; m * k / 32];
        group.throughput(Throughput::Elements((m * k) as u64));
        group.bench_function(BenchmarkId::new("groups32", format!("128x{k}")), |b| {
            b.iter(|| quantize_groups_into(black_box(&x), m, k, &mut q, &mut scales))
        });
        let mut scales128 = vec![0f32; m * k.div_ceil(128)];
        group.bench_function(BenchmarkId::new("groups128", format!("128x{k}")), |b| {
            b.iter(|| quantize_groups128_into(black_box(&x), m, k, &mut q, &mut scales128))
        });
        group.bench_function(BenchmarkId::new("per-tensor", format!("128x{k}")), |b| {
            b.iter(|| {
                let scale = scale_for_max_abs_fast(black_box(&x));
                quantize_per_tensor_fast(&x, scale, &mut q)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, w4a8_vs_w8a8, act_quantize);
criterion_main!(benches);
