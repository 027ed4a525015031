//! Kernel throughput at SmolLM2-135M prefill shapes, single-threaded: the INT8 GEMM
//! (ops/s: compare with the machine's VNNI peak, 64 MACs × 2 ops × 2 ports per cycle per
//! core on AVX-512 VNNI), the f32 GEMM, and attention. Criterion's throughput is set
//! in operations, so "elem/s" reads as ops/s.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{
    AttentionKv, AttentionShape, PackedF32Weights, PackedI8Weights, attention_causal_gqa_gemm,
    gemm_i8, matmul_f32_packed,
};
use hetsched_kernels::{FlashKeys, attention_causal_gqa_flash, flash_supported};

/// (name, m, k, n): SmolLM2's FFN up/gate and down projections at chunk lengths.
const SHAPES: [(&str, usize, usize, usize); 4] = [
    ("gate m=16", 16, 576, 1536),
    ("gate m=128", 128, 576, 1536),
    ("down m=128", 128, 1536, 576),
    ("gate m=512", 512, 576, 1536),
];

fn gemm(c: &mut Criterion) {
    let mut rng = SeededRng::new(7);
    let mut group = c.benchmark_group("gemm_i8");
    for (name, m, k, n) in SHAPES {
        let a = rng.i8s(m * k);
        let w = PackedI8Weights::pack(&rng.i8s(n * k), n, k);
        let mut out = vec![0i32; m * n];
        group.throughput(Throughput::Elements((2 * m * k * n) as u64));
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| gemm_i8(black_box(&a), m, &w, &mut out))
        });
    }
    group.finish();
    let mut group = c.benchmark_group("gemm_f32");
    for (name, m, k, n) in SHAPES {
        let a = rng.f32s(m * k);
        let w = PackedF32Weights::pack(&rng.f32s(n * k), n, k);
        let mut out = vec![0f32; m * n];
        group.throughput(Throughput::Elements((2 * m * k * n) as u64));
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| matmul_f32_packed(black_box(&a), m, &w, &mut out))
        });
    }
    group.finish();
}

fn attention(c: &mut Criterion) {
    let mut rng = SeededRng::new(9);
    let (heads, kv_heads, d) = (9, 3, 64);
    let mut group = c.benchmark_group("attention");
    group.sample_size(20);
    // The last chunk of 128 tokens of a 512-token prompt.
    let (n, pos0) = (128, 384);
    let kv_len = pos0 + n;
    let q = rng.f32s(n * heads * d);
    let k = rng.f32s(kv_len * kv_heads * d);
    let v = rng.f32s(kv_len * kv_heads * d);
    let shape = AttentionShape {
        n_tokens: n,
        pos0,
        kv_len,
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim: d,
    };
    let mut out = vec![0f32; q.len()];
    // QKᵀ and PV over the causal part: 4 ops per key, head and dimension.
    let keys = n * pos0 + n * (n + 1) / 2;
    group.throughput(Throughput::Elements((4 * keys * heads * d) as u64));
    group.bench_function("gather+gemm chunk 128 at 384", |b| {
        b.iter(|| {
            let kv = AttentionKv::gather(&k, &v, kv_len, kv_heads, d);
            attention_causal_gqa_gemm(black_box(&q), &kv, &mut out, &shape)
        })
    });
    group.finish();
    flash_attention(c, &mut rng);
}

/// The flash kernel against the GEMM one on the last 128-token chunk of a 512- and a
/// 4096-token prompt (keys prepared inside the timed loop, as each call does).
fn flash_attention(c: &mut Criterion, rng: &mut SeededRng) {
    let (heads, kv_heads, d, n) = (9, 3, 64, 128);
    if !flash_supported(d) {
        return;
    }
    let mut group = c.benchmark_group("attention_long");
    group.sample_size(10);
    for kv_len in [512, 4096] {
        let pos0 = kv_len - n;
        let q = rng.f32s(n * heads * d);
        let k = rng.f32s(kv_len * kv_heads * d);
        let v = rng.f32s(kv_len * kv_heads * d);
        let shape = AttentionShape {
            n_tokens: n,
            pos0,
            kv_len,
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: d,
        };
        let mut out = vec![0f32; q.len()];
        let keys = n * pos0 + n * (n + 1) / 2;
        group.throughput(Throughput::Elements((4 * keys * heads * d) as u64));
        group.bench_function(BenchmarkId::new("flash", kv_len), |b| {
            b.iter(|| {
                let kt = FlashKeys::gather(&k, kv_len, kv_heads, d);
                attention_causal_gqa_flash(black_box(&q), &kt, &v, &mut out, &shape)
            })
        });
        group.bench_function(BenchmarkId::new("gemm", kv_len), |b| {
            b.iter(|| {
                let kv = AttentionKv::gather(&k, &v, kv_len, kv_heads, d);
                attention_causal_gqa_gemm(black_box(&q), &kv, &mut out, &shape)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, gemm, attention);
criterion_main!(benches);
