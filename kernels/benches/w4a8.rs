//! W4A8 against W8A8 GEMM throughput at SmolLM2-135M prefill shapes, single-threaded,
//! side by side in one run (the same shapes, the same activations), and W4A8 with
//! per-group activation scales (`w4a8-g32`, and `w4a8-g128` with one scale per 128
//! inputs; their f32 output dequantized by the kernel; the per-tensor rows leave the
//! dequantization out). Criterion's
//! throughput is set in operations (2·m·k·n), so "elem/s" reads as ops/s (GOPS). A second
//! group times the activation quantizers in front of them (values/s). A third,
//! `decode_gemv`, times the one-row products of a decode step, one thread, in weight bytes
//! per second: every FFN matrix of SmolLM2's 30 layers in turn (W8A8 80 MB, W4A8 42 MB:
//! streamed from memory, past the 32 MiB last-level cache), and one matrix again and
//! again (from the cache: the kernel's own speed), so that the two say whether a kernel
//! is bound by memory or by its instructions (compare `hetsched bench-memory --threads 1`).
//! A fourth, `decode_rows`, times the W8A8 product of a batched decode step (M = 1, 2, 4
//! and 8 rows, one per sequence) over the same matrices, in rows × weight bytes per
//! second: against `decode_gemv`'s `w8a8`, it gives what a row costs in a batch of M.
//! The INT8 weights lie in `[-127, 127]`, as the quantizers produce them; the rows named
//! `widened` hold -128 too, which sends the AVX2 kernels to their exact widening form
//! (`gemm_i8/avx2.rs`): against the plain rows, what the signed-pairs form buys.
//! A fifth, `decode_shapes`, times the one-row product of each of SmolLM2's matrix shapes
//! alone (one matrix again and again, from the cache), INT8 against `w4a8-g32`, in weight
//! bytes per second.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched_kernels::gemm_w4::{gemm_w4_g128, quantize_groups_into, quantize_groups128_into};
use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{
    I8Vector, PackedI8Weights, PackedW4Weights, gemm_i8, gemm_i8_cols, gemm_w4, gemm_w4_g128_cols,
    gemm_w4_grouped, gemm_w4_grouped_cols, gemv_i8, quantize_per_tensor_fast,
    scale_for_max_abs_fast,
};

/// `len` INT8 weights in `[-127, 127]`, the range the weight quantizers produce.
fn symmetric_i8s(rng: &mut SeededRng, len: usize) -> Vec<i8> {
    rng.i8s(len).iter().map(|&v| v.max(-127)).collect()
}

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
        let drawn = rng.i8s(n * k);
        let w8 = PackedI8Weights::pack(
            &drawn.iter().map(|&v| v.max(-127)).collect::<Vec<_>>(),
            n,
            k,
        );
        let w8_widened = PackedI8Weights::pack(&drawn, n, k);
        assert!(w8.is_symmetric() && !w8_widened.is_symmetric());
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
        group.bench_function(BenchmarkId::new("w8a8 widened", name), |b| {
            b.iter(|| gemm_i8(black_box(&a), m, &w8_widened, &mut out))
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

/// SmolLM2's FFN matrices, `(k, n)`: gate, up, down.
const FFN: [(usize, usize); 3] = [(576, 1536), (576, 1536), (1536, 576)];
/// Decoder layers of SmolLM2-135M.
const LAYERS: usize = 30;

fn decode_gemv(c: &mut Criterion) {
    let mut rng = SeededRng::new(38);
    let shapes: Vec<(usize, usize)> = (0..LAYERS).flat_map(|_| FFN).collect();
    let int8: Vec<PackedI8Weights> = shapes
        .iter()
        .map(|&(k, n)| PackedI8Weights::pack(&symmetric_i8s(&mut rng, n * k), n, k))
        .collect();
    // The same values with one -128 a matrix.
    let int8_widened: Vec<PackedI8Weights> = int8
        .iter()
        .map(|w| {
            let mut rows = w.to_rows();
            rows[0] = i8::MIN;
            PackedI8Weights::pack(&rows, w.n(), w.k())
        })
        .collect();
    let int4: Vec<PackedW4Weights> = shapes
        .iter()
        .map(|&(k, n)| PackedW4Weights::quantize(&rng.f32s(n * k), n, k))
        .collect();
    let acts = |k: usize, rng: &mut SeededRng| {
        let a: Vec<i8> = rng.i8s(k).iter().map(|&v| v.max(-127)).collect();
        let scales: Vec<f32> = rng.f32s(k / 32).iter().map(|v| v.abs()).collect();
        (a, scales)
    };
    let (a576, s576) = acts(576, &mut rng);
    let (a1536, s1536) = acts(1536, &mut rng);
    let act = |k: usize| {
        if k == 576 {
            (&a576, &s576)
        } else {
            (&a1536, &s1536)
        }
    };
    let (v576, v1536) = (I8Vector::new(&a576), I8Vector::new(&a1536));
    let mut acc = vec![0i32; 1536];
    let mut out = vec![0f32; 1536];
    let mut group = c.benchmark_group("decode_gemv");
    group.sample_size(20);
    for (place, cached) in [("memory", false), ("cache", true)] {
        // In the cache: the first matrix (gate, 0.9 MB at INT8) every time.
        let pick = |i: usize| if cached { 0 } else { i };
        let read = |bytes: &dyn Fn(usize) -> usize| {
            (0..shapes.len()).map(|i| bytes(pick(i))).sum::<usize>() as u64
        };
        let int8_bytes = read(&|i| int8[i].n() * int8[i].k());
        let int4_bytes = read(&|i| int4[i].bytes());
        group.throughput(Throughput::Bytes(int8_bytes));
        group.bench_function(BenchmarkId::new("w8a8", place), |b| {
            b.iter(|| {
                for i in 0..shapes.len() {
                    let w = &int8[pick(i)];
                    let x = if w.k() == 576 { &v576 } else { &v1536 };
                    gemv_i8(x, w, 0..w.n(), &mut acc[..w.n()]);
                }
            })
        });
        group.bench_function(BenchmarkId::new("w8a8 widened", place), |b| {
            b.iter(|| {
                for i in 0..shapes.len() {
                    let w = &int8_widened[pick(i)];
                    let x = if w.k() == 576 { &v576 } else { &v1536 };
                    gemv_i8(x, w, 0..w.n(), &mut acc[..w.n()]);
                }
            })
        });
        group.throughput(Throughput::Bytes(int4_bytes));
        group.bench_function(BenchmarkId::new("w4a8-g32", place), |b| {
            b.iter(|| {
                for i in 0..shapes.len() {
                    let w = &int4[pick(i)];
                    let (a, scales) = act(w.k());
                    gemm_w4_grouped_cols(a, scales, 1, w, 0..w.n(), &mut out[..w.n()]);
                }
            })
        });
        group.bench_function(BenchmarkId::new("w4a8-g128", place), |b| {
            b.iter(|| {
                for i in 0..shapes.len() {
                    let w = &int4[pick(i)];
                    let (a, scales) = act(w.k());
                    let scales = &scales[..w.k().div_ceil(128)];
                    gemm_w4_g128_cols(a, scales, 1, w, 0..w.n(), &mut out[..w.n()]);
                }
            })
        });
    }
    group.finish();
    decode_rows(c, &int8, &int8_widened);
}

/// Rows of a batched decode step (one per sequence): the FFN matrices of every layer
/// from memory (and one from the cache), W8A8, one thread. Throughput in rows × weight
/// bytes, so that a higher figure means a cheaper row; a product bound by streaming the
/// weights gives M rows for about the time of one.
fn decode_rows(c: &mut Criterion, int8: &[PackedI8Weights], int8_widened: &[PackedI8Weights]) {
    let mut group = c.benchmark_group("decode_rows");
    group.sample_size(20);
    for (place, cached) in [("memory", false), ("cache", true)] {
        // In the cache: the first matrix (gate, 0.9 MB) every time.
        let pick = |i: usize| if cached { 0 } else { i };
        let bytes: usize = (0..int8.len())
            .map(|i| int8[pick(i)].n() * int8[pick(i)].k())
            .sum();
        for m in [1, 2, 4, 8] {
            let mut rng = SeededRng::new(m as u64);
            let (a576, a1536) = (rng.i8s(m * 576), rng.i8s(m * 1536));
            let mut acc = vec![0i32; m * 1536];
            group.throughput(Throughput::Bytes((m * bytes) as u64));
            for (name, weights) in [("w8a8", int8), ("w8a8 widened", int8_widened)] {
                if name == "w8a8 widened" && m != 8 {
                    continue;
                }
                group.bench_function(BenchmarkId::new(format!("{name} {place}"), m), |b| {
                    b.iter(|| {
                        for i in 0..weights.len() {
                            let w = &weights[pick(i)];
                            let a = if w.k() == 576 { &a576 } else { &a1536 };
                            gemm_i8_cols(black_box(a), m, w, 0..w.n(), &mut acc[..m * w.n()]);
                        }
                    })
                });
            }
        }
    }
    group.finish();
}

/// SmolLM2-135M's matrix shapes, `(name, k, n)`: the FFN's gate and up, its down, the
/// attention's Q and output, its K and V, and the head (49152 tokens: beyond the caches,
/// streamed from memory).
const DECODE_SHAPES: [(&str, usize, usize); 5] = [
    ("gate 576x1536", 576, 1536),
    ("down 1536x576", 1536, 576),
    ("q 576x576", 576, 576),
    ("kv 576x192", 576, 192),
    ("head 576x49152", 576, 49152),
];

fn decode_shapes(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_shapes");
    group.sample_size(30);
    for (name, k, n) in DECODE_SHAPES {
        let mut rng = SeededRng::new((k * 7 + n) as u64);
        let int8 = PackedI8Weights::pack(&symmetric_i8s(&mut rng, n * k), n, k);
        let int4 = PackedW4Weights::quantize(&rng.f32s(n * k), n, k);
        let a: Vec<i8> = rng.i8s(k).iter().map(|&v| v.max(-127)).collect();
        let scales: Vec<f32> = rng.f32s(k / 32).iter().map(|v| v.abs()).collect();
        let x = I8Vector::new(&a);
        let mut acc = vec![0i32; n];
        let mut out = vec![0f32; n];
        group.throughput(Throughput::Bytes((n * k) as u64));
        group.bench_function(BenchmarkId::new("w8a8", name), |b| {
            b.iter(|| gemv_i8(black_box(&x), &int8, 0..n, &mut acc))
        });
        group.throughput(Throughput::Bytes(int4.bytes() as u64));
        group.bench_function(BenchmarkId::new("w4a8-g32", name), |b| {
            b.iter(|| gemm_w4_grouped_cols(black_box(&a), &scales, 1, &int4, 0..n, &mut out))
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    w4a8_vs_w8a8,
    act_quantize,
    decode_gemv,
    decode_shapes
);
criterion_main!(benches);
