//! Kernel throughput at SmolLM2-135M prefill shapes, single-threaded: the INT8 GEMM
//! (ops/s: compare with the machine's VNNI peak, 64 MACs × 2 ops × 2 ports per cycle per
//! core on AVX-512 VNNI), the f32 GEMM, and attention; and the products of one decode
//! step's attention (one head's query against the cached keys, the weighted values) with
//! the softmax between them, which run compiled for the widest vector unit the CPU has.
//! Criterion's throughput is set in operations, so "elem/s" reads as ops/s.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{
    AttentionKv, AttentionShape, PackedF32Weights, PackedI8Weights, attention_causal_gqa_gemm,
    gemm_i8, matmul_f32_packed,
};
use hetsched_kernels::{FlashKeys, attention_causal_gqa_flash, flash_supported};
use hetsched_kernels::{add_weighted_rows, scaled_dots, softmax_in_place};

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

/// Random q, k, v of the last `n`-token chunk of a `kv_len`-token prompt at SmolLM2's
/// attention shape (9 query heads, 3 KV heads, head dim 64), and its shape.
struct AttentionInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    shape: AttentionShape,
}

impl AttentionInputs {
    fn new(rng: &mut SeededRng, n: usize, kv_len: usize) -> Self {
        let (heads, kv_heads, d) = (9, 3, 64);
        Self {
            q: rng.f32s(n * heads * d),
            k: rng.f32s(kv_len * kv_heads * d),
            v: rng.f32s(kv_len * kv_heads * d),
            shape: AttentionShape {
                n_tokens: n,
                pos0: kv_len - n,
                kv_len,
                n_heads: heads,
                n_kv_heads: kv_heads,
                head_dim: d,
            },
        }
    }

    /// QKᵀ and PV over the causal part: 4 ops per key, head and dimension.
    fn ops(&self) -> u64 {
        let s = &self.shape;
        let keys = s.n_tokens * s.pos0 + s.n_tokens * (s.n_tokens + 1) / 2;
        (4 * keys * s.n_heads * s.head_dim) as u64
    }

    /// The GEMM kernel, keys and values gathered inside (as each call does).
    fn gemm(&self, out: &mut [f32]) {
        let s = &self.shape;
        let kv = AttentionKv::gather(&self.k, &self.v, s.kv_len, s.n_kv_heads, s.head_dim);
        attention_causal_gqa_gemm(black_box(&self.q), &kv, out, s);
    }
}

fn attention(c: &mut Criterion) {
    let mut rng = SeededRng::new(9);
    let mut group = c.benchmark_group("attention");
    group.sample_size(20);
    // The last chunk of 128 tokens of a 512-token prompt.
    let inputs = AttentionInputs::new(&mut rng, 128, 512);
    let mut out = vec![0f32; inputs.q.len()];
    group.throughput(Throughput::Elements(inputs.ops()));
    group.bench_function("gather+gemm chunk 128 at 384", |b| {
        b.iter(|| inputs.gemm(&mut out))
    });
    group.finish();
    flash_attention(c, &mut rng);
}

/// The flash kernel against the GEMM one on the last 128-token chunk of a 512- and a
/// 4096-token prompt (keys prepared inside the timed loop, as each call does).
fn flash_attention(c: &mut Criterion, rng: &mut SeededRng) {
    let (d, n) = (64, 128);
    if !flash_supported(d) {
        return;
    }
    let mut group = c.benchmark_group("attention_long");
    group.sample_size(10);
    for kv_len in [512, 4096] {
        let inputs = AttentionInputs::new(rng, n, kv_len);
        let s = &inputs.shape;
        let mut out = vec![0f32; inputs.q.len()];
        group.throughput(Throughput::Elements(inputs.ops()));
        group.bench_function(BenchmarkId::new("flash", kv_len), |b| {
            b.iter(|| {
                let kt = FlashKeys::gather(&inputs.k, kv_len, s.n_kv_heads, s.head_dim);
                attention_causal_gqa_flash(black_box(&inputs.q), &kt, &inputs.v, &mut out, s)
            })
        });
        group.bench_function(BenchmarkId::new("gemm", kv_len), |b| {
            b.iter(|| inputs.gemm(&mut out))
        });
    }
    group.finish();
}

/// One head of a decode step's attention over 512 cached positions at SmolLM2's shape
/// (rows of 3 KV heads × 64 values): the scores, their softmax, the weighted values.
fn decode_attention(c: &mut Criterion) {
    let (positions, d, stride) = (512, 64, 192);
    let mut rng = SeededRng::new(11);
    let (q, keys, values) = (
        rng.f32s(d),
        rng.f32s(positions * stride),
        rng.f32s(positions * stride),
    );
    let mut scores = vec![0f32; positions];
    let mut acc = vec![0f32; d];
    let mut group = c.benchmark_group("decode_attention");
    group.throughput(Throughput::Elements((2 * positions * d) as u64));
    group.bench_function("scaled_dots 512", |b| {
        b.iter(|| scaled_dots(black_box(&q), &keys, stride, d, 0.125, &mut scores))
    });
    group.throughput(Throughput::Elements(positions as u64));
    group.bench_function("softmax 512", |b| {
        b.iter(|| softmax_in_place(black_box(&mut scores)))
    });
    group.throughput(Throughput::Elements((2 * positions * d) as u64));
    group.bench_function("add_weighted_rows 512", |b| {
        b.iter(|| add_weighted_rows(black_box(&scores), &values, stride, d, &mut acc))
    });
    group.finish();
}

criterion_group!(benches, gemm, attention, decode_attention);
criterion_main!(benches);
